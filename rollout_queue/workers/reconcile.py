"""Reconciling the worker's attempts with the PEL: what the queue says this worker owns but the runtime
does not hold goes back to ready.

Why: the reaper frees the work of *silent* workers only. An attempt the PEL still gives a live worker
that no longer knows about it is never freed while that worker heartbeats: its group hangs and so
does the RL step that waits for it. That happens when
- a settlement (complete, fail, abort, filter) was acknowledged and then lost: Redis with AOF
  ``appendfsync everysec`` restarts without the last second of writes, and the PEL gives the entry
  back to the worker at the same delivery count (docs/DESIGN.md, "Workers reconcile");
- a reserve reply was lost and the call never resent with its request id, so its grants never
  reached the runtime;
- a worker restarted under a fixed ``--worker-id`` inherits what its previous process held;
- a bug dropped an attempt from the runtime's bookkeeping.

Rules this module keeps:
1. The PEL (``AsyncWorker.owned``) and the runtime's own bookkeeping decide, nothing else; the
   hand-back is ``abort`` with the exact receipt (terminal ``aborted``: requeued, not counted toward
   max_attempts, since the lost write was not the group's fault). abort checks the receipt inside
   its script, so a settlement or a reaper racing it is safe: whichever lands second changes
   nothing (StaleReceipt, or a replay), and that is taken as "already handed back".
2. Never touch an attempt the runtime holds (executing, or being settled), nor one that a reserve
   call still in flight may have granted (``is_orphan``), nor one delivered less than ``grace_s``
   ago. Sans-IO decisions (``is_orphan``) are separate from the loop, so they are tested by hand.
3. No Redis keys and no queue semantics here: a read-only view and a receipt-checked script.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Iterable

from redis.exceptions import RedisError

from rollout_queue import AsyncWorker, Receipt, RetryPolicy, RolloutQueueError, StaleReceipt
from rollout_queue.drivers.cluster import redis_options
from rollout_queue.core.models import OwnedAttempt
from rollout_queue.workers.attempt import RuntimeStats
from rollout_queue.workers.served import ServedQueues

log = logging.getLogger("rollout_queue.workers.runtime")

REASON = "orphaned: the worker holds no attempt for this reservation (a settlement lost in a server crash?)"
#: Interval when the option is None: max(worker_timeout_s, MIN_INTERVAL_S).
MIN_INTERVAL_S = 5.0
#: Default grace: the longest a grant can stay on the wire before the runtime sees it. The transport
#: resends a reserve call (same request id, so the script replays the same grants) for the retry
#: window, and one try can block for a socket timeout past it; after that the call has raised
#: OutcomeUnknown, which stops the worker (close() then requeues everything it owns). So an entry
#: delivered longer ago than this cannot be a grant still on its way. The in-flight rule of
#: ``is_orphan`` already excludes those; the grace is the second guard, one that compares no clocks
#: (the in-flight rule sets the server's idle time against the worker's monotonic clock, and a step
#: of the server's wall clock must not turn a fresh grant into an orphan). It delays a real repair
#: by this much, once: without it the orphan would hang until the worker exits.
DEFAULT_GRACE_S = RetryPolicy().window_s + float(redis_options({})["socket_timeout"])
#: Allowance for comparing the worker's monotonic clock with server idle times (ms resolution, and
#: the two clocks' rates may differ slightly over one reserve call).
CLOCK_SLACK_S = 0.05


def interval_for(option_s: float | None, worker_timeout_s: float) -> float:
    """The interval to run at (0: reconciliation off). None: every worker timeout, at most once per
    MIN_INTERVAL_S, so an orphan costs about one timeout on top of the grace (what a dead worker's
    work costs) and a pass, one XPENDING of the worker's own entries, stays negligible."""
    return max(worker_timeout_s, MIN_INTERVAL_S) if option_s is None else option_s


def is_orphan(a: OwnedAttempt, held: Collection[Receipt], *, grace_s: float, listed_at: float,
              reserving_since: float | None) -> bool:
    """True when the runtime should hand ``a`` back.

    ``held``: every receipt the runtime held at any time during the listing (before and after it),
    so an attempt settled while the listing was on the wire is not mistaken for an orphan.
    ``listed_at``: the worker's monotonic time when the listing's reply had arrived, an upper bound
    of when the server read ``idle_ms``; ``reserving_since``: when the reserve call now in flight
    started (None: none). A grant of that call was delivered after it started, i.e. at most
    ``idle_ms`` before ``listed_at`` and not before ``reserving_since``: such an entry is skipped.
    """
    if a.receipt in held or a.idle_ms < grace_s * 1000:
        return False
    if reserving_since is not None and listed_at - a.idle_ms / 1000 >= reserving_since - CLOCK_SLACK_S:
        return False  # may be a grant of the reserve call in flight: the runtime is about to hold it
    return True


@dataclass
class RuntimeView:
    """What the reconciler may read of the runtime: the receipts it holds, when its reserve call in
    flight started, and whether it is stopping (close() then requeues everything owned); ``fail``
    stops the runtime on a bug, as its other loops do."""

    held: Callable[[], Iterable[Receipt]]
    reserving_since: Callable[[], float | None]
    stopping: asyncio.Event
    fail: Callable[[BaseException], None]


class Reconciler:
    """Every ``interval_s``: list what the PEL gives the worker, abort the orphans, one warning each."""

    def __init__(self, worker: AsyncWorker | ServedQueues, runtime: RuntimeView, interval_s: float, grace_s: float,
                 stats: RuntimeStats, fields: Callable[..., dict[str, Any]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or grace_s < 0:
            raise ValueError("interval_s must be > 0 and grace_s >= 0")
        self.worker, self.runtime, self.interval_s, self.grace_s = worker, runtime, interval_s, grace_s
        self.stats, self.fields, self.clock = stats, fields, clock

    async def run(self) -> None:
        """Reconcile at once (a worker restarted under the same id finds its predecessor's orphans),
        then every interval, until the runtime stops. A pass that cannot reach Redis is retried at
        the next interval: the reserve loop decides whether Redis is gone for good."""
        stopping = self.runtime.stopping
        while not stopping.is_set():
            try:
                await self.reconcile()
            except (RolloutQueueError, RedisError, OSError) as exc:  # retried at the next pass
                log.warning("reconciliation pass failed; retrying at the next interval",
                            extra=self.fields(error=str(exc)))
            except Exception as exc:  # a bug: loud and fatal, never a silently dead task
                self.runtime.fail(exc)
                return
            try:
                await asyncio.wait_for(stopping.wait(), self.interval_s)
            except asyncio.TimeoutError:
                continue

    async def reconcile(self) -> int:
        """One pass; returns how many orphaned attempts it handed back."""
        held_before = set(self.runtime.held())
        owned = await self.worker.owned(min_idle_ms=int(self.grace_s * 1000))
        listed_at = self.clock()
        held = held_before | set(self.runtime.held())
        since = self.runtime.reserving_since()
        orphans = [a for a in owned if is_orphan(a, held, grace_s=self.grace_s, listed_at=listed_at,
                                                 reserving_since=since)]
        handed_back = 0
        for a in orphans:
            if self.runtime.stopping.is_set():
                break  # close() requeues whatever is left, in batches
            if a.receipt in set(self.runtime.held()):
                continue  # cannot happen (a new grant is a new receipt); checked because it is cheap
            handed_back += await self._hand_back(a)
        return handed_back

    async def _hand_back(self, a: OwnedAttempt) -> int:
        try:
            outcome = await self.worker.abort(a.receipt, REASON)
        except StaleReceipt as exc:  # a settlement or the reaper moved it first: nothing left to return
            log.info("orphan candidate already moved on", extra=self.fields(a.receipt, detail=str(exc)))
            return 0
        if outcome == "replay":  # the runtime's own abort of this receipt landed first
            return 0
        self.stats.reconciled += 1
        log.warning("orphaned attempt handed back to ready", extra=self.fields(
            a.receipt, idle_ms=a.idle_ms, outcome=outcome, terminal="aborted", reason=REASON))
        return 1
