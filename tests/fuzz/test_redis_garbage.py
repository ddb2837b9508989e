"""Garbage written straight into every key of a queue, next to well-formed groups in every state.

Hypothesis writes junk that keeps each key's documented type (bogus members in the ready, buffer,
bufver, leases, workers, holds and kept sorted sets; undecodable ledger, history, reserves, ids and
lease-record hash fields; extra meta fields; undecodable completion payloads: strings of junk at the
payload keys of the real entries' attempts, and of junk ones; garbage entries in the source, dlq,
commits and wake streams, including unknown schema versions and non-UTF-8 bytes). Then the
well-formed groups, left in backlog, executing, ready, completed and leased, must all still be committed:
no call may fail with anything but a typed error, and none with a script error at all. Junk that
breaks a key's type (or the stored config) must give a ScriptError naming the cause (WRONGTYPE, or
ROLLOUTQ for corrupt state), and once the key is restored the groups go through. A payload key of
the wrong type reads as a missing payload (MGET answers nil): the lease hands the group back, and
only the one command that reads its size (inspect's STRLEN) answers WRONGTYPE.
"""

from __future__ import annotations

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollout_queue import RolloutQueue, ScriptError
from rollout_queue.core import protocol as p
from rollout_queue.ops import views
from rollout_queue.core.scripts import counter_home

from .support import CFG, EXAMPLES, drive, fresh_queue, good_groups, samples_for, typed

#: Short timeouts: the staged executing group and lease are reaped within the drive's deadline.
STAGED = CFG.replace(worker_timeout_s=0.2, lease_timeout_s=0.3)

JUNK = st.one_of(
    st.binary(max_size=24),
    st.text(max_size=16),
    st.sampled_from([b"", b"\xff\xfe", b"1-1", b"0-0", b"99999999999999-0", b"-1", b"nan", b"inf", b"@ready",
                     b"@done", b"@lease:x", b"{", b"[]", b'{"f":"x","h":5}', b'{"f":1e999}', b"a|1|w|completed",
                     b"s|committed|x", b"RQC1\x00\x00\x00\x00", b"RQC1\xff\xff\xff\x7f{"]),
)
SCORE = st.one_of(st.floats(allow_nan=False), st.sampled_from([0.0, -1.0, 1e18, float("inf"), float("-inf")]))
ZSETS = ["ready", "buffer", "bufver", "workers", "leases", "kept"]
HASHES = ["ledger", "history", "reserves", "ids"]
STREAMS = ["src", "dlq", "commits", "wake_work", "wake_done"]
SRC_FIELDS = st.dictionaries(st.sampled_from([b"v", b"sid", b"n", b"p", b"g", b"x"]), JUNK, min_size=1, max_size=6)
# Well-shaped source entries whose content is wrong: unknown schema version, bad n, bad parents or body.
SRC_ENTRIES = st.one_of(SRC_FIELDS, st.builds(
    lambda v, n, p, g: {b"v": v, b"sid": b"junk-sid", b"n": n, b"p": p, b"g": g},
    st.sampled_from([b"1", b"2", b"0", b"v1"]), st.sampled_from([b"2", b"0", b"-1", b"1e400", b"99999999", b"x"]),
    st.sampled_from([b'[{"slot":0,"uid":"a"},{"slot":1,"uid":"b"}]', b'[{"slot":0,"uid":"a"},{"slot":0,"uid":"a"}]',
                     b"[]", b"{", b'[{"slot":5,"uid":"a"},{"slot":1}]']),
    st.sampled_from([b'{"prompt":"p"}', b'{"prompt":5}', b"\xff", b"[]", b'{"prompt":"p","prompt_token_ids":[1e99]}'])))


@st.composite
def garbage_ops(draw: st.DrawFn) -> list[tuple]:
    """A list of (kind, key role, member/field, value) writes; ``ref`` members name real entries."""
    ops = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["zset", "hash", "stream", "meta", "lease", "hold", "payload"]))
        ref = draw(st.integers(0, 5))  # which well-formed entry a member may name (5: junk)
        if kind == "zset":
            ops.append(("zset", draw(st.sampled_from(ZSETS)), ref, draw(JUNK), draw(SCORE)))
        elif kind == "hash":
            ops.append(("hash", draw(st.sampled_from(HASHES)), ref, draw(JUNK), draw(JUNK)))
        elif kind == "stream":
            role = draw(st.sampled_from(STREAMS))
            ops.append(("stream", role, ref, draw(SRC_ENTRIES if role == "src" else SRC_FIELDS), None))
        elif kind == "payload":
            # The attempt every staged group is at (1), or another (a stale or future attempt's key).
            ops.append(("payload", "payload", ref, draw(st.sampled_from([1, 1, 0, 2, 7])), draw(JUNK)))
        elif kind == "meta":
            ops.append(("meta", "meta", ref, b"junk:" + draw(st.binary(max_size=8)), draw(JUNK)))
        elif kind == "lease":
            ops.append(("lease", "lease", ref, draw(st.sampled_from([b"token", b"state", b"deadline", b"members",
                                                                       b"versions", b"trainer", b"x"])), draw(JUNK)))
        else:
            # A member hold_open could not have written: a bad id, or a deadline that is past or infinite
            # (a valid id with a finite future deadline IS a hold: admission stays closed until it expires).
            member = b"\xff" + draw(st.binary(max_size=8))
            ops.append(("hold", "holds", ref, member, draw(st.sampled_from([float("inf"), 0.0, -1.0, 1e18]))))
    return ops


def _stage(q: RolloutQueue) -> tuple[list[str], str]:
    """Six well-formed groups: backlog, executing (by another worker), ready, completed, leased, backlog."""
    ids = q.submit(good_groups("good", 6))
    other = q.worker("other-worker")
    executing, ready, completed, leased = other.reserve(4)
    other.abort(ready.receipt)
    other.complete(completed.receipt, samples_for(completed.group.n))
    other.complete(leased.receipt, samples_for(leased.group.n))
    lease = q.lease(1)
    assert lease is not None
    # The staged work is handed over as a crash would leave it: the executing group's worker and the
    # lease's trainer are gone, so the reaper must take both back after their (short) timeouts.
    return ids, lease.lease_id


def _write(raw: redis.Redis, q: RolloutQueue, ids: list[str], lease_id: str, op: tuple) -> None:
    kind, role, ref, member, value = op
    real = ids[ref].encode() if ref < len(ids) - 1 else member
    if kind == "zset":
        raw.zadd(q.keys[role], {real if isinstance(real, bytes) else member: value})
    elif kind == "hash":
        raw.hset(q.keys[role], real if role in ("ledger", "history") else member, value)
    elif kind == "payload":  # member: the attempt; a junk ref names an entry that does not exist
        raw.set(q.keys.payload(ids[ref] if ref < len(ids) - 1 else "99999999999999-0", member), value)
    elif kind == "stream":
        raw.xadd(q.keys[role], member)
    elif kind == "meta":
        raw.hset(q.keys["meta"], member, value)
    elif kind == "lease":
        raw.hset(q.keys.lease(lease_id if ref < 3 else "junk-lease"), member, value)
    else:
        raw.zadd(q.keys["holds"], {member: value})


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=garbage_ops())
@example(ops=[("hash", "history", 0, b"", b'{"":1e310}')])  # decodes to inf, which cjson cannot encode (CI)
# The completed and the leased group's payloads (attempt 1) overwritten with junk: undecodable when leased.
@example(ops=[("payload", "payload", 2, 1, b"RQC1\xff\xff\xff\x7f{"), ("payload", "payload", 3, 1, b"")])
def test_garbage_of_the_right_type_blocks_no_well_formed_group(redis_url: str, ops: list[tuple]) -> None:
    with fresh_queue(redis_url, STAGED) as (q, raw):
        ids, lease_id = _stage(q)
        for op in ops:
            _write(raw, q, ids, lease_id, op)
        committed = drive(q, raw, ids, script_errors="none")
        # A history overwritten with a well-formed failure count (say {"f":4}) is not garbage but a
        # group that already failed that often: reaching max_attempts, it is dead-lettered, not lost.
        rewritten = {ids[op[2]] for op in ops if op[:2] == ("hash", "history") and op[2] < len(ids) - 1}
        ledger = dict(zip(ids, raw.hmget(q.keys["ledger"], ids)))
        dead = {e for e in rewritten if (ledger[e] or b"").startswith(b"s|dead|")}
        assert committed | dead == set(ids), f"well-formed groups blocked or lost: {sorted(set(ids) - committed - dead)}"
        assert typed(q.stats, script_errors="none") is not None
        typed(q.dead_letters, script_errors="none")
        typed(lambda: q.checkpoint(10**6), script_errors="none")


# -- junk that breaks a key's type or the stored config -------------------------------------------

TYPE_BREAKS = ["src", "ready", "buffer", "bufver", "workers", "reserves", "leases", "holds",
               "history", "ledger", "dlq", "wake_work", "wake_done", "ids", "commits", "kept", "settled"]


@pytest.mark.parametrize("role", TYPE_BREAKS)
def test_a_key_of_the_wrong_type_gives_a_typed_error_then_recovers(redis_url: str, role: str) -> None:
    with fresh_queue(redis_url, STAGED) as (q, raw):
        ids, lease_id = _stage(q)
        raw.hdel(q.keys.lease(lease_id), "x")
        key = q.keys[role]
        saved = raw.dump(key)
        raw.delete(key)
        raw.set(key, b"\xffnot a " + role.encode())
        w = q.worker("probe-worker")
        for call in (lambda: w.reserve(2), q.reap, lambda: q.lease(1, partial=True), q.stats, q.dead_letters,
                     lambda: q.submit(good_groups("more", 1)), lambda: q.checkpoint(1), w.heartbeat):
            typed(call, script_errors="wrongtype")
        typed(w.close, script_errors="wrongtype")
        raw.delete(key)
        if saved is not None:
            raw.restore(key, 0, saved)
        assert drive(q, raw, ids, script_errors="none") == set(ids)


@pytest.mark.parametrize("field,value", [("max_completed_groups", b"abc"), ("lease_timeout_ms", b"1.5"),
                                         ("buffer_order", b"sideways"), ("retained", b"\xff"),
                                         ("version", b"v2"), ("library", b"")])
def test_corrupt_stored_config_gives_a_rolloutq_error_then_recovers(redis_url: str, field: str,
                                                                     value: bytes) -> None:
    with fresh_queue(redis_url, STAGED) as (q, raw):
        ids, _ = _stage(q)
        key = q.keys[counter_home(field)]  # a counter lives in the counters hash since data layout 4
        saved = raw.hget(key, field)
        raw.hset(key, field, value)
        w = q.worker("probe-worker")
        for call in (lambda: w.reserve(2), q.reap, lambda: q.lease(1, partial=True), q.stats,
                     lambda: q.submit(good_groups("more", 1)), w.heartbeat):
            typed(call, script_errors="rolloutq")
        raw.hset(key, field, saved) if saved is not None else raw.hdel(key, field)
        assert drive(q, raw, ids, script_errors="none") == set(ids)


#: A payload key holding another type: each written as Redis would keep it.
WRONG_TYPES = {
    "hash": lambda raw, key: raw.hset(key, "f", b"\xffnot a payload"),
    "list": lambda raw, key: raw.rpush(key, b"\xffnot a payload"),
    "set": lambda raw, key: raw.sadd(key, b"\xffnot a payload"),
    "zset": lambda raw, key: raw.zadd(key, {b"\xffnot a payload": 1}),
    "stream": lambda raw, key: raw.xadd(key, {b"not": b"a payload"}),
}


@pytest.mark.parametrize("kind", sorted(WRONG_TYPES))
def test_a_payload_key_of_the_wrong_type_gives_a_typed_error_then_recovers(redis_url: str, kind: str) -> None:
    """The completed and the leased group's payload keys (rollout:{q}:payload:<id>:<attempt>) hold
    another type. Inspecting the completed group reads its size with STRLEN: WRONGTYPE, a typed
    error. Every other call keeps the typed rule: MGET reads such a key as nil, so a lease hands that
    group back (its DEL removes the key whatever its type) and a complete's SET overwrites it. Once
    any key left is restored, every group is committed and no payload key outlives its group."""
    with fresh_queue(redis_url, STAGED) as (q, raw):
        ids, lease_id = _stage(q)
        buffered = p.s(raw.zrange(q.keys["buffer"], 0, -1)[0])
        leased = p.s(raw.hget(q.keys.lease(lease_id), "members")).split(",")[0]
        assert {buffered, leased} == set(ids[2:4])
        broken = {e: q.keys.payload(e, 1) for e in (buffered, leased)}
        saved = {}
        for key in broken.values():
            saved[key] = raw.dump(key)
            assert saved[key] is not None, f"the staged group's payload is not at {key}"
            raw.delete(key)
            WRONG_TYPES[kind](raw, key)
        err = typed(lambda: q.run(views.entry(q.keys, buffered)), script_errors="wrongtype")
        assert isinstance(err, ScriptError) and "WRONGTYPE" in str(err), err
        more = typed(lambda: q.submit(good_groups("more", 1)), script_errors="wrongtype")
        w = q.worker("probe-worker")
        for call in (lambda: w.reserve(2), q.reap, lambda: q.lease(2, partial=True), q.stats, q.dead_letters,
                     lambda: q.checkpoint(1), w.heartbeat):
            typed(call, script_errors="wrongtype")
        typed(w.close, script_errors="wrongtype")
        for key, dump in saved.items():
            if raw.type(key) not in (b"none", b"string"):  # not handed back yet: restore the payload
                raw.delete(key)
                raw.restore(key, 0, dump)
        want = ids + (more if isinstance(more, list) else [])
        assert drive(q, raw, want, script_errors="none") == set(want)
        left = [k for k in raw.scan_iter(match=q.keys.payload("*", "*"))]
        assert left == [], f"payload keys outlived their groups: {left}"
