"""Contract of complete_many.lua: a batch of one worker's completions, each settled as complete settles it.

Header outcomes: {'ok', reply, ...} with one of complete's replies per item, in order; a ROLLOUTQ
error for bad ARGV before anything is written. The central claim is equivalence: one batch leaves
Redis exactly as N complete calls in item order would (same outcomes, ledger lines, histories,
buffer order and scores, counters, overflow victims), including a batch whose overflow evicts one
of its own earlier members and a batch naming an entry twice. Each item's refusal comes back in its
place (StaleReceipt, PayloadTooLarge, MalformedCompletion), never hiding the others' outcomes. Each
item's payload is staged (SET in the call's MULTI) at rollout:{q}:payload:<entry ID>:<attempt>; the
script keeps it only for an item it buffered (or a replay of one still buffered or leased).
"""

from __future__ import annotations

from typing import Any, Generator

import orjson
import pytest
import redis

from rollout_queue import (
    InvalidInput,
    MalformedCompletion,
    PayloadTooLarge,
    QueueConfig,
    Receipt,
    Sample,
    ScriptError,
    StaleReceipt,
)
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.codec import encode_completion
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.scripts import SCRIPTS
from rollout_queue.drivers.transport import READ_COMMANDS
from tests.contract.conftest import snapshot
from tests.contract.worker_support import (
    buffer_ids,
    call,
    call_complete_many,
    group,
    keys,
    payload_keys,
    pel,
    ready_ids,
    samples,
    send,
)
from tests.stateful.redis_truth import derive_state, observe

CFG = QueueConfig(max_attempts=3, max_payload_bytes=600)
Items = list[tuple[Receipt, list[Sample]]]


def _outputs(vs: list[int], slots: list[int] | None = None) -> list[Sample]:
    return [Sample(slot=s, token_ids=(s,), version=v) for s, v in zip(slots or range(len(vs)), vs)]


def _reserve_all(q: Any, sizes: dict[str, int], worker_id: str = "w1") -> tuple[Any, dict[str, Any]]:
    q.submit([group(sid, n=n) for sid, n in sizes.items()])
    w = q.worker(worker_id)
    got = w.reserve(len(sizes))
    assert len(got) == len(sizes)
    return w, {r.group.source_id: r for r in got}


def _sequential(w: Any, items: Items) -> list[Any]:
    """What N complete calls answer: the outcome string, or the refusal raised."""
    out: list[Any] = []
    for receipt, outputs in items:
        try:
            out.append(w.complete(receipt, outputs))
        except p.COMPLETION_REFUSALS as exc:
            out.append(exc)
    return out


def _described(outcomes: list[Any], sid_of: dict[str, str]) -> list[Any]:
    """Outcomes with entry IDs named by source_id, comparable across two queues."""
    out: list[Any] = []
    for o in outcomes:
        if isinstance(o, StaleReceipt):
            out.append(("stale", sid_of[o.entry_id], o.attempt, o.owner, o.delivery_count))
        elif isinstance(o, MalformedCompletion):
            out.append(("malformed", sid_of[o.entry_id], o.detail, o.requeued_to))
        elif isinstance(o, PayloadTooLarge):
            out.append(("too_large", o.size, o.limit))
        else:
            assert isinstance(o, str), o
            out.append(o)
    return out


def _normalized(raw: redis.Redis, name: str) -> dict[str, Any]:
    """Every key the completions touch, entry IDs replaced by source_ids and clocks dropped; also
    checks that each reservation is in exactly one state."""
    k = QueueKeys(name)
    t = observe(raw, k)
    sid = {eid: s for s, eid in t.ids.items()}
    for eid in t.ids.values():
        derive_state(t, eid)
    history = {}
    for e, v in raw.hgetall(k["history"]).items():
        h = orjson.loads(v)
        history[sid[e.decode()]] = (h["f"], [(x["a"], x["w"], x["t"], x["r"]) for x in h["h"]])
    return {
        "pel": {sid[e]: v for e, v in t.pel.items()},
        "ready": [sid[e] for e in sorted(t.ready, key=t.ready.__getitem__)],
        "buffer": {sid[e]: v for e, v in t.buffer.items()},
        "bufver": {sid[e]: v for e, v in t.bufver.items()},
        "payloads": {(sid[e], int(a)): raw.get(key) for key in payload_keys(raw, name)
                     for e, a in [key[len(k.prefix + "payload:"):].rsplit(":", 1)]},
        "ledger": {sid[e]: v for e, v in t.ledger.items()},
        "history": history,
        "dlq": [(sid[d["entry_id"]], d["reason"], d["attempt"], d["worker"]) for d in t.dlq],
        "meta": {f: v for f, v in t.meta.items() if f != "library"},
    }


def _recount(raw: redis.Redis, name: str, stats: Any) -> None:
    """The counters complete_many moves agree with a recount from Redis truth."""
    t = observe(raw, QueueKeys(name))
    executing = [e for e, (owner, _) in t.pel.items() if not owner.startswith("@")]
    retained = [e for e, (owner, _) in t.pel.items() if owner not in ("@dead", "@filtered")]  # parked: settled
    got = (stats.executing_groups, stats.executing_samples, stats.completed, stats.retained, stats.ready)
    assert got == (len(executing), sum(t.n_of(e) for e in executing), len(t.buffer), len(retained), len(t.ready))


# The mixed batch: every outcome of the header, an overflow that evicts earlier members of the same
# batch and one that evicts the arriving group, and entries named twice.
SIZES = {"r": 2, "a": 2, "b": 2, "c": 2, "d": 2, "e": 2, "f": 2, "g": 1, "h": 2, "i": 2}


def _mixed(q: Any) -> tuple[Any, Items, dict[str, str]]:
    w, res = _reserve_all(q, SIZES)
    rc = {sid: r.receipt for sid, r in res.items()}
    assert w.complete(rc["r"], _outputs([5, 5])) == "buffered"  # completed before the batch: a replay in it
    items: Items = [
        (rc["a"], _outputs([1, 1])),                     # buffered
        (rc["r"], _outputs([5, 5])),                     # replay
        (Receipt(rc["b"].entry_id, 2, "w1"), _outputs([0, 0])),  # stale: attempt 2 was never granted
        (rc["c"], _outputs([0, 0, 0], [0, 1, 2])),       # malformed: slot 2 of a 2-slot group
        (rc["d"], samples(2, tokens=200)),               # too large: refused before it is sent
        (rc["e"], _outputs([0, 0])),                     # overflow, stalest itself: evicted_self
        (rc["f"], _outputs([3, 3])),                     # overflow: evicts a, buffered in this batch
        (rc["a"], _outputs([1, 1])),                     # a again: completed (then evicted): replay
        (rc["g"], []),                                   # no samples: malformed
        (rc["h"], _outputs([0, 0], [0, 0])),             # malformed: slot 1 has no output
        (rc["c"], _outputs([0, 0])),                     # c again, now ready: stale
        (rc["i"], _outputs([4, 4])),                     # overflow: evicts f, pending in this batch
        (rc["i"], _outputs([4, 4])),                     # i again at once: replay
    ]
    return w, items, {r.entry_id: sid for sid, r in res.items()}


@pytest.mark.parametrize("max_attempts", [3, 1])
def test_a_mixed_batch_equals_sequential_completes(open_queue, raw: redis.Redis, queue_name: str,
                                                   max_attempts: int) -> None:
    cfg = CFG.replace(max_completed_groups=2, max_attempts=max_attempts)
    seq_name = f"{queue_name}-seq"
    try:
        qs = open_queue(cfg, name=seq_name)
        ws, items_s, sid_s = _mixed(qs)
        expected = _described(_sequential(ws, items_s), sid_s)
        q = open_queue(cfg)
        w, items, sid = _mixed(q)
        got = w.complete_many(items)
        assert _described(got, sid) == expected
        assert expected[:3] == ["buffered", "replay", ("stale", "b", 2, "w1", 1)]
        assert expected[4:8] == [("too_large", len(encode_completion(samples(2, tokens=200))), 600),
                                 "evicted_self", "buffered", "replay"]
        assert expected[11:] == ["buffered", "replay"]
        assert _normalized(raw, queue_name) == _normalized(raw, seq_name)
        assert buffer_ids(raw, queue_name) == [res for res, s in sid.items() if s in ("r", "i")]
        # Only the buffered groups keep a payload: none is left by the stale, malformed, evicted or
        # replayed items (a replay of a group evicted earlier in the batch included).
        assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e, s in sid.items()
                                                 if s in ("r", "i")}
        _recount(raw, queue_name, q.stats())
    finally:
        for key in raw.scan_iter(match=f"rollout:{{{seq_name}}}:*"):
            raw.unlink(key)


def test_a_batch_buffers_everything_with_one_write_per_key(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_all(q, {"x": 2, "y": 3, "z": 1, "u": 2})
    k = keys(queue_name)
    done_before = raw.xlen(k["wake_done"])
    items = [(res[s].receipt, samples(res[s].group.n, version=0)) for s in ("x", "y", "z", "u")]
    raw.script_load(SCRIPTS["complete_many"].source)  # no NOSCRIPT round trip inside the count
    before = _calls(raw)
    assert w.complete_many(items) == ["buffered"] * 4
    writes = _writes(_used(raw, before))
    assert writes.pop("set") == 4, writes  # one staged payload per item, in the call's MULTI
    # The script: one write per key, not per item (HSET: the ledger, the counters, the token records).
    assert writes and all(n <= 3 for n in writes.values()), writes
    ids = [res[s].entry_id for s in ("x", "y", "z", "u")]
    # Each adopted completion's tokens (2 per sample here) are kept beside its payload and counted.
    assert raw.hgetall(k["tokens"]) == {f"{i}:1".encode(): str(2 * len(out)).encode() for i, (_, out) in zip(ids, items)}
    assert q.stats().counters["tokens_generated"] == 2 * 8
    assert pel(raw, queue_name) == {i: ("@done", 1) for i in ids}
    assert buffer_ids(raw, queue_name) == ids  # arrival order is item order
    for i, (_, out) in zip(ids, items):
        assert raw.get(k.payload(i, 1)) == encode_completion(out)  # staged at the attempt's key, kept
        assert raw.hget(k["ledger"], i) == b"a|1|w1|completed"
    assert payload_keys(raw, queue_name) == {k.payload(i, 1) for i in ids}
    assert raw.xlen(k["wake_done"]) == done_before + 1  # one wake per call, not per item
    stats = q.stats()
    assert (stats.completed, stats.executing_groups, stats.executing_samples) == (4, 0, 0)
    assert int(raw.hget(k["counters"], "completed_total")) == 4 and int(raw.hget(k["counters"], "arrivals")) == 4
    lease = q.lease(4)
    assert [g.entry_id for g in lease.groups] == ids and [g.samples for g in lease.groups] == [tuple(o) for _, o in items]


def test_a_repeated_call_replays_and_writes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """The transport resends a call whose reply was lost: every settled item answers 'replay'."""
    q = open_queue(CFG.replace(max_completed_groups=1))
    w, res = _reserve_all(q, {"x": 2, "y": 2, "z": 2})
    items = [(res["x"].receipt, _outputs([1, 1])), (res["y"].receipt, _outputs([0, 0])),
             (res["z"].receipt, _outputs([2, 2]))]
    flow = flows.complete_many(q.keys, "w1", items, CFG.max_payload_bytes)
    op = next(flow)
    send(q, op)  # it ran; its reply was lost
    before = snapshot(raw, queue_name)
    with pytest.raises(StopIteration) as stop:
        flow.send(send(q, op))
    assert stop.value.value == ["replay"] * 3
    assert snapshot(raw, queue_name) == before
    assert w.complete_many(items) == ["replay"] * 3  # and so does a call made again by hand
    assert snapshot(raw, queue_name) == before
    assert buffer_ids(raw, queue_name) == [res["z"].entry_id]
    assert ready_ids(raw, queue_name) == [res["x"].entry_id, res["y"].entry_id]


def test_refused_items_change_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    w, res = _reserve_all(q, {"x": 2})
    rc = res["x"].receipt
    before = snapshot(raw, queue_name)
    got = w.complete_many([(Receipt(rc.entry_id, 3, "w1"), samples(2)), (rc, samples(2, tokens=200))])
    assert isinstance(got[0], StaleReceipt) and (got[0].owner, got[0].delivery_count) == ("w1", 1)
    assert isinstance(got[1], PayloadTooLarge) and got[1].limit == 600
    assert snapshot(raw, queue_name) == before
    assert w.complete_many([(rc, samples(2))]) == ["buffered"]  # the attempt was still the worker's


def test_the_script_refuses_an_oversized_item_alone(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """For a client that skips its own check: the big item stays executing, the other is buffered."""
    q = open_queue(CFG)
    _, res = _reserve_all(q, {"x": 2, "y": 2})
    big, small = encode_completion(samples(2, tokens=200)), encode_completion(samples(2))
    x, y = res["x"].entry_id, res["y"].entry_id
    reply = call_complete_many(q, "w1", [(x, 1, big, 0, "0,1"), (y, 1, small, 0, "0,1")])
    assert reply[0] == "ok"
    assert [p.s(v) if isinstance(v, bytes) else v for v in reply[1]] == ["payload_too_large", len(big), 600]
    assert [p.s(v) for v in reply[2]] == ["ok", "buffered", ""]
    assert pel(raw, queue_name) == {x: ("w1", 1), y: ("@done", 1)}
    # The refused item's staged payload is deleted; the buffered one's is kept as staged.
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(y, 1)}
    assert raw.get(keys(queue_name).payload(y, 1)) == small


def _statuses(reply: list[Any]) -> list[str]:
    return [p.s(item[0]) for item in reply[1:]]


def test_refused_items_leave_no_staged_payload_and_a_replay_keeps_the_live_one(open_queue, raw: redis.Redis,
                                                                             queue_name: str) -> None:
    """Each item's payload is staged at its attempt's key in the call's MULTI: a stale, oversized or
    malformed item's is deleted by the script, a buffered one's kept; the same call sent again keeps
    the live payload byte-identical, and once that group is committed a replay leaves no key."""
    q = open_queue(CFG)
    _, res = _reserve_all(q, {"x": 2, "y": 2, "z": 2, "v": 2})
    x, y, z, v = (res[sid].entry_id for sid in "xyzv")
    good = encode_completion(samples(2))
    items = [
        (x, 2, good, 0, "0,1"),                                                  # stale: attempt 2 never granted
        (y, 1, encode_completion(samples(2, tokens=200)), 0, "0,1"),             # too large
        (z, 1, encode_completion(_outputs([0, 0, 0], [0, 1, 2])), 0, "0,1,2"),  # malformed: slot 2 of 2
        (v, 1, good, 0, "0,1"),                                                  # buffered
    ]
    reply = call_complete_many(q, "w1", items)
    assert _statuses(reply) == ["stale_receipt", "payload_too_large", "malformed", "ok"]
    k = keys(queue_name)
    assert payload_keys(raw, queue_name) == {k.payload(v, 1)} and raw.get(k.payload(v, 1)) == good
    before = snapshot(raw, queue_name)
    reply = call_complete_many(q, "w1", items)  # resent: z is ready now (stale), v replays
    assert _statuses(reply) == ["stale_receipt", "payload_too_large", "stale_receipt", "ok"]
    assert p.s(reply[4][1]) == "replay"
    assert snapshot(raw, queue_name) == before
    assert payload_keys(raw, queue_name) == {k.payload(v, 1)} and raw.get(k.payload(v, 1)) == good
    lease = q.lease(1)
    assert [g.entry_id for g in lease.groups] == [v] and lease.groups[0].samples == tuple(samples(2))
    lease.commit()
    assert payload_keys(raw, queue_name) == set()
    assert _statuses(call_complete_many(q, "w1", items[3:])) == ["ok"]  # a replay once committed
    assert payload_keys(raw, queue_name) == set()


@pytest.mark.parametrize("items", [
    ["{x}", 1, b"", 0, "0,1", 4, "{y}", 1, b"", "1.5", "0,1", 4],   # the second item's min_version
    ["{x}", 1, b"", 0, "0,1", 4, "{y}", 0, b"", 0, "0,1", 4],       # the second item's attempt
    ["{x}", 1, b"", 0, "0,1", 4, "{y}", 1, b"", 0, "0,1"],          # not 6 values per item
    ["{x}", 1, b"", 0, "0,1", 4, "nope", 1, b"", 0, "0,1", 4],      # not an entry ID
    ["{x}", 1, b"", 0, "0,1", 4, "{y}", 1, b"", 0, "0,1", -1],      # the second item's tokens
    ["{x}", 1, b"", 0, "0,1", 4, "{y}", 1, b"", 0, "0,1", 2 ** 31],  # tokens past 2^31 - 1
])
def test_bad_argv_is_a_rolloutq_error_before_anything_is_written(open_queue, raw: redis.Redis, queue_name: str,
                                                                 items: list[Any]) -> None:
    q = open_queue(CFG)
    _, res = _reserve_all(q, {"x": 2, "y": 2})
    ids = {"{x}": res["x"].entry_id, "{y}": res["y"].entry_id}
    argv = [ids.get(v, v) if isinstance(v, str) else v for v in items]
    argv[2] = len(encode_completion(samples(2)))  # the first item is well-formed: it must not be settled
    before = snapshot(raw, queue_name)
    with pytest.raises(ScriptError, match="ROLLOUTQ"):
        call(q, "complete_many", worker_id="w1", items=argv)  # nothing staged: what the script writes
    assert snapshot(raw, queue_name) == before


def test_receipts_of_another_worker_are_refused_before_anything_is_sent(open_queue, raw: redis.Redis,
                                                                        queue_name: str) -> None:
    q = open_queue(CFG)
    _, res = _reserve_all(q, {"x": 2})
    before = snapshot(raw, queue_name)
    with pytest.raises(InvalidInput):
        q.worker("w2").complete_many([(res["x"].receipt, samples(2))])
    assert snapshot(raw, queue_name) == before
    assert q.worker("w1").complete_many([]) == []


def _counting(flow: Generator[p.Op, Any, Any], calls: list[p.Op]) -> Generator[p.Op, Any, Any]:
    reply = None
    while True:
        try:
            op = flow.send(reply)
        except StopIteration as stop:
            return stop.value
        calls.append(op)
        reply = yield op


def test_large_batches_go_in_chunks_in_order(open_queue, raw: redis.Redis, queue_name: str) -> None:
    n_items = flows.COMPLETE_BATCH + 5
    q = open_queue(CFG.replace(max_completed_groups=1000, max_executing_samples=1000))
    w, res = _reserve_all(q, {f"s{i}": 1 for i in range(n_items)})
    items = [(res[f"s{i}"].receipt, samples(1)) for i in range(n_items)]
    items.insert(3, (res["s0"].receipt, samples(1)))  # named twice, across the chunk boundary too
    items.append((res["s0"].receipt, samples(1)))
    calls: list[p.Op] = []
    got = q.run(_counting(flows.complete_many(q.keys, "w1", items, CFG.max_payload_bytes), calls))
    assert got == ["buffered"] * 3 + ["replay"] + ["buffered"] * (n_items - 3) + ["replay"]
    assert [c.script.name for c in calls] == ["complete_many"] * 2  # type: ignore[union-attr]
    assert buffer_ids(raw, queue_name) == [res[f"s{i}"].entry_id for i in range(n_items)]
    assert w.complete_many(items[:1]) == ["replay"]


def _calls(raw: redis.Redis) -> dict[str, int]:
    """Command name (lower case) -> calls so far, from INFO commandstats (script calls included)."""
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in raw.info("commandstats").items()}


def _used(raw: redis.Redis, before: dict[str, int]) -> dict[str, int]:
    """Commands run since ``before`` (the INFO that reads them left out)."""
    after = _calls(raw)
    after["info"] = after.get("info", 0) - 1
    return {c: n - before.get(c, 0) for c, n in after.items() if n != before.get(c, 0)}


#: What wraps one complete_many call: the transaction its payloads are staged in, and the script call.
_CALL_WRAPPER = {"multi", "exec", "evalsha"}


def _writes(used: dict[str, int]) -> dict[str, int]:
    """The write commands among ``used`` (neither a read nor the call's wrapper)."""
    reads = {c.lower() for c in READ_COMMANDS}
    return {c: n for c, n in used.items() if c.split("|")[0] not in reads | _CALL_WRAPPER}


def test_per_item_cost_is_the_receipt_check_and_the_entry_read(open_queue, raw: redis.Redis,
                                                                queue_name: str) -> None:
    """benchmarks/README.md P4: per completion only XPENDING, the HGET of K.leased (a receipt never owns
    a leased entry: lua/include/leased_guard.lua) and XRANGE in the script, and the SET that stages its
    payload in the call's MULTI; the rest (MULTI/EXEC, the script's writes) is per call."""
    q = open_queue(CFG)
    w, res = _reserve_all(q, {f"s{i}": 2 for i in range(16)})
    items = [(r.receipt, samples(2)) for r in res.values()]
    w.complete_many(items[:1])  # loads the script (NOSCRIPT) outside the count
    before = _calls(raw)
    assert w.complete_many(items[1:6]) == ["buffered"] * 5
    five = _used(raw, before)
    before = _calls(raw)
    assert w.complete_many(items[6:]) == ["buffered"] * 10
    ten = _used(raw, before)
    for used in (five, ten):
        assert {c: used.get(c) for c in _CALL_WRAPPER} == {"multi": 1, "exec": 1, "evalsha": 1}, used
    # Five items more cost exactly five receipt checks (XPENDING, HGET), five entry reads and five SETs.
    extra = {c: ten.get(c, 0) - five.get(c, 0) for c in set(five) | set(ten)}
    assert {c: n for c, n in extra.items() if n} == {"xpending": 5, "hget": 5, "xrange": 5, "set": 5}, (five, ten)
    # The only write per item is the staged SET: every other write runs a fixed number of times a call
    # (HSET: the ledger, the counters and the token records).
    assert ten["set"] == 10 and all(n <= 3 for c, n in _writes(ten).items() if c != "set"), ten
    # 16 a call: one is drop_partials' HLEN (progress records), one the token records' HSET.
    assert sum(ten.values()) <= 4 * 10 + 16, ten
