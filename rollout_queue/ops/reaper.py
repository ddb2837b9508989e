"""The reaper process: calls ``q.reap()`` every interval until told to stop (a pass also prunes the
ledger lines and source_id mappings of groups settled longer ago than ``settled_retention_s``).

Owns only the loop, its logging and its shutdown; every decision is made inside the reap scripts
(flows.reap), so several reapers may run at once and a killed reaper loses nothing: the next pass
(or opportunistic reaping inside reserve/lease) picks up where it stopped.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.errors import OutcomeUnknown
from rollout_queue.ops.logs import fields
from rollout_queue.core.models import ReapReport

log = logging.getLogger("rollout_queue.ops.reaper")


def run_reaper(queue: RolloutQueue, interval_s: float = 1.0, stop: threading.Event | None = None,
               max_passes: int | None = None) -> ReapReport:
    """Reap every ``interval_s`` until ``stop`` is set (or ``max_passes``). Returns the totals.

    A lost connection is logged and retried next pass: the reaper must outlive Redis restarts.
    """
    stop = stop or threading.Event()
    total = ReapReport()
    passes = 0
    log.info("reaper started", extra=fields(queue=queue.name, interval_s=interval_s))
    while not stop.is_set() and (max_passes is None or passes < max_passes):
        passes += 1
        try:
            report = queue.reap()
        except OutcomeUnknown as exc:
            log.warning("reap pass failed; retrying next interval", extra=fields(queue=queue.name, error=str(exc)))
        else:
            total += report
            if report.total:
                log.info("reaped", extra=fields(queue=queue.name, lost=report.lost, expired=report.expired,
                                                stale=report.stale, dead=report.dead,
                                                holds_expired=report.holds_expired, orphans=report.orphans,
                                                pruned=report.pruned))
        stop.wait(interval_s)
    log.info("reaper stopped", extra=fields(queue=queue.name, passes=passes, lost=total.lost,
                                            expired=total.expired, stale=total.stale, dead=total.dead,
                                            pruned=total.pruned))
    return total


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM and SIGINT finish the current pass and exit cleanly."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("signal received, stopping", extra=fields(signal=signal.Signals(signum).name))
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
