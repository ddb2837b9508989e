"""Contract of settle_parked.lua: parked -> settled(dead) or settled(filtered).

A worker's script cannot XACK (issue 29 item 7: the worker role holds no XACK, XDEL or XADD to the
dead letters), so fail / filter / reject / reserve / close_worker park what they settle: the
parking consumer (@dead, @filtered) owns it, with a record in ``parked``, and its ledger line and
counters already say its settlement. settle_parked (the reaper's pass; trainer and admin too)
finishes it. Header outcomes: {'ok', settled, requeued, done}. Replays settle nothing twice; a
batch is bounded; a garbage record still settles; an entry claimed to a parking consumer without a
record was not parked and goes back to ready, not counted.
"""

from __future__ import annotations

import redis

from rollout_queue import QueueConfig
from rollout_queue.ops import verify
from tests.contract.lifecycle import check_header, reserve_all, submit
from tests.contract.worker_support import call, counter, group, history, keys, ledger, pel, ready_ids

CFG = QueueConfig(max_attempts=1, max_retained_groups=200)


def test_header_matches_builder() -> None:
    check_header("settle_parked", ["src", "parked", "dlq", "settled", "ledger", "history", "ready", "wake_work",
                                   "counters"], ["count"])


def _park_dead(q, count: int) -> list[str]:
    ids = submit(q, count)
    w = q.worker("w1")
    for res in reserve_all(w, count):
        assert w.fail(res.receipt, "engine crashed") == "dead"
    return ids


def test_a_parked_dead_letter_counts_dead_and_is_settled_once(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = _park_dead(q, 1)
    k = keys(queue_name)
    assert pel(raw, queue_name) == {eid: ("@dead", 1)} and raw.xlen(k["dlq"]) == 0
    assert raw.hget(k["parked"], eid) == b"dead|1|w1|" + raw.hget(k["parked"], eid).split(b"|")[3] + b"|max_attempts"
    s = q.stats()
    assert (s.dead, s.retained, s.backlog) == (1, 0, 0)  # counted dead now; not backlog though in the stream
    report = q.run(verify.verify(q.keys))
    assert report.states.get("dead") == 1 and not report.problems
    assert call(q, "settle_parked", count=10) == ["ok", 1, 0, 1]
    assert pel(raw, queue_name) == {} and raw.hlen(k["parked"]) == 0 and raw.xlen(k["src"]) == 0
    [letter] = q.dead_letters()
    assert (letter.entry_id, letter.reason, letter.attempt, letter.worker_id) == (eid, "max_attempts", 1, "w1")
    assert [a["r"] for a in letter.history] == ["engine crashed"] and letter.group is not None
    assert ledger(raw, queue_name, eid) == "s|dead|1|w1|max_attempts"
    # Replays: the call again, and the worker's fail again, settle nothing twice.
    before = counter(raw, queue_name, "dead")
    assert call(q, "settle_parked", count=10) == ["ok", 0, 0, 1]
    assert q.worker("w1").fail(letter_receipt(eid), "engine crashed") == "replay"
    assert counter(raw, queue_name, "dead") == before and raw.xlen(k["dlq"]) == 1
    assert q.stats().counters.get("parked", 0) == 0


def letter_receipt(eid: str):
    from rollout_queue import Receipt

    return Receipt(eid, 1, "w1")


def test_batches_are_bounded_and_done_says_when_none_is_left(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    _park_dead(q, 5)
    w = q.worker("w2")
    [eid] = submit(q, 1)
    [res] = w.reserve(1)
    assert w.filter(res.receipt, "zero_std") == "filtered"
    assert call(q, "settle_parked", count=2) == ["ok", 2, 0, 0]
    assert call(q, "settle_parked", count=3) == ["ok", 3, 0, 0]  # the dead ones first, then the filtered
    assert call(q, "settle_parked", count=3) == ["ok", 1, 0, 1]
    assert raw.xlen(keys(queue_name)["dlq"]) == 5 and pel(raw, queue_name) == {}
    assert ledger(raw, queue_name, eid) == "s|filtered|1|w2|zero_std"
    s = q.stats()
    assert (s.dead, s.filtered, s.retained, s.backlog) == (5, 1, 0, 0)
    assert call(q, "settle_parked", count=10_000)[0] == "ok"  # clamped, not refused


def test_a_garbage_record_still_settles_from_the_ledger(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [a, b] = _park_dead(q, 2)
    k = keys(queue_name)
    raw.hset(k["parked"], a, "garbage")
    raw.hset(k["parked"], b, "filtered|x|y")  # the owner (@dead) says the settlement, not the record
    assert call(q, "settle_parked", count=10) == ["ok", 2, 0, 1]
    letters = {d.entry_id: d for d in q.dead_letters()}
    assert {letters[a].reason, letters[b].reason} == {"max_attempts"}
    assert counter(raw, queue_name, "dead") == 2 and pel(raw, queue_name) == {}


def test_an_entry_claimed_to_a_parking_consumer_without_a_record_goes_back_to_ready(
        open_queue, raw: redis.Redis, queue_name: str) -> None:
    """A hostile (or hand-made) XCLAIM to @dead is not a settlement: the group is requeued, not counted."""
    q = open_queue(QueueConfig(max_attempts=3))
    [eid] = q.submit([group("hostile", n=2)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    k = keys(queue_name)
    raw.xclaim(k["src"], "rollout", "@dead", 0, [eid], justid=True)
    assert call(q, "settle_parked", count=10) == ["ok", 0, 1, 1]
    assert pel(raw, queue_name) == {eid: ("@ready", 1)} and ready_ids(raw, queue_name) == [eid]
    assert raw.xlen(k["dlq"]) == 0 and counter(raw, queue_name, "dead") == 0
    assert history(raw, queue_name, eid)["f"] == 0  # not counted against the group
    [again] = q.worker("w2").reserve(1)
    assert again.entry_id == eid and again.receipt.attempt == 2


def test_the_reaper_pass_settles_what_workers_parked(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    _park_dead(q, 3)
    assert q.reap().settled == 3
    assert raw.xlen(keys(queue_name)["dlq"]) == 3 and pel(raw, queue_name) == {}
