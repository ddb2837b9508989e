"""Refusals after which a command never ran are retried, for every call, until the window runs out.

Redis says BUSY (a script holds the server), LOADING (a restart is loading the dataset), READONLY (the
client still points at an old primary that came back as a replica), MASTERDOWN (a replica without its
primary), NOREPLICAS (min-replicas-to-write) before it runs anything, so the transport sends the call
again with backoff, idempotent or not (issue 12, item 8), and raises ServerUnavailable (nothing ran)
once the retry window is spent. Each test provokes the refusal on a real server of its own, over both
transports, and ends it from the transport's first backoff (a hooked sleep), so nothing here is
timed: a test that passes has proved the call met the refusal, waited, and then ran exactly once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from rollout_queue import AsyncRolloutQueue, QueueConfig, RetryPolicy, RolloutQueue, ScriptError, ServerUnavailable
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.drivers.transport import refusal
from tests.conftest import SERVER_KINDS
from tests.contract.conftest import SyncView
from tests.contract.worker_support import group
from tests.helpers import wait_until, after_settling
from tests.proxy import Proxy

CFG = QueueConfig(max_attempts=1, worker_timeout_s=30.0)
NAME = "refusals"
RETRY = RetryPolicy(window_s=20.0, first_backoff_s=0.01, max_backoff_s=0.1)
SHORT = RetryPolicy(window_s=0.3, first_backoff_s=0.01, max_backoff_s=0.05)
BUSY_LOOP = "local i = 0 while true do i = i + 1 end"


@pytest.fixture
def opener(transport: str) -> Iterator[Callable[..., Any]]:
    """open(url, retry=RETRY, config=CFG) -> a queue of this test's transport."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def open_(url: str, retry: RetryPolicy = RETRY, config: QueueConfig | None = CFG) -> Any:
        if transport == "sync":
            q: Any = RolloutQueue.from_url(url, NAME, config, retry=retry)
        else:
            q = SyncView(loop.run_until_complete(AsyncRolloutQueue.from_url(url, NAME, config, retry=retry)), loop)
        opened.append(q)
        return q

    yield open_
    for q in opened:
        q.close()
    loop.close()


def on_backoff(q: Any, transport: str, action: Callable[[], None]) -> list[float]:
    """Run ``action`` at the transport's first backoff (the call met a refusal); the list of backoffs."""
    seen: list[float] = []
    real = q.driver.sleep

    def note(seconds: float) -> None:
        seen.append(seconds)
        if len(seen) == 1:
            action()

    if transport == "sync":
        def sleep(seconds: float) -> None:
            note(seconds)
            real(seconds)
    else:
        async def sleep(seconds: float) -> None:  # type: ignore[misc]
            note(seconds)
            await real(seconds)
    q.driver.sleep = sleep
    return seen


def admin(server: LocalServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=10)


def dead_letter(q: Any) -> str:
    """One group dead-lettered (max_attempts=1); its DLQ id."""
    q.submit([group("dl")])
    [res] = q.worker("w1").reserve(1)
    assert q.worker("w1").fail(res.receipt, "bad") == "dead"
    [dl] = after_settling(q).dead_letters()
    return dl.dlq_id


def replica_of(primary: LocalServer) -> LocalServer:
    replica = LocalServer(primary.kind, replica_of=primary).start()
    replica.wait_synced(primary)
    return replica


@contextmanager
def busy_server(server: LocalServer) -> Iterator[Callable[[], None]]:
    """A never-ending read-only EVAL holds ``server`` (BUSY to everyone else after 10 ms); yields a
    function that kills it (SCRIPT KILL), which also runs on exit."""
    control = admin(server)
    control.config_set("busy-reply-threshold", 10)
    looper = redis.Redis.from_url(server.url, socket_timeout=60)
    thread = threading.Thread(target=lambda: _run_killed(looper), daemon=True)
    thread.start()

    def busy() -> bool:
        try:
            control.ping()
        except redis.ResponseError as exc:
            return str(exc).startswith("BUSY")
        return False

    def kill() -> None:
        try:
            control.script_kill()
        except redis.ResponseError as exc:
            assert "NOTBUSY" in str(exc), exc

    wait_until(busy, timeout=10, message="the busy loop to hold the server")
    try:
        yield kill
    finally:
        kill()
        thread.join(timeout=10)
        looper.close()
        control.close()


def _run_killed(client: redis.Redis) -> None:
    try:
        client.eval(BUSY_LOOP, 0)
    except redis.ResponseError as exc:
        assert "killed" in str(exc).lower(), exc


# -- BUSY ------------------------------------------------------------------------------------------


def test_a_call_that_meets_busy_is_retried_until_the_script_is_killed(opener, transport: str,
                                                                       fresh_server: LocalServer) -> None:
    q = opener(fresh_server.url)
    dlq_id = dead_letter(q)
    with busy_server(fresh_server) as kill:  # idempotent: submit
        backoffs = on_backoff(q, transport, kill)
        [eid] = q.submit([group("after-busy")])
    assert backoffs, "the call never met BUSY"
    with busy_server(fresh_server) as kill:  # not idempotent: a requeued dead letter is a new submit
        backoffs = on_backoff(q, transport, kill)
        new_id = q.requeue_dead_letter(dlq_id)
    assert backoffs, "the call never met BUSY"
    assert after_settling(q).dead_letters() == [] and q.submit([group("dl")]) == [new_id]
    stats = q.stats()
    assert (stats.backlog, stats.dead) == (2, 0), "each call ran exactly once"
    assert eid != new_id


def test_busy_past_the_window_raises_server_unavailable_and_nothing_ran(opener, fresh_server: LocalServer) -> None:
    q = opener(fresh_server.url, SHORT)
    with busy_server(fresh_server):
        with pytest.raises(ServerUnavailable) as caught:
            q.submit([group("never")])
    assert caught.value.refusal == "BUSY" and "did not run" in str(caught.value)
    assert q.stats().backlog == 0


# -- LOADING ---------------------------------------------------------------------------------------


@pytest.fixture(params=SERVER_KINDS, ids=[k or "no-server" for k in SERVER_KINDS])
def slow_loader(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    """A server whose restart spends about 1.6 s LOADING (8,000 filler keys at 200 us each)."""
    server = LocalServer(request.param, extra_config=[("key-load-delay", "200"),
                                                      ("loading-process-events-interval-bytes", "1024")])
    try:
        yield server.start()
    finally:
        server.cleanup(graceful=False)


def test_a_call_that_meets_loading_is_retried_even_if_not_idempotent(opener, transport: str,
                                                                      slow_loader: LocalServer) -> None:
    q = opener(slow_loader.url)
    dlq_id = dead_letter(q)
    control = admin(slow_loader)
    control.eval("for i = 1, 8000 do redis.call('SET', 'filler:' .. i, 'x') end", 0)
    control.bgrewriteaof()  # the AOF's RDB base now holds the filler keys, which load slowly
    wait_until(lambda: not (lambda i: i["aof_rewrite_in_progress"] or i["aof_rewrite_scheduled"])(
        control.info("persistence")), timeout=10, message="the AOF rewrite")
    control.close()
    slow_loader.kill()
    starting = threading.Thread(target=slow_loader.start)
    starting.start()
    try:
        wait_until(lambda: _loading(slow_loader), timeout=10, interval=0.002, message="LOADING")
        _drop_connections(q, transport)  # the old ones died with the server; nothing was in flight
        backoffs = on_backoff(q, transport, lambda: None)
        new_id = q.requeue_dead_letter(dlq_id)
    finally:
        starting.join(timeout=30)
    assert backoffs, "the call never met LOADING"
    assert after_settling(q).dead_letters() == [] and q.submit([group("dl")]) == [new_id]
    assert q.stats().backlog == 1


def _loading(server: LocalServer) -> bool:
    try:
        return server.command("PING", timeout_s=1).startswith(b"-LOADING")
    except OSError:
        return False


def _drop_connections(q: Any, transport: str) -> None:
    if transport == "sync":
        q.client.connection_pool.disconnect()
    else:
        q._loop.run_until_complete(q._target.client.connection_pool.disconnect())


# -- READONLY, MASTERDOWN, NOREPLICAS: replication -------------------------------------------------


@pytest.fixture
def demoted(fresh_server: LocalServer) -> Iterator[Callable[[], LocalServer]]:
    """demote() -> the replica that took over: fresh_server, the old primary, now replicates from it
    (what a failover leaves behind when the old primary comes back). Calls on fresh_server's URL get
    READONLY until ``fresh_server.promote()``."""
    replicas: list[LocalServer] = []

    def demote() -> LocalServer:
        replica = replica_of(fresh_server)
        replicas.append(replica)
        replica.promote()
        assert fresh_server.command("REPLICAOF", replica.host, str(replica.port)) == b"+OK"
        fresh_server.replica_of = (replica.host, replica.port)
        fresh_server.wait_synced(replica)
        return replica

    yield demote
    for replica in replicas:
        replica.cleanup(graceful=False)


def test_readonly_after_a_failover_is_retried_until_the_server_is_primary_again(
        opener, transport: str, fresh_server: LocalServer, demoted) -> None:
    q = opener(fresh_server.url)
    dlq_id = dead_letter(q)
    [eid] = q.submit([group("ro")])
    demoted()
    _drop_connections(q, transport)
    backoffs = on_backoff(q, transport, fresh_server.promote)
    new_id = q.requeue_dead_letter(dlq_id)  # not idempotent
    assert backoffs, "the call never met READONLY"
    demoted()  # a second failover, and the old primary back as a replica again
    _drop_connections(q, transport)
    backoffs = on_backoff(q, transport, fresh_server.promote)
    [res] = q.worker("w2").reserve(1)  # idempotent
    assert backoffs, "the call never met READONLY"
    assert res.entry_id == eid
    assert after_settling(q).dead_letters() == [] and q.submit([group("dl")]) == [new_id]
    assert q.stats().backlog == 1  # the requeued dead letter; eid is executing on w2


def test_readonly_past_the_window_raises_server_unavailable(opener, fresh_server: LocalServer, demoted) -> None:
    q = opener(fresh_server.url, SHORT)
    dlq_id = dead_letter(q)
    demoted()
    with pytest.raises(ServerUnavailable) as caught:
        q.requeue_dead_letter(dlq_id)
    assert caught.value.refusal == "READONLY"
    fresh_server.promote()
    assert len(after_settling(q).dead_letters()) == 1, "nothing ran"


def test_masterdown_on_a_replica_is_retried_until_it_is_promoted(opener, transport: str,
                                                                 fresh_server: LocalServer) -> None:
    """The client's address (a proxy, as a VIP or a Sentinel-aware client gives it) moves to the
    replica before the replica is promoted: it answers MASTERDOWN until then."""
    replica = replica_of(fresh_server)
    with Proxy(fresh_server.address) as service:
        try:
            q = opener(service.url)
            dlq_id = dead_letter(q)
            replica.wait_synced(fresh_server)
            fresh_server.kill()
            admin(replica).config_set("replica-serve-stale-data", "no")
            service.point_at(replica.address)
            _drop_connections(q, transport)  # cut by the move; nothing was in flight
            backoffs = on_backoff(q, transport, replica.promote)
            new_id = q.requeue_dead_letter(dlq_id)  # not idempotent
            assert backoffs, "the call never met MASTERDOWN"
            assert after_settling(q).dead_letters() == [] and q.submit([group("dl")]) == [new_id]
        finally:
            replica.cleanup(graceful=False)


def test_noreplicas_is_retried_until_enough_replicas_are_back(opener, transport: str,
                                                              fresh_server: LocalServer) -> None:
    q = opener(fresh_server.url)
    dlq_id = dead_letter(q)
    control = admin(fresh_server)
    control.config_set("min-replicas-to-write", 1)
    backoffs = on_backoff(q, transport, lambda: control.config_set("min-replicas-to-write", 0))
    new_id = q.requeue_dead_letter(dlq_id)
    assert backoffs, "the call never met NOREPLICAS"
    assert after_settling(q).dead_letters() == [] and q.submit([group("dl")]) == [new_id]
    control.close()


# -- what is not a refusal -------------------------------------------------------------------------


def test_only_exact_refusal_words_are_refusals(r: redis.Redis, queue_name: str) -> None:
    """BUSYGROUP (a consumer group that exists) or a script's own error ran, or was a bug: never retried."""
    key = f"rollout:{{{queue_name}}}:refusal-probe"
    r.xgroup_create(key, "g", id="0", mkstream=True)
    with pytest.raises(redis.ResponseError) as caught:
        r.xgroup_create(key, "g", id="0")
    assert str(caught.value).startswith("BUSYGROUP") and refusal(caught.value) is None
    with pytest.raises(redis.ResponseError) as caught:
        r.eval("return redis.error_reply('ROLLOUTQ corrupt')", 0)
    assert refusal(caught.value) is None
    r.delete(key)


def test_a_script_error_is_still_raised_at_once(opener, transport: str, fresh_server: LocalServer) -> None:
    q = opener(fresh_server.url)
    control = admin(fresh_server)
    control.delete(q.keys["meta"])
    control.set(q.keys["meta"], "not a hash")  # every script now fails with WRONGTYPE: a bug, not a refusal
    backoffs = on_backoff(q, transport, lambda: None)
    with pytest.raises(ScriptError):
        q.submit([group("x")])
    assert backoffs == [], "a script error is never retried"
    control.close()
