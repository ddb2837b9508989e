"""The single-queue clients on a Redis Cluster: found by the URL (``redis+cluster://``) or a flag.

Every script and plain command of a queue goes to the node that owns its hash tag: blocking reserve
and lease (XREAD BLOCK on a wake stream), views and dead letters included; a node that forgot the
scripts (SCRIPT FLUSH, or a restart) gets them again on the one node that refused.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
import redis

from rollout_queue import AsyncRolloutQueue, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.drivers.cluster import split_url
from rollout_queue.devtools.local_cluster import LocalCluster
from tests.cluster.conftest import SyncView, delete_queue

CFG = QueueConfig(max_staleness=2)


@pytest.fixture(params=["sync", "async"])
def plain_queue(request: pytest.FixtureRequest, cluster: LocalCluster) -> Any:
    name = f"t-{uuid.uuid4().hex[:12]}"
    loop = asyncio.new_event_loop()
    if request.param == "sync":
        q: Any = RolloutQueue.from_url(cluster.url, name, CFG)
    else:
        q = SyncView(loop.run_until_complete(AsyncRolloutQueue.from_url(cluster.url, name, CFG)), loop)
    yield q
    q.close()
    loop.close()
    delete_queue(cluster, name)


def complete_all(w: Any, got: list[Any]) -> None:
    for r in got:
        w.complete(r.receipt, [Sample(slot=i, token_ids=[1], version=r.version) for i in range(r.group.n)])


def test_lifecycle_on_a_cluster_url(plain_queue: Any) -> None:
    q = plain_queue
    q.submit([SourceGroup(f"s{i}", "p", 2) for i in range(8)])
    w = q.worker("w-1")
    complete_all(w, w.reserve(max_groups=8))
    with q.lease(groups=8) as lease:
        assert len(lease.groups) == 8
    assert q.publish_version(1)
    with q.hold(timeout_s=10) as hold:
        assert hold.wait_terminal(1)
        hold.record_weight_update(2)
    s = q.stats()
    assert (s.committed, s.version, s.retained) == (8, 2, 0)
    assert q.reap().total == 0 and q.dead_letters() == []
    assert q.version == 2  # a plain HGET, routed by the key's tag


def test_blocking_reserve_wakes_on_the_keys_node(cluster: LocalCluster) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    q = RolloutQueue.from_url(cluster.url, name, CFG)
    producer = RolloutQueue.from_url(cluster.url, name)
    try:
        timer = threading.Timer(0.2, lambda: producer.submit([SourceGroup("late", "p", 1)]))
        timer.start()
        got = q.worker("w-1").reserve(max_groups=1, block_ms=5000)
        timer.join()
        assert [r.group.source_id for r in got] == ["late"]
    finally:
        q.close()
        producer.close()
        delete_queue(cluster, name)


def test_a_node_that_forgot_the_scripts_gets_them_back(cluster: LocalCluster) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    q = RolloutQueue.from_url(cluster.url, name, CFG)
    try:
        node = cluster.nodes[cluster.node_of(f"rollout:{{{name}}}:meta")]
        direct = redis.Redis(host=node.host, port=node.port)
        direct.script_flush()
        direct.close()
        assert q.submit([SourceGroup("s", "p", 1)])
    finally:
        q.close()
        delete_queue(cluster, name)


def test_the_cluster_flag_with_a_plain_url(cluster: LocalCluster) -> None:
    name = f"t-{uuid.uuid4().hex[:12]}"
    plain_url = f"redis://{cluster.addresses[1]}"
    q = RolloutQueue.from_url(plain_url, name, CFG, cluster=True)
    try:
        assert q.submit([SourceGroup("s", "p", 1)]) and q.stats().backlog == 1
    finally:
        q.close()
        delete_queue(cluster, name)


def test_split_url() -> None:
    assert split_url("redis+cluster://h:7000") == ("redis://h:7000", True)
    assert split_url("rediss+cluster://u:p@h:7000/0") == ("rediss://u:p@h:7000/0", True)
    assert split_url("redis://h:6380/0") == ("redis://h:6380/0", False)
    assert split_url("redis://h:6380", cluster=True) == ("redis://h:6380", True)
    with pytest.raises(ValueError):
        split_url("redis+cluster://h:7000", cluster=False)
