"""Time the server was down does not count against workers, leases or holds (issue 12 item 5).

A Redis restart (AOF always, shutdown, restart seconds later) is a pause for every client: the
queue clock (lua/include/now_ms.lua) goes on from where it stopped, and every client gets a grace of
two worker timeouts to reconnect before anything it owns is taken away. Each test owns a fresh
server, stopped for longer than every timeout of the queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from rollout_queue import Lease, QueueConfig, RetryPolicy, RolloutQueue, StaleReceipt
from rollout_queue.devtools.local_server import LocalServer
from tests.contract.worker_support import group, samples

NAME = "outage"
TIMEOUT_S = 1.0
CFG = QueueConfig(worker_timeout_s=TIMEOUT_S, lease_timeout_s=2.0, hold_timeout_s=2.0, max_attempts=1)
OUTAGE_S = 3.0


@pytest.fixture
def queue(fresh_server: LocalServer) -> Iterator[RolloutQueue]:
    q = RolloutQueue.from_url(fresh_server.url, NAME, CFG, retry=RetryPolicy(window_s=30.0, max_backoff_s=0.2))
    try:
        yield q
    finally:
        q.close()


def leased_group(queue: RolloutQueue) -> Lease:
    """One group submitted, reserved, completed and leased."""
    queue.submit([group("a")])
    w = queue.worker("w1")
    r = w.reserve(1)[0]
    w.complete(r.receipt, samples(2))
    lease = queue.lease(1)
    assert lease is not None
    return lease


def outage(server: LocalServer, seconds: float = OUTAGE_S) -> None:
    """A clean shutdown (AOF always), then the same data back `seconds` later."""
    server.stop()
    time.sleep(seconds)
    server.start()


def test_an_outage_longer_than_worker_timeout_reaps_nobody_and_settles_normally(
        fresh_server: LocalServer, queue: RolloutQueue) -> None:
    queue.submit([group("a"), group("b")])
    w = queue.worker("w1")
    granted = w.reserve(2)
    assert len(granted) == 2
    outage(fresh_server)
    # The first client back is a reaper: before the fix it reaped w1 as lost (max_attempts=1: dead).
    report = queue.reap()
    assert report.lost == 0 and report.dead == 0
    w.heartbeat()
    assert w.complete(granted[0].receipt, samples(2)) == "buffered"
    assert w.complete(granted[1].receipt, samples(2)) == "buffered"
    stats = queue.stats()
    assert stats.dead == 0 and stats.completed == 2 and stats.outages == 1


def test_three_long_restarts_dead_letter_nothing(fresh_server: LocalServer, queue: RolloutQueue) -> None:
    queue.submit([group(f"g{i}") for i in range(3)])
    w = queue.worker("w1")
    receipts = [r.receipt for r in w.reserve(3)]
    for _ in range(3):
        outage(fresh_server, 1.5)
        queue.reap()
        w.heartbeat()
    assert queue.stats().dead == 0
    assert sorted(w.owned(), key=lambda o: o.receipt.entry_id) and len(w.owned()) == 3
    assert {o.receipt for o in w.owned()} == set(receipts)


def test_a_worker_that_never_comes_back_is_reaped_after_the_grace_and_not_counted(
        fresh_server: LocalServer, queue: RolloutQueue) -> None:
    queue.submit([group("a")])
    queue.worker("gone").reserve(1)
    outage(fresh_server)
    assert queue.reap().lost == 0  # within the grace
    time.sleep(2 * TIMEOUT_S + 0.3)
    report = queue.reap()
    assert report.lost == 1 and report.dead == 0  # max_attempts=1, yet not dead: not counted
    back = queue.worker("w2").reserve(1)
    assert back and back[0].receipt.attempt == 2


def test_a_worker_silent_before_the_outage_is_still_reaped_and_counted(
        fresh_server: LocalServer, queue: RolloutQueue) -> None:
    queue.submit([group("a")])
    queue.worker("dead-before").reserve(1)
    live = queue.worker("live")
    for _ in range(6):  # silent past its timeout before the server went down, while the fleet beats
        live.heartbeat()
        time.sleep(TIMEOUT_S / 4)
    outage(fresh_server, 1.0)
    report = queue.reap()
    assert report.lost == 0 and report.dead == 1  # counted as before: max_attempts=1, dead-lettered


def test_leases_and_holds_keep_their_remaining_time_across_an_outage(
        fresh_server: LocalServer, queue: RolloutQueue) -> None:
    lease = leased_group(queue)
    hold = queue.hold()
    outage(fresh_server)
    assert queue.reap().expired == 0
    assert hold.wait_terminal(0.1)  # still active: no HoldLost
    hold.release()
    lease.commit()
    assert queue.stats().committed == 1


def test_server_time_that_goes_backwards_never_moves_the_queue_clock_back(
        fresh_server: LocalServer, queue: RolloutQueue) -> None:
    admin = redis.Redis.from_url(fresh_server.url)
    queue.worker("w1").heartbeat()
    clock = int(admin.hget(f"rollout:{{{NAME}}}:clock", "ms"))
    # Pretend the last script ran an hour from now: the server clock is now "behind" it.
    admin.hset(f"rollout:{{{NAME}}}:clock", "ms", clock + 3_600_000)
    info = queue.worker("w1").heartbeat()
    assert info.server_ms >= clock + 3_600_000
    assert admin.hget(f"rollout:{{{NAME}}}:clock", "outages") is None  # the same server: not an outage
    admin.close()


def test_the_queue_clock_never_goes_back_across_a_restart(fresh_server: LocalServer, queue: RolloutQueue) -> None:
    """The clock's ms is written at most every 100 ms, so a script can see (and store a deadline
    from) a queue time up to 100 ms past it. Found by the ledger machine in CI: a lease extended
    just before a restart got an earlier deadline from the next extend. Here the lag is the
    state a restart can meet: ms written 99 ms before the last extend, whose deadline was stored."""
    admin = redis.Redis.from_url(fresh_server.url)
    key = f"rollout:{{{NAME}}}:clock"
    lease = leased_group(queue)
    first = lease.extend(900)
    admin.hset(key, "ms", first - 900_000 - 99)  # the last write a step behind that extend's time
    outage(fresh_server, 0.2)
    assert lease.extend(900) >= first
    assert int(admin.hget(key, "outages")) == 1
    lease.commit()
    admin.close()


def test_garbage_in_the_clock_fields_restarts_the_clock_instead_of_failing(
        fresh_server: LocalServer, queue: RolloutQueue) -> None:
    admin = redis.Redis.from_url(fresh_server.url)
    admin.hset(f"rollout:{{{NAME}}}:clock", mapping={"ms": "x", "offset": "y", "resumed": "z", "outages": "w"})
    queue.submit([group("a")])
    assert len(queue.worker("w1").reserve(1)) == 1
    admin.close()


def test_stale_receipt_still_refused_after_an_outage(fresh_server: LocalServer, queue: RolloutQueue) -> None:
    queue.submit([group("a")])
    w = queue.worker("w1")
    r = w.reserve(1)[0]
    w.abort(r.receipt)
    outage(fresh_server, 1.0)
    with pytest.raises(StaleReceipt):
        w.complete(r.receipt, samples(2))
