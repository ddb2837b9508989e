"""Cluster-test fixtures: a private 3-master Redis Cluster per server kind, and partitioned queues on it.

``cluster`` (session) serves the contract-style tests; ``private_cluster`` is a cluster of this test
alone, free to kill a master and restart it. ``open_pq`` opens a PartitionedQueue (or an
AsyncPartitionedQueue behind ``SyncView``, as tests/contract does) so each test runs over both
drivers. Queue names are unique per test and chosen so that the P = 6 partitions land on every
master; each test's keys are deleted afterwards (never FLUSHALL a shared server).
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from rollout_queue import AsyncPartitionedQueue, Hold, Lease, PartitionedQueue, QueueConfig, RolloutQueue, Worker
from rollout_queue.devtools.local_cluster import LocalCluster
from rollout_queue.scale.layout import partition_names
from tests.conftest import SERVER_KINDS

P = 6
#: what an async target hands out (one class serves both drivers): wrapped as well
_ASYNC_TYPES = (RolloutQueue, Worker, Lease, Hold)
_KIND_IDS = [kind or "no-server" for kind in SERVER_KINDS]


class SyncView:
    """An async client object with the sync client's calling convention (each coroutine is run to
    completion on a private loop); objects it returns are wrapped the same way."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_loop", loop)

    def _wrap(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            value = self._loop.run_until_complete(value)
        if isinstance(value, _ASYNC_TYPES):
            return SyncView(value, self._loop)
        return value

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if callable(attr) and not isinstance(attr, type):
            return lambda *a, **kw: self._wrap(attr(*a, **kw))
        return self._wrap(attr)

    def __len__(self) -> int:
        return len(self._target)

    def __enter__(self) -> "SyncView":
        self._wrap(self._target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> None:
        self._wrap(self._target.__aexit__(*exc))


@pytest.fixture(scope="session", params=SERVER_KINDS, ids=_KIND_IDS)
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-master cluster shared by the session's tests of one server kind; never killed."""
    with LocalCluster(request.param, masters=3) as local:
        yield local


@pytest.fixture
def private_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 3-master cluster of this test alone (of the first server kind), free to kill and restart."""
    with LocalCluster(SERVER_KINDS[0], masters=3) as local:
        yield local


def slot_owners(local: LocalCluster) -> dict[int, int]:
    """slot -> master index, from CLUSTER SLOTS of a running node."""
    node = next(n for n in local.nodes if n.is_running())
    client = redis.Redis(host=node.host, port=node.port)
    try:
        ports = [n.port for n in local.nodes]
        owners = {}
        for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
            for slot in range(start, end + 1):
                owners[slot] = ports.index(int(master[1]))
        return owners
    finally:
        client.close()


def spread_name(local: LocalCluster, partitions: int = P) -> str:
    """A fresh queue name whose partitions land on every master (so a killed master takes some,
    never all, of them)."""
    owners = slot_owners(local)
    while True:
        name = f"t-{uuid.uuid4().hex[:12]}"
        nodes = {owners[key_slot(f"{n}".encode())] for n in partition_names(name, partitions)}
        if len(nodes) == min(partitions, len(local.nodes)):
            return name


def delete_queue(local: LocalCluster, name: str) -> None:
    """UNLINK every key of the logical queue and its partitions on every running master."""
    for node in local.nodes:
        if not node.is_running():
            continue
        client = redis.Redis(host=node.host, port=node.port)
        try:
            for pattern in (f"rollout:{{{name}}}:*", f"rollout:{{{name}#*}}:*"):
                for key in client.scan_iter(match=pattern, count=1000):
                    client.unlink(key)
        finally:
            client.close()


@pytest.fixture(params=["sync", "async"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def open_pq(transport: str, cluster: LocalCluster) -> Iterator[Callable[..., Any]]:
    """Factory: open_pq(config=None, partitions=P, name=None) on the shared cluster, of this test's
    driver. Returns the queue; ``.name`` is its logical name."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []
    names: set[str] = set()

    def factory(config: QueueConfig | None = None, partitions: int = P, name: str | None = None) -> Any:
        name = name or spread_name(cluster, partitions)
        names.add(name)
        if transport == "sync":
            q: Any = PartitionedQueue.from_url(cluster.url, name, partitions, config)
        else:
            q = SyncView(loop.run_until_complete(AsyncPartitionedQueue.from_url(cluster.url, name, partitions,
                                                                                config)), loop)
        opened.append(q)
        return q

    yield factory
    for q in opened:
        q.close()
    loop.close()
    for name in names:
        delete_queue(cluster, name)
