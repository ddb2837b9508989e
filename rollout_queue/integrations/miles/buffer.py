"""miles' fully-async ``DataBuffer``, backed by the queue: durable and exactly-once.

``--custom-async-data-buffer-path rollout_queue.integrations.miles.QueueDataBuffer``. Read at
radixark/miles@31f1ca961a94cb860cec3b2dea34ec332bfa8f76 (``miles/rollout/fully_async_data_buffer.py``:
``DataBuffer`` with ``async put(DataBufferInput)``, ``async get(**context)``, ``get_metrics()``;
built by ``FullyAsyncRolloutFn`` as ``cls(DataBufferConstructorInput(args, unused_handler_fn))``).

What it keeps of miles' ``DefaultDataBuffer`` (same filters, same metric names):
- ``put`` rejects an aborted group (``aborted_groups_filtered``; handed to the unused-samples
  handler) and a group the dynamic filter drops (``rollout/dynamic_filter/drop_<reason>``), and
  waits while ``floor(async_data_buffer_capacity_factor * rollout_batch_size)`` groups are buffered.
- ``get`` hands out one group at a time in the queue's buffer order (``fifo``, miles' only order at
  this commit; a queue created with ``buffer_order="lifo"`` hands out the newest first) and skips a
  group more than ``--max-weight-staleness`` versions behind ``current_version``
  (``stale_groups_filtered``, ``avg_staleness``, ``max_staleness``, ``buffer_avg_staleness``,
  ``buffer_max_staleness``, ``queue_size``).

What the queue adds: a group ``put`` stores is the completion of the reservation its prompt came
from (``QueueDataSource``), checked against that exact receipt, so it survives the rollout process;
``get`` leases it and commits the lease as it hands the group out, as the queue step of the rollout
being drawn (ledger.py, rules 1-5): killed at any point, a group is trained exactly once relative to
the checkpoint miles resumes from, since that resume requeues every rollout after the checkpoint.
Differences, on purpose: an aborted or stale group is requeued in the queue (a new attempt) rather
than recycled through the data source (whose ``add_samples`` ignores the queue's own prompts), and
with ``--async-unused-samples-handler drop`` an aborted group is settled ``filtered`` (recorded,
never trained), a stale one still regenerated: the queue loses no group silently. Groups beyond the
queue's ``max_completed_groups`` would be evicted, so a capacity above it is refused at start.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from rollout_queue.api.lease import Lease
from rollout_queue.core.errors import IntegrationConfigError, InvalidInput, LeaseLost, OwnershipLost
from rollout_queue.core.models import Receipt
from rollout_queue.integrations.convert import framework_class
from rollout_queue.integrations.miles.codec import receipt_of, to_miles_group, to_queue_samples
from rollout_queue.integrations.miles.ledger import MilesLedger, ledger_for
from rollout_queue.ops.logs import fields

log = logging.getLogger("rollout_queue.integrations.miles")

__all__ = ["QueueDataBuffer"]

_MODULE = "miles.rollout.fully_async_data_buffer"
_Base: Any = framework_class("DataBuffer", _MODULE) or object
PREFIX = "rollout/fully_async/"


def _miles(name: str) -> Any:
    found = framework_class(name, _MODULE)
    if found is None:
        raise IntegrationConfigError(f"QueueDataBuffer runs inside miles: {_MODULE}.{name} does not import here")
    return found


class QueueDataBuffer(_Base):
    """miles' fully-async buffer, stored in the queue (module docstring)."""

    #: seconds between checks of the buffer's size while ``put`` waits for room
    poll_s = 0.05
    #: how long one lease call waits in Redis for a completed group
    block_ms = 1000

    def __init__(self, input: Any, *, ledger: MilesLedger | None = None) -> None:
        args = input.args
        self._args, self._unused = args, input.unused_handler_fn
        self._ledger = ledger or ledger_for(args)
        config = self._ledger.queue.config
        self._capacity = int(args.async_data_buffer_capacity_factor * args.rollout_batch_size)
        if not 1 <= self._capacity <= config.max_completed_groups:
            raise IntegrationConfigError(
                f"miles' buffer capacity (async_data_buffer_capacity_factor * rollout_batch_size = {self._capacity}) "
                f"must be 1..{config.max_completed_groups}, the queue's max_completed_groups (beyond it completions "
                "are evicted and generated again): lower the factor or raise max_completed_groups")
        self._filter = _miles("load_function")(getattr(args, "dynamic_sampling_filter_path", None))
        self._sample_cls = framework_class("Sample", "miles.utils.types")
        self._gatherer = _miles("MetricGatherer")()
        self._retry = getattr(args, "async_unused_samples_handler", "retry") == "retry"
        self._current_version: int | None = None
        self._aborted = self._stale = self._malformed = self._lost = 0
        self._consumed: list[int] = []
        self._estimate = self._ledger.queue.stats().completed  # buffered groups, refreshed when it says full

    # -- put ---------------------------------------------------------------------------------------

    async def put(self, input: Any) -> None:
        receipt = receipt_of(input.prompt_group) or receipt_of(input.group)
        if receipt is None:
            raise IntegrationConfigError("a group without a queue receipt reached QueueDataBuffer: set "
                                         "--data-source-path rollout_queue.integrations.miles.QueueDataSource "
                                         "(the buffer stores the completions of the queue's reservations)")
        samples = list(_miles("iter_samples")(input.group))
        if any(s.status.name == "ABORTED" for s in samples):
            self._aborted += 1
            self._ledger.sources.pop(receipt.entry_id, None)
            await self._settle_unused(receipt, "aborted by the generate function")
            self._unused(input.prompt_group)
            return
        verdict = _miles("call_dynamic_filter")(self._filter, self._args, input.group)
        if not verdict.keep:
            self._ledger.sources.pop(receipt.entry_id, None)
            self._gatherer.on_dynamic_filter_drop(reason=verdict.reason)
            await asyncio.to_thread(self._ledger.worker.filter, receipt, f"dynamic_filter: {verdict.reason}")
            return
        try:
            converted = to_queue_samples(input.group, self._ledger.sources.pop(receipt.entry_id, {}))
        except InvalidInput as exc:  # garbage from a generate function fails this attempt, counted
            self._malformed += 1
            log.error("a finished group cannot be stored; its attempt fails", exc_info=exc,
                      extra=fields(queue=self._ledger.queue.name, entry=receipt.entry_id))
            await asyncio.to_thread(self._ledger.worker.fail, receipt, f"malformed: {exc}"[:500])
            return
        await self._wait_for_room()
        try:
            await asyncio.to_thread(self._ledger.worker.complete, receipt, converted)
        except OwnershipLost as exc:  # reaped while generating (this process was silent): the queue regenerates it
            self._lost += 1
            log.warning("a completion arrived after its reservation was requeued; dropped", exc_info=exc,
                        extra=fields(queue=self._ledger.queue.name, entry=receipt.entry_id))
            return
        self._estimate += 1

    async def _settle_unused(self, receipt: Receipt, reason: str) -> None:
        worker = self._ledger.worker
        try:
            if self._retry:
                await asyncio.to_thread(worker.abort, receipt, reason)
            else:
                await asyncio.to_thread(worker.filter, receipt, reason)
        except OwnershipLost as exc:  # already requeued by the reaper: nothing left to settle
            log.info("unused group already requeued", exc_info=exc, extra=fields(entry=receipt.entry_id))

    async def _wait_for_room(self) -> None:
        while self._estimate >= self._capacity:
            self._estimate = (await asyncio.to_thread(self._ledger.queue.stats)).completed
            if self._estimate < self._capacity:
                return
            await asyncio.sleep(self.poll_s)

    # -- get ---------------------------------------------------------------------------------------

    async def get(self, current_version: int | None = None, **_: Any) -> Any:
        if current_version is not None:
            self._current_version = current_version
        bound = getattr(self._args, "max_weight_staleness", None)
        while True:
            lease = await self._lease()
            self._estimate = max(0, self._estimate - 1)
            prompts, group = to_miles_group(lease.groups[0], self._sample_cls)
            oldest = _miles("group_oldest_weight_version")(group)
            staleness = None if oldest is None or current_version is None else current_version - oldest
            if staleness is not None:
                self._consumed.append(staleness)
            if staleness is None or bound is None or staleness <= bound:
                # committed here, with no await before the return (ledger rule 2): a get cancelled
                # after this point has already returned, so no group is committed and not handed out
                try:
                    self._ledger.hand_out(lease)
                except LeaseLost as exc:  # its deadline passed first: the queue has it back, miles must not train it
                    log.warning("a leased group was lost before hand-out; leasing another", exc_info=exc,
                                extra=fields(queue=self._ledger.queue.name))
                    if staleness is not None:
                        self._consumed.pop()  # not consumed after all
                    continue
                return _miles("DataBufferInput")(prompt_group=prompts, group=group)
            log.info(f"Filtered stale group ({staleness=} > max={bound})")
            self._stale += 1
            await asyncio.to_thread(self._ledger.give_back, lease)
            self._unused(prompts)

    async def _lease(self) -> Lease:
        """Lease one group, waiting in a thread; a lease that arrives after the caller was cancelled
        (miles cancels a pending get when its producer dies) is handed back, not leaked."""
        loop = asyncio.get_running_loop()
        while True:
            future = loop.run_in_executor(None, self._ledger.lease_one, self.block_ms)
            try:
                lease = await asyncio.shield(future)
            except asyncio.CancelledError:
                future.add_done_callback(self._give_back_late)
                raise
            if lease is not None:
                return lease

    def _give_back_late(self, future: "asyncio.Future[Lease | None]") -> None:
        if future.cancelled() or future.exception() is not None or future.result() is None:
            return
        lease = future.result()
        assert lease is not None
        threading.Thread(target=self._ledger.give_back, args=(lease,), daemon=True).start()

    # -- metrics -----------------------------------------------------------------------------------

    def get_metrics(self) -> dict[str, float]:
        """miles' names, from the queue's own counts; marks the end of a rollout's drain (ledger rule 1)."""
        stats = self._ledger.queue.stats()
        metrics: dict[str, float] = {
            f"{PREFIX}queue_size": stats.completed,
            f"{PREFIX}aborted_groups_filtered": self._aborted,
            f"{PREFIX}stale_groups_filtered": self._stale,
            **self._gatherer.collect(),
            "rollout_queue/malformed_groups": self._malformed,
            "rollout_queue/late_completions": self._lost,
            "rollout_queue/dead": stats.dead,
        }
        if self._consumed:
            metrics[f"{PREFIX}avg_staleness"] = sum(self._consumed) / len(self._consumed)
            metrics[f"{PREFIX}max_staleness"] = max(self._consumed)
        if self._current_version is not None and stats.buffer_versions:
            pairs = [(self._current_version - v, n) for v, n in stats.buffer_versions if v > 0]
            total = sum(n for _, n in pairs)
            if total:
                metrics[f"{PREFIX}buffer_avg_staleness"] = sum(s * n for s, n in pairs) / total
                metrics[f"{PREFIX}buffer_max_staleness"] = max(s for s, _ in pairs)
        self._ledger.end_drain()
        self._gatherer = _miles("MetricGatherer")()
        self._consumed = []
        self._aborted = self._stale = self._malformed = self._lost = 0
        return metrics

