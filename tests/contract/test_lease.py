"""lease.lua: completed -> leased, against real servers over both transports.

Proves each outcome of the header ('ok', 'held', 'insufficient', 'lease_lost', replay) and the
DESIGN rules lease implements: buffer order, exactly `groups` or nothing, never a stale group,
strictly on-policy with max_staleness=None, reported staleness, blocking, and `with` semantics.
"""

from __future__ import annotations

import threading
import time

import orjson
import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.codec import decode_completion
from rollout_queue.core.errors import ScriptError
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    execute,
    fill_buffer,
    history,
    keys,
    ledger,
    meta,
    owners,
    payload_keys,
    pel,
    reserve_all,
    samples_for,
    submit,
    wait_past,
    zmembers,
)
from tests.helpers import wait_until


def test_header_matches_builder() -> None:
    check_header("lease", ["src", "meta", "ready", "buffer", "bufver", "workers", "reserves", "leases", "holds", "history", "ledger", "dlq", "parked", "settled", "suspects", "wake_work", "wake_done", "progress", "reaped", "retired", "counters", "leased"],
        ["lease_id", "token", "trainer_id", "groups", "partial", "timeout_ms"],
    )


@pytest.mark.parametrize("order", ["fifo", "lifo"])
def test_buffer_order(open_queue, order) -> None:
    q = open_queue(QueueConfig(buffer_order=order))
    ids = fill_buffer(q, 3)
    expect = ids if order == "fifo" else ids[::-1]
    first = q.lease(1)
    rest = q.lease(2)
    assert [g.entry_id for g in first.groups + rest.groups] == expect


def test_lease_records_ownership(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(2, timeout_s=30, trainer_id="trainer-a")
    assert [g.entry_id for g in lease.groups] == ids[:2]
    owner = f"@lease:{lease.lease_id}"
    assert owners(raw, queue_name, ids) == [owner, owner, "@done"]
    # In no other index; the completion payload stays (at the attempt's key) until commit or rollback.
    assert zmembers(raw, queue_name, "buffer") == [ids[2]]
    assert zmembers(raw, queue_name, "bufver") == [ids[2]]
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in ids}
    record = {k.decode(): v.decode() for k, v in raw.hgetall(keys(queue_name).lease(lease.lease_id)).items()}
    assert record["state"] == "active" and record["trainer"] == "trainer-a" and record["token"] == lease.token
    assert record["members"] == ",".join(ids[:2])
    assert int(record["deadline"]) == lease.deadline_ms
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) == lease.deadline_ms
    assert meta(raw, queue_name)["leased"] == "2"
    # The group and samples come back whole: pristine reservation, every slot.
    g = lease.groups[0]
    assert g.attempt == 1 and g.min_version == 0
    assert g.group.source_id.endswith("-0") and g.group.n == 2
    assert sorted(s.slot for s in g.samples) == [0, 1]


def test_exactly_groups_or_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 2)
    before = snapshot(raw, queue_name)
    assert q.lease(3) is None
    assert snapshot(raw, queue_name) == before, "an insufficient lease must write nothing"
    reply = execute(q, p.build(q.keys, "lease", lease_id="l1", token="t", trainer_id="t", groups=3, partial=0,
                               timeout_ms=0))
    assert p.s(reply[0]) == "insufficient" and int(reply[1]) == 2
    assert snapshot(raw, queue_name) == before
    partial = q.lease(3, partial=True)
    assert len(partial.groups) == 2
    assert q.lease(1, partial=True) is None, "partial still needs at least one group"


def test_never_a_stale_group(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1))
    ids = fill_buffer(q, 4, versions=[0, 2, 1, 3])
    q.publish_version(3)  # floor = 3 - 1 = 2: the v0 and v1 groups are stale
    assert q.stats().completed == 4
    lease = q.lease(2)
    assert [g.entry_id for g in lease.groups] == [ids[1], ids[3]]
    assert lease.staleness == (1, 0.5)
    stale = [ids[0], ids[2]]
    assert owners(raw, queue_name, stale) == ["@ready", "@ready"]
    assert zmembers(raw, queue_name, "ready") == stale
    for entry_id in stale:
        h = history(raw, queue_name, entry_id)
        assert [(x["t"], x["r"]) for x in h] == [("stale", "stale")]
    # The evicted groups' payloads are dropped; the leased ones' stay.
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in (ids[1], ids[3])}
    assert int(meta(raw, queue_name)["evicted_stale"]) == 2
    assert q.stats().completed == 0 and q.stats().leased == 2
    # Not counted toward max_attempts: the history's failure count stays 0.
    import orjson
    assert orjson.loads(raw.hget(keys(queue_name)["history"], ids[0]))["f"] == 0


def test_never_a_stale_group_in_lifo_order(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=1, buffer_order="lifo"))
    ids = fill_buffer(q, 4, versions=[0, 2, 1, 3])
    q.publish_version(3)
    lease = q.lease(2)
    # Newest first: v3 and v2 are taken; every stale group (v1, v0) is requeued first, inline (issue
    # 12 item 1: lease never leaves a stale group in the buffer, whether or not it reaches it).
    assert [g.entry_id for g in lease.groups] == [ids[3], ids[1]]
    assert owners(raw, queue_name, [ids[2], ids[0]]) == ["@ready", "@ready"]
    assert q.lease(1) is None, "nothing fresh is left"
    assert q.stats().completed == 0


def test_stale_groups_are_not_counted_as_available(open_queue) -> None:
    q = open_queue(QueueConfig(max_staleness=0))
    fill_buffer(q, 3, versions=[0, 1, 1])
    q.publish_version(1)
    assert q.lease(3) is None, "only 2 of the 3 buffered groups are fresh"
    assert len(q.lease(2).groups) == 2


def test_strictly_on_policy_when_max_staleness_is_none(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=None))
    ids = fill_buffer(q, 3, versions=[0, 1, 1])
    q.publish_version(1)
    lease = q.lease(3, partial=True)
    assert [g.entry_id for g in lease.groups] == ids[1:]
    assert lease.staleness == (0, 0.0)
    assert owners(raw, queue_name, ids[:1]) == ["@ready"]


def test_nothing_is_stale_before_the_first_published_version(open_queue) -> None:
    q = open_queue(QueueConfig(max_staleness=None))
    fill_buffer(q, 2, versions=[0, 5])
    lease = q.lease(2)
    assert len(lease.groups) == 2 and lease.version == 0


def test_lease_reports_staleness(open_queue) -> None:
    q = open_queue(QueueConfig(max_staleness=2))
    fill_buffer(q, 3, versions=[1, 2, 3])
    q.publish_version(3)
    lease = q.lease(3)
    assert lease.version == 3
    assert [g.min_version for g in lease.groups] == [1, 2, 3]
    assert lease.staleness == (2, 1.0)


def test_active_hold_hands_out_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    hold = q.hold()
    before = snapshot(raw, queue_name)
    assert q.lease(1) is None
    reply = execute(q, p.build(q.keys, "lease", lease_id="l1", token="t", trainer_id="t", groups=1, partial=1,
                               timeout_ms=0))
    assert p.s(reply[0]) == "held" and int(reply[1]) == 1
    assert snapshot(raw, queue_name) == before
    hold.release()
    assert len(q.lease(1).groups) == 1


def test_blocking_lease_wakes_on_a_completion(open_queue, redis_url, queue_name, raw) -> None:
    q = open_queue()
    other = RolloutQueue.from_url(redis_url, queue_name)
    try:
        submit(other, 1)
        w = other.worker("w-other")
        [res] = reserve_all(w, 1)

        def complete_once_blocked() -> None:
            # Wait for the trainer's XREAD BLOCK, a state, then hand in the completion.
            wait_until(lambda: any("b" in c.get("flags", "") for c in raw.client_list()), timeout=5)
            w.complete(res.receipt, samples_for(res))

        t = threading.Thread(target=complete_once_blocked)
        t.start()
        start = time.monotonic()
        lease = q.lease(1, block_ms=8000)
        elapsed = time.monotonic() - start
        t.join()
        assert lease is not None and lease.groups[0].entry_id == res.entry_id
        assert elapsed < 4.0, f"lease returned after {elapsed:.2f}s, not promptly"
    finally:
        other.close()


def test_blocking_lease_times_out(open_queue) -> None:
    q = open_queue()
    start = time.monotonic()
    assert q.lease(1, block_ms=300) is None
    elapsed = time.monotonic() - start
    assert 0.29 <= elapsed < 2.0


def test_replay_answers_identically(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 3)
    call = p.build(q.keys, "lease", lease_id="replay-1", token="tok-1", trainer_id="t", groups=2, partial=0,
                   timeout_ms=0)
    first = execute(q, call)
    after_first = snapshot(raw, queue_name)
    second = execute(q, call)
    assert first == second
    assert snapshot(raw, queue_name) == after_first, "a replay leases nothing more"
    parsed = p.parse_lease(second, "replay-1")
    assert parsed.status == "ok" and len(parsed.members) == 2
    decoded = p.decode_lease(parsed, execute(q, p.read_lease_payloads(q.keys, parsed)))
    assert [g.entry_id for g in decoded.groups] == [m.entry_id for m in parsed.members] and not decoded.undecodable
    assert [o for o, _ in pel(raw, queue_name).values()].count("@lease:replay-1") == 2
    # The same lease id with another token is refused and writes nothing.
    other = p.build(q.keys, "lease", lease_id="replay-1", token="tok-2", trainer_id="t", groups=2, partial=0,
                    timeout_ms=0)
    assert [p.s(x) for x in execute(q, other)] == ["lease_lost", "token"]
    assert snapshot(raw, queue_name) == after_first
    # Once the lease is settled, a late replay does not resurrect it.
    execute(q, p.build(q.keys, "commit", lease_id="replay-1", token="tok-1", step=""))
    assert [p.s(x) for x in execute(q, call)] == ["lease_lost", "committed"]


def test_bad_arguments_are_script_errors(open_queue) -> None:
    q = open_queue()
    with pytest.raises(ScriptError, match="ROLLOUTQ"):
        execute(q, p.build(q.keys, "lease", lease_id="bad id", token="t", trainer_id="t", groups=1, partial=0,
                           timeout_ms=0))
    with pytest.raises(ValueError):
        q.lease(0)


def test_with_commits_on_normal_exit(open_queue, raw, queue_name) -> None:
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    with q.lease(1) as lease:
        assert len(lease) == 1
    assert lease.closed == "committed"
    assert entry_id not in pel(raw, queue_name)
    assert ledger(raw, queue_name, entry_id).startswith(f"s|committed|1|w-fill|{lease.lease_id}|")


def test_with_rolls_back_on_exception(open_queue, raw, queue_name) -> None:
    """An error in the block may be the data's fault: an errored rollback (DESIGN rule 4), so the
    group goes back to the buffer with its completion and counts one trainer error."""
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    with pytest.raises(RuntimeError, match="optimizer blew up"):
        with q.lease(1) as lease:
            raise RuntimeError("optimizer blew up")
    assert lease.closed == "rolled_back"
    assert owners(raw, queue_name, [entry_id]) == ["@done"]
    assert zmembers(raw, queue_name, "buffer") == [entry_id]
    assert raw.zscore(keys(queue_name)["suspects"], entry_id) == 1
    last = orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))["h"][-1]
    assert (last["t"], last["r"]) == ("trainer_error", "RuntimeError: optimizer blew up")
    assert q.stats().leased == 0


def test_with_rolls_back_plain_on_an_interrupt(open_queue, raw, queue_name) -> None:
    """A KeyboardInterrupt (or SystemExit) is the trainer stopping, not the data: plain, not counted."""
    q = open_queue()
    [entry_id] = fill_buffer(q, 1)
    with pytest.raises(KeyboardInterrupt):
        with q.lease(1) as lease:
            raise KeyboardInterrupt
    assert lease.closed == "rolled_back"
    assert owners(raw, queue_name, [entry_id]) == ["@ready"]
    assert zmembers(raw, queue_name, "ready") == [entry_id]
    assert raw.zscore(keys(queue_name)["suspects"], entry_id) is None
    assert q.stats().leased == 0


def _buffer_on_attempts(q, attempts: list[int], versions: list[int]) -> list[str]:
    """Submit one group per entry of ``attempts``, fail each until its attempt number is reached, then
    complete them in submission order with samples of ``versions``. Returns the entry IDs."""
    ids = submit(q, len(attempts))
    want = dict(zip(ids, attempts))
    w = q.worker("w-mix")
    held = {}
    for _ in range(4 * max(attempts)):
        for res in w.reserve(max_groups=len(ids)):
            if res.receipt.attempt < want[res.entry_id]:
                w.fail(res.receipt, "once more")
            else:
                held[res.entry_id] = res
        if len(held) == len(ids):
            break
    assert [held[i].receipt.attempt for i in ids] == attempts
    for entry_id, v in zip(ids, versions):
        assert w.complete(held[entry_id].receipt, samples_for(held[entry_id], v)) == "buffered"
    return ids


def _put_ghost(raw, queue_name: str, member: str, after: str) -> None:
    """Write ``member`` into buffer and bufver by hand, just behind ``after`` in completion order."""
    for role in ("buffer", "bufver"):
        raw.zadd(keys(queue_name)[role], {member: raw.zscore(keys(queue_name)[role], after) + 0.5})


def test_a_batch_mixing_ghosts_stale_groups_and_attempts(open_queue, raw, queue_name) -> None:
    """One walk meets ghosts (garbage, an executing entry, an ID pending nowhere) and a stale group
    between members of different delivery counts: the ghosts are dropped and counted, the stale group
    goes back to ready, and every member keeps its exact attempt through the lease, a replay of it
    and a rollback (moves between the queue's own owners never change the delivery count)."""
    q = open_queue(QueueConfig(max_staleness=1, max_attempts=5))
    a, b, c, d, e, f = _buffer_on_attempts(q, [1, 3, 2, 1, 3, 2], [2, 0, 2, 2, 2, 0])
    [executing] = submit(q, 1)
    [other] = q.worker("w-other").reserve(1)
    _put_ghost(raw, queue_name, "not-an-id", after=a)
    _put_ghost(raw, queue_name, executing, after=c)
    _put_ghost(raw, queue_name, "1-1", after=d)
    q.publish_version(2)  # floor 1: b and f (v0) are stale
    ghosts_before = int(meta(raw, queue_name).get("ghosts", 0))

    call = p.build(q.keys, "lease", lease_id="mix-1", token="tok", trainer_id="t", groups=4, partial=0,
                   timeout_ms=0)
    first = execute(q, call)
    replay = execute(q, call)
    assert first == replay, "the replay reads attempts from the PEL, the lease from its walk: they agree"
    lease = p.parse_lease(first, "mix-1")
    assert [(m.entry_id, m.attempt) for m in lease.members] == [(a, 1), (c, 2), (d, 1), (e, 3)]
    table = pel(raw, queue_name)
    assert {i: table[i] for i in (a, c, d, e)} == {a: ("@lease:mix-1", 1), c: ("@lease:mix-1", 2),
                                                   d: ("@lease:mix-1", 1), e: ("@lease:mix-1", 3)}
    assert table[b] == ("@ready", 3), "a stale eviction keeps the attempt"
    assert table[f] == ("@ready", 2), "stale groups are evicted up front, met by the walk or not"
    assert table[executing] == ("w-other", other.receipt.attempt), "a ghost's real owner is untouched"
    for role in ("buffer", "bufver"):
        assert zmembers(raw, queue_name, role) == []
    assert int(meta(raw, queue_name)["ghosts"]) == ghosts_before + 3

    execute(q, p.build(q.keys, "rollback", lease_id="mix-1", token="tok", reason="", count=64))
    table = pel(raw, queue_name)
    assert [table[i] for i in (a, c, d, e)] == [("@ready", 1), ("@ready", 2), ("@ready", 1), ("@ready", 3)]
    again = {r.entry_id: r.receipt.attempt for r in q.worker("w-again").reserve(8)}
    assert again == {b: 4, a: 2, c: 3, d: 2, e: 4, f: 3}, "only a grant to a worker raises the attempt"


def test_members_past_the_owner_span_cut_are_asked_one_by_one(open_queue, raw, queue_name) -> None:
    """The walk reads @done's PEL over the span of a buffer batch; when @done holds more entries in
    that span than the read's limit, the members it did not list are still found (not taken for ghosts)."""
    q = open_queue(QueueConfig(max_attempts=5))
    ids = submit(q, 60, n=1)
    w = q.worker("w-span")
    held = {r.entry_id: r for r in reserve_all(w, 60)}
    order = [ids[0], ids[59]] + ids[1:59]  # the first two completions span every entry
    complete_all(w, [held[i] for i in order])
    ghosts_before = int(meta(raw, queue_name).get("ghosts", 0))
    lease = q.lease(2)
    assert [g.entry_id for g in lease.groups] == [ids[0], ids[59]]
    assert int(meta(raw, queue_name).get("ghosts", 0)) == ghosts_before
    assert zmembers(raw, queue_name, "buffer") == ids[1:59]


def test_a_lease_larger_than_one_command_chunk(open_queue, raw, queue_name) -> None:
    """Submit, lease and commit batch per-member work in chunks of 1000 items: 1001 groups cross
    every chunk boundary (HMGET/HSET ids, ZMSCORE, XCLAIM, ZREM, the payloads' MGET and DEL)."""
    q = open_queue(QueueConfig(max_completed_groups=2048))
    ids = submit(q, 1001, n=1)
    assert len(set(ids)) == 1001 and int(raw.hlen(keys(queue_name)["ids"])) == 1001
    w = q.worker("w-big")
    complete_all(w, reserve_all(w, 1001))
    lease = q.lease(1001)
    assert [g.entry_id for g in lease.groups] == ids
    assert all(g.attempt == 1 and len(g.samples) == 1 for g in lease.groups)
    assert set(owners(raw, queue_name, ids)) == {f"@lease:{lease.lease_id}"}
    assert zmembers(raw, queue_name, "buffer") == [] and zmembers(raw, queue_name, "bufver") == []
    lease.commit()
    assert q.stats().committed == 1001
    assert payload_keys(raw, queue_name) == set()


def test_the_reply_names_members_and_the_payloads_follow_in_one_mget(open_queue, raw, queue_name) -> None:
    """P2: the script answers {entry_id, attempt, min_version, fields} per member and no payload; the
    flow reads the payloads with one MGET of the members' payload keys (entry and attempt) after it,
    and the groups decode to what the workers sent."""
    q = open_queue()
    ids = fill_buffer(q, 3, versions=[0, 1, 2])
    stored = [raw.get(keys(queue_name).payload(i, 1)) for i in ids[:2]]
    assert all(stored)
    flow = flows.lease(q.keys, "t", 2, False, None, 0, q.clock)
    script = next(flow)
    reply = execute(q, script)
    assert [len(item) for item in reply[4]] == [4, 4], "entry_id, attempt, min_version, fields: no payload"
    assert not any(blob in repr(reply).encode() for blob in stored)
    read = flow.send(reply)
    assert read == p.Command(("MGET", *(keys(queue_name).payload(i, 1) for i in ids[:2])))
    with pytest.raises(StopIteration) as stop:
        flow.send(execute(q, read))
    r, _ = stop.value.value
    assert [(g.entry_id, g.attempt, g.min_version) for g in r.groups] == [(ids[0], 1, 0), (ids[1], 1, 1)]
    for g, blob in zip(r.groups, stored):
        assert g.samples == decode_completion(blob), "the lazy samples equal an eager decode"
        cols = g.columns()
        assert cols.token_ids.tolist() == [t for s in g.samples for t in s.token_ids]
        assert list(cols.counts) == [len(s.token_ids) for s in g.samples]


def _lease_until_the_read(q, groups: int, timeout_s: float | None = None):
    """Drive flows.lease by hand up to its payload read; returns (flow, the MGET, the parsed reply)."""
    flow = flows.lease(q.keys, "t", groups, False, timeout_s, 0, q.clock)
    reply = execute(q, next(flow))
    read = flow.send(reply)
    assert isinstance(read, p.Command) and read.args[0] == "MGET"
    return flow, read, p.parse_lease(reply, p.s(reply[1]))


def _finish(q, flow, reply):
    """Send ``reply`` into ``flow`` and run its remaining calls; returns the flow's result."""
    try:
        while True:
            reply = execute(q, flow.send(reply))
    except StopIteration as stop:
        return stop.value


def test_a_payload_deleted_before_the_read_is_undecodable_and_handed_back(open_queue, raw, queue_name) -> None:
    """A payload gone between the script and the MGET (edited by hand) makes its group undecodable:
    the flow rolls the lease back (nothing trained, nothing lost) and tries again, never crashes."""
    q = open_queue()
    ids = fill_buffer(q, 3)
    flow, read, parsed = _lease_until_the_read(q, 2)
    assert raw.delete(keys(queue_name).payload(ids[0], 1)) == 1
    payloads = execute(q, read)
    assert payloads[0] is None
    decoded = p.decode_lease(parsed, payloads)
    assert decoded.undecodable == (ids[0],) and [g.entry_id for g in decoded.groups] == [ids[1]]
    assert _finish(q, flow, payloads) is None, "handed back, then only one fresh group is buffered"
    assert raw.hget(keys(queue_name).lease(parsed.lease_id), "state") == b"rolled_back"
    assert owners(raw, queue_name, ids) == ["@ready", "@ready", "@done"]
    assert zmembers(raw, queue_name, "ready") == ids[:2]
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(ids[2], 1)}  # the hand-back dropped ids[1]'s
    assert q.stats().leased == 0


def test_a_lease_expired_before_the_read_is_undecodable_and_left_to_the_reaper(open_queue, raw, queue_name) -> None:
    """The lease expires between the script and the MGET and the reaper requeues its members (their
    payloads go): the read finds nothing, the flow's hand-back meets an expired lease, and the flow
    tries again instead of raising LeaseLost at a trainer that never saw the lease."""
    q = open_queue()
    ids = fill_buffer(q, 2)
    flow, read, parsed = _lease_until_the_read(q, 2, timeout_s=0.05)
    wait_past(raw, parsed.deadline_ms)
    assert q.reap().expired == 2
    assert payload_keys(raw, queue_name) == set()
    payloads = execute(q, read)
    assert payloads == [None, None]
    assert _finish(q, flow, payloads) is None
    assert raw.hget(keys(queue_name).lease(parsed.lease_id), "state") == b"expired"
    assert owners(raw, queue_name, ids) == ["@ready", "@ready"]


def test_groups_of_an_errored_lease_are_held_apart_while_more_groups_can_come(open_queue, raw, queue_name) -> None:
    """DESIGN rule 4 (issue 29 item 12): a lease takes at most one group marked by an errored rollback
    while an attempt is executing (more groups will come), so a group that breaks the trainer is not
    leased again beside the same companions; once nothing else can come, they fill the lease."""
    q = open_queue()
    a, b, c = fill_buffer(q, 3)
    q.lease(2).rollback(reason="ValueError: boom")  # a and b are marked, back at the head of the buffer
    [x] = submit(q, 1)
    w = q.worker("w-late")
    [res] = w.reserve(1)  # executing: another group is coming
    assert q.lease(3) is None, "a and c only: b is held apart while x is executing"
    partial = q.lease(3, partial=True)
    assert [g.entry_id for g in partial.groups] == [a, c]
    partial.commit()
    complete_all(w, [res])
    full = q.lease(2)
    assert [g.entry_id for g in full.groups] == [b, x]
    full.commit()
    assert q.stats().committed == 4


def test_held_apart_groups_fill_a_lease_when_the_buffer_is_full(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_completed_groups=3))
    a, b, c = fill_buffer(q, 3)
    lease = q.lease(3)
    submit(q, 1)
    w = q.worker("w-late")
    [res] = w.reserve(1)  # executing while the buffer is empty
    lease.rollback(reason="ValueError: boom")  # all three marked: the buffer is full again
    assert w.reserve(1) == [], "reserve stops at a full buffer: nothing else can come"
    again = q.lease(3)
    assert again is not None and [g.entry_id for g in again.groups] == [a, b, c]
    w.abort(res.receipt, "done")
