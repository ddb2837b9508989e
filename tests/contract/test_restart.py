"""A Redis restart is a pause, not an error: kill -9 the server (AOF always) between operations.

DESIGN rule 5: every transition is idempotent, so a client resends a call across a lost connection
until its retry window runs out, reloads scripts the restarted server forgot (NOSCRIPT), and raises
OutcomeUnknown (never a guess) when the server stays down or a call is not safe to resend. Nothing
acknowledged before the kill is lost. Each test owns a fresh server (never the session's).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from rollout_queue import AsyncRolloutQueue, OutcomeUnknown, QueueConfig, RetryPolicy, RolloutQueue
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.core.scripts import SCRIPTS
from tests.contract.conftest import SyncView
from tests.contract.worker_support import group, samples

CFG = QueueConfig(worker_timeout_s=30.0, max_attempts=3)
NAME = "restart"


@pytest.fixture
def opener(transport: str, fresh_server: LocalServer) -> Iterator[Callable[..., Any]]:
    """open(retry=None) -> a queue of this test's transport on the test's own server."""
    loop = asyncio.new_event_loop()
    opened: list[Any] = []

    def open_(retry: RetryPolicy | None = None) -> Any:
        if transport == "sync":
            q: Any = RolloutQueue.from_url(fresh_server.url, NAME, CFG, retry=retry)
        else:
            q = SyncView(loop.run_until_complete(AsyncRolloutQueue.from_url(fresh_server.url, NAME, CFG,
                                                                            retry=retry)), loop)
        opened.append(q)
        return q

    yield open_
    for q in opened:
        q.close()
    loop.close()


@pytest.fixture
def admin(fresh_server: LocalServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(fresh_server.url, socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def ledger_state(client: redis.Redis) -> dict[bytes, Any]:
    """Every key of the queue read back by type (no idle times): equal values mean nothing was lost."""
    out: dict[bytes, Any] = {}
    for key in sorted(client.scan_iter(match=QueueKeys(NAME).pattern)):
        if key == QueueKeys(NAME)["clock"].encode():
            continue  # the queue clock moves on its own, and across a restart by design (now_ms.lua)
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            out[key] = client.smembers(key)
        elif kind == b"string":
            out[key] = client.get(key)
        elif kind == b"stream":
            groups = [(g["name"], g["last-delivered-id"], g["pending"]) for g in client.xinfo_groups(key)]
            pending = [(p["message_id"], p["consumer"], p["times_delivered"])
                       for g in groups for p in client.xpending_range(key, g[0], "-", "+", 10_000)]
            out[key] = (client.xrange(key), groups, pending)
        else:
            raise AssertionError(f"unexpected key type {kind!r} for {key!r}")
    return out


def crash(server: LocalServer, admin: redis.Redis) -> None:
    """kill -9 and restart on the same port and directory; the AOF is replayed."""
    server.kill()
    server.restart()
    admin.connection_pool.disconnect()


def hook_retries(q: Any, transport: str) -> threading.Event:
    """An event set when the queue's transport first backs off to retry (the call met a dead server)."""
    retried = threading.Event()
    real = q.driver.sleep
    if transport == "sync":
        def sleep(seconds: float) -> None:
            retried.set()
            real(seconds)
    else:
        async def sleep(seconds: float) -> None:  # type: ignore[misc]
            retried.set()
            await real(seconds)
    q.driver.sleep = sleep
    return retried


def test_no_state_is_lost_across_restarts(opener, fresh_server: LocalServer, admin: redis.Redis) -> None:
    q = opener()
    ids = q.submit([group(f"r{i}") for i in range(3)])
    w = q.worker("w1")
    state = ledger_state(admin)
    crash(fresh_server, admin)
    assert ledger_state(admin) == state
    got = w.reserve(2)  # the first call after the restart reloads the forgotten script
    assert [r.entry_id for r in got] == ids[:2]
    state = ledger_state(admin)
    crash(fresh_server, admin)
    assert ledger_state(admin) == state
    assert w.complete(got[0].receipt, samples(2)) == "buffered"
    assert w.fail(got[1].receipt, "x") == "ready"
    state = ledger_state(admin)
    crash(fresh_server, admin)
    assert ledger_state(admin) == state
    lease = q.lease(1)
    crash(fresh_server, admin)
    lease.commit()
    stats = q.stats()
    assert (stats.committed, stats.ready, stats.backlog, stats.retained, stats.executing_groups) == (1, 1, 1, 1, 0)


def test_scripts_the_server_forgot_are_reloaded(opener, fresh_server: LocalServer, admin: redis.Redis) -> None:
    q = opener()
    [eid] = q.submit([group("ns")])
    crash(fresh_server, admin)
    assert admin.script_exists(SCRIPTS["reserve"].sha) == [False]
    assert [r.entry_id for r in q.worker("w1").reserve(1)] == [eid]
    assert admin.script_exists(SCRIPTS["reserve"].sha) == [True]
    admin.script_flush()  # NOSCRIPT without a reconnect
    assert q.submit([group("ns")]) == [eid]


def test_a_call_made_while_the_server_is_down_succeeds_after_a_restart(opener, transport: str,
                                                                      fresh_server: LocalServer,
                                                                      admin: redis.Redis) -> None:
    q = opener(RetryPolicy(window_s=20.0, first_backoff_s=0.02, max_backoff_s=0.1))
    [eid] = q.submit([group("down")])
    retried = hook_retries(q, transport)

    def restart_once_the_call_has_failed() -> None:
        if retried.wait(timeout=10):
            fresh_server.restart()

    fresh_server.kill()
    thread = threading.Thread(target=restart_once_the_call_has_failed)
    thread.start()
    try:
        got = q.worker("w1").reserve(1)
    finally:
        thread.join(timeout=15)
    assert retried.is_set(), "the call never met the dead server"
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(eid, 1)]
    admin.connection_pool.disconnect()
    pending = admin.xpending_range(QueueKeys(NAME)["src"], "rollout", "-", "+", 10)
    assert [(p["message_id"].decode(), p["consumer"], p["times_delivered"]) for p in pending] == [(eid, b"w1", 1)]


def test_a_server_that_stays_down_past_the_window_raises_outcome_unknown(opener, fresh_server: LocalServer,
                                                                         admin: redis.Redis) -> None:
    q = opener(RetryPolicy(window_s=0.5, first_backoff_s=0.02, max_backoff_s=0.1))
    [eid] = q.submit([group("gone")])
    fresh_server.kill()
    start = time.monotonic()
    with pytest.raises(OutcomeUnknown):
        q.worker("w1").reserve(1)
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 5.0
    fresh_server.restart()
    assert [r.entry_id for r in q.worker("w1").reserve(1)] == [eid]  # nothing ran; the queue works on


def test_a_call_that_is_not_safe_to_resend_raises_at_once(opener, fresh_server: LocalServer) -> None:
    q = opener(RetryPolicy(window_s=30.0))
    fresh_server.kill()
    start = time.monotonic()
    with pytest.raises(OutcomeUnknown):
        q.requeue_dead_letter("1-0")  # a second submit of a dead letter is not idempotent
    assert time.monotonic() - start < 5.0
