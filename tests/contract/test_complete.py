"""Contract of complete.lua: executing -> completed: the attempt's samples enter the buffer.

Header outcomes: {'ok', 'buffered' | 'replay' | 'evicted_self', evicted}, {'stale_receipt', ...}
(nothing written), {'payload_too_large', ...} (nothing kept, still executing) and
{'malformed', detail, 'ready' | 'dead'}. The payload, staged by the worker in the call's MULTI at
rollout:{q}:payload:<entry ID>:<attempt>, is kept exactly while that attempt is buffered (or leased):
every refusal and eviction deletes it, a replay of a live completion keeps it byte-identical.
DESIGN rule 1 (exact receipts), rule 3 (every output names a parent slot, every slot has one;
one-to-many is fine), rule 4 (malformed counts toward max_attempts; overflow does not) and the
overflow victim: the stalest of buffered + arriving, ties to the earliest arrival.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from rollout_queue import MalformedCompletion, PayloadTooLarge, QueueConfig, Sample, ScriptError, StaleReceipt
from rollout_queue.core.codec import decode_completion, encode_completion
from tests.contract.conftest import snapshot
from tests.contract.worker_support import (
    attempt_of,
    buffer_ids,
    call,
    call_complete,
    counter,
    group,
    history,
    keys,
    ledger,
    payload_keys,
    pel,
    ready_ids,
    samples,
    stored_payload,
)
from tests.helpers import wait_until, after_settling

# The default worker_timeout_s (60 s) keeps the reaper out of every test but the one about it.
CFG = QueueConfig(max_attempts=3, max_payload_bytes=600)


def _reserve_one(q: Any, n: int = 2, worker_id: str = "w1", sid: str = "c") -> tuple[Any, Any]:
    [eid] = q.submit([group(sid, n=n)])
    w = q.worker(worker_id)
    [res] = w.reserve(1)
    assert res.entry_id == eid
    return w, res


def test_completion_is_buffered_and_owned_by_done(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_one(q, n=3)
    out = samples(3, version=0)
    assert w.complete(res.receipt, out) == "buffered"
    eid = res.entry_id
    assert pel(raw, queue_name) == {eid: ("@done", 1)}
    assert buffer_ids(raw, queue_name) == [eid]
    assert raw.zscore(keys(queue_name)["bufver"], eid) is not None
    stored = raw.get(keys(queue_name).payload(eid, 1))  # the attempt's payload key, as the worker staged it
    assert stored == encode_completion(out) and decode_completion(stored) == tuple(out)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(eid, 1)}
    assert ledger(raw, queue_name, eid) == "a|1|w1|completed"
    assert raw.xlen(keys(queue_name)["wake_done"]) == 1
    stats = q.stats()
    assert (stats.completed, stats.executing_groups, stats.executing_samples, stats.retained) == (1, 0, 0, 1)


def test_many_outputs_per_slot_are_valid(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_one(q, n=2)
    out = [Sample(0, (1,)), Sample(0, (2, 3)), Sample(1, (4,)), Sample(0, ())]
    assert w.complete(res.receipt, out) == "buffered"
    assert decode_completion(stored_payload(raw, queue_name, res.entry_id)) == tuple(out)
    lease = q.lease(1)
    assert lease.groups[0].samples == tuple(out)


@pytest.mark.parametrize("slots, detail", [([0, 1, 2], "output names slot 2 outside 0..1"),
                                           ([0, 0], "1 of 2 slots have no output")])
def test_a_malformed_completion_requeues_the_group_and_counts(open_queue, raw: redis.Redis, queue_name: str,
                                                              slots: list[int], detail: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_one(q, n=2)
    with pytest.raises(MalformedCompletion) as info:
        w.complete(res.receipt, [Sample(s, (1,)) for s in slots])
    assert (info.value.entry_id, info.value.detail, info.value.requeued_to) == (res.entry_id, detail, "ready")
    eid = res.entry_id
    assert pel(raw, queue_name) == {eid: ("@ready", 1)}  # still owned: by the queue, not the worker
    assert ready_ids(raw, queue_name) == [eid]
    # The staged payload of the refused attempt is deleted with it: no payload key of the entry is left.
    assert buffer_ids(raw, queue_name) == [] and payload_keys(raw, queue_name, eid) == set()
    assert history(raw, queue_name, eid)["f"] == 1
    assert ledger(raw, queue_name, eid) == "a|1|w1|malformed"
    stats = q.stats()
    assert (stats.terminals["malformed"], stats.executing_groups, stats.executing_samples) == (1, 0, 0)
    [again] = w.reserve(1)
    assert (again.entry_id, again.receipt.attempt) == (eid, 2)


def test_malformed_completions_reach_max_attempts_and_dead_letter(open_queue, raw: redis.Redis,
                                                                  queue_name: str) -> None:
    q = open_queue(CFG.replace(max_attempts=2))
    w, res = _reserve_one(q, n=2)
    with pytest.raises(MalformedCompletion):
        w.complete(res.receipt, [Sample(5, (1,))])
    [res2] = w.reserve(1)
    with pytest.raises(MalformedCompletion) as info:
        w.complete(res2.receipt, [Sample(0, (1,))])
    assert info.value.requeued_to == "dead"
    [dead] = after_settling(q).dead_letters()
    assert (dead.entry_id, dead.reason, dead.group) == (res.entry_id, "max_attempts", group("c", n=2))
    assert [(h["a"], h["t"]) for h in dead.history] == [(1, "malformed"), (2, "malformed")]
    assert pel(raw, queue_name) == {}


@pytest.mark.parametrize("max_attempts, where", [(3, "ready"), (1, "dead")])
def test_an_empty_completion_is_malformed(open_queue, raw: redis.Redis, queue_name: str, max_attempts: int,
                                          where: str) -> None:
    q = open_queue(CFG.replace(max_attempts=max_attempts))
    w, res = _reserve_one(q)
    with pytest.raises(MalformedCompletion) as info:
        w.complete(res.receipt, [])
    assert info.value.requeued_to == where
    assert q.stats().terminals["malformed"] == 1


def _reap_until_lost(q: Any) -> None:
    wait_until(lambda: q.reap().lost, timeout=5.0, message="the silent worker to be reaped")


def test_a_receipt_the_reaper_requeued_is_stale(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(worker_timeout_s=0.2))
    w, res = _reserve_one(q)
    _reap_until_lost(q)  # the worker went silent past worker_timeout_s
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as info:
        w.complete(res.receipt, samples(2))
    assert (info.value.owner, info.value.delivery_count) == ("@ready", 1)
    assert snapshot(raw, queue_name) == before
    [again] = q.worker("w2").reserve(1)
    assert again.receipt.attempt == 2
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as info:
        w.complete(res.receipt, samples(2))
    assert (info.value.owner, info.value.delivery_count) == ("w2", 2)
    assert snapshot(raw, queue_name) == before
    assert q.worker("w2").complete(again.receipt, samples(2)) == "buffered"


def test_a_payload_over_the_limit_leaves_the_attempt_executing(open_queue, raw: redis.Redis,
                                                              queue_name: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_one(q)
    before = snapshot(raw, queue_name)
    big = samples(2, tokens=200)
    with pytest.raises(PayloadTooLarge) as info:
        w.complete(res.receipt, big)
    assert (info.value.size, info.value.limit) == (len(encode_completion(big)), 600)
    assert snapshot(raw, queue_name) == before
    # The script refuses it too, for a client that skips its own check.
    # It was staged at the attempt's payload key and is deleted with the refusal: nothing kept.
    reply = call_complete(q, res.entry_id, 1, "w1", encode_completion(big))
    assert reply == ["payload_too_large", len(encode_completion(big)), 600]
    assert snapshot(raw, queue_name) == before
    assert payload_keys(raw, queue_name) == set()
    assert pel(raw, queue_name) == {res.entry_id: ("w1", 1)}
    assert w.complete(res.receipt, samples(2)) == "buffered"  # the attempt is still the worker's


def test_completing_twice_with_the_same_receipt_is_a_replay(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_one(q)
    assert w.complete(res.receipt, samples(2)) == "buffered"
    before = snapshot(raw, queue_name)
    assert w.complete(res.receipt, samples(2)) == "replay"
    assert snapshot(raw, queue_name) == before
    assert counter(raw, queue_name, "completed_total") == 1
    q.lease(1).commit()
    assert w.complete(res.receipt, samples(2)) == "replay"  # still the same answer once trained
    assert payload_keys(raw, queue_name) == set()  # and its staged payload is not kept


def test_a_replay_keeps_the_live_payload_and_one_after_commit_leaves_none(open_queue, raw: redis.Redis,
                                                                         queue_name: str) -> None:
    """The resent call stages the same bytes at the same attempt's key: while the completion is
    buffered or leased under that attempt the key is the live payload and stays, byte-identical;
    once the group is committed (or otherwise gone) the replay's staged copy is deleted."""
    q = open_queue(CFG)
    w, res = _reserve_one(q)
    out = samples(2, version=0)
    original = encode_completion(out)
    eid, key = res.entry_id, keys(queue_name).payload(res.entry_id, 1)
    assert w.complete(res.receipt, out) == "buffered"
    assert payload_keys(raw, queue_name) == {key} and raw.get(key) == original
    assert call_complete(q, eid, 1, "w1", original) == ["ok", b"replay", b""]  # buffered: the live payload
    assert payload_keys(raw, queue_name) == {key} and raw.get(key) == original
    lease = q.lease(1)
    assert w.complete(res.receipt, out) == "replay"  # leased under the same attempt: still the live one
    assert payload_keys(raw, queue_name) == {key} and raw.get(key) == original
    assert lease.groups[0].samples == tuple(out)
    lease.commit()
    assert payload_keys(raw, queue_name) == set()
    before = snapshot(raw, queue_name)
    assert call_complete(q, eid, 1, "w1", original) == ["ok", b"replay", b""]
    assert w.complete(res.receipt, out) == "replay"
    assert payload_keys(raw, queue_name) == set() and snapshot(raw, queue_name) == before


def test_a_stale_receipt_leaves_no_payload_of_its_attempt(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """A stale worker's staged payload is deleted by the refusal, and, named by its own attempt,
    never lands on the payload of the attempt that replaced it."""
    q = open_queue(CFG.replace(worker_timeout_s=0.2))
    w, res = _reserve_one(q)
    eid = res.entry_id
    # Attempt 2 was never granted: refused while attempt 1 is still executing.
    assert call_complete(q, eid, 2, "w1", encode_completion(samples(2)))[0] == "stale_receipt"
    assert payload_keys(raw, queue_name) == set()
    _reap_until_lost(q)
    with pytest.raises(StaleReceipt):
        w.complete(res.receipt, samples(2))  # requeued to @ready: stale
    assert payload_keys(raw, queue_name) == set()
    w2 = q.worker("w2")
    [again] = w2.reserve(1)
    assert (again.entry_id, again.receipt.attempt) == (eid, 2)
    live = samples(2, version=1)
    assert w2.complete(again.receipt, live) == "buffered"
    with pytest.raises(StaleReceipt) as info:
        w.complete(res.receipt, samples(2, version=0, tokens=3))  # attempt 1, now @done at attempt 2
    assert (info.value.owner, info.value.delivery_count) == ("@done", 2)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(eid, 2)}
    assert stored_payload(raw, queue_name, eid) == encode_completion(live)
    assert q.lease(1).groups[0].samples == tuple(live)


@pytest.mark.parametrize("refusal", ["too_large", "slot_outside", "slot_missing"])
def test_a_refused_staged_payload_is_deleted(open_queue, raw: redis.Redis, queue_name: str, refusal: str) -> None:
    """payload_too_large (for a client that skips its own check) and a malformed completion: the
    payload staged in the call's MULTI is not kept; only an attempt that was buffered keeps one."""
    q = open_queue(CFG)
    _, res = _reserve_one(q)
    eid = res.entry_id
    outputs = {"too_large": samples(2, tokens=200), "slot_outside": [Sample(0, (1,)), Sample(2, (1,))],
               "slot_missing": [Sample(0, (1,)), Sample(0, (2,))]}[refusal]
    slots = ",".join(str(x.slot) for x in outputs)
    reply = call_complete(q, eid, 1, "w1", encode_completion(outputs), slots=slots)
    assert reply[0] == ("payload_too_large" if refusal == "too_large" else "malformed")
    assert payload_keys(raw, queue_name) == set()
    assert pel(raw, queue_name)[eid] == (("w1", 1) if refusal == "too_large" else ("@ready", 1))
    assert attempt_of(raw, queue_name, eid) == 1


def _complete_all(q: Any, versions: dict[str, list[int]]) -> tuple[Any, dict[str, Any]]:
    """Reserve one group per source id, all at once (before the buffer fills)."""
    ids = q.submit([group(sid, n=2) for sid in versions])
    w = q.worker("w1")
    got = w.reserve(len(ids))
    assert len(got) == len(ids)
    return w, {sid: r for sid, r in zip(versions, got)}


def _outputs(vs: list[int]) -> list[Sample]:
    return [Sample(slot=i, token_ids=(i,), version=v) for i, v in enumerate(vs)]


def test_overflow_sends_the_stalest_buffered_group_back_to_ready(open_queue, raw: redis.Redis,
                                                                 queue_name: str) -> None:
    q = open_queue(CFG.replace(max_completed_groups=2))
    plan = {"a": [3, 1], "b": [0, 2], "c": [2, 2]}  # oldest sample versions: a 1, b 0, c 2
    w, res = _complete_all(q, plan)
    assert w.complete(res["a"].receipt, _outputs(plan["a"])) == "buffered"
    assert w.complete(res["b"].receipt, _outputs(plan["b"])) == "buffered"
    assert w.complete(res["c"].receipt, _outputs(plan["c"])) == "buffered"
    b = res["b"].entry_id
    assert buffer_ids(raw, queue_name) == [res["a"].entry_id, res["c"].entry_id]
    assert pel(raw, queue_name)[b] == ("@ready", 1) and ready_ids(raw, queue_name) == [b]
    assert payload_keys(raw, queue_name, b) == set()  # the evicted group's payload went with it
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(res[s].entry_id, 1) for s in ("a", "c")}
    assert history(raw, queue_name, b)["f"] == 0  # overflow is not the group's fault
    stats = q.stats()
    assert (stats.completed, stats.evictions["overflow"], stats.executing_groups) == (2, 1, 0)


def test_overflow_evicts_the_arriving_group_when_it_is_the_stalest(open_queue, raw: redis.Redis,
                                                                   queue_name: str) -> None:
    q = open_queue(CFG.replace(max_completed_groups=2))
    plan = {"a": [1, 1], "b": [2, 2], "c": [0, 5]}
    w, res = _complete_all(q, plan)
    w.complete(res["a"].receipt, _outputs(plan["a"]))
    w.complete(res["b"].receipt, _outputs(plan["b"]))
    assert w.complete(res["c"].receipt, _outputs(plan["c"])) == "evicted_self"
    c = res["c"].entry_id
    assert buffer_ids(raw, queue_name) == [res["a"].entry_id, res["b"].entry_id]
    assert pel(raw, queue_name)[c] == ("@ready", 1) and ready_ids(raw, queue_name) == [c]
    assert history(raw, queue_name, c)["f"] == 0
    assert q.stats().executing_samples == 0
    # The arriving group's own payload went with it; a replay of it keeps none either.
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(res[s].entry_id, 1) for s in ("a", "b")}
    assert w.complete(res["c"].receipt, _outputs(plan["c"])) == "replay"
    assert payload_keys(raw, queue_name, c) == set()


def test_overflow_ties_go_to_the_earliest_arrival(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(max_completed_groups=2))
    plan = {"x": [1, 1], "y": [1, 4], "z": [1, 2]}
    w, res = _complete_all(q, plan)
    for sid in ("y", "x", "z"):  # y arrives first, so y is the earliest of the tie at version 1
        assert w.complete(res[sid].receipt, _outputs(plan[sid])) == "buffered"
    assert buffer_ids(raw, queue_name) == [res["x"].entry_id, res["z"].entry_id]
    assert ready_ids(raw, queue_name) == [res["y"].entry_id]


def test_no_outputs_at_all_ends_the_attempt_as_fail_malformed_does(open_queue, raw: redis.Redis,
                                                                   queue_name: str) -> None:
    """slots '' (the header): the script ends the attempt itself, with the reason and the replay rule
    of flows.complete's empty-completion path (fail, terminal 'malformed')."""
    q = open_queue(CFG)
    w, res = _reserve_one(q)
    argv = dict(entry_id=res.entry_id, attempt=1, worker_id="w1", payload=b"", min_version=0, slots="")
    assert call_complete(q, **argv) == ["malformed", b"completion has no samples", b"ready"]
    eid = res.entry_id
    assert pel(raw, queue_name) == {eid: ("@ready", 1)} and ready_ids(raw, queue_name) == [eid]
    assert ledger(raw, queue_name, eid) == "a|1|w1|malformed"
    h = history(raw, queue_name, eid)
    assert (h["f"], h["h"][-1]["t"], h["h"][-1]["r"]) == (1, "malformed", "completion has no samples")
    before = snapshot(raw, queue_name)
    assert call_complete(q, **argv) == ["malformed", b"completion has no samples", b"ready"]  # a replay
    with pytest.raises(MalformedCompletion):
        w.complete(res.receipt, [])  # the client's own path (fail) agrees
    assert snapshot(raw, queue_name) == before


def test_a_resent_call_never_replaces_the_payload_it_handed_in(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """SET NX: a complete resent with other bytes (a buggy client's second call for the same receipt)
    answers 'replay' and leaves the payload the first call handed in; so does a receipt forged with
    another worker's name for the same entry and attempt (refused stale, and the live payload is
    neither replaced nor deleted)."""
    q = open_queue(CFG)
    w, res = _reserve_one(q)
    first, other = samples(2, version=0), samples(2, version=0, tokens=3)
    assert w.complete(res.receipt, first) == "buffered"
    assert call_complete(q, res.entry_id, 1, "w1", encode_completion(other)) == ["ok", b"replay", b""]
    assert call_complete(q, res.entry_id, 1, "w9", encode_completion(other))[0] == "stale_receipt"
    assert stored_payload(raw, queue_name, res.entry_id) == encode_completion(first)
    assert q.lease(1).groups[0].samples == tuple(first)


@pytest.mark.parametrize("end", ["fail", "abort", "filter", "reject", "close", "reaped"])
def test_every_end_of_an_attempt_drops_a_payload_it_staged_but_never_handed_in(
        open_queue, raw: redis.Redis, queue_name: str, end: str) -> None:
    """A call refused for a bad argument (here: a min_version that is not an integer) deletes what its
    transaction staged before it raises. The one way a staged payload outlives its call: the server
    had forgotten the script (NOSCRIPT inside EXEC, after the SET ran) and the worker died before
    resending; planted here by hand. Whatever then ends the attempt deletes it, so nothing outlives
    the attempt that staged it (and no later completion of it could adopt those bytes under NX)."""
    q = open_queue(CFG.replace(worker_timeout_s=0.2) if end == "reaped" else CFG)
    w, res = _reserve_one(q)
    key = keys(queue_name).payload(res.entry_id, 1)
    with pytest.raises(ScriptError):
        call_complete(q, res.entry_id, 1, "w1", encode_completion(samples(2)), min_version="1.5")
    assert payload_keys(raw, queue_name) == set()
    raw.set(key, encode_completion(samples(2)))
    if end == "fail":
        assert w.fail(res.receipt, "engine error") == "ready"
    elif end == "abort":
        assert w.abort(res.receipt, "weights update") == "ready"
    elif end == "filter":
        assert w.filter(res.receipt, "all rewards equal") == "filtered"
    elif end == "reject":  # the reserve flow's own call for a body it cannot decode
        assert call(q, "reject", entry_id=res.entry_id, attempt=1, worker_id="w1", reason="undecodable") == ["ok", b"dead"]
    elif end == "close":
        w.close()
    else:
        _reap_until_lost(q)
    assert payload_keys(raw, queue_name) == set()
