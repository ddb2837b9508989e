"""Logical bounds are logical (issue 12 item 9), on a 3-master cluster over both drivers.

Each partition enforces a share of every logical bound and the shares sum to the bound exactly, so
filling the queue through the public API until it refuses finds exactly the logical bound, never
more (ceil(bound / P) per partition let 12 groups be retained under max_retained_groups=10). A group
runs whole in the partition its source_id hashes to, so submit refuses, before sending anything, a
group larger than the smallest share of max_executing_samples (it used to be accepted and then
dead-lettered as malformed at its first reserve); a group that fits runs in any partition.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollout_queue import InvalidInput, MalformedReservation, PartitionedQueue, QueueConfig, Sample, SourceGroup
from rollout_queue.core.errors import GroupTooLarge
from rollout_queue.devtools.local_cluster import LocalCluster
from tests.cluster.conftest import delete_queue, spread_name

P = 4
BIG = 100_000  # a bound far from binding, so each test sees the one bound it is about


def spread(q: Any, per_partition: int, n: int = 1, prefix: str = "s") -> list[SourceGroup]:
    """``per_partition`` groups of ``n`` samples for every partition of ``q`` (chosen by placement)."""
    count = {name: 0 for name in q.partitions}
    out: list[SourceGroup] = []
    i = 0
    while min(count.values()) < per_partition:
        sid = f"{prefix}{i}"
        i += 1
        if count[q.partition_for(sid)] < per_partition:
            count[q.partition_for(sid)] += 1
            out.append(SourceGroup(sid, f"prompt {sid}", n))
    return out


def samples(r: Any) -> list[Sample]:
    return [Sample(slot=i, token_ids=[i + 1], reward=float(i), version=r.version) for i in range(r.group.n)]


def reserve_until_refused(w: Any) -> list[Any]:
    got: list[Any] = []
    while batch := w.reserve(max_groups=64):
        got += batch
    return got


def test_a_group_larger_than_the_smallest_share_is_refused_before_anything_is_sent(open_pq: Any) -> None:
    q = open_pq(QueueConfig(max_executing_samples=16, max_retained_groups=BIG), partitions=P)
    assert [c.max_executing_samples for c in q.configs] == [4] * P and q.config.max_executing_samples == 16
    batch = spread(q, 2) + [SourceGroup("big", "p", 8)]
    with pytest.raises(GroupTooLarge) as exc:
        q.submit(batch)
    assert isinstance(exc.value, MalformedReservation)
    assert (exc.value.source_id, exc.value.n, exc.value.limit, exc.value.partitions) == ("big", 8, 4, P)
    text = str(exc.value)
    assert "n=8" in text and "max_executing_samples=16" in text and f"{P} partitions" in text
    assert "raise max_executing_samples to >= 32" in text and "fewer partitions" in text
    # Nothing was written anywhere, not even the valid groups checked before the big one.
    assert all((s.submitted, s.backlog) == (0, 0) for s in q.partition_stats().values())
    assert q.dead_letters() == []


def test_the_rule_is_the_smallest_share_whichever_partition_a_group_hashes_to(open_pq: Any) -> None:
    q = open_pq(QueueConfig(max_executing_samples=30, max_retained_groups=BIG), partitions=P)
    assert [c.max_executing_samples for c in q.configs] == [8, 8, 7, 7]  # sum 30 (ceil gave 8 x 4 = 32)
    for g in spread(q, 1, n=8, prefix="eight"):  # one per partition, even where the share is 8
        with pytest.raises(GroupTooLarge, match="smallest of this queue's 4 partitions' shares"):
            q.submit([g])
    sevens = spread(q, 2, n=7, prefix="seven")
    assert len(q.submit(sevens)) == 2 * P
    w = q.worker("w-a")
    got = reserve_until_refused(w)
    assert len(got) == P  # one 7-sample group fits each partition's share
    assert q.stats().executing_samples == 7 * P <= 30
    for r in got:
        assert w.complete(r.receipt, samples(r)) == "buffered"
    got = reserve_until_refused(w)
    assert len(got) == P and q.dead_letters() == []


def test_an_n8_group_runs_in_every_partition_once_the_bound_is_raised_as_the_error_says(open_pq: Any) -> None:
    """The refusal's fix (max_executing_samples >= n x P) makes the issue's n=8 groups valid in every
    partition: generated, leased and committed, none dead-lettered, executing samples <= 32."""
    q = open_pq(QueueConfig(max_executing_samples=32, max_completed_groups=2 * P, max_retained_groups=BIG),
                partitions=P)
    batch = spread(q, 2, n=8)
    ids = q.submit(batch)
    assert all(ids)
    w = q.worker("w-a")
    done = 0
    while done < len(batch):
        got = reserve_until_refused(w)
        assert got, f"nothing to reserve after {done} of {len(batch)}"
        assert q.stats().executing_samples == 8 * len(got) <= 32
        for r in got:
            assert w.complete(r.receipt, samples(r)) == "buffered"
        done += len(got)
    with q.lease(groups=len(batch), block_ms=2000) as lease:
        assert sorted(g.group.source_id for g in lease.groups) == sorted(g.source_id for g in batch)
        assert all(len(g.samples) == 8 for g in lease.groups)
    s = q.stats()
    assert (s.committed, s.dead, s.backlog, s.retained) == (len(batch), 0, 0, 0)
    assert q.dead_letters() == []


def test_retained_groups_never_exceed_the_logical_bound(open_pq: Any) -> None:
    q = open_pq(QueueConfig(max_retained_groups=10, max_executing_samples=BIG), partitions=P)
    assert [c.max_retained_groups for c in q.configs] == [3, 3, 2, 2]
    q.submit(spread(q, 6))
    got = reserve_until_refused(q.worker("w-a"))
    s = q.stats()
    assert (len(got), s.retained, s.executing_groups) == (10, 10, 10)  # ceil(10 / 4) per partition let 12 in
    assert s.counters["max_retained_groups"] == 10 == q.config.max_retained_groups  # reported logical
    assert sorted(p.counters["max_retained_groups"] for p in q.partition_stats().values()) == [2, 2, 3, 3]


def test_completed_groups_never_exceed_the_logical_bound(open_pq: Any) -> None:
    q = open_pq(QueueConfig(max_completed_groups=10, max_executing_samples=BIG), partitions=P)
    q.submit(spread(q, 6))
    w = q.worker("w-a")
    completed = 0
    while batch := w.reserve(max_groups=1):  # complete one at a time: never an overflow, only backpressure
        [r] = batch
        assert w.complete(r.receipt, samples(r)) == "buffered"
        completed += 1
    s = q.stats()
    assert (completed, s.completed, s.evictions["overflow"]) == (10, 10, 0)
    assert s.counters["max_completed_groups"] == 10


def test_executing_samples_never_exceed_the_logical_bound(open_pq: Any) -> None:
    q = open_pq(QueueConfig(max_executing_samples=10, max_retained_groups=BIG), partitions=P)
    q.submit(spread(q, 6))
    got = reserve_until_refused(q.worker("w-a"))
    s = q.stats()
    assert (len(got), s.executing_samples) == (10, 10)
    assert s.counters["max_executing_samples"] == 10


def test_admission_never_exceeds_the_logical_batch_groups(open_pq: Any) -> None:
    q = open_pq(QueueConfig(batch_groups=6, max_staleness=0, max_retained_groups=BIG, max_executing_samples=BIG),
                partitions=P)
    assert [c.batch_groups for c in q.configs] == [2, 2, 1, 1]
    q.submit(spread(q, 6))
    got = reserve_until_refused(q.worker("w-a"))
    assert len(got) == 6 == q.stats().executing_groups  # (version 0 + staleness 0 + 1) x batch_groups
    assert q.stats().counters["batch_groups"] == 6


def test_a_bound_below_the_partition_count_is_refused_at_open_and_nothing_is_written(cluster: LocalCluster) -> None:
    name = spread_name(cluster, P)
    try:
        with pytest.raises(InvalidInput, match=r"max_completed_groups=3 is below partitions=4.*"
                                               r"Raise max_completed_groups to >= 4 or use fewer partitions"):
            PartitionedQueue.from_url(cluster.url, name, P, QueueConfig(max_completed_groups=3))
        # Nothing was recorded: the same name still opens with another partition count.
        with PartitionedQueue.from_url(cluster.url, name, 2, QueueConfig(max_completed_groups=3)) as q:
            assert [c.max_completed_groups for c in q.configs] == [2, 1]
    finally:
        delete_queue(cluster, name)


def test_reopening_with_config_none_adopts_the_shares_and_reports_the_logical_bounds(open_pq: Any) -> None:
    cfg = QueueConfig(max_retained_groups=10, max_completed_groups=7, max_executing_samples=30, batch_groups=5)
    q = open_pq(cfg, partitions=P)
    again = open_pq(None, partitions=P, name=q.name)
    assert again.configs == q.configs and again.config == cfg == q.config
    fresh = open_pq(None, partitions=P)  # a new queue opened with None gets the split of the defaults
    assert fresh.config == QueueConfig() and len({c.max_executing_samples for c in fresh.configs}) == 1


def test_the_issue_reproduction_on_one_server(redis_url: str, queue_name: str) -> None:
    """Issue 12 item 9 as reported, with 4 partitions on one plain server."""
    cfg = QueueConfig(max_executing_samples=16, max_retained_groups=10)
    with PartitionedQueue.from_url(redis_url, queue_name, P, cfg) as q:
        with pytest.raises(GroupTooLarge, match="raise max_executing_samples to >= 32"):
            q.submit([SourceGroup("big", "p", 8)])
        assert q.stats().submitted == 0 and q.worker("w-a").reserve(1) == [] and q.dead_letters() == []
        q.submit(spread(q, 6))
        assert len(reserve_until_refused(q.worker("w-a"))) == 10 == q.stats().retained
