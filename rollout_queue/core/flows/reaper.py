"""The reaper's pass: silent workers, expired leases and holds, stale groups, orphans, interrupted
restores or checkpoints, pruning of settled bookkeeping and the PEL reindex. Every action is its own
script that re-checks its condition, so reapers may run concurrently and a pass may be cut anywhere.
"""

from __future__ import annotations

from typing import Any, Callable

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_int
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import ReapReport
from rollout_queue.core.flows.base import BATCH, Flow, MAX_REAP_BUDGET
from rollout_queue.core.flows.hold import hold_release


#: Most prune calls in one reap pass (BATCH groups each): 8,192 groups, a few tens of ms of Redis
#: time, so a backlog of due groups (after the reaper was down, or retention was shortened) is
#: worked off over several passes without delaying the reaping of workers and leases behind it.
PRUNE_CALLS_PER_PASS = 256


def reap(keys: QueueKeys, budget: int = BATCH) -> Flow[ReapReport]:
    """One reaper pass: silent workers, expired leases, stale groups, expired holds, orphans, and
    the ledger lines and source_id mappings of groups settled longer ago than settled_retention_s.
    Every action is its own script that re-checks its condition, so reapers may run concurrently.
    ``budget``: entries per script call, 1..MAX_REAP_BUDGET."""
    budget = check_int(budget, "budget", 1, MAX_REAP_BUDGET)
    scan = p.parse_reap_scan((yield p.build(keys, "reap_scan", count=budget)))
    orphans, _ = p.parse_sweep_owners((yield p.build(keys, "sweep_owners", count=OWNERS_BATCH)))
    report = ReapReport()
    # Names go back to the scripts as the raw bytes Redis gave: a name that is not UTF-8 (garbage
    # written by hand) is then reaped like any other instead of failing the whole pass.
    for worker in list(scan.silent) + [o for o in orphans if not o.startswith(b"@lease:")]:
        report += yield from _reap_worker(keys, worker, orphan=worker in orphans, budget=budget)
    for worker in scan.retired:  # closed or reaped inline: only the consumer may be left
        yield from _reap_worker(keys, worker, orphan=False, budget=budget)
    for lease_id in list(scan.expired_leases) + [o[7:] for o in orphans if o.startswith(b"@lease:")]:
        while True:
            reply = yield p.build(keys, "expire_lease", lease_id=lease_id, count=budget)
            expired = p.parse_expire_lease(reply, lease_id)
            if expired is None:  # not due
                break
            requeued, done = expired
            report += ReapReport(expired=requeued)
            if done:
                break
    for hold_id in scan.expired_holds:
        yield from hold_release(keys, hold_id)  # as the index holds it: garbage there need not be UTF-8
        report += ReapReport(holds_expired=1)
    if scan.stale:
        while True:
            evicted, done = p.parse_reap_stale((yield p.build(keys, "reap_stale", count=budget)))
            report += ReapReport(stale=evicted)
            if done:
                break
    if scan.prune_due:
        report += yield from prune(keys, max(budget, BATCH), PRUNE_CALLS_PER_PASS)
    if scan.interrupted:
        report += yield from finish_interrupted(keys, budget, PRUNE_CALLS_PER_PASS)
    reply = yield p.build(keys, "reindex", count=REINDEX_BATCH)
    report += ReapReport(reindexed=p.parse_reindex(reply))
    report += yield from settle_parked(keys, SETTLE_BATCH, PRUNE_CALLS_PER_PASS)
    return report


#: PEL entries whose owners one reap pass checks (sweep_owners.lua): a PEL of at most this many is
#: swept whole every pass; a larger one in PEL / OWNERS_BATCH passes, each a fraction of a ms of
#: script whatever the number of consumers (XINFO CONSUMERS, which lists them all, is not used).
OWNERS_BATCH = 256

#: PEL entries one reap pass checks against their index (reindex.lua): ~0.1 ms of script a call, so a
#: queue of 100k owned entries is swept every ~400 passes (minutes at the reaper's 1 s interval).
REINDEX_BATCH = 256


#: Parked entries one settle_parked call settles (one dead letter each: well under a ms a call).
SETTLE_BATCH = 64


def settle_parked(keys: QueueKeys, count: int = SETTLE_BATCH, max_calls: int | None = None) -> Flow[ReapReport]:
    """Settle what workers' scripts parked (dead letters and filtered groups: the worker role holds no
    XACK), ``count`` entries per call, until none is left or ``max_calls`` ran."""
    return ReapReport(settled=(yield from _batches(keys, "settle_parked", count, max_calls,
                                                   p.parse_settle_parked)))


def finish_interrupted(keys: QueueKeys, count: int = BATCH, max_calls: int | None = None) -> Flow[ReapReport]:
    """Finish a restore or checkpoint whose caller died between batches (the step the queue recorded),
    ``count`` entries per call, until done or ``max_calls`` ran."""
    return ReapReport(finished=(yield from _batches(keys, "finish_interrupted", count, max_calls,
                                                    p.parse_finish_interrupted)))


def prune(keys: QueueKeys, count: int = BATCH, max_calls: int | None = None) -> Flow[ReapReport]:
    """Delete the ledger lines and source_id mappings of groups settled longer ago than the queue's
    settled_retention_s, ``count`` groups per call (>= 32), until none is due or ``max_calls`` ran."""
    return ReapReport(pruned=(yield from _batches(keys, "prune", count, max_calls, p.parse_prune)))


def _batches(keys: QueueKeys, script: str, count: int, max_calls: int | None,
             parse: Callable[[Any], tuple[int, bool]]) -> Flow[int]:
    """Call a bounded reaper script until its reply (read by ``parse``: moved, done) says done (or
    ``max_calls`` ran); the sum of what it moved."""
    total, calls = 0, 0
    while max_calls is None or calls < max_calls:
        calls += 1
        moved, done = parse((yield p.build(keys, script, count=count)))
        total += moved
        if done:
            break
    return total


def _reap_worker(keys: QueueKeys, worker: bytes, orphan: bool, budget: int) -> Flow[ReapReport]:
    report = ReapReport(orphans=1 if orphan else 0)
    while True:
        reply = yield p.build(keys, "reap_worker", worker_id=worker, count=budget)
        reaped = p.parse_reap_worker(reply, worker)
        if reaped is None:  # alive
            return report
        lost, dead, done = reaped
        report += ReapReport(lost=lost, dead=dead)
        if done:
            return report
