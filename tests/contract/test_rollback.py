"""rollback.lua: leased -> ready (plain) or back to the buffer, counted (errored), against real
servers over both transports.

Proves the header's outcomes ('rolled_back', 'replay', 'lease_lost' for unknown / token / committed /
expired) with byte-identical keys on every refusal, and DESIGN: a plain rollback puts the members
back to ready under the same entry ID with the pristine payload, in submission order, not counted
toward max_attempts; an errored one (the trainer raised on the data, rule 4) puts them back at the
head of the buffer with their completions, marked, and dead-letters a group at max_attempts marks,
so a poison group cannot loop for ever nor take the innocent groups of its batches with it.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_queue import LeaseLost, QueueConfig, Receipt, Reservation
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    fill_buffer,
    history,
    keys,
    ledger,
    make_groups,
    meta,
    owners,
    payload_keys,
    pel,
    reserve_all,
    samples_for,
    server_ms,
    wait_past,
    zmembers,
)
from tests.helpers import wait_until


def test_header_matches_builder() -> None:
    check_header("rollback", ["src", "meta", "ready", "buffer", "bufver", "leases", "history", "ledger", "dlq", "parked", "settled", "suspects", "wake_work", "wake_done", "counters", "leased"],
                 ["lease_id", "token", "reason", "count"])


def test_rollback_requeues_the_same_entries_pristine(open_queue, raw, queue_name) -> None:
    q = open_queue()
    groups = make_groups(3)
    ids = q.submit(groups)
    w = q.worker("w-a")
    complete_all(w, reserve_all(w, 3))
    lease = q.lease(3)
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in ids}  # kept while leased
    assert lease.rollback() == 3
    assert lease.closed == "rolled_back"
    # Same entry IDs, owned by @ready, in submission order; the delivery count is kept.
    assert {e: pel(raw, queue_name)[e] for e in ids} == {e: ("@ready", 1) for e in ids}
    assert zmembers(raw, queue_name, "ready") == ids
    assert payload_keys(raw, queue_name) == set()  # the completions are dropped with the lease
    for entry_id in ids:
        # The ledger still names the attempt that completed: its worker's retry of complete replays.
        assert ledger(raw, queue_name, entry_id) == "a|1|w-a|completed"
        assert orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))["f"] == 0
    record = keys(queue_name).lease(lease.lease_id)
    assert raw.hget(record, "state") == b"rolled_back" and raw.pttl(record) > 0
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None
    m = meta(raw, queue_name)
    assert (m["leased"], m["rolled_back"], m["retained"]) == ("0", "3", "3")
    # The next attempt sees the original reservation, at attempt 2.
    again = w.reserve(max_groups=3)
    assert [r.entry_id for r in again] == ids
    assert [r.receipt.attempt for r in again] == [2, 2, 2]
    assert [r.group for r in again] == groups


def test_rollbacks_do_not_count_toward_max_attempts(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=1))
    [entry_id] = fill_buffer(q, 1)
    w = q.worker("w-fill")
    for attempt in (2, 3):
        q.lease(1).rollback()
        [res] = w.reserve(1)
        assert (res.entry_id, res.receipt.attempt) == (entry_id, attempt)
        complete_all(w, [res])
    assert q.stats().dead == 0
    q.lease(1).commit()
    assert q.stats().committed == 1


def test_rollback_replay_returns_zero_and_writes_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 2)
    lease = q.lease(2)
    assert lease.rollback() == 2
    before = snapshot(raw, queue_name)
    assert lease.rollback() == 0
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("field,value,state", [("lease_id", "no-such-lease", "unknown"),
                                               ("token", "wrong-token", "token")])
def test_rollback_unknown_lease_or_wrong_token_is_lost(open_queue, raw, queue_name, field, value, state) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    setattr(lease, field, value)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.rollback()
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before


def test_rollback_after_commit_is_lost(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1)
    lease.commit()
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.rollback()
    assert err.value.state == "committed"
    assert snapshot(raw, queue_name) == before


def test_rollback_after_the_reaper_expired_it_is_lost(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.05)
    wait_past(raw, lease.deadline_ms)
    assert q.reap().expired == 1
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.rollback()
    assert err.value.state == "expired"
    assert snapshot(raw, queue_name) == before


def test_rolled_back_work_goes_ahead_of_the_backlog(open_queue, raw, queue_name) -> None:
    q = open_queue()
    ids = fill_buffer(q, 2)
    q.lease(2).rollback()
    later = q.submit(make_groups(2))
    got = q.worker("w-b").reserve(max_groups=4)
    assert [r.entry_id for r in got] == ids + later
    assert [r.receipt.attempt for r in got] == [2, 2, 1, 1]


def test_rollback_in_batches_fences_the_lease_from_the_first_call(open_queue, raw, queue_name) -> None:
    from rollout_queue.core import protocol as p
    from tests.contract.lifecycle import execute, owners

    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(3)
    call = p.build(q.keys, "rollback", lease_id=lease.lease_id, token=lease.token, reason="", count=1)
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, call)] == ["ok", "rolled_back", 1, 0, 0]
    assert owners(raw, queue_name, ids) == ["@ready"] + [f"@lease:{lease.lease_id}"] * 2
    # A commit after the first batch is refused: the record already says rolled_back.
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        lease.commit()
    assert err.value.state == "rolled_back"
    assert snapshot(raw, queue_name) == before
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, call)] == ["ok", "replay", 1, 0, 0]
    # The trainer dies here; the reaper finishes the rollback under the same terminal.
    q.reap()
    assert owners(raw, queue_name, ids) == ["@ready"] * 3
    m = meta(raw, queue_name)
    assert (m["leased"], m["rolled_back"], m.get("expired", "0")) == ("0", "3", "0")
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) is None


# -- errored rollbacks: the trainer raised on the data (issue 29 item 12, DESIGN rule 4) -----------


def test_an_errored_rollback_hands_the_members_back_to_the_head_of_the_buffer_counted(
        open_queue, raw, queue_name) -> None:
    q = open_queue()
    a, b, c = fill_buffer(q, 3)
    lease = q.lease(2)
    assert lease.rollback(reason="ValueError: nan loss") == 2
    assert owners(raw, queue_name, [a, b, c]) == ["@done"] * 3
    assert pel(raw, queue_name)[a] == ("@done", 1) and pel(raw, queue_name)[b] == ("@done", 1)  # same attempt
    assert zmembers(raw, queue_name, "buffer") == [a, b, c], "back at the head, before the groups behind"
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in (a, b, c)}  # kept
    for entry_id in (a, b):
        assert raw.zscore(keys(queue_name)["suspects"], entry_id) == 1
        assert ledger(raw, queue_name, entry_id) == "a|1|w-fill|completed"  # its worker's retry still replays
        h = orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))
        assert h["f"] == 0, "a trainer error is not a worker failure"
        assert {k: h["h"][-1][k] for k in ("a", "w", "t", "r", "c")} == {
            "a": 1, "w": f"@lease:{lease.lease_id}", "t": "trainer_error", "r": "ValueError: nan loss", "c": "w-fill"}
    assert raw.hget(keys(queue_name).lease(lease.lease_id), "error") == b"ValueError: nan loss"
    m = meta(raw, queue_name)
    assert (m["leased"], m["rolled_back"], m["retained"]) == ("0", "2", "3")
    again = q.lease(3)  # nothing is executing: the marked groups may share a lease (no other group can come)
    assert [g.entry_id for g in again.groups] == [a, c, b] and [g.attempt for g in again.groups] == [1, 1, 1]
    again.commit()
    assert q.stats().committed == 3


def test_a_group_in_max_attempts_errored_leases_is_dead_lettered_with_the_trainers_reason(
        open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=2))
    [entry_id] = fill_buffer(q, 1)
    assert q.lease(1).rollback(reason="RuntimeError: shape mismatch") == 1
    last = q.lease(1)
    assert last.rollback(reason="RuntimeError: shape mismatch again") == 0  # dead-lettered: not handed back
    [letter] = q.dead_letters()
    assert (letter.entry_id, letter.reason) == (entry_id, "trainer_error: RuntimeError: shape mismatch again")
    assert [(x["t"], x["r"]) for x in letter.history] == [
        ("trainer_error", "RuntimeError: shape mismatch"), ("trainer_error", "RuntimeError: shape mismatch again")]
    assert ledger(raw, queue_name, entry_id) == (
        f"s|dead|1|@lease:{last.lease_id}|trainer_error: RuntimeError: shape mismatch again")
    assert raw.zscore(keys(queue_name)["suspects"], entry_id) is None
    assert payload_keys(raw, queue_name) == set()
    s = q.stats()
    assert (s.dead, s.retained, s.leased, s.completed) == (1, 0, 0, 0)
    # The completing worker's resent complete still answers as the replay it is (replayed.lua, `c`).
    res = Reservation(Receipt(entry_id, 1, "w-fill"), make_groups(1)[0], 0)
    assert q.worker("w-fill").complete(res.receipt, samples_for(res)) == "replay"


def test_a_poison_group_does_not_kill_the_innocent_groups_of_its_batches(open_queue, raw, queue_name) -> None:
    """The default config (max_attempts=3): one group makes every lease holding it raise. Leases hold
    marked groups apart, so the poison group meets new companions each time: it alone reaches the
    bound and is dead-lettered; every innocent group is trained (or still waits, with fewer than a
    batch left), none is dead-lettered, none carries more than one mark."""
    q = open_queue()
    ids = fill_buffer(q, 24)
    poison = ids[1]
    crashes = 0
    while (lease := q.lease(4)) is not None:
        if poison in [g.entry_id for g in lease.groups]:
            crashes += 1
            lease.rollback(reason="ValueError: the loss is nan")
        else:
            lease.commit()
    [letter] = q.dead_letters()
    assert letter.entry_id == poison and letter.reason == "trainer_error: ValueError: the loss is nan"
    assert crashes == 3
    s = q.stats()
    assert s.dead == 1 and s.committed >= 24 - 1 - 3 and s.committed + s.completed == 23
    marks = {k.decode(): v for k, v in raw.zrange(keys(queue_name)["suspects"], 0, -1, withscores=True)}
    assert poison not in marks and max(marks.values()) == 1


def test_an_errored_rollback_follows_its_first_call_and_a_resend_counts_nothing_twice(
        open_queue, raw, queue_name) -> None:
    from rollout_queue.core import protocol as p
    from tests.contract.lifecycle import execute

    q = open_queue()
    ids = fill_buffer(q, 3)
    lease = q.lease(3)
    first = p.build(q.keys, "rollback", lease_id=lease.lease_id, token=lease.token, reason="boom", count=1)
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, first)] == ["ok", "rolled_back", 1, 0, 0]
    plain = p.build(q.keys, "rollback", lease_id=lease.lease_id, token=lease.token, reason="", count=1)
    assert [p.s(x) if isinstance(x, bytes) else x for x in execute(q, plain)] == ["ok", "replay", 1, 0, 0]
    assert owners(raw, queue_name, ids) == ["@done", "@done", f"@lease:{lease.lease_id}"]
    # The trainer dies here: the reaper finishes the rest plain (a trainer's death is not counted).
    q.reap()
    assert owners(raw, queue_name, ids) == ["@done", "@done", "@ready"]
    assert [raw.zscore(keys(queue_name)["suspects"], i) for i in ids] == [1, 1, None]
    before = snapshot(raw, queue_name)
    assert lease.rollback(reason="boom") == 0  # done: a replay writes nothing, counts nothing
    assert snapshot(raw, queue_name) == before


def test_an_errored_rollback_without_room_in_the_buffer_requeues_to_ready(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_completed_groups=2))
    ids = fill_buffer(q, 2)
    lease = q.lease(2)
    refill = fill_buffer(q, 2)  # the buffer is full again
    assert lease.rollback(reason="boom") == 2
    assert owners(raw, queue_name, ids) == ["@ready"] * 2 and zmembers(raw, queue_name, "buffer") == refill
    assert payload_keys(raw, queue_name) == {keys(queue_name).payload(e, 1) for e in refill}
    assert [raw.zscore(keys(queue_name)["suspects"], i) for i in ids] == [1, 1]  # marked all the same
    assert [history(raw, queue_name, i)[-1]["t"] for i in ids] == ["trainer_error"] * 2


def test_prune_forgets_a_settled_groups_mark(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(settled_retention_s=0.001))
    [entry_id] = fill_buffer(q, 1)
    q.lease(1).rollback(reason="boom")
    q.lease(1).commit()
    assert raw.zscore(keys(queue_name)["suspects"], entry_id) == 1
    start = server_ms(raw)
    wait_until(lambda: server_ms(raw) > start + 2, message="past the retention")
    assert q.reap().pruned == 1
    assert raw.zscore(keys(queue_name)["suspects"], entry_id) is None


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.integers(2, 5), extra=st.integers(0, 6), where=st.integers(0, 10**6),
       order=st.sampled_from(["fifo", "lifo"]), n=st.integers(0, 10**9))
def test_a_poison_group_alone_reaches_the_bound_wherever_it_sits(open_queue, raw, queue_name, batch: int,
                                                                  extra: int, where: int, order: str,
                                                                  n: int) -> None:
    """Any batch size k and buffer order, the poison group anywhere with at least (k - 1)(k + 1) other
    groups after its first lease in the walk: holding apart needs companions (DESIGN, "A group that
    breaks the trainer", Limits: its k - 1 batch-mates may each take a lease of fresh groups before it
    is retried, then two more leases). It alone is dead-lettered, after exactly max_attempts errored
    leases, and no innocent group carries more than one mark."""
    name = f"{queue_name}-{n}"
    q = open_queue(QueueConfig(buffer_order=order), name=name)
    try:
        ids = fill_buffer(q, batch + (batch - 1) * (batch + 1) + extra)
        walk = ids if order == "fifo" else ids[::-1]
        poison = walk[where % (extra + 1)]  # its first lease ends within the first batch + extra groups
        crashes = 0
        while (lease := q.lease(batch)) is not None:
            if poison in [g.entry_id for g in lease.groups]:
                crashes += 1
                lease.rollback(reason="poison")
            else:
                lease.commit()
        assert crashes == 3 and [d.entry_id for d in q.dead_letters()] == [poison]
        marks = [v for _, v in raw.zrange(keys(name)["suspects"], 0, -1, withscores=True)]
        assert marks and max(marks) == 1
        s = q.stats()
        assert s.committed + s.completed == len(ids) - 1 and s.completed < batch
    finally:
        doomed = list(raw.scan_iter(match=f"rollout:{{{name}}}:*", count=1000))
        if doomed:
            raw.unlink(*doomed)


def test_an_errored_rollback_over_partitions_counts_each_partitions_members(open_queue, raw, queue_name) -> None:
    """A composite lease rolls back member by member: each partition marks and re-buffers its own."""
    q = open_queue(QueueConfig(max_executing_samples=64, max_retained_groups=64, max_completed_groups=64),
                   partitions=2)
    fill_buffer(q, 8)
    lease = q.lease(6)
    assert len(lease.members) == 2, "drawn from both partitions"
    assert lease.rollback(reason="boom") == 6
    marked = {i: {m.decode() for m in raw.zrange(keys(f"{queue_name}#{i}")["suspects"], 0, -1)} for i in (0, 1)}
    assert sum(len(v) for v in marked.values()) == 6 and all(marked.values())
    s = q.stats()
    assert (s.completed, s.leased, s.dead) == (8, 0, 0)
