"""NeMo-RL's single-controller GRPO trained from the queue: a custom ``PromptGroupSampler``.

Configuration only (docs/integrations/nemo-rl.md)::

    async_rl:
      sampler:
        name: custom
        target: rollout_queue.integrations.nemo_rl.sampler:QueueSampler
        url: redis://queue-host:6379/0
        queue: math
        checkpoint_dir: results/grpo        # = checkpointing.checkpoint_dir

Where NeMo-RL knows what, read at NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909
(``nemo_rl/algorithms/single_controller.py``, ``async_utils/staleness_sampler.py``):

1. ``create_sampler`` builds ``cls(buffer, **extra_keys)`` and checks it against the
   ``PromptGroupSampler`` protocol; ``SingleControllerActor.__init__`` then calls
   ``set_dispatch_index(save_state.current_step)``: 0 on a fresh run, the step of the checkpoint it
   resumed from otherwise. There the queue is restored to that step (every group committed after
   it is requeued: the weights resumed from never saw it) and told the checkpoint is durable.
2. The train pump calls ``evict`` then ``select(current_train_weight=w, ...)`` for step ``w + 1``
   (``_train_steps`` after its increment, the number the step's checkpoint carries); what select
   returns is trained in that step. select leases exactly ``max_prompt_groups`` completed groups,
   writes them into NeMo-RL's data plane through the buffer's own ``reserve``/``commit`` (NeMo-RL's
   ``record_to_train_batch`` shapes the rows), and commits the lease with step ``w + 1`` before it
   returns them. Early, as the verl sampler does: NeMo-RL saves its checkpoint after the optimizer
   step and before the next select, with no hook between, so a commit taken after training would
   leave a kill between the save and the commit to train the batch twice; a commit at ``w + 1``
   taken early is exactly-once all the same (a checkpoint at ``w + 1`` or later covers it, a resume
   from an earlier one requeues it). A kill between the lease and its commit leaves the lease to
   its deadline (requeued, uncounted); a group that cannot be converted is rolled back counted.
3. select never waits forever: it raises WorkersGone once every worker is gone (bound:
   ``worker_timeout_s + fleet_grace_s`` after the last heartbeat plus two ``block_ms``,
   core/liveness.py) and StreamStarved after ``wait_s`` or at once when the data is exhausted.
   The wait runs in a thread, so NeMo-RL's event loop (its watchdog, its weight sync) keeps going;
   a lease that arrives after NeMo-RL cancelled the select is handed back, not leaked.
4. NeMo-RL's own generation is parked: ``admit`` never admits a batch (the queue's workers
   generate), so its rollout pump dispatches nothing and its buffer holds this sampler's groups
   only inside a select. ``evict`` has nothing to drop: the queue enforces its staleness bound at
   lease time (``max_staleness``). NeMo-RL's stall watchdog (``stall_timeout_s``) still applies;
   keep it above ``wait_s``.
5. Checkpoints: ``checkpoint_dir`` (NeMo-RL's ``checkpointing.checkpoint_dir``) lets each select
   tell the queue about every finalized ``step_N`` folder (``CheckpointManager`` renames
   ``tmp_step_N`` only once the weights are on disk), so it drops the data that checkpoint covers.
   Without it the queue keeps every committed payload until the next resume (1).

``supports_buffer_checkpoint`` is False: NeMo-RL's replay-buffer checkpoint (an unmerged branch at
the pinned commit; main saves ``replay_buffer.pt`` for every sampler) would hold this sampler's
groups only mid-select, and the queue is their durable copy. Not covered: weights reach the
queue's workers only if something publishes NeMo-RL's versions to the queue (NeMo-RL refits its
own engines).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rollout_queue.api.lease import Lease, error_reason
from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError, LeasesOpen
from rollout_queue.integrations.convert import framework_class
from rollout_queue.integrations.environment import queue_address
from rollout_queue.integrations.nemo_rl.records import to_record
from rollout_queue.integrations.stream import TrainingStream
from rollout_queue.ops.logs import fields

log = logging.getLogger("rollout_queue.integrations.nemo_rl")

__all__ = ["QueueSampler"]

_Base: Any = framework_class("BaseSampler", "nemo_rl.algorithms.async_utils.staleness_sampler") or object
_STEP_DIR = re.compile(r"step_(\d+)")
_PARKED = 3600.0


class QueueSampler(_Base):
    """NeMo-RL's ``PromptGroupSampler`` whose groups are leases of the queue (module docstring).

    The constructor is NeMo-RL's custom-sampler contract: ``buffer`` first, then the sampler
    config's extra keys; ``url`` / ``queue`` left out come from the environment (``queue_address``).
    It connects at once, so a wrong URL or queue name fails before NeMo-RL starts its workers.
    Raises IntegrationConfigError, QueueNotFound.
    """

    supports_buffer_checkpoint: ClassVar[bool] = False

    def __init__(self, buffer: Any, *, url: str | None = None, queue: str | None = None, wait_s: float = 600.0,
                 lease_timeout_s: float | None = None, fleet_grace_s: float | None = None,
                 checkpoint_dir: str | None = None, tokenizer: str | None = None, block_ms: int = 1000) -> None:
        if _Base is not object:
            super().__init__(buffer)
        else:
            self._buffer = buffer
        url, queue = queue_address(url, queue, needs="the queue sampler",
                                   keys=("async_rl.sampler.url", "async_rl.sampler.queue"))
        if wait_s <= 0 or (lease_timeout_s is not None and lease_timeout_s <= 0):
            raise IntegrationConfigError(f"wait_s and lease_timeout_s must be > 0, got {wait_s}, {lease_timeout_s}")
        self.stream = TrainingStream(RolloutQueue.from_url(url, queue, create=False), wait_s=wait_s,
                                     lease_timeout_s=lease_timeout_s, block_ms=block_ms,
                                     fleet_grace_s=fleet_grace_s)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._tokenizer_name = tokenizer
        self._tokenizer: Any = None
        #: the step NeMo-RL resumed from (set_dispatch_index), None before it was told
        self.resumed_from: int | None = None
        #: the last step the queue was told is durably checkpointed
        self.checkpointed = 0
        self._groups = 0   # prompt_idx of the next group written into the data plane

    # -- resume (item 1) -------------------------------------------------------------------------

    def set_dispatch_index(self, resume_from_step: int) -> None:
        """NeMo-RL starts from checkpoint ``resume_from_step`` (0: fresh): requeue every group committed
        after it, then let the queue drop what that checkpoint covers. Raises IntegrationConfigError
        for a negative step, CheckpointPruned when the queue already checkpointed past it."""
        if isinstance(resume_from_step, bool) or not isinstance(resume_from_step, int) or resume_from_step < 0:
            raise IntegrationConfigError(f"set_dispatch_index({resume_from_step!r}): NeMo-RL's steps start at 0")
        requeued = self.stream.restore(resume_from_step)
        self.resumed_from = resume_from_step
        if resume_from_step > 0:
            self.stream.checkpoint(resume_from_step)
            self.checkpointed = resume_from_step
        log.info("queue restored to NeMo-RL's step", extra=fields(queue=self.stream.queue.name,
                                                                  step=resume_from_step, requeued=requeued))

    # -- the rollout pump's side (item 4) --------------------------------------------------------

    async def admit(self, *, trainer_version_fn: Callable[[], int]) -> int | None:
        """Never admits: the queue's workers generate, NeMo-RL's rollout pump stays parked here."""
        while True:
            await asyncio.sleep(_PARKED)

    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        return False

    @property
    def is_on_policy(self) -> bool:
        """Strictly on-policy when the queue's bound is (``max_staleness=None``)."""
        return self.stream.queue.config.max_staleness is None

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        return None

    # -- the train pump's side (items 2, 3, 5) ---------------------------------------------------

    async def evict(self, *, current_train_weight: int) -> int:
        """Nothing to drop: the queue evicts stale groups at lease time."""
        return 0

    async def select(self, *, current_train_weight: int, min_prompt_groups: int,
                     max_prompt_groups: int) -> tuple[Any, int]:
        """``max_prompt_groups`` leased groups for step ``current_train_weight + 1``, in the data plane
        and committed at that step. Raises WorkersGone, StreamStarved, LeaseUnsatisfiable, LeaseLost."""
        if self.resumed_from is None:
            raise IntegrationConfigError("select() before set_dispatch_index(): NeMo-RL's SingleControllerActor "
                                         "calls it at construction with the step it resumed from")
        if min_prompt_groups < 1 or max_prompt_groups < min_prompt_groups:
            raise ValueError(f"need 1 <= min_prompt_groups <= max_prompt_groups, got {min_prompt_groups}, "
                             f"{max_prompt_groups}")
        await asyncio.to_thread(self._note_checkpoints)
        step = current_train_weight + 1
        lease = await self._lease(max_prompt_groups)
        written: list[tuple[str, Any]] = []
        try:
            for part in lease.parts:
                for group in part.groups:
                    stamp = max(0, current_train_weight - max(0, part.version - group.min_version))
                    written.append(await self._write(group, stamp, current_train_weight, lease.lease_id))
            await asyncio.to_thread(self.stream.ack, step)                      # item 2: committed early
        except BaseException as exc:
            for slot, _ in written:   # NeMo-RL never saw them: their rows go with the lease
                await self._buffer.remove_group(slot, remove_in_dp=True)
            await asyncio.to_thread(self.stream.rollback, error_reason(exc))  # counted for the data's own errors (DESIGN rule 4)
            raise
        for slot, _ in written:
            await self._buffer.remove_group(slot, remove_in_dp=False)   # selected: NeMo-RL reads and clears the rows
        metas = [meta for _, meta in written]
        return metas[0].concat(*metas[1:]), len(metas)

    async def _lease(self, groups: int) -> Lease:
        """Wait for the lease in a thread (item 3). Cancelled, it stops the wait and hands back a
        lease that arrives anyway."""
        stop = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(None, self.stream.poll, groups, stop)
        try:
            lease = await asyncio.shield(future)
        except asyncio.CancelledError:
            stop.set()
            future.add_done_callback(self._give_back_late)
            raise
        assert lease is not None  # poll() returns None only once ``stop`` is set
        return lease

    def _give_back_late(self, future: "asyncio.Future[Lease | None]") -> None:
        if not future.cancelled() and future.exception() is None and future.result() is not None:
            threading.Thread(target=self.stream.rollback, daemon=True).start()  # uncounted: not the data's fault

    async def _write(self, group: Any, stamp: int, weight: int, lease_id: str) -> tuple[str, Any]:
        """One group into NeMo-RL's data plane, the way its own rollouts write one: reserve a slot,
        commit the record (NeMo-RL shapes and writes the rows). ``stamp``, the trainer's weight less
        the group's staleness, makes NeMo-RL's ``lag`` metric read the queue's. Returns the slot's
        group id and its KVBatchMeta."""
        record = to_record(group, self._groups, self._tokenizer_for(group))
        self._groups += 1
        slot = f"rq-{lease_id}-{group.entry_id}".replace("_", "-")  # NeMo-RL's row ids are {slot}_g{i}
        self._buffer.reserve(weight_version=stamp, group_id=slot)
        try:
            return slot, await self._buffer.commit(slot, record, stamp, weight)
        except BaseException:
            await self._buffer.remove_group(slot, remove_in_dp=False)  # commit cleared its own rows
            raise

    def _note_checkpoints(self) -> None:
        """Item 5: tell the queue about NeMo-RL's newest finalized checkpoint."""
        if self.checkpoint_dir is None or not self.checkpoint_dir.is_dir():
            return
        steps = [int(m.group(1)) for p in self.checkpoint_dir.iterdir() if (m := _STEP_DIR.fullmatch(p.name))]
        newest = max(steps, default=0)
        if newest <= self.checkpointed:
            return
        try:
            dropped = self.stream.queue.checkpoint(newest)
        except LeasesOpen as exc:  # another trainer's lease: nothing written; the next select tries again
            log.info("queue checkpoint deferred: groups are leased", exc_info=exc,
                     extra=fields(queue=self.stream.queue.name, step=newest))
            return
        self.checkpointed = newest
        log.info("queue checkpointed at NeMo-RL's step", extra=fields(queue=self.stream.queue.name, step=newest,
                                                                      dropped=dropped))

    def _tokenizer_for(self, group: Any) -> Any:
        """The tokenizer named by ``tokenizer``, loaded once and only for a group without prompt ids."""
        if self._tokenizer is None and self._tokenizer_name and group.group.prompt_token_ids is None:
            from transformers import AutoTokenizer
            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_name)
        return self._tokenizer

    def close(self) -> None:
        """Hand back any open lease and close the connection (tests; NeMo-RL has no close hook)."""
        self.stream.rollback()
        self.stream.queue.close()

    def __repr__(self) -> str:
        return f"<QueueSampler {self.stream.queue.name} resumed_from={self.resumed_from} wait_s={self.stream.wait_s}>"
