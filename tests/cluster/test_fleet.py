"""Several runs on one worker fleet: a worker reserves from two queues 3:1, each queue with its own
policy version, skipping a queue that has no work without letting it bank credit.

Runs on the session's plain server: the fleet only chooses which queue to ask; a queue may be plain
or partitioned (here one of each), on the same Redis or not.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from rollout_queue import (
    AsyncFleetReserver,
    AsyncRolloutQueue,
    FleetReserver,
    PartitionedQueue,
    QueueConfig,
    RolloutQueue,
    Sample,
    SourceGroup,
)

CFG = QueueConfig(max_staleness=8, max_completed_groups=1000, max_executing_samples=10000)


@pytest.fixture
def names(redis_url: str) -> Iterator[tuple[str, str]]:
    run = uuid.uuid4().hex[:10]
    pair = (f"fleet-{run}-a", f"fleet-{run}-b")
    yield pair
    client = redis.Redis.from_url(redis_url)
    for name in pair:
        for pattern in (f"rollout:{{{name}}}:*", f"rollout:{{{name}#*}}:*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.unlink(key)
    client.close()


def work(prefix: str, count: int, n: int = 4) -> list[SourceGroup]:
    return [SourceGroup(f"{prefix}{i}", "p", n) for i in range(count)]


def settle(fleet: Any, got: list[tuple[str, Any]]) -> None:
    for queue, r in got:
        fleet.workers[queue].complete(r.receipt, [Sample(slot=i, token_ids=[1], version=r.version)
                                                  for i in range(r.group.n)])


def test_two_runs_share_a_worker_three_to_one(redis_url: str, names: tuple[str, str]) -> None:
    a = RolloutQueue.from_url(redis_url, names[0], CFG)
    b = PartitionedQueue.from_url(redis_url, names[1], 2, CFG)
    a.submit(work("a", 200))
    b.submit(work("b", 200))
    a.publish_version(5, "s3://run-a/5")
    b.publish_version(9, "s3://run-b/9")
    fleet = FleetReserver({"run-a": a.worker("gpu0"), "run-b": b.worker("gpu0")}, {"run-a": 3, "run-b": 1})
    served: Counter[str] = Counter()
    for _ in range(80):
        got = fleet.reserve(max_groups=1)
        assert len(got) == 1
        queue, r = got[0]
        assert r.version == {"run-a": 5, "run-b": 9}[queue]  # each run's own policy version
        served[queue] += 1
        settle(fleet, got)
    assert served == {"run-a": 60, "run-b": 20}
    beats = fleet.heartbeat()
    assert (beats["run-a"].version, beats["run-b"].weights_uri) == (5, "s3://run-b/9")

    # A larger call is split in the same proportion.
    got = fleet.reserve(max_groups=8)
    assert Counter(q for q, _ in got) == {"run-a": 6, "run-b": 2}
    settle(fleet, got)
    for q in (a, b):
        q.close()


def test_an_empty_run_is_skipped_and_rejoins_without_a_burst(redis_url: str, names: tuple[str, str]) -> None:
    a = RolloutQueue.from_url(redis_url, names[0], CFG)
    b = RolloutQueue.from_url(redis_url, names[1], CFG)
    a.submit(work("a", 120))
    b.submit(work("b", 2))
    fleet = FleetReserver({"a": a.worker("gpu0"), "b": b.worker("gpu0")}, {"a": 1, "b": 1})
    served: Counter[str] = Counter()
    for _ in range(40):  # b runs dry after 2: a worker never idles while a has work
        got = fleet.reserve(max_groups=1)
        served.update(q for q, _ in got)
        settle(fleet, got)
    assert served == {"a": 38, "b": 2}
    b.submit(work("b-more", 50))
    served.clear()
    for _ in range(20):
        got = fleet.reserve(max_groups=1)
        served.update(q for q, _ in got)
        settle(fleet, got)
    assert served == {"a": 10, "b": 10}  # an even split again, not 36 catch-up groups for b
    assert fleet.reserve(max_groups=1, block_ms=0)
    for q in (a, b):
        q.close()


def test_async_fleet_reserver_blocks_across_runs(redis_url: str, names: tuple[str, str]) -> None:
    async def scenario() -> list[Counter[str]]:
        a = await AsyncRolloutQueue.from_url(redis_url, names[0], CFG)
        b = await AsyncRolloutQueue.from_url(redis_url, names[1], CFG)
        await a.submit(work("a", 4))
        fleet = AsyncFleetReserver({"a": a.worker("gpu0"), "b": b.worker("gpu0")}, {"a": 1, "b": 3})
        first = Counter(q for q, _ in await fleet.reserve(max_groups=8))  # b is empty: all from a

        async def late_submit() -> None:
            await asyncio.sleep(0.3)
            await b.submit(work("b", 1))

        task = asyncio.create_task(late_submit())
        second = Counter(q for q, _ in await fleet.reserve(max_groups=1, block_ms=5000))  # waits for b
        await task
        await a.close()
        await b.close()
        return [first, second]

    assert asyncio.run(scenario()) == [{"a": 4}, {"b": 1}]
