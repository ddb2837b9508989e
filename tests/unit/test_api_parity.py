"""One facade per role: every variant (sync/async x plain/partitioned) exposes the same methods.

The variants are one class each (the driver decides sync or asyncio, the layout one partition or
P); the only subclasses are spellings of the constructor. This test fails on any other difference,
so a method added to one variant is a method of all.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest
import redis
import redis.asyncio

from rollout_queue import (AsyncPartitionedQueue, AsyncRolloutQueue, FleetReserver, Hold, Lease, PartitionedQueue,
                           QueueConfig, RolloutQueue, Sample, SourceGroup, Worker)

VARIANTS = (RolloutQueue, AsyncRolloutQueue, PartitionedQueue, AsyncPartitionedQueue)
#: the constructor spellings PartitionedQueue keeps (the partition count as third positional argument)
CONSTRUCTORS = {"__init__", "open", "from_url"}


def public(cls: type) -> dict[str, str]:
    """Public names -> their signature (properties as 'property')."""
    out = {}
    for name, attr in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__enter__", "__exit__", "__aenter__", "__aexit__"):
            continue
        if isinstance(inspect.getattr_static(cls, name), property):
            out[name] = "property"
        elif callable(attr):
            out[name] = str(inspect.signature(attr))
    return out


@pytest.mark.parametrize("variant", VARIANTS[1:], ids=lambda c: c.__name__)
def test_queue_variants_have_the_same_methods(variant: type) -> None:
    base, other = public(RolloutQueue), public(variant)
    assert set(base) == set(other)
    differ = {n for n in base if base[n] != other[n]}
    assert differ <= CONSTRUCTORS, {n: (base[n], other[n]) for n in differ - CONSTRUCTORS}
    # no method body of its own beyond the constructor spellings: the class is the facade itself
    own = {n for n, v in vars(variant).items() if callable(v) or isinstance(v, (classmethod, property))}
    assert own <= CONSTRUCTORS, own


def _exercise(q, is_async: bool, loop: asyncio.AbstractEventLoop | None):
    """What each role's object is, on a real queue of this variant."""
    run = (lambda x: loop.run_until_complete(x)) if is_async else (lambda x: x)
    w = q.worker("parity-w")
    run(q.submit([SourceGroup("s0", "p", 1)]))
    [res] = run(w.reserve(1))
    run(w.complete(res.receipt, [Sample(slot=0, token_ids=(1,), logprobs=(-0.1,), reward=1.0)]))
    lease = run(q.lease(1))
    hold = run(q.hold())
    kinds = (type(w), type(lease), type(hold))
    run(hold.release())
    run(lease.commit())
    return kinds


@pytest.mark.parametrize("partitions", [1, 3])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_every_variant_hands_out_the_same_role_classes(redis_url: str, queue_name: str, partitions: int,
                                                       is_async: bool) -> None:
    cfg = QueueConfig(max_executing_samples=30, max_retained_groups=30, max_completed_groups=30)
    loop = asyncio.new_event_loop() if is_async else None
    try:
        if is_async:
            q = loop.run_until_complete(AsyncRolloutQueue.from_url(redis_url, queue_name, cfg, partitions=partitions))
        else:
            q = RolloutQueue.from_url(redis_url, queue_name, cfg, partitions=partitions)
        assert q.driver.is_async is is_async
        assert _exercise(q, is_async, loop) == (Worker, Lease, Hold)
        fleet = FleetReserver({"a": q.worker("fleet-w")}, {"a": 1})
        assert fleet.is_async is is_async
        result = fleet.reserve(1)
        assert inspect.isawaitable(result) is is_async
        got = loop.run_until_complete(result) if is_async else result
        assert got == []
        closed = q.close()
        if is_async:
            loop.run_until_complete(closed)
    finally:
        if loop is not None:
            loop.close()
        r = redis.Redis.from_url(redis_url)
        for key in r.scan_iter(match=f"rollout:{{{queue_name}*", count=1000):
            r.delete(key)
        r.close()


def test_a_sync_constructor_refuses_an_asyncio_client() -> None:
    client = redis.asyncio.Redis()
    with pytest.raises(Exception, match="asyncio"):
        RolloutQueue(client, "q")


def test_a_fleet_of_sync_and_asyncio_workers_is_refused(redis_url: str, queue_name: str) -> None:
    """A fleet drives its workers' calls one way (values or awaitables): mixing them is InvalidInput."""
    from rollout_queue import InvalidInput

    loop = asyncio.new_event_loop()
    sync_q = RolloutQueue.from_url(redis_url, queue_name + "-s")
    async_q = loop.run_until_complete(AsyncRolloutQueue.from_url(redis_url, queue_name + "-a"))
    try:
        with pytest.raises(InvalidInput, match="must all be sync or all asyncio"):
            FleetReserver({"s": sync_q.worker("w"), "a": async_q.worker("w")}, {"s": 1, "a": 1})
        with pytest.raises(InvalidInput, match="same queues"):
            FleetReserver({"s": sync_q.worker("w")}, {"t": 1})
    finally:
        sync_q.close()
        loop.run_until_complete(async_q.close())
        loop.close()
        r = redis.Redis.from_url(redis_url)
        for key in r.scan_iter(match=f"rollout:{{{queue_name}*", count=1000):
            r.delete(key)
        r.close()
