"""The framework-neutral trainer contract: leased groups in; ack, checkpoint and restore out.

Every trainer integration (TRL, a verl sampler, an AReaL engine, a slime data source, a bare loop)
is this object plus a converter to the framework's sample shape (integrations/convert/)::

    stream = TrainingStream(queue, groups_per_step=8)
    stream.restore(resumed_step)               # once, at start: requeue what the lost run committed later
    for step, lease in enumerate(stream, start=resumed_step + 1):
        train_on(lease.groups)                  # the framework's optimizer step
        stream.ack(step)                        # commit: these groups are trained, at this step
        if step % save_every == 0:
            stream.checkpoint(step, save)       # save(step) first, then the queue drops the data

What it guarantees, given the queue's scripts (docs/DESIGN.md, "Checkpoints"):
1. Each group is acked at most once; ack(step) commits every lease taken since the last ack, with
   ``step``, so the queue keeps the payloads until a checkpoint covers that step.
2. restore(step) after a crash requeues every group acked after ``step``: the weights resumed from
   never saw them, so relative to those weights each group is trained exactly once.
3. A lease the trainer never acks (it died, or raised) goes back: rollback() now, or the reaper at
   the lease deadline. Nothing is lost, nothing is half committed. rollback(reason) after an error
   the data may have caused counts it (DESIGN rule 4): a group that breaks every step it is in is
   dead-lettered after max_attempts, never retried for ever.
4. next() never waits forever: after ``wait_s`` it raises StreamStarved with the queue's state
   (no workers, nothing queued, or generation behind), at once when the data is known exhausted:
   the source is done and fewer groups than a batch are left, counting as left every group queued,
   executing, buffered or leased by anyone else (a dead predecessor's lease comes back at its
   deadline), but not this stream's own open leases. When the generation side is gone (no worker
   live while groups wait for one) it raises WorkersGone (a StreamStarved) well before ``wait_s``:
   within ``worker_timeout_s + fleet_grace_s`` (default 2 x worker_timeout_s) of the last worker's
   last heartbeat, plus two ``block_ms`` waits (core/liveness.py has the rule and why it holds).
5. Admission control: where the queue's config left ``batch_groups`` to the trainer (DERIVED, the
   default), the stream sets it once to its batch (the largest it leased) times ``publish_every``,
   the groups it commits per policy version, at the first ack after the loop published a version:
   generation then runs at most max_staleness + 1 versions ahead of training instead of without
   bound (each group further ahead would go stale and be generated again). A loop that publishes
   no version never gets it (admission counts versions: it would close after max_staleness + 1
   batches). A number or None in the queue's config is the user's and is kept.

It decides nothing across round trips: each call is one queue operation (one script per
partition); the class only remembers which of its own leases are open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rollout_queue.api.lease import Lease
from rollout_queue.api.queue import RolloutQueue, default_process_id
from rollout_queue.core.config import DERIVED
from rollout_queue.core.errors import (
    IntegrationConfigError,
    LeasesOpen,
    OutcomeUnknown,
    RolloutQueueError,
    ScriptError,
    StreamStarved,
)
from rollout_queue.core.liveness import FleetWatch
from rollout_queue.core.models import QueueStats
from rollout_queue.ops.logs import fields

log = logging.getLogger("rollout_queue.integrations.stream")

__all__ = ["TrainingStream", "derive_admission"]


def derive_admission(queue: RolloutQueue, batch_groups: int) -> bool:
    """``queue.derive_admission(batch_groups)`` for a trainer-side helper (item 5), the batch_groups
    in force logged. True once settled: derived now or before, or kept as the user set it (a number,
    or None: off). A credential that may not run it (a trainer role from before derive_admission
    existed) only costs the bound: logged with how to set it by hand, and settled. False when Redis
    was out of reach past the retry window (logged; ask again later). The step goes on either way."""
    try:
        got = queue.derive_admission(batch_groups)
    except ScriptError as exc:  # refused (ops/acl.py): not this trainer's to change
        log.warning("admission control not derived: this credential may not set it; set it by hand with "
                    f"`rollout-queue config set batch_groups={batch_groups} --yes`", exc_info=exc,
                    extra=fields(queue=queue.name, batch_groups=batch_groups))
        return True
    except OutcomeUnknown as exc:
        log.warning("admission control not derived yet: the queue did not answer; asking again later",
                    exc_info=exc, extra=fields(queue=queue.name, batch_groups=batch_groups))
        return False
    log.info("admission control" + ("" if got else ": off (the queue's config says batch_groups=None)"),
             extra=fields(queue=queue.name, batch_groups=got, derived=batch_groups))
    return True


class TrainingStream:
    """Batches of completed groups for one trainer (one process; see ranks.py for data parallel).

    ``groups_per_step``: the default batch of next(). ``wait_s``: how long next() waits for a batch
    before StreamStarved. ``lease_timeout_s``: each lease's deadline (it must outlast the step;
    extend() otherwise). ``exhausted``: a callable that says the data source is done (the in-process
    producer's flag), so a batch that can never fill fails at once instead of after ``wait_s``.
    ``publish_every``: acks between the policy versions the loop publishes, which sizes admission
    control (module docstring, item 5); None: this stream leaves it alone (its owner sizes it).
    ``fleet_grace_s``: how long no worker may be live, while groups wait for one, before next()
    raises WorkersGone (None: the queue's worker_timeout_s; ``math.inf``: never): longer than the
    time your workers take to restart beyond worker_timeout_s (item 4).
    """

    def __init__(self, queue: RolloutQueue, *, groups_per_step: int = 1, wait_s: float = 600.0,
                 lease_timeout_s: float | None = None, block_ms: int = 1000, trainer_id: str | None = None,
                 exhausted: Callable[[], bool] | None = None, publish_every: int | None = 1,
                 fleet_grace_s: float | None = None) -> None:
        if queue.driver.is_async:
            raise IntegrationConfigError("TrainingStream drives a sync queue (RolloutQueue.from_url(...)): trainer "
                                         "loops are synchronous; open the queue without asyncio")
        if groups_per_step < 1 or wait_s <= 0:
            raise IntegrationConfigError(f"groups_per_step must be >= 1 and wait_s > 0, got {groups_per_step}, {wait_s}")
        if publish_every is not None and (isinstance(publish_every, bool) or not isinstance(publish_every, int)
                                          or publish_every < 1):
            raise IntegrationConfigError(f"publish_every must be an integer >= 1 (acks between published versions) "
                                         f"or None, got {publish_every!r}")
        self.queue = queue
        self.groups_per_step = groups_per_step
        self.wait_s = wait_s
        self.lease_timeout_s = lease_timeout_s
        self.block_ms = max(1, min(block_ms, int(wait_s * 1000)))
        self.trainer_id = trainer_id or default_process_id()
        self.exhausted = exhausted or (lambda: False)
        #: this stream's view of whether the workers are gone (item 4; InvalidInput for a bad grace)
        self.fleet = FleetWatch(fleet_grace_s)
        #: leases taken and not yet acked or rolled back, oldest first
        self.open: list[Lease] = []
        #: the step of the last ack (None before the first)
        self.last_acked: int | None = None
        #: acks per published version while admission control is still to be derived, else None
        self._sizing: int | None = publish_every if queue.config.batch_groups is DERIVED else None
        self._largest = groups_per_step   # the largest batch leased: the admission batch
        self._version_seen: int | None = None

    # -- in ------------------------------------------------------------------------------------

    def next(self, groups: int | None = None) -> Lease:
        """Lease exactly ``groups`` (default ``groups_per_step``) completed groups, waiting up to
        ``wait_s``. Raises StreamStarved when none came (or at once once the source is exhausted
        and too few are left), WorkersGone (a StreamStarved) once no worker has been live for the
        grace while groups wait for one, LeaseUnsatisfiable for a batch the queue's bounds can
        never hold."""
        lease = self.poll(groups)
        assert lease is not None  # only a set ``stop`` returns None
        return lease

    def poll(self, groups: int | None = None, stop: threading.Event | None = None) -> Lease | None:
        """next(), for a thread that must be stoppable: None as soon as ``stop`` is set (checked
        after each ``block_ms`` wait)."""
        lease = self.take(groups, stop)
        if lease is not None:
            self.open.append(lease)
        return lease

    def take(self, groups: int | None = None, stop: threading.Event | None = None) -> Lease | None:
        """poll() for a caller that settles each lease itself (one group at a time, one rollout at a
        time): the lease is not added to ``open``, so ack() and rollback() leave it alone."""
        want = groups or self.groups_per_step
        self._largest = max(self._largest, want)
        started = time.monotonic()
        while stop is None or not stop.is_set():
            lease = self.queue.lease(groups=want, timeout_s=self.lease_timeout_s, block_ms=self.block_ms,
                                     trainer_id=self.trainer_id, fleet=self.fleet)  # WorkersGone: item 4
            if lease is not None:
                return lease
            waited = time.monotonic() - started
            done = self.exhausted()
            if done or waited >= self.wait_s:
                stats = self.queue.stats()
                left = self._left(stats)
                if waited >= self.wait_s or left < want:
                    raise StreamStarved(self.queue.name, want, waited, stats, exhausted=done and left < want)
        return None

    def _left(self, stats: QueueStats) -> int:
        """Groups that may still reach this stream: queued, executing, buffered, and leased by anyone
        but this stream itself (a dead predecessor's lease comes back at its deadline; this stream's
        own open leases are acked, not returned). Leases taken with take() are not in ``open``, so
        they count as coming back: the stream then waits out ``wait_s`` rather than failing early."""
        own = sum(len(lease) for lease in self.open)
        return (stats.backlog + stats.ready + stats.executing_groups + stats.completed
                + max(0, stats.leased - own))

    def __iter__(self) -> Iterator[Lease]:
        while True:
            yield self.next()

    # -- out -----------------------------------------------------------------------------------

    def ack(self, step: int) -> list[str]:
        """The optimizer step ``step`` is done: commit every open lease with it. Returns the commit
        ids. Raises LeaseLost if a lease expired during the step (its groups went back to ready
        while the update used them): resume from the last checkpoint, or extend() long steps."""
        ids = []
        while self.open:
            lease = self.open[0]
            ids.append(str(lease.commit(step=step)))
            self.open.pop(0)
        self.last_acked = step
        if self._sizing is not None:
            self._size_admission()
        return ids

    def _size_admission(self) -> None:
        """Item 5: derive admission control once a version was published since the previous ack."""
        assert self._sizing is not None
        try:
            version = int(self.queue.version)
        except (RolloutQueueError, OSError) as exc:  # the commit stands: ask again at the next ack
            log.warning("admission control not derived yet: the queue's version could not be read", exc_info=exc,
                        extra=fields(queue=self.queue.name))
            return
        if self._version_seen is None or version <= self._version_seen:
            self._version_seen = version
            return
        if derive_admission(self.queue, self._largest * self._sizing):
            self._sizing = None

    def rollback(self, reason: str | None = None) -> int:
        """The step failed: hand back every open lease. ``reason`` (the trainer raised on this data:
        ``error_reason(exc)``) makes it an errored rollback, counted toward max_attempts per group
        (DESIGN rule 4); None (the trainer stops) requeues them uncounted. A lease already gone is
        left to the reaper. Returns how many groups went back."""
        back = 0
        while self.open:
            lease = self.open.pop(0)
            try:
                back += int(lease.rollback(reason))
            except (RolloutQueueError, OSError) as exc:
                log.warning("rollback failed; the reaper requeues the lease at its deadline", exc_info=exc,
                            extra=fields(queue=self.queue.name, lease=lease.lease_id))
        return back

    def extend(self, seconds: float) -> None:
        """Move every open lease's deadline ``seconds`` from now (a step longer than the lease timeout)."""
        for lease in self.open:
            lease.extend(seconds)

    def checkpoint(self, step: int, save: Callable[[int], Any] | None = None, *, wait_s: float | None = None) -> int:
        """Run ``save(step)`` (the framework's own checkpoint: weights, optimizer), then let the queue
        drop the data acked at or before ``step``. Returns how many payloads were dropped.

        Refused (IntegrationConfigError) while this stream holds an open lease: the saved weights
        would include a batch that may still go back to ready. Leases of a dead earlier incarnation
        of this trainer are waited out (the reaper requeues them at their deadline; this call reaps
        too, where its credential may) for ``wait_s`` (default: the lease timeout plus a margin),
        then LeasesOpen is raised.
        """
        if self.open:
            raise IntegrationConfigError(
                f"checkpoint({step}) with {len(self.open)} lease(s) not acked: ack(step) after the optimizer "
                "step, before saving (a lease that spans a checkpoint would be trained twice after a resume)")
        if save is not None:
            save(step)
        limit = wait_s if wait_s is not None else (self.lease_timeout_s or self.queue.config.lease_timeout_s) + 30.0
        started = time.monotonic()
        deadline = started + limit
        may_reap, waited = True, False
        while True:
            try:
                dropped = int(self.queue.checkpoint(step))
            except LeasesOpen as refused:
                if time.monotonic() >= deadline:
                    raise
                if not waited:  # a pause of up to a lease's bound, else silent: the log says why training stopped
                    waited = True
                    log.info("checkpoint waits for leases other trainers hold (a killed earlier run's go back at their "
                             "deadline, or trainer_silence_s after their last beat)", extra=fields(
                                 queue=self.queue.name, step=step, leased=refused.leased, wait_s=round(limit, 1)))
                if may_reap:
                    try:
                        self.queue.reap()  # an expired lease of a dead incarnation goes back to ready now
                    except ScriptError as exc:  # the trainer role may not reap (ops/acl.py): the reaper will
                        may_reap = False
                        log.info("cannot reap with this credential; waiting for the reaper", exc_info=exc,
                                 extra=fields(queue=self.queue.name, step=step))
                time.sleep(0.5)
                continue
            if waited:
                log.info("checkpoint done: the open leases went back", extra=fields(
                    queue=self.queue.name, step=step, waited_s=round(time.monotonic() - started, 1)))
            return dropped

    def restore(self, step: int) -> int:
        """The trainer resumed from its checkpoint ``step`` (0: from scratch): roll back this stream's
        open leases and requeue every group acked after ``step``. Returns how many were requeued."""
        self.rollback()
        return int(self.queue.restore(step))

    def stats(self) -> QueueStats:
        """The queue's counters (for the framework's metrics)."""
        return self.queue.stats()

    def __repr__(self) -> str:
        return (f"<TrainingStream {self.queue.name} groups_per_step={self.groups_per_step} open={len(self.open)} "
                f"last_acked={self.last_acked}>")
