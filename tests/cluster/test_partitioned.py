"""A partitioned queue (P = 6) on a real 3-master Redis Cluster, over the sync and asyncio drivers.

Each test checks one promise of issue 7 against Redis truth: placement by source_id, reserve and
lease across partitions, composite commit and rollback, reaping, publish_version and holds on every
partition, aggregated stats, and P = 1 being the plain queue.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from rollout_queue import ConfigMismatch, LeaseLost, PartitionedQueue, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.devtools.local_cluster import LocalCluster
from rollout_queue.scale.layout import PartitionReceipt
from tests.cluster.conftest import P, delete_queue, spread_name
from tests.helpers import wait_until

CFG = QueueConfig(max_staleness=4, max_completed_groups=600, max_executing_samples=6000)


def groups(count: int, prefix: str = "s", n: int = 2) -> list[SourceGroup]:
    return [SourceGroup(f"{prefix}{i}", f"prompt {i}", n) for i in range(count)]


def samples(r: Any) -> list[Sample]:
    return [Sample(slot=i, token_ids=[i + 1], reward=float(i), version=r.version) for i in range(r.group.n)]


def generate(q: Any, worker: str, count: int) -> list[Any]:
    """Reserve and complete ``count`` groups; returns the reservations."""
    w = q.worker(worker)
    done: list[Any] = []
    while len(done) < count:
        got = w.reserve(max_groups=count - len(done), block_ms=500)
        assert got, f"nothing to reserve after {len(done)} of {count}"
        for r in got:
            assert w.complete(r.receipt, samples(r)) == "buffered"
        done += got
    return done


def test_submit_places_each_group_in_its_source_ids_partition(open_pq: Any) -> None:
    q = open_pq(CFG)
    batch = groups(60)
    ids = q.submit(batch)
    assert all(ids)
    per = q.partition_stats()
    expected = Counter(q.partition_for(g.source_id) for g in batch)
    assert {name: s.backlog for name, s in per.items()} == {name: expected[name] for name in q.partitions}
    assert len([name for name in q.partitions if expected[name]]) > 1  # the groups are spread
    assert q.submit(batch) == ids  # idempotent: same partition, same entry IDs, nothing stored twice
    assert q.stats().backlog == 60


def test_lifecycle_over_partitions(open_pq: Any) -> None:
    q = open_pq(CFG)
    q.submit(groups(30))
    reserved = generate(q, "w-a", 30)
    receipts = [r.receipt for r in reserved]
    assert all(isinstance(rc, PartitionReceipt) for rc in receipts)
    assert len({rc.queue for rc in receipts}) > 1
    lease = q.lease(groups=30, block_ms=2000)
    assert lease is not None and len(lease.groups) == 30
    assert len(lease.partitions) > 1  # one composite lease over several partitions
    assert sorted(g.group.source_id for g in lease.groups) == sorted(f"s{i}" for i in range(30))
    assert len(lease.commit(step=None).split(",")) == len(lease.partitions)  # one partition/id per member
    assert lease.commit() == lease.commit()  # a repeated commit replays each member's answer
    total = q.stats()
    assert (total.committed, total.completed, total.leased, total.retained, total.backlog) == (30, 0, 0, 0, 0)
    assert sum(s.committed for s in q.partition_stats().values()) == 30


def test_lease_waits_until_enough_groups_exist_then_takes_exactly_that_many(open_pq: Any) -> None:
    q = open_pq(CFG)
    q.submit(groups(12))
    generate(q, "w-a", 12)
    assert q.lease(groups=13) is None  # not enough: nothing is leased (nothing to hand back)
    assert q.stats().leased == 0
    lease = q.lease(groups=9)
    assert len(lease.groups) == 9 and q.stats().leased == 9
    rest = q.lease(groups=10, partial=True)
    assert len(rest.groups) == 3
    lease.commit()
    rest.commit()


def test_a_lease_that_cannot_be_completed_hands_its_members_back(open_pq: Any) -> None:
    q = open_pq(CFG.replace(max_staleness=0))
    q.submit(groups(12))
    generate(q, "w-a", 6)  # generated before version 2: stale once it is published
    q.publish_version(2)
    generate(q, "w-a", 6)
    # Each partition's reserve evicted its stale groups inline (issue 12 item 1): at most 6 are fresh.
    assert q.stats().completed >= 6
    assert q.lease(groups=10, block_ms=300) is None  # not enough fresh ones anywhere: none is kept
    s = q.stats()
    assert (s.leased, s.committed, s.completed + s.ready + s.backlog) == (0, 0, 12)
    q.reap()  # the stale groups the lease did not walk over are evicted too
    s = q.stats()
    assert (s.completed, s.leased, s.ready + s.backlog) == (0, 0, 12)  # every member handed back


def test_rollback_requeues_every_member(open_pq: Any) -> None:
    q = open_pq(CFG)
    q.submit(groups(18))
    generate(q, "w-a", 18)
    lease = q.lease(groups=18)
    assert len(lease.partitions) > 1
    assert lease.rollback() == 18
    s = q.stats()
    assert (s.ready, s.leased, s.completed, s.committed) == (18, 0, 0, 0)
    generate(q, "w-b", 18)  # requeued groups keep their entry and are generated again
    with q.lease(groups=18) as again:
        assert sorted(g.group.source_id for g in again.groups) == sorted(f"s{i}" for i in range(18))
    assert q.stats().committed == 18


def test_reap_requeues_a_silent_workers_groups_on_every_partition(open_pq: Any) -> None:
    q = open_pq(CFG.replace(worker_timeout_s=0.3))
    q.submit(groups(24))
    w = q.worker("w-dies")
    held = w.reserve(max_groups=24)
    assert len(held) == 24 and len({r.receipt.queue for r in held}) > 1
    lost: list[int] = []
    wait_until(lambda: lost.append(q.reap().lost) or sum(lost) >= 24, timeout=10,
               message="the reaper to requeue the silent worker's work")
    assert sum(lost) == 24
    assert q.stats().ready == 24


def test_expired_member_fences_the_whole_composite_commit(open_pq: Any) -> None:
    q = open_pq(CFG.replace(lease_timeout_s=30))
    q.submit(groups(18))
    generate(q, "w-a", 18)
    lease = q.lease(groups=18)
    assert len(lease.members) > 1
    # One member is lost (e.g. rolled back by someone holding its token): the commit must fail
    # before committing any member, so the trainer can drop the whole step.
    keys, lease_id, token = lease.members[-1]
    lost = q.partition(q.partitions.index(keys.queue)).run(__import__("rollout_queue.core.flows", fromlist=["x"]).rollback(
        keys, lease_id, token))
    assert lost > 0
    with pytest.raises(LeaseLost):
        lease.commit()
    assert q.stats().committed == 0 and not lease.committed
    assert lease.rollback() == 18 - lost  # the trainer hands back the rest


def test_publish_version_and_holds_reach_every_partition(open_pq: Any) -> None:
    q = open_pq(CFG)
    assert q.publish_version(1, "s3://w/1") is True
    assert q.publish_version(1, "s3://w/1") is False  # a replay on every partition
    assert {s.version for s in q.partition_stats().values()} == {1} and q.version == 1
    q.submit(groups(12))
    w = q.worker("w-a")
    executing = w.reserve(max_groups=6)
    hold = q.hold(timeout_s=30)
    assert hold.waiting == 6
    assert w.reserve(max_groups=6) == []  # admission closed on every partition
    assert hold.wait_terminal(0.05) is False
    for r in executing:
        w.complete(r.receipt, samples(r))
    assert hold.wait_terminal(5) is True
    assert q.lease(groups=1) is None  # no leases during a hold either
    hold.record_weight_update(2, "s3://w/2")
    assert hold.release() == 0
    assert {s.version for s in q.partition_stats().values()} == {2}
    info = w.heartbeat()
    assert (info.version, info.weights_uri, info.held) == (2, "s3://w/2", False)
    assert len(w.reserve(max_groups=6)) == 6


def test_stats_are_the_sum_of_the_partitions(open_pq: Any) -> None:
    q = open_pq(CFG)
    q.submit(groups(40))
    generate(q, "w-a", 10)
    q.worker("w-b").reserve(max_groups=5)
    q.lease(groups=4).commit()
    total, parts = q.stats(), q.partition_stats()
    for field in ("backlog", "executing_groups", "completed", "committed", "retained", "submitted"):
        assert getattr(total, field) == sum(getattr(s, field) for s in parts.values()), field
    assert (total.backlog, total.executing_groups, total.completed, total.committed) == (25, 5, 6, 4)
    assert total.counters["partitions"] == P and total.counters["partitions_unreachable"] == 0


def test_bounds_are_split_over_the_partitions(open_pq: Any) -> None:
    q = open_pq(QueueConfig(max_completed_groups=60, max_executing_samples=600, batch_groups=12, max_staleness=1))
    assert {(c.max_completed_groups, c.max_executing_samples, c.batch_groups) for c in q.configs} == {(10, 100, 2)}
    assert (q.config.max_completed_groups, q.config.max_executing_samples, q.config.batch_groups) == (60, 600, 12)
    reopened = open_pq(QueueConfig(max_completed_groups=60, max_executing_samples=600, batch_groups=12,
                                   max_staleness=1), name=q.name)
    assert reopened.configs == q.configs


def test_partition_count_is_fixed_for_the_queue(cluster: LocalCluster) -> None:
    name = spread_name(cluster)
    try:
        PartitionedQueue.from_url(cluster.url, name, P).close()
        with pytest.raises(ConfigMismatch):
            PartitionedQueue.from_url(cluster.url, name, 4)
        with pytest.raises(ConfigMismatch):
            PartitionedQueue.from_url(cluster.url, name, 1)
        RolloutQueue.from_url(cluster.url, name + "-plain").close()
        with pytest.raises(ConfigMismatch):
            PartitionedQueue.from_url(cluster.url, name + "-plain", P)
    finally:
        delete_queue(cluster, name)
        delete_queue(cluster, name + "-plain")


def test_one_partition_is_the_plain_queue(cluster: LocalCluster) -> None:
    name = spread_name(cluster, 1)
    try:
        pq = PartitionedQueue.from_url(cluster.url, name, 1, CFG)
        plain = RolloutQueue.from_url(cluster.url, name, CFG)
        pq.submit(groups(4))
        generate(pq, "w-a", 2)
        assert plain.stats().completed == 2 and plain.stats().backlog == 2
        node = cluster.nodes[cluster.node_of(f"rollout:{{{name}}}:meta")]
        client = redis.Redis(host=node.host, port=node.port)
        keys = {k.decode() for k in client.scan_iter(match=f"rollout:{{{name}*", count=1000)}
        client.close()
        assert keys and all(k.startswith(f"rollout:{{{name}}}:") for k in keys)
        assert f"rollout:{{{name}}}:partitions" not in keys  # nothing beyond today's keys
        lease = plain.lease(groups=2)  # the plain client leases what the partitioned one generated
        assert lease is not None and lease.commit()
        pq.close()
        plain.close()
    finally:
        delete_queue(cluster, name)
