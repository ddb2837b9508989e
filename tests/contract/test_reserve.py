"""Contract of reserve.lua: ready, then backlog -> executing; the attempt is the PEL delivery count.

Header outcomes: 'ok' (granted, or a replay of the same request id), and the refusals 'held',
'backpressure', 'capacity', 'admission', 'retained_full', 'empty', 'retry'. A refusal may only
refresh the caller's heartbeat (workers) and replay record (reserves): every other key stays
byte-identical. DESIGN: requeued work keeps submission order; three capacity bounds; admission
control; malformed reservations are dead-lettered and never block the good ones behind them.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import redis

from rollout_queue import QueueConfig, Receipt, RolloutQueue
from rollout_queue.ops import actions
from rollout_queue.core.errors import GroupTooLarge
from rollout_queue.core import protocol as p
from tests.contract.conftest import snapshot
from tests.contract.worker_support import (
    counter,
    entry_ids,
    group,
    keys,
    pel,
    raw_reserve,
    ready_ids,
    samples,
    send,
)
from tests.helpers import wait_until, after_settling

CFG = QueueConfig(max_attempts=10)  # the default worker_timeout_s keeps the reaper out
REFUSAL_TOUCHES = ("workers", "reserves")


def assert_refused(q: Any, raw: redis.Redis, queue_name: str, status: str, worker_id: str = "w1",
                   **kwargs: Any) -> None:
    """A reserve call answers ``status``, grants nothing and leaves every other key byte-identical,
    but for an admission refusal's one count of ``admission_waits`` (what pace mode measures)."""
    touches = REFUSAL_TOUCHES + (("counters",) if status == "admission" else ())
    counters_key = f"rollout:{{{queue_name}}}:counters"
    counters_before = {k: v for k, v in raw.hgetall(counters_key).items() if k != b"admission_waits"}
    waits_before = int(raw.hget(counters_key, "admission_waits") or 0)
    before = snapshot(raw, queue_name, exclude=touches)
    reply = raw_reserve(q, worker_id, request_id=f"refused-{uuid.uuid4().hex}", **kwargs)
    assert (reply.status, reply.granted, reply.dead_lettered) == (status, (), 0)
    assert reply.wake_id  # a refused caller can block on the wake stream from here
    assert snapshot(raw, queue_name, exclude=touches) == before
    assert {k: v for k, v in raw.hgetall(counters_key).items() if k != b"admission_waits"} == counters_before
    waits = int(raw.hget(counters_key, "admission_waits") or 0)
    assert waits == waits_before + (1 if status == "admission" else 0)


def test_grants_backlog_to_the_worker_at_attempt_one(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    groups = [group(f"g{i}", n=3) for i in range(3)]
    ids = q.submit(groups)
    got = q.worker("w1").reserve(2)
    assert entry_ids(got) == ids[:2]
    assert [r.group for r in got] == groups[:2]  # pristine copies
    assert all(r.receipt.attempt == 1 and r.receipt.worker_id == "w1" and r.version == 0 for r in got)
    assert pel(raw, queue_name) == {ids[0]: ("w1", 1), ids[1]: ("w1", 1)}
    stats = q.stats()
    assert (stats.backlog, stats.executing_groups, stats.executing_samples, stats.retained) == (1, 2, 6, 2)
    assert raw.zscore(keys(queue_name)["workers"], "w1") is not None


def test_empty_queue_grants_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    assert q.worker("w1").reserve(3) == []
    assert_refused(q, raw, queue_name, "empty")


def test_ready_comes_before_backlog_and_attempt_is_the_delivery_count(open_queue, raw: redis.Redis,
                                                                     queue_name: str) -> None:
    q = open_queue(CFG)
    a, b = q.submit([group("a"), group("b")])
    w = q.worker("w1")
    [first] = w.reserve(1)
    assert first.receipt.attempt == 1
    w.abort(first.receipt)
    w.fail(w.reserve(1)[0].receipt, "boom")  # the requeued `a` again, not the backlog's `b`
    got = w.reserve(2)
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(a, 3), (b, 1)]
    assert pel(raw, queue_name) == {a: ("w1", 3), b: ("w1", 1)}


def test_requeued_work_keeps_submission_order(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group(f"o{i}") for i in range(4)])
    w = q.worker("w1")
    got = {r.entry_id: r for r in w.reserve(4)}
    for eid in reversed(ids):  # requeue newest first
        w.abort(got[eid].receipt)
    assert ready_ids(raw, queue_name) == ids
    assert entry_ids(q.worker("w2").reserve(2)) == ids[:2]
    assert entry_ids(q.worker("w3").reserve(2)) == ids[2:]


def test_max_executing_samples_caps_the_grant(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(max_executing_samples=4))
    ids = q.submit([group(f"c{i}", n=2) for i in range(3)])
    w = q.worker("w1")
    got = w.reserve(3)
    assert entry_ids(got) == ids[:2]
    assert q.stats().executing_samples == 4
    assert_refused(q, raw, queue_name, "capacity", max_groups=3)
    w.complete(got[0].receipt, samples(2))  # the attempt's terminal reopens its samples
    assert entry_ids(w.reserve(3)) == ids[2:]


def test_a_requeued_group_that_does_not_fit_the_queue_is_not_overtaken(open_queue, raw: redis.Redis,
                                                                     queue_name: str) -> None:
    """Ready is served in submission order: when the *queue's* sample bound is what a big requeued
    group waits for, smaller ones behind it do not take the room (it frees as attempts end)."""
    q = open_queue(CFG.replace(max_executing_samples=3))
    a, b, c, d = q.submit([group("a", n=2), group("b", n=1), group("c", n=1), group("d", n=1)])
    assert entry_ids(q.worker("w1").reserve(1)) == [a]
    assert entry_ids(q.worker("w2").reserve(1)) == [b]
    q.worker("w1").abort(Receipt(a, 1, "w1"))  # a is back at its place in ready; 1 sample executing
    # Too large for w3's own cap: skipped for that caller only, c behind it is granted.
    assert entry_ids(q.worker("w3").reserve(1, max_samples=1)) == [c]
    # 2 executing, 1 free: a (n=2) waits for the queue's room, and d (n=1) does not overtake it.
    assert_refused(q, raw, queue_name, "capacity", worker_id="w4", max_groups=2)
    q.worker("w2").abort(Receipt(b, 1, "w2"))  # 2 free: a first, then b does not fit any more
    assert [(r.entry_id, r.receipt.attempt) for r in q.worker("w4").reserve(2)] == [(a, 2)]


def test_a_group_too_large_for_the_caller_is_skipped_not_a_wall(open_queue, raw: redis.Redis,
                                                                queue_name: str) -> None:
    """Issue 12 item 2: one group whose n exceeds every caller's free slots must not freeze the fleet.
    Three workers reserve(5, max_samples=4) behind a group of n=8: they get the small groups, the big
    one waits in ready at its place, and a caller that queues samples (overcommit) or has room takes it."""
    q = open_queue(CFG)
    big, *small = q.submit([group("big", n=8)] + [group(f"s{i}", n=1) for i in range(5)])
    got = [r.entry_id for w in ("w1", "w2", "w3") for r in q.worker(w).reserve(5, max_samples=4)]
    assert got == small[:4] + small[4:]  # all five small groups, in order; big is never granted
    assert ready_ids(raw, queue_name) == [big]
    assert pel(raw, queue_name)[big] == ("@ready", 0)  # parked at attempt 0: its first grant is attempt 1
    refused = raw_reserve(q, "w4", max_groups=5, max_samples=4)
    assert (refused.status, refused.granted) == ("oversized", ()) and refused.wake_id
    stats = q.stats()
    assert stats.counters["oversize_skipped"] >= 3 and stats.retained == 6
    (taken,) = q.worker("w5").reserve(5, max_samples=4, overcommit=True)
    assert (taken.entry_id, taken.receipt.attempt) == (big, 1)
    assert q.stats().counters["oversize_granted"] == 1 and q.stats().executing_samples == 13


def test_a_caller_with_room_takes_the_skipped_group_first(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    big, s0, s1 = q.submit([group("big", n=8), group("s0", n=1), group("s1", n=1)])
    assert entry_ids(q.worker("w1").reserve(1, max_samples=4)) == [s0]
    assert entry_ids(q.worker("w2").reserve(3, max_samples=9)) == [big, s1]  # submission order


def test_overcommit_grants_at_most_one_group_beyond_the_cap(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group("a", n=8), group("b", n=8), group("c", n=1)])
    assert entry_ids(q.worker("w1").reserve(3, max_samples=4, overcommit=True)) == ids[:1]
    assert entry_ids(q.worker("w2").reserve(3, max_samples=8, overcommit=True)) == ids[1:2]  # b fits; c does not


def test_per_call_max_samples(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group(f"m{i}", n=2) for i in range(4)])
    w = q.worker("w1")
    assert entry_ids(w.reserve(4, max_samples=5)) == ids[:2]
    assert entry_ids(w.reserve(4, max_samples=2)) == ids[2:3]
    # Too large for this call and nothing granted yet: left (parked in ready) for another caller.
    refused = raw_reserve(q, "w1", max_groups=4, max_samples=1)
    assert (refused.status, refused.granted) == ("oversized", ()) and ready_ids(raw, queue_name) == ids[3:]
    assert entry_ids(w.reserve(4)) == ids[3:]  # 0: only the queue's bound


def test_max_retained_groups_is_taken_at_first_delivery_and_reopened_by_settlement(
        open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(max_retained_groups=2))
    ids = q.submit([group(f"r{i}") for i in range(3)])
    w = q.worker("w1")
    first, second = w.reserve(3)
    assert [first.entry_id, second.entry_id] == ids[:2]
    assert_refused(q, raw, queue_name, "retained_full")
    w.complete(first.receipt, samples(2))  # completed is still retained
    assert_refused(q, raw, queue_name, "retained_full")
    w.abort(second.receipt)  # ready work is already retained: it may be granted again
    [again] = w.reserve(3)
    assert (again.entry_id, again.receipt.attempt) == (ids[1], 2)
    w.filter(again.receipt, "zero_std")  # settlement reopens the slot
    assert entry_ids(w.reserve(3)) == ids[2:]
    assert q.stats().retained == 2


def test_backpressure_while_the_buffer_is_full(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(max_completed_groups=1))
    ids = q.submit([group(f"b{i}") for i in range(3)])
    w = q.worker("w1")
    first, _ = w.reserve(2)
    w.complete(first.receipt, samples(2))
    assert_refused(q, raw, queue_name, "backpressure")
    lease = q.lease(1)
    assert lease is not None
    assert entry_ids(w.reserve(1)) == ids[2:]


def test_admission_control_bounds_work_ahead_of_training(open_queue, raw: redis.Redis, queue_name: str) -> None:
    # limit = (version + max_staleness + 1) * batch_groups = (0 + 0 + 1) * 2 before any publish
    q = open_queue(CFG.replace(batch_groups=2, max_staleness=0))
    ids = q.submit([group(f"ad{i}") for i in range(6)])
    w = q.worker("w1")
    got = w.reserve(6)
    assert entry_ids(got) == ids[:2]
    assert_refused(q, raw, queue_name, "admission", max_groups=6)
    for r in got:
        w.complete(r.receipt, samples(2))
    lease = q.lease(2)
    lease.commit()
    assert q.stats().committed == 2 and q.stats().retained == 0
    assert_refused(q, raw, queue_name, "admission", max_groups=6)  # committed still counts
    q.publish_version(1)  # limit (1 + 0 + 1) * 2 = 4, room 4 - 2 committed = 2
    got = w.reserve(6)
    assert entry_ids(got) == ids[2:4]
    assert all(r.version == 1 for r in got)
    assert_refused(q, raw, queue_name, "admission", max_groups=6)


def test_admission_limit_counts_max_staleness(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(batch_groups=2, max_staleness=2))  # (0 + 2 + 1) * 2 = 6
    ids = q.submit([group(f"ms{i}") for i in range(8)])
    assert entry_ids(q.worker("w1").reserve(8)) == ids[:6]
    assert_refused(q, raw, queue_name, "admission")


def test_an_active_hold_grants_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group("h")])
    hold = q.hold()
    assert q.worker("w1").reserve(1) == []
    assert_refused(q, raw, queue_name, "held")
    hold.release()
    assert entry_ids(q.worker("w1").reserve(1)) == ids


def _blocked_clients(raw: redis.Redis) -> int:
    return int(raw.info("clients")["blocked_clients"])


def test_blocking_reserve_returns_when_work_arrives(open_queue, raw: redis.Redis, queue_name: str,
                                                   redis_url: str) -> None:
    q = open_queue(CFG)
    producer = RolloutQueue.from_url(redis_url, queue_name)
    submitted: list[str] = []

    def produce() -> None:
        wait_until(lambda: _blocked_clients(raw) >= 1, message="the reserver to block")
        submitted.extend(producer.submit([group("late")]))

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        start = time.monotonic()
        got = q.worker("w1").reserve(1, block_ms=10_000)
        elapsed = time.monotonic() - start
    finally:
        thread.join(timeout=10)
        producer.close()
    assert entry_ids(got) == submitted
    # Woken by the submit, not by a 2 s XREAD chunk ending (flows.MAX_BLOCK_CHUNK_MS) or by block_ms.
    assert elapsed < 1.5, f"reserve waited {elapsed:.2f}s for work submitted while it blocked"


def test_blocking_reserve_returns_nothing_after_block_ms(open_queue) -> None:
    q = open_queue(CFG)
    start = time.monotonic()
    assert q.worker("w1").reserve(1, block_ms=300) == []
    elapsed = time.monotonic() - start
    assert 0.29 <= elapsed < 2.0


def test_a_replayed_request_returns_the_same_grants_and_nothing_more(open_queue, raw: redis.Redis,
                                                                    queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group(f"rp{i}") for i in range(4)])
    built = p.build(q.keys, "reserve", worker_id="w1", max_groups=2, max_samples=0, request_id="same-call", overcommit=0)
    first = p.parse_reserve(send(q, built), "w1")
    before = snapshot(raw, queue_name, exclude=("workers",))
    second = p.parse_reserve(send(q, built), "w1")
    assert first.status == second.status == "ok"
    assert [(r.entry_id, r.attempt) for r, _ in first.granted] == [(i, 1) for i in ids[:2]]
    assert second.granted == first.granted
    assert snapshot(raw, queue_name, exclude=("workers",)) == before
    assert q.stats().backlog == 2


def test_a_replay_returns_only_grants_the_worker_still_owns(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group(f"ro{i}") for i in range(3)])
    built = p.build(q.keys, "reserve", worker_id="w1", max_groups=2, max_samples=0, request_id="call-7", overcommit=0)
    first = p.parse_reserve(send(q, built), "w1")
    q.worker("w1").complete(first.granted[0][0], samples(2))
    again = p.parse_reserve(send(q, built), "w1")
    assert [r.entry_id for r, _ in again.granted] == [ids[1]]
    assert pel(raw, queue_name)[ids[0]] == ("@done", 1)


def _xadd(raw: redis.Redis, queue_name: str, fields: dict[str, Any]) -> str:
    return raw.xadd(keys(queue_name)["src"], fields).decode()


GOOD_PARENTS = '[{"slot":0,"uid":"x/0"},{"slot":1,"uid":"x/1"}]'
GARBAGE = {
    "missing parents": ({"v": "1", "sid": "x", "n": "2", "g": '{"prompt":"p"}'}, "parents are not a JSON list"),
    "missing source_id": ({"v": "1", "n": "2", "p": GOOD_PARENTS, "g": '{"prompt":"p"}'}, "no source_id"),
    "missing body": ({"v": "1", "sid": "x", "n": "2", "p": GOOD_PARENTS}, "no body"),
    "missing n": ({"v": "1", "sid": "x", "p": GOOD_PARENTS, "g": '{"prompt":"p"}'}, "bad parent count"),
    "wrong parent count": ({"v": "1", "sid": "x", "n": "3", "p": GOOD_PARENTS, "g": "{}"}, "2 parents for n=3"),
    "duplicate slots": ({"v": "1", "sid": "x", "n": "2", "p": '[{"slot":0,"uid":"a"},{"slot":0,"uid":"b"}]',
                         "g": "{}"}, "duplicate parent identity"),
    "duplicate uids": ({"v": "1", "sid": "x", "n": "2", "p": '[{"slot":0,"uid":"a"},{"slot":1,"uid":"a"}]',
                        "g": "{}"}, "duplicate parent identity"),
    "parent without uid": ({"v": "1", "sid": "x", "n": "1", "p": '[{"slot":0}]', "g": "{}"}, "without uid"),
    "unknown schema": ({"v": "2", "sid": "x", "n": "2", "p": GOOD_PARENTS, "g": "{}"}, "unknown schema version 2"),
    "non-JSON parents": ({"v": "1", "sid": "x", "n": "2", "p": "slot0,slot1", "g": "{}"}, "not a JSON list"),
    "body not orjson": ({"v": "1", "sid": "x", "n": "2", "p": GOOD_PARENTS, "g": "{not json"}, "undecodable"),
    "body with bad token ids": ({"v": "1", "sid": "x", "n": "2", "p": GOOD_PARENTS,
                                 "g": '{"prompt":"p","prompt_token_ids":5}'}, "malformed_reservation"),
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_is_dead_lettered_and_never_blocks_the_good_entry_behind_it(
        open_queue, raw: redis.Redis, queue_name: str, kind: str) -> None:
    q = open_queue(CFG)
    fields, reason = GARBAGE[kind]
    bad = _xadd(raw, queue_name, fields)
    [good] = q.submit([group("good")])
    got = q.worker("w1").reserve(1)
    assert entry_ids(got) == [good]
    [dead] = after_settling(q).dead_letters()
    assert dead.entry_id == bad and dead.reason.startswith("malformed_reservation") and reason in dead.reason
    assert dead.fields == {k.encode(): v.encode() for k, v in fields.items()}  # the pristine payload
    assert pel(raw, queue_name) == {good: ("w1", 1)}
    assert [i.decode() for i, _ in raw.xrange(keys(queue_name)["src"])] == [good]
    stats = q.stats()
    assert (stats.dead, stats.retained, stats.executing_groups, stats.executing_samples) == (1, 1, 1, 2)


def test_a_long_run_of_garbage_is_cleared_across_calls(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    fields, _ = GARBAGE["unknown schema"]
    for _ in range(40):
        _xadd(raw, queue_name, fields)
    [good] = q.submit([group("good")])
    first = raw_reserve(q, "w1")
    assert (first.status, first.granted) == ("retry", ())  # dead-lettered some: call again at once
    assert first.dead_lettered > 0
    assert entry_ids(q.worker("w1").reserve(1)) == [good]
    assert q.stats().dead == 40 and len(after_settling(q).dead_letters()) == 40


def test_a_group_larger_than_max_executing_samples_is_refused_at_submit(open_queue, raw: redis.Redis,
                                                                      queue_name: str) -> None:
    """Issue 12 item 9: such a group could never run; stored, it was dead-lettered at its first
    reserve. submit refuses the whole call (every group checked first) and writes nothing."""
    q = open_queue(CFG.replace(max_executing_samples=4))
    before = snapshot(raw, queue_name)
    with pytest.raises(GroupTooLarge) as exc:
        q.submit([group("ok", n=4), group("big", n=5)])
    assert (exc.value.source_id, exc.value.n, exc.value.limit, exc.value.partitions) == ("big", 5, 4, 1)
    assert "raise max_executing_samples to >= 5" in str(exc.value)
    assert snapshot(raw, queue_name) == before
    assert q.stats().backlog == 0 and after_settling(q).dead_letters() == []
    [ok] = q.submit([group("ok", n=4)])
    assert entry_ids(q.worker("w1").reserve(1)) == [ok]


def test_a_group_the_bound_was_lowered_under_is_dead_lettered(open_queue, raw: redis.Redis,
                                                             queue_name: str) -> None:
    """submit checks the client's config; an operator may lower max_executing_samples afterwards
    (``config set``). reserve still dead-letters what can never run, and it blocks nothing."""
    q = open_queue(CFG.replace(max_executing_samples=8))
    big, ok = q.submit([group("big", n=5), group("ok", n=4)])
    q.run(actions.set_config(q.keys, {"max_executing_samples": 4}))
    assert entry_ids(q.worker("w1").reserve(2)) == [ok]
    [dead] = after_settling(q).dead_letters()
    assert (dead.entry_id, dead.group) == (big, group("big", n=5))
    assert "exceeds max_executing_samples" in dead.reason


def test_a_ghost_in_ready_is_dropped_and_does_not_block(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [good] = q.submit([group("g")])
    raw.zadd(keys(queue_name)["ready"], {"1-1": 0})
    assert entry_ids(q.worker("w1").reserve(1)) == [good]
    assert ready_ids(raw, queue_name) == []
    assert counter(raw, queue_name, "ghosts") == 1


def test_bad_arguments_are_refused_before_any_call(open_queue) -> None:
    q = open_queue(CFG)
    with pytest.raises(ValueError):
        q.worker("@ready").reserve(1)
    with pytest.raises(ValueError):
        q.worker("w1").reserve(0)
