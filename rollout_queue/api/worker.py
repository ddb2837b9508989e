"""Worker: a generation worker's handle on a queue: reserve, then settle each receipt exactly once.

A receipt names the partition that issued it (PartitionReceipt) on a partitioned queue, so every
settlement goes to the one partition that owns the attempt; a receipt of another worker is refused
(InvalidInput) before anything is sent. Methods return ``Result[T]`` as the queue's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from rollout_queue.api.results import Result
from rollout_queue.core import flows
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import HeartbeatInfo, Receipt, Reservation, Sample, check_worker_id
from rollout_queue.core.models import OwnedAttempt, Progress, PushTicket
from rollout_queue.core.protocol import CompletionOutcome
from rollout_queue.scale import flows as pf
from rollout_queue.scale.layout import Selector

if TYPE_CHECKING:
    from rollout_queue.api.queue import RolloutQueue


class Worker:
    """Reserve groups, then complete, fail, abort or filter each receipt; heartbeat while executing."""

    queue: "RolloutQueue"
    worker_id: str
    selector: Selector  # this worker's own partition order

    def __init__(self, queue: "RolloutQueue", worker_id: str) -> None:
        self.queue, self.worker_id = queue, check_worker_id(worker_id)
        self.selector = Selector(queue.layout.count)

    def reserve(self, max_groups: int = 1, block_ms: int = 0, max_samples: int = 0,
                overcommit: bool = False) -> Result[list[Reservation]]:
        """Up to ``max_groups`` groups and ``max_samples`` samples (0: no cap of the caller's own).
        ``overcommit``: this caller queues samples internally, so the oldest group larger than
        ``max_samples`` may be its first grant; without it such a group is left for another caller."""
        q = self.queue
        return q.run(pf.reserve(q.layout, self.selector, self.worker_id, max_groups, max_samples, block_ms, q.clock,
                                overcommit))

    def complete(self, receipt: Receipt, samples: Sequence[Sample]) -> Result[str]:
        """Buffer the attempt's samples for training ('buffered', or 'replay' for a repeat)."""
        return self.queue.run(flows.complete(self._keys(receipt), receipt, samples, self.queue.config.max_payload_bytes))

    def complete_many(self, items: Sequence[tuple[Receipt, Sequence[Sample]]]) -> Result[list[CompletionOutcome]]:
        """Complete several attempts in one script call per chunk (and partition), each settled as
        ``complete`` would. Returns one outcome per item: 'buffered' / 'replay' / 'evicted_self', or
        the item's refusal as an exception instance (StaleReceipt, PayloadTooLarge,
        MalformedCompletion), not raised: the other items are settled either way. Safe to repeat after
        OutcomeUnknown (settled items replay). Raises InvalidInput, before anything is sent, for a
        receipt of another worker."""
        return self.queue.run(pf.complete_many(self.queue.layout, self.worker_id, items,
                                               self.queue.config.max_payload_bytes))

    def fail(self, receipt: Receipt, reason: str) -> Result[str]:
        """The attempt failed: retry the group (or dead-letter it after max_attempts)."""
        return self.queue.run(flows.fail(self._keys(receipt), receipt, reason))

    def abort(self, receipt: Receipt, reason: str = "aborted", progress: Sequence[Sample] = (),
              discarded: int = 0) -> Result[str]:
        """Hand the attempt back unfinished (not counted toward max_attempts). ``progress``: its samples
        so far (tokens, behaviour logprobs, segments), kept in the same call so the next attempt
        continues from them (partial rollouts). Raises PartialTooLarge, with nothing sent, for a
        record over the queue's max_partial_bytes: abort again without it. ``discarded``: the tokens
        it generated that no record keeps, counted as waste (QueueStats.waste, 'aborted')."""
        return self.queue.run(flows.abort(self._keys(receipt), receipt, reason, progress,
                                          self.queue.config.max_partial_bytes, discarded))

    def save_partial(self, receipt: Receipt, samples: Sequence[Sample]) -> Result[str]:
        """Record the attempt's progress so far ('saved', or 'replay' for a resent call: the record
        stored is already this one, nothing written): if the attempt ends unfinished, the next one
        continues from it. Only the receipt's owner writes (StaleReceipt otherwise); PartialTooLarge
        over max_partial_bytes."""
        return self.queue.run(flows.save_partial(self._keys(receipt), receipt, samples,
                                                 self.queue.config.max_partial_bytes))

    def filter(self, receipt: Receipt, reason: str, tokens: int = 0) -> Result[str]:
        """The group is not worth training (all rewards equal, say): settle it filtered, with ``reason``.
        ``tokens``: what the attempt generated for it, counted as waste (QueueStats.waste, 'filtered')."""
        return self.queue.run(flows.filter_group(self._keys(receipt), receipt, reason, tokens))

    def heartbeat(self, progress: Progress | None = None) -> Result[HeartbeatInfo]:
        """I am alive (on every partition that answers); the newest policy version announced.
        ``progress``: this process's groups, tokens and uptime so far, for operators' rates."""
        q = self.queue
        return q.run(pf.heartbeat(q.layout, self.selector, self.worker_id, q.clock, progress))

    def owned(self, min_idle_ms: int = 0) -> Result[list[OwnedAttempt]]:
        """What the PEL gives this worker now (read-only): each entry's exact receipt and ms since its
        delivery, oldest entry first (per partition). An attempt listed here that you do not hold is
        orphaned (its settlement was lost in a server crash, or a reserve reply never arrived): hand
        it back with ``abort(receipt)``, which refuses (StaleReceipt) if it moved meanwhile."""
        return self.queue.run(pf.owned(self.queue.layout, self.worker_id, min_idle_ms))

    def close(self, terminal: str = "aborted", reason: str = "worker closed") -> Result[tuple[int, int]]:
        """Requeue all owned work (terminal 'aborted', or 'lost' after a fatal engine error) on every
        partition and deregister. Returns (requeued, dead-lettered)."""
        return self.queue.run(pf.close_worker(self.queue.layout, self.worker_id, terminal, reason))

    def join_push(self, epoch: int = 0, newer_than: int = -1) -> Result[PushTicket | None]:
        """Join round ``epoch`` of a weights push (0: whichever is joinable now) if its version is
        newer than ``newer_than``; None if none is. A member must then receive (weights.push.receive):
        the round waits for it until its deadline."""
        return self.queue.run(flows.push_join(self.queue.layout.keys[0], self.worker_id, epoch, newer_than))

    def _keys(self, receipt: Receipt) -> QueueKeys:
        return pf.settle_keys(self.queue.layout, receipt, self.worker_id)

    def __repr__(self) -> str:
        return f"<Worker {self.worker_id!r} of {self.queue.name!r}>"
