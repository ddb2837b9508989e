"""No call holds Redis for longer than its grants need, whatever its arguments (issue 12 item 8).

Measured deterministically, not by the clock: MONITOR lists every command a script runs, so a test
can read how many entries each read inside the script asked for. Before the fix, reserve(20000,
max_samples=2) over a 20k backlog read all 20k entries (~1.5 s with 8 KB entries) to grant one,
and a 150k-group submit was one multi-second script that made every concurrent call fail BUSY.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from tests.contract.worker_support import group

CFG = QueueConfig(max_attempts=10)


def monitored(url: str, action: Callable[[], Any]) -> tuple[Any, list[list[str]]]:
    """Run ``action`` while MONITOR records every command the server runs; (its result, the commands
    run inside scripts, each as its argument list)."""
    mon = redis.Redis.from_url(url)
    lines: list[str] = []
    ready, done = threading.Event(), threading.Event()

    def listen() -> None:
        with mon.monitor() as m:
            ready.set()
            for event in m.listen():
                lines.append(event["command"])
                if "rollout-monitor-stop" in event["command"]:
                    return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    ready.wait(5)
    time.sleep(0.1)
    try:
        result = action()
    finally:
        redis.Redis.from_url(url).echo("rollout-monitor-stop")
        t.join(10)
        done.set()
    return result, [line.split(" ") for line in lines]


def count_arg(cmd: list[str]) -> int | None:
    up = [c.upper() for c in cmd]
    return int(cmd[up.index("COUNT") + 1]) if "COUNT" in up else None


@pytest.fixture
def big_backlog(fresh_server: LocalServer) -> Iterator[RolloutQueue]:
    q = RolloutQueue.from_url(fresh_server.url, "bounded", CFG)
    body = "x" * 8000
    q.submit([SourceGroup(f"g{i}", body, 1) for i in range(3000)])
    try:
        yield q
    finally:
        q.close()


def test_reserve_reads_only_what_it_can_grant(fresh_server: LocalServer, big_backlog: RolloutQueue) -> None:
    w = big_backlog.worker("w1")
    got, cmds = monitored(fresh_server.url, lambda: w.reserve(20_000, max_samples=2))
    assert len(got) == 2
    reads = [count_arg(c) for c in cmds if c[0].strip('"').upper() in ('XRANGE', 'XREADGROUP')]
    assert reads and max(r for r in reads if r is not None) <= 2 + 32  # grants + lookahead, not 20k


def test_reserve_grants_at_most_a_bounded_batch_per_call(fresh_server: LocalServer, big_backlog: RolloutQueue) -> None:
    w = big_backlog.worker("w1")
    got, cmds = monitored(fresh_server.url, lambda: w.reserve(20_000))
    assert len(got) == 64  # RESERVE_MAX_GROUPS: "up to max_groups"
    reads = [count_arg(c) for c in cmds if c[0].strip('"').upper() in ('XRANGE', 'XREADGROUP')]
    assert max(r for r in reads if r is not None) <= 64 + 32
    assert sum(r.group.n for r in got) == 64 and big_backlog.stats().executing_groups == 64


def test_reserve_of_huge_entries_stops_at_its_byte_budget(fresh_server: LocalServer) -> None:
    q = RolloutQueue.from_url(fresh_server.url, "huge", CFG)
    q.submit([SourceGroup(f"h{i}", "y" * (1 << 20), 1) for i in range(12)])  # 1 MiB prompts
    got = q.worker("w1").reserve(12)
    assert 1 <= len(got) <= 9  # ~8 MiB per reply (RESERVE_MAX_BYTES), never the 12 MiB asked for
    assert len(got) + len(q.worker("w1").reserve(12)) <= 12
    q.close()


def test_a_huge_submit_is_sent_in_bounded_calls_in_order() -> None:
    """The flow itself: every submit call carries at most SUBMIT_BATCH groups, and the answers are
    stitched back in the order given."""
    keys_ = QueueKeys("unit")
    groups = [SourceGroup(f"s{i}", "p", 1) for i in range(1000)]
    flow = flows.submit(keys_, groups, 1 << 20)
    calls, out = 0, None
    reply: Any = None
    sent = 0
    while True:
        try:
            op = flow.send(reply)
        except StopIteration as stop:
            out = stop.value
            break
        assert isinstance(op, p.Call) and op.script.name == "submit"
        n = len(op.args) // 5
        assert 1 <= n <= flows.SUBMIT_BATCH
        reply = [b"ok", n] + [f"{sent + i}-0".encode() for i in range(n)]
        sent += n
        calls += 1
    assert calls == 4 and out == [f"{i}-0" for i in range(1000)]


def test_a_submit_of_20k_groups_lets_other_calls_through(fresh_server: LocalServer) -> None:
    """Bounded calls interleave with other clients' calls (none fails BUSY) and dedupe as one call."""
    q = RolloutQueue.from_url(fresh_server.url, "wide", CFG)
    other = RolloutQueue.from_url(fresh_server.url, "wide")
    groups = [group(f"w{i}", n=1) for i in range(20_000)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            try:
                other.stats()
            except BaseException as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(exc)
                return

    t = threading.Thread(target=poll)
    t.start()
    try:
        ids = q.submit(groups)
    finally:
        stop.set()
        t.join()
    assert not errors and len(ids) == len(set(ids)) == 20_000
    assert q.submit(groups[:3] + groups[-2:]) == ids[:3] + ids[-2:]  # the same source_ids: stored once
    assert q.stats().submitted == 20_000
    q.close()
    other.close()


@pytest.mark.parametrize("distinct", [3, 100])
def test_stats_counts_the_buffer_by_version_without_reading_it(fresh_server: LocalServer, distinct: int) -> None:
    """stats over a 30k-group buffer: a first member and a ZCOUNT per distinct version (at most 64,
    the newer rest counted at the 65th), never a read of the whole bufver set; the counts exact."""
    q = RolloutQueue.from_url(fresh_server.url, "stats-big", QueueConfig(max_staleness=None))
    q.publish_version(distinct - 1, "/w")
    r = redis.Redis.from_url(fresh_server.url)
    members = {f"9-{i}": (i % distinct) * 2**32 + i for i in range(30_000)}  # what buffer_score packs
    for start in range(0, len(members), 5000):
        r.zadd(q.keys["bufver"], dict(list(members.items())[start:start + 5000]))
    st, cmds = monitored(fresh_server.url, q.stats)
    reads = [c for c in cmds if "bufver" in " ".join(c)]
    assert not any(c[0].strip('"').upper() in ("ZRANGE", "ZRANGEBYSCORE") and "LIMIT" not in " ".join(c).upper()
                   for c in reads)
    assert len(reads) <= 2 * 64 + 2
    per = 30_000 // distinct
    if distinct <= 64:
        assert st.buffer_versions == tuple((v, per) for v in range(distinct))
        assert st.staleness_max == distinct - 1 and st.staleness_mean == pytest.approx((distinct - 1) / 2)
    else:  # 64 listed, the 36 newer versions counted together at version 64
        assert st.buffer_versions[:64] == tuple((v, per) for v in range(64))
        assert st.buffer_versions[64] == (64, 30_000 - 64 * per)
        assert st.staleness_max == distinct - 1
    r.close()
    q.close()
