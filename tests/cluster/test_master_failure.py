"""Kill one master of a 3-master cluster: the partitions on the other masters keep working, and the
killed master's work is recovered when it comes back on the same port and directory (AOF replay).

The queue's partitions are spread over all three masters (spread_name), so the killed one holds
some partitions, never all. Every group must end trained exactly once.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

from rollout_queue import OutcomeUnknown, PartitionedQueue, PartitionsUnreachable, QueueConfig, RetryPolicy
from rollout_queue.devtools.local_cluster import LocalCluster
from tests.cluster.conftest import P, spread_name
from tests.cluster.test_partitioned import groups, samples

CFG = QueueConfig(max_staleness=None, max_completed_groups=600, max_executing_samples=6000)


def trained(q: Any, lease: Any, ledger: Counter[str]) -> None:
    for g in lease.groups:
        ledger[g.group.source_id] += 1
    lease.commit()


def test_other_partitions_keep_working_and_the_killed_masters_work_comes_back(private_cluster: LocalCluster) -> None:
    c = private_cluster
    name = spread_name(c)
    # A short retry window: a call aimed at the dead master gives up after ~1 s instead of 30 s.
    q = PartitionedQueue.from_url(c.url, name, P, CFG, retry=RetryPolicy(window_s=1.0))
    victim = c.node_of(f"rollout:{{{q.partitions[0]}}}:meta")
    down = {n for n in q.partitions if c.node_of(f"rollout:{{{n}}}:meta") == victim}
    up = set(q.partitions) - down
    assert down and up

    # Before the crash, the victim's partitions hold work in every state: executing, completed, leased.
    first = groups(60, "a")
    q.submit(first)
    w = q.worker("w-1")
    reserved = w.reserve(max_groups=60)
    assert len(reserved) == 60
    for r in reserved[:40]:
        w.complete(r.receipt, samples(r))
    executing = reserved[40:]
    ledger: Counter[str] = Counter()
    held = q.lease(groups=10)
    assert held is not None

    c.kill(victim)

    # Submits reach the live partitions; the dead ones are named in the error, the rest are stored.
    second = groups(30, "b")
    with pytest.raises(PartitionsUnreachable) as refused:
        q.submit(second)
    assert set(refused.value.failed) == {n for n in down if any(q.partition_for(g.source_id) == n for g in second)}
    assert q.submit([g for g in second if q.partition_for(g.source_id) in up])

    # Settling work of a live partition works; of a dead one, the outcome is unknown (never guessed).
    for r in [r for r in executing if r.receipt.queue in up]:
        w.complete(r.receipt, samples(r))
    stuck = [r for r in executing if r.receipt.queue in down]
    if stuck:
        with pytest.raises(OutcomeUnknown):
            w.complete(stuck[0].receipt, samples(stuck[0]))

    # Reserve and lease keep going on the live partitions, without waiting on the dead master.
    started = time.monotonic()
    fresh = w.reserve(max_groups=30, block_ms=200)
    assert fresh and all(r.receipt.queue in up for r in fresh)
    for r in fresh:
        w.complete(r.receipt, samples(r))
    assert time.monotonic() - started < 5
    while (lease := q.lease(groups=10, partial=True)) is not None:
        assert set(lease.partitions) <= up
        trained(q, lease, ledger)
    stats = q.stats()
    assert stats.counters["partitions_unreachable"] == len(down)

    c.restart(victim)

    # The victim's partitions come back with their AOF: executing receipts are still valid, the
    # held lease still commits, and resubmitting the whole second batch stores each group once.
    trained(q, held, ledger)
    for r in stuck:
        w.complete(r.receipt, samples(r))
    q.submit(second)
    while True:
        got = w.reserve(max_groups=30, block_ms=100)
        if not got:
            break
        for r in got:
            w.complete(r.receipt, samples(r))
    while (lease := q.lease(groups=16, partial=True)) is not None:
        trained(q, lease, ledger)
    every = {g.source_id for g in first + second}
    assert set(ledger) == every and set(ledger.values()) == {1}  # each group trained exactly once
    final = q.stats()
    assert (final.committed, final.retained, final.backlog, final.counters["partitions_unreachable"]) == (90, 0, 0, 0)
    q.close()
