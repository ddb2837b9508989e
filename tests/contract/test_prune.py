"""Contract of prune.lua (and of the settle-time records that commit, filter, checkpoint, dlq_purge and
dlq_requeue write for it), against real servers over both transports.

Header outcomes: {'ok', pruned, done 0|1}; nothing is due while settled_retention_s = None. What it
proves: only groups settled at least the retention ago lose their ledger line and source_id mapping,
for every kind of settlement; owned, kept and dead-lettered groups never do; a second prune changes
nothing; a call handles at most `count` groups; after pruning, a retried settlement is refused with a
typed error (never a replay), a submit of the source_id adds a new entry (the dedupe window is the
retention), while a producer's cursor still refuses to enqueue a batch twice; and memory returns to
~0 for the ledger, the ids and the settled keys once N committed groups are pruned.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from rollout_queue import LeaseLost, NotFound, QueueConfig, ReapReport, RolloutQueue, StaleReceipt
from rollout_queue.core import flows, protocol
from rollout_queue.ops import views
from rollout_queue.ops import actions
from rollout_queue.core.flows import producer as pf
from rollout_queue.core.errors import ScriptError
from rollout_queue.ops.reaper import run_reaper
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (check_header, complete_all, execute, fill_buffer, keys, ledger, make_groups,
                                      reserve_all, samples_for, server_ms, submit, train, wait_past)
from tests.helpers import after_settling

RETENTION_S = 0.05
CFG = QueueConfig(settled_retention_s=RETENTION_S, max_attempts=1)


def test_header_matches_builder() -> None:
    check_header("prune", ["meta", "ledger", "history", "ids", "settled", "suspects", "counters"], ["count"])
    check_header("reap_scan", ["meta", "workers", "leases", "holds", "bufver", "settled", "kept", "retired"],
                 ["count"])
    check_header("sweep_owners", ["src", "meta", "workers", "leases"], ["count"])
    check_header("filter", ["src", "ledger", "wake_work", "parked", "counters"],
                 ["entry_id", "attempt", "worker_id", "reason", "tokens"])


# -- helpers ---------------------------------------------------------------------------------------


def _hlen(raw: redis.Redis, queue_name: str, role: str) -> int:
    return int(raw.hlen(keys(queue_name)[role]))


def _sid_of(raw: redis.Redis, queue_name: str, source_id: str) -> str:
    got = raw.hget(keys(queue_name)["ids"], source_id)
    return got.decode() if got else ""


def _records(raw: redis.Redis, queue_name: str) -> list[tuple[int, list[tuple[str, str]]]]:
    """The settled stream: (settle time ms, [(entry ID, source_id), ...]) per record."""
    out = []
    for rid, kv in raw.xrange(keys(queue_name)["settled"]):
        pairs = [(k.decode(), v.decode()) for k, v in kv.items()]
        out.append((int(rid.decode().split("-")[0]), pairs))
    return out


def _sources_of(raw: redis.Redis, queue_name: str, ids: list[str]) -> list[str]:
    """The source_id each entry ID was submitted under (read from ids, before pruning)."""
    by_entry = {v.decode(): k.decode() for k, v in raw.hgetall(keys(queue_name)["ids"]).items()}
    return [by_entry[i] for i in ids]


def _recorded(raw: redis.Redis, queue_name: str) -> dict[str, str]:
    return {eid: sid for _, pairs in _records(raw, queue_name) for eid, sid in pairs}


def _past_retention(raw: redis.Redis, retention_s: float = RETENTION_S) -> None:
    """Wait until everything settled so far is due (the server clock is past now + retention)."""
    wait_past(raw, server_ms(raw) + int(retention_s * 1000))


def _prune_once(q: Any, queue_name: str, count: int = flows.BATCH) -> list[Any]:
    reply = execute(q, protocol.build(keys(queue_name), "prune", count=count))
    return [x.decode() if isinstance(x, bytes) else x for x in reply]


# -- due vs not due; every settlement kind ---------------------------------------------------------


def test_commit_records_each_member_with_its_source_id_and_prune_forgets_them(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    ids = fill_buffer(q, 3)
    train(q, 3)
    assert _recorded(raw, queue_name) == dict(zip(ids, _sources_of(raw, queue_name, ids)))
    assert all(ledger(raw, queue_name, i).startswith("s|committed|") for i in ids)
    _past_retention(raw)
    assert q.reap() == ReapReport(pruned=3)
    assert (_hlen(raw, queue_name, "ledger"), _hlen(raw, queue_name, "ids")) == (0, 0)
    assert raw.xlen(keys(queue_name)["settled"]) == 0
    s = q.stats()
    assert (s.committed, s.ledger_lines, s.source_ids, s.counters["pruned"]) == (3, 0, 0, 3)


def test_only_groups_settled_a_retention_ago_are_pruned(open_queue, raw, queue_name) -> None:
    retention_ms = 500
    q = open_queue(QueueConfig(settled_retention_s=retention_ms / 1000))
    first = fill_buffer(q, 2)
    train(q, 2)
    wait_past(raw, _records(raw, queue_name)[-1][0] + retention_ms)
    second = fill_buffer(q, 2)
    train(q, 2)
    second_ms = _records(raw, queue_name)[-1][0]
    before_ms = server_ms(raw)
    reply = _prune_once(q, queue_name)
    after_ms = server_ms(raw)
    assert all(ledger(raw, queue_name, i) == "" for i in first), "due groups were not pruned"
    # The second pair is due only if this machine stalled for a whole retention (then it must go too).
    if second_ms > after_ms - retention_ms:
        assert reply == ["ok", 2, 1]
        assert all(ledger(raw, queue_name, i).startswith("s|committed|") for i in second)
        assert set(_recorded(raw, queue_name)) == set(second)
    elif second_ms <= before_ms - retention_ms:
        assert reply == ["ok", 4, 1]


def test_nothing_due_changes_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(settled_retention_s=3600))
    fill_buffer(q, 2)
    train(q, 2)
    before = snapshot(raw, queue_name)
    assert _prune_once(q, queue_name) == ["ok", 0, 1]
    assert q.reap() == ReapReport()
    assert snapshot(raw, queue_name) == before


def test_filter_is_recorded_and_pruned(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    [g] = make_groups(1)
    [eid] = q.submit([g])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.filter(res.receipt, "zero_std") == "filtered"
    assert _recorded(raw, queue_name) == {}  # parked: settle_parked records it for prune
    after_settling(q)
    assert _recorded(raw, queue_name) == {eid: g.source_id}
    _past_retention(raw)
    assert q.reap().pruned == 1
    assert ledger(raw, queue_name, eid) == "" and _sid_of(raw, queue_name, g.source_id) == ""
    with pytest.raises(NotFound, match="pruned after settled_retention_s"):
        q.run(views.entry(q.keys, eid))
    with pytest.raises(StaleReceipt) as info:  # the retried filter: refused, not replayed
        w.filter(res.receipt, "zero_std")
    assert (info.value.owner, info.value.delivery_count) == ("", 0)


def test_a_kept_group_is_recorded_only_when_a_checkpoint_drops_it(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    ids = fill_buffer(q, 2)
    train(q, 2, step=5)
    _past_retention(raw)
    before = snapshot(raw, queue_name)
    assert q.reap() == ReapReport()  # kept for restore: its ledger line (the attempt) must stay
    assert snapshot(raw, queue_name) == before
    assert q.checkpoint(5) == 2
    sources = _sources_of(raw, queue_name, ids)
    assert _recorded(raw, queue_name) == dict(zip(ids, sources))
    _past_retention(raw)
    assert q.reap().pruned == 2
    assert (_hlen(raw, queue_name, "ledger"), _hlen(raw, queue_name, "ids")) == (0, 0)


def test_a_commit_at_a_covered_step_is_recorded_at_commit(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    assert q.checkpoint(7) == 0
    ids = fill_buffer(q, 2)
    train(q, 2, step=3)  # 3 <= checkpoint 7: no kept copy, settled now
    assert set(_recorded(raw, queue_name)) == set(ids)
    _past_retention(raw)
    assert q.reap().pruned == 2


def _dead(q: Any, count: int) -> list[str]:
    ids = submit(q, count)
    w = q.worker("w-dead")
    for res in reserve_all(w, count):
        assert w.fail(res.receipt, "engine crashed") == "dead"  # max_attempts = 1
    after_settling(q)  # parked by the worker's fail; settled (dead-lettered) here
    return ids


def test_dead_letters_are_kept_until_purged_then_pruned(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    ids = _dead(q, 3)
    _past_retention(raw)
    before = snapshot(raw, queue_name)
    assert q.reap() == ReapReport()  # in the DLQ: the ledger line and the mapping stay
    assert snapshot(raw, queue_name) == before
    letters = after_settling(q).dead_letters()
    assert q.run(actions.purge_dead_letters(q.keys, [letters[0].dlq_id] * 2)) == 1  # listed ids, counted once
    assert set(_recorded(raw, queue_name)) == {ids[0]}
    assert q.run(actions.purge_all_dead_letters(q.keys)) == 2  # up to the newest
    assert set(_recorded(raw, queue_name)) == set(ids)
    _past_retention(raw)
    assert q.reap().pruned == 3
    assert (_hlen(raw, queue_name, "ledger"), _hlen(raw, queue_name, "ids")) == (0, 0)
    assert q.stats().dead == 0


def test_a_requeued_dead_letter_forgets_the_old_id_but_keeps_the_mapping(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    [old] = _dead(q, 1)
    [letter] = after_settling(q).dead_letters()
    new = q.requeue_dead_letter(letter.dlq_id)
    assert _recorded(raw, queue_name) == {old: letter.source_id}
    _past_retention(raw)
    assert q.reap().pruned == 1
    assert ledger(raw, queue_name, old) == ""
    assert _sid_of(raw, queue_name, letter.source_id) == new, "the mapping names the live entry"
    assert q.submit([letter.group]) == [new]


def test_retention_none_records_nothing_and_prunes_nothing(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(settled_retention_s=None))
    fill_buffer(q, 2)
    train(q, 2)
    assert raw.exists(keys(queue_name)["settled"]) == 0
    assert _prune_once(q, queue_name) == ["ok", 0, 1]
    assert q.stats().ledger_lines == 2


# -- never an owned group --------------------------------------------------------------------------


def test_owned_groups_are_never_pruned(open_queue, raw, queue_name) -> None:
    """Executing, ready (after a failure), completed, leased, kept and dead groups all outlive the
    retention untouched, even while settled groups beside them are pruned."""
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, max_attempts=2, max_completed_groups=10))
    w = q.worker("w1")
    settled = fill_buffer(q, 1)
    train(q, 1)
    kept = fill_buffer(q, 1)
    train(q, 1, step=9)
    leased = fill_buffer(q, 1)
    lease = q.lease(1)
    completed = fill_buffer(q, 1)
    [dead] = submit(q, 1)
    for outcome in ("ready", "dead"):  # max_attempts 2 here
        [res] = w.reserve(1)
        assert w.fail(res.receipt, "oom") == outcome
    [ready] = submit(q, 1)
    [res] = w.reserve(1)
    assert w.fail(res.receipt, "oom") == "ready"
    [executing] = submit(q, 1)
    [running] = w.reserve(1)
    owned = {i: ledger(raw, queue_name, i) for i in [kept[0], leased[0], completed[0], dead, ready]}
    assert ledger(raw, queue_name, executing) == "" and all(owned.values())
    mapped = dict(raw.hgetall(keys(queue_name)["ids"]))
    _past_retention(raw)
    assert q.reap().pruned == 1
    assert ledger(raw, queue_name, settled[0]) == ""
    assert {i: ledger(raw, queue_name, i) for i in owned} == owned
    assert set(mapped) - set(raw.hgetall(keys(queue_name)["ids"])) == {_source_raw(mapped, settled[0])}
    # Still owned, so still settled normally: nothing of theirs went missing.
    assert w.complete(running.receipt, samples_for(running)) == "buffered"
    assert lease.commit()


def _source_raw(mapped: dict[bytes, bytes], entry_id: str) -> bytes:
    [sid] = [k for k, v in mapped.items() if v.decode() == entry_id]
    return sid


def test_a_hand_written_record_never_forgets_an_unsettled_group(open_queue, raw, queue_name) -> None:
    """Garbage in settled (an owned entry, a backlog entry, an id that is no entry) is dropped as a
    ghost: only settlement lines (s|...) and the mappings of their entries are ever deleted."""
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, max_attempts=2))
    [g_owned, g_backlog] = make_groups(2)
    [owned, backlog] = q.submit([g_owned, g_backlog])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.fail(res.receipt, "oom") == "ready"  # ledger a|1|w1|failed: owned by @ready
    raw.xadd(keys(queue_name)["settled"], {owned: g_owned.source_id, backlog: g_backlog.source_id,
                                          "not-an-id": "nobody"})
    line = ledger(raw, queue_name, owned)
    _past_retention(raw)
    assert q.reap().pruned == 0
    assert ledger(raw, queue_name, owned) == line
    mapped = (_sid_of(raw, queue_name, g_owned.source_id), _sid_of(raw, queue_name, g_backlog.source_id))
    assert mapped == (owned, backlog)
    assert raw.xlen(keys(queue_name)["settled"]) == 0 and q.stats().counters["ghosts"] == 1


def test_a_broken_settled_key_fails_each_settlement_before_its_first_write(open_queue, raw, queue_name) -> None:
    """The record is each settlement's first write: a settled key of the wrong type (a bug or a hand
    edit) makes commit, settle_parked (a filter's record), checkpoint, dlq purge and requeue fail
    whole, never half done."""
    q = open_queue(CFG)
    fill_buffer(q, 2)
    lease = q.lease(1)
    kept_lease = q.lease(1)
    kept_lease.commit(step=1)
    [eid] = submit(q, 1)
    w = q.worker("w1")
    [res] = w.reserve(1)
    _dead(q, 1)
    [letter] = after_settling(q).dead_letters()
    assert w.filter(res.receipt, "zero_std") == "filtered"  # parked: no record yet
    raw.set(keys(queue_name)["settled"], b"not a stream")
    before = snapshot(raw, queue_name)
    for call in (lease.commit, q.settle_parked,
                 lambda: q.requeue_dead_letter(letter.dlq_id),
                 lambda: q.run(actions.purge_dead_letters(q.keys, [letter.dlq_id]))):
        with pytest.raises(ScriptError, match="WRONGTYPE"):
            call()
        assert snapshot(raw, queue_name) == before
    raw.delete(keys(queue_name)["settled"])
    assert lease.commit() and q.settle_parked() == 1 and w.filter(res.receipt, "zero_std") == "replay"
    settled = keys(queue_name)["settled"]
    saved = raw.dump(settled)
    raw.set(settled, b"not a stream")  # checkpoint runs with no lease open (else LeasesOpen first)
    before = snapshot(raw, queue_name)
    with pytest.raises(ScriptError, match="WRONGTYPE"):
        q.checkpoint(1)
    assert snapshot(raw, queue_name) == before
    raw.restore(settled, 0, saved, replace=True)
    assert q.checkpoint(1) == 1
    assert set(_recorded(raw, queue_name)) == {lease.groups[0].entry_id, eid, kept_lease.groups[0].entry_id}


# -- idempotent, bounded ---------------------------------------------------------------------------


def test_prune_is_idempotent_and_bounded_per_call(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, max_completed_groups=200))
    ids = fill_buffer(q, 70)
    train(q, 70)  # one commit: records of 32 + 32 + 6 groups
    assert [len(pairs) for _, pairs in _records(raw, queue_name)] == [32, 32, 6]
    _past_retention(raw)
    assert _prune_once(q, queue_name, count=40) == ["ok", 32, 0]  # whole records only, <= count
    assert _prune_once(q, queue_name, count=64) == ["ok", 38, 1]
    assert _hlen(raw, queue_name, "ledger") == 0 and set(_recorded(raw, queue_name)) == set()
    before = snapshot(raw, queue_name)
    assert _prune_once(q, queue_name) == ["ok", 0, 1]
    assert q.reap() == ReapReport()
    assert snapshot(raw, queue_name) == before
    assert q.stats().counters["pruned"] == len(ids)


def test_records_of_one_group_are_taken_up_to_the_bound(open_queue, raw, queue_name) -> None:
    """Filters are parked and settled (recorded for prune) in batches: a call takes whole records up
    to `count`, and whole commits after."""
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, max_completed_groups=100))
    submit(q, 40)
    w = q.worker("w1")
    for res in reserve_all(w, 40):
        w.filter(res.receipt, "zero_std")
    assert q.settle_parked() == 40
    fill_buffer(q, 10)
    train(q, 10)
    assert [len(pairs) for _, pairs in _records(raw, queue_name)] == [32, 8, 10]
    _past_retention(raw)
    assert _prune_once(q, queue_name) == ["ok", 32, 0]
    assert _prune_once(q, queue_name) == ["ok", 18, 1]  # 8 filters and the commit of 10
    assert _hlen(raw, queue_name, "ledger") == 0


@pytest.mark.parametrize("count", [0, 31, "x"])
def test_a_count_below_one_record_is_a_bug(open_queue, queue_name, count) -> None:
    q = open_queue(CFG)
    with pytest.raises(ScriptError, match="ROLLOUTQ bad count"):
        _prune_once(q, queue_name, count=count)


def test_a_reap_pass_prunes_at_most_its_cap(open_queue, raw, queue_name, monkeypatch) -> None:
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, max_completed_groups=200))
    fill_buffer(q, 100)
    train(q, 100)
    _past_retention(raw)
    monkeypatch.setattr(flows, "PRUNE_CALLS_PER_PASS", 2)
    assert q.reap().pruned == 64  # the rest waits for the next pass
    assert q.reap().pruned == 36


# -- what a caller sees after pruning --------------------------------------------------------------


def test_retried_settlements_after_pruning_are_refused_never_replayed(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, lease_record_ttl_s=RETENTION_S))
    submit(q, 2)
    w = q.worker("w1")
    reservations = reserve_all(w, 2)
    complete_all(w, reservations)
    lease = q.lease(2)
    commit_id = lease.commit()
    assert w.complete(reservations[0].receipt, samples_for(reservations[0])) == "replay"  # within retention
    assert lease.commit() == commit_id
    _past_retention(raw)
    assert q.reap().pruned == 2
    before = snapshot(raw, queue_name)
    for res in reservations:
        with pytest.raises(StaleReceipt) as info:
            w.complete(res.receipt, samples_for(res))
        assert (info.value.owner, info.value.delivery_count) == ("", 0)
        with pytest.raises(StaleReceipt):
            w.fail(res.receipt, "late")
        with pytest.raises(StaleReceipt):
            w.abort(res.receipt)
    # The lease record (lease_record_ttl_s) answered replays; once it is gone too: LeaseLost, typed.
    with pytest.raises(LeaseLost) as lost:
        lease.commit()
    assert lost.value.state == "unknown"
    assert snapshot(raw, queue_name) == before


def test_a_pruned_source_id_is_submitted_as_a_new_entry(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    [g] = make_groups(1)
    [old] = q.submit([g])
    [res] = q.worker("w1").reserve(1)
    complete_all(q.worker("w1"), [res])
    train(q, 1)
    assert q.submit([g]) == [old], "within the retention a resubmit is deduplicated"
    assert q.stats().backlog == 0
    _past_retention(raw)
    assert q.reap().pruned == 1
    [new] = q.submit([g])
    assert new != old and _sid_of(raw, queue_name, g.source_id) == new
    assert q.stats().backlog == 1


def test_the_producer_cursor_still_enqueues_each_group_once(open_queue, raw, queue_name) -> None:
    """produce's exactly-once rests on its cursor, not on ids: a batch resent after its groups were
    consumed and pruned answers 'replay', and a restarted producer resumes after the cursor."""
    q = open_queue(CFG)
    batch = make_groups(2, tag="prod")
    run = q.run
    got = run(pf.produce(q.keys, "p1", "plan-1", 0, batch, 0, 1 << 20))
    assert (got.status, got.cursor, got.new) == ("ok", 2, 2)
    w = q.worker("w1")
    complete_all(w, reserve_all(w, 2))
    train(q, 2)
    _past_retention(raw)
    assert q.reap().pruned == 2
    resent = run(pf.produce(q.keys, "p1", "plan-1", 0, batch, 0, 1 << 20))
    assert (resent.status, resent.new) == ("replay", 0)
    assert run(pf.read_cursor(q.keys, "p1")) == (2, "plan-1")
    assert q.stats().backlog == 0 and q.stats().submitted == 2


def test_retention_changes_take_effect_live(open_queue, raw, queue_name) -> None:
    """config set: records written under a long retention are pruned once it is shortened (they
    carry their settle time, not a deadline); None stops recording."""
    q = open_queue(QueueConfig(settled_retention_s=3600))
    fill_buffer(q, 2)
    train(q, 2)
    assert q.reap() == ReapReport()
    q.run(actions.set_config(q.keys, {"settled_retention_s": RETENTION_S}))
    _past_retention(raw)
    assert q.reap().pruned == 2
    q.run(actions.set_config(q.keys, {"settled_retention_s": None}))
    fill_buffer(q, 1)
    train(q, 1)
    assert raw.xlen(keys(queue_name)["settled"]) == 0 and q.stats().ledger_lines == 1


# -- the reaper process and memory -----------------------------------------------------------------


def test_the_reaper_logs_what_it_pruned(redis_url, raw, queue_name, caplog) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, CFG)
    try:
        fill_buffer(q, 3)
        train(q, 3)
        _past_retention(raw)
        with caplog.at_level(logging.INFO, logger="rollout_queue.ops.reaper"):
            total = run_reaper(q, interval_s=0.0, max_passes=1)
        assert total.pruned == 3
        [line] = [r for r in caplog.records if r.getMessage() == "reaped"]
        assert line.fields["pruned"] == 3  # type: ignore[attr-defined]  # the structured log fields
    finally:
        q.close()


def _memory(raw: redis.Redis, queue_name: str) -> int:
    return sum(int(raw.memory_usage(keys(queue_name)[role], samples=0) or 0) for role in ("ledger", "ids", "settled"))


def test_memory_returns_to_zero_after_pruning(open_queue, raw, queue_name) -> None:
    """Not timed: N committed groups leave ~N ledger lines, ids fields and settled records, and
    nothing once pruned (the figures behind docs/OPERATIONS.md's bytes per group)."""
    n = 600
    q = open_queue(QueueConfig(settled_retention_s=RETENTION_S, max_completed_groups=n))
    for _ in range(n // 200):
        fill_buffer(q, 200)
        train(q, 200)
    retained = _memory(raw, queue_name)
    assert (_hlen(raw, queue_name, "ledger"), _hlen(raw, queue_name, "ids")) == (n, n)
    assert retained / n > 100  # ledger + ids + settled, per group while retained
    _past_retention(raw)
    assert q.reap().pruned == n
    assert (_hlen(raw, queue_name, "ledger"), _hlen(raw, queue_name, "ids")) == (0, 0)
    # ledger and ids are deleted once empty; the settled stream stays, empty: its bare header.
    assert raw.exists(keys(queue_name)["ledger"], keys(queue_name)["ids"]) == 0
    assert raw.xlen(keys(queue_name)["settled"]) == 0 and _memory(raw, queue_name) < 1024
