"""reap_worker.lua: a silent worker's executing work -> ready (terminal lost), against real servers.

Proves the header's outcomes ('ok' with requeued / dead-lettered / done, batch by batch; 'alive' with
every key byte-identical) and the DESIGN rules the reaper implements: lost attempts are counted and
reach the dead letter at max_attempts with every attempt's reason; a paused worker's late
settlements raise StaleReceipt and change nothing; concurrent reapers requeue each entry once;
reserve and lease reap opportunistically; orphan PEL consumers are recovered.
"""

from __future__ import annotations

import threading

import orjson
import pytest

from rollout_queue import QueueConfig, RolloutQueue, StaleReceipt
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    execute,
    keys,
    ledger,
    make_groups,
    meta,
    owners,
    payload_keys,
    pel,
    reserve_all,
    samples_for,
    submit,
    wait_past,
    wait_silent,
    zmembers,
)

FAST = QueueConfig(worker_timeout_s=0.15)
LOST_REASON = "worker silent past worker_timeout"


def test_header_matches_builder() -> None:
    check_header("reap_worker", ["src", "meta", "ready", "workers", "reserves", "history", "ledger", "dlq", "parked", "settled", "wake_work", "progress", "reaped", "retired", "counters"],
                 ["worker_id", "count"])


def _consumers(raw, queue_name) -> set[str]:
    out = set()
    for c in raw.xinfo_consumers(keys(queue_name)["src"], "rollout"):
        name = c["name"]
        out.add(name.decode() if isinstance(name, bytes) else name)
    return out


def test_silent_worker_work_is_requeued_lost_and_counted(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    ids = submit(q, 2, n=3)
    reserve_all(q.worker("w-silent"), 2)
    assert q.stats().executing_samples == 6
    wait_silent(q)
    report = q.reap()
    assert (report.lost, report.dead, report.orphans) == (2, 0, 0)
    assert {e: pel(raw, queue_name)[e] for e in ids} == {e: ("@ready", 1) for e in ids}
    assert zmembers(raw, queue_name, "ready") == ids
    for entry_id in ids:
        h = orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))
        assert h["f"] == 1, "a lost attempt counts toward max_attempts"
        assert [(x["a"], x["w"], x["t"], x["r"]) for x in h["h"]] == [(1, "w-silent", "lost", LOST_REASON)]
        assert ledger(raw, queue_name, entry_id) == "a|1|w-silent|lost"
    # The worker is deregistered and its PEL consumer deleted; capacity is released.
    assert raw.zscore(keys(queue_name)["workers"], "w-silent") is None
    assert "w-silent" not in _consumers(raw, queue_name)
    s = q.stats()
    assert (s.executing_groups, s.executing_samples, s.ready, s.retained) == (0, 0, 2, 2)
    assert s.terminals["lost"] == 2
    assert q.reap().total == 0


def test_a_silent_workers_staged_payloads_are_dropped_with_its_attempts(open_queue, raw, queue_name) -> None:
    """A worker that died after its transaction staged a payload but before its script ran (NOSCRIPT,
    then the process died before the retry) leaves the payload key of that attempt behind: the reaper
    deletes it with the attempt; another worker's buffered payload stays."""
    q = open_queue(FAST)
    ids = submit(q, 3)
    done = q.worker("w-done")
    [kept] = done.reserve(1)
    assert done.complete(kept.receipt, samples_for(kept)) == "buffered"
    silent = reserve_all(q.worker("w-silent"), 2)
    k = keys(queue_name)
    for res in silent:  # as the transaction's SET left it, named by the attempt (its delivery count)
        raw.set(k.payload(res.entry_id, res.receipt.attempt), b"staged, never adopted")
    assert payload_keys(raw, queue_name) == {k.payload(e, 1) for e in ids}
    done.close()  # keep w-done out of the silent count
    wait_silent(q)
    assert q.reap().lost == 2
    assert owners(raw, queue_name, [r.entry_id for r in silent]) == ["@ready", "@ready"]
    assert payload_keys(raw, queue_name) == {k.payload(kept.entry_id, 1)}


@pytest.mark.parametrize("late", ["complete", "fail", "abort"])
def test_paused_worker_late_settlement_is_stale(open_queue, raw, queue_name, late) -> None:
    q = open_queue(FAST)
    [entry_id] = submit(q, 1)
    paused = q.worker("w-paused")
    [res] = paused.reserve(1)
    wait_silent(q)
    assert q.reap().lost == 1

    def settle_late() -> None:
        if late == "complete":
            paused.complete(res.receipt, samples_for(res))
        elif late == "fail":
            paused.fail(res.receipt, "engine error")
        else:
            paused.abort(res.receipt, "weight update")

    # Requeued but not yet re-reserved: the late call names an attempt that is over.
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as err:
        settle_late()
    assert (err.value.owner, err.value.delivery_count) == ("@ready", 1)
    assert snapshot(raw, queue_name) == before
    # Re-reserved by another worker: attempt 2 is theirs; the paused worker still changes nothing.
    [again] = q.worker("w-fresh").reserve(1)
    assert (again.entry_id, again.receipt.attempt) == (entry_id, 2)
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as err:
        settle_late()
    assert (err.value.owner, err.value.delivery_count) == ("w-fresh", 2)
    assert snapshot(raw, queue_name) == before
    assert q.worker("w-fresh").complete(again.receipt, samples_for(again)) == "buffered"


def test_a_heartbeat_landing_first_saves_the_worker(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    [entry_id] = submit(q, 1)
    w = q.worker("w-slow")
    w.reserve(1)
    wait_silent(q)
    # The reaper saw it silent, but the heartbeat lands before reap_worker runs: 'alive'.
    w.heartbeat()
    before = snapshot(raw, queue_name)
    reply = execute(q, p.build(q.keys, "reap_worker", worker_id="w-slow", count=200))
    assert p.s(reply[0]) == "alive"
    assert int(reply[1]) == int(raw.zscore(keys(queue_name)["workers"], "w-slow"))
    assert snapshot(raw, queue_name) == before
    assert q.reap().lost == 0
    assert owners(raw, queue_name, [entry_id]) == ["w-slow"]


def test_reap_worker_works_in_batches(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    submit(q, 2)
    reserve_all(q.worker("w-big"), 2)
    wait_silent(q)
    call = p.build(q.keys, "reap_worker", worker_id="w-big", count=1)
    assert [int(x) for x in execute(q, call)[1:]] == [1, 0, 0]
    assert "w-big" in _consumers(raw, queue_name), "not deregistered while it still owns work"
    assert [int(x) for x in execute(q, call)[1:]] == [1, 0, 0]
    assert [int(x) for x in execute(q, call)[1:]] == [0, 0, 1]
    assert "w-big" not in _consumers(raw, queue_name)
    assert raw.zscore(keys(queue_name)["workers"], "w-big") is None


def test_two_reapers_requeue_each_entry_exactly_once(open_queue, raw, queue_name, redis_url) -> None:
    q = open_queue(FAST)
    ids = submit(q, 9)
    for i in range(3):
        reserve_all(q.worker(f"w-{i}"), 3)
    wait_silent(q, 3)
    reapers = [RolloutQueue.from_url(redis_url, queue_name) for _ in range(2)]
    barrier = threading.Barrier(2)
    reports = []

    def run(reaper: RolloutQueue) -> None:
        barrier.wait()
        for _ in range(3):
            reports.append(reaper.reap())

    threads = [threading.Thread(target=run, args=(r,)) for r in reapers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for r in reapers:
            r.close()
    assert sum(r.lost for r in reports) == 9
    assert int(meta(raw, queue_name)["lost"]) == 9
    for entry_id in ids:
        h = orjson.loads(raw.hget(keys(queue_name)["history"], entry_id))
        assert h["f"] == 1 and len(h["h"]) == 1, f"{entry_id} was requeued {len(h['h'])} times"
    assert sorted(zmembers(raw, queue_name, "ready")) == sorted(ids)
    s = q.stats()
    assert (s.executing_groups, s.executing_samples, s.ready) == (0, 0, 9)


def test_dead_letter_after_max_attempts_lost_attempts(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST.replace(max_attempts=3))
    [entry_id] = submit(q, 1)
    reports = []
    for attempt in (1, 2, 3):
        [res] = q.worker(f"w-{attempt}").reserve(1)
        assert (res.entry_id, res.receipt.attempt) == (entry_id, attempt)
        wait_silent(q)
        reports.append(q.reap())
    assert [(r.lost, r.dead) for r in reports] == [(1, 0), (1, 0), (0, 1)]
    [dl] = q.dead_letters()
    assert (dl.entry_id, dl.reason, dl.attempt, dl.worker_id) == (entry_id, "max_attempts", 3, "w-3")
    assert [(h["a"], h["w"], h["t"], h["r"]) for h in dl.history] == \
        [(a, f"w-{a}", "lost", LOST_REASON) for a in (1, 2, 3)]
    assert entry_id not in pel(raw, queue_name)
    assert ledger(raw, queue_name, entry_id) == "s|dead|3|w-3|max_attempts"
    s = q.stats()
    assert (s.dead, s.retained, s.ready, s.executing_groups, s.executing_samples) == (1, 0, 0, 0, 0)


def test_reserve_reaps_a_silent_worker_opportunistically(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    [entry_id] = submit(q, 1)
    q.worker("w-gone").reserve(1)
    wait_silent(q)
    [res] = q.worker("w-next").reserve(1)  # no reaper call in between
    assert (res.entry_id, res.receipt.attempt) == (entry_id, 2)
    assert meta(raw, queue_name)["lost"] == "1"
    assert raw.zscore(keys(queue_name)["workers"], "w-gone") is None


def test_lease_reaps_a_silent_worker_opportunistically(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    [entry_id] = submit(q, 1)
    q.worker("w-gone").reserve(1)
    wait_silent(q)
    assert q.lease(1) is None
    assert owners(raw, queue_name, [entry_id]) == ["@ready"]
    assert meta(raw, queue_name)["lost"] == "1"


def test_orphan_consumers_are_reaped(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    ids = submit(q, 2)
    # A consumer that owns PEL entries but never registered (XREADGROUP by hand).
    raw.xreadgroup("rollout", "ghost", {keys(queue_name)["src"]: ">"}, count=2)
    assert owners(raw, queue_name, ids) == ["ghost", "ghost"]
    report = q.reap()
    assert (report.orphans, report.lost) == (1, 2)
    assert owners(raw, queue_name, ids) == ["@ready", "@ready"]
    assert "ghost" not in _consumers(raw, queue_name)
    got = q.worker("w-real").reserve(2)
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(e, 2) for e in ids]


def test_entries_of_a_consumer_that_never_registered_are_requeued_uncounted(open_queue, raw, queue_name) -> None:
    # A worker credential can XCLAIM any entry to a made-up consumer; the owners sweep requeues it.
    # Counted, max_attempts such claims would dead-letter a group no worker ever failed.
    q = open_queue(FAST)
    [eid] = submit(q, 1)
    src = keys(queue_name)["src"]
    w = q.worker("w-real")
    for i in range(FAST.max_attempts + 1):
        assert len(w.reserve(1)) == 1
        raw.xclaim(src, "rollout", f"made-up-{i}", 0, [eid], justid=True)
        assert q.reap().orphans == 1
        assert owners(raw, queue_name, [eid]) == ["@ready"]
    assert q.dead_letters() == [] and q.stats().dead == 0


def test_a_worker_whose_registration_was_lost_is_reaped_with_exact_counters(open_queue, raw, queue_name) -> None:
    q = open_queue(FAST)
    ids = submit(q, 2, n=3)
    reserve_all(q.worker("w-unlisted"), 2)
    raw.zrem(keys(queue_name)["workers"], "w-unlisted")  # its heartbeat record is gone
    report = q.reap()
    assert (report.orphans, report.lost) == (1, 2)
    assert owners(raw, queue_name, ids) == ["@ready", "@ready"]
    s = q.stats()
    assert (s.backlog, s.ready, s.executing_groups, s.executing_samples, s.retained) == (0, 2, 0, 0, 2)


def _ints(reply) -> list:
    return [p.s(reply[0]), *(int(x) for x in reply[1:])]


def test_one_batch_mixes_dead_letters_and_requeues_of_different_attempts(open_queue, raw, queue_name) -> None:
    # One reap_worker call ends three attempts of one worker: a at its third counted failure (dead),
    # b at attempt 2 and c at attempt 1 (ready, each keeping its own delivery count), with different n.
    q = open_queue(QueueConfig(worker_timeout_s=0.3, max_attempts=3))
    a, b = q.submit(make_groups(2, n=2))
    [c] = q.submit(make_groups(1, n=3))
    prep = q.worker("w-prep")
    for res in reserve_all(prep, 2):
        prep.fail(res.receipt, "boom")
    [again] = prep.reserve(1)
    assert again.entry_id == a
    prep.fail(again.receipt, "boom again")
    got = reserve_all(q.worker("w-silent"), 3)
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(a, 3), (b, 2), (c, 1)]
    assert q.stats().executing_samples == 7
    wait_past(raw, int(raw.zscore(keys(queue_name)["workers"], "w-silent")) + 300)
    call = p.build(q.keys, "reap_worker", worker_id="w-silent", count=flows.BATCH)
    assert _ints(execute(q, call)) == ["ok", 2, 1, 1]
    assert {e: pel(raw, queue_name).get(e) for e in (a, b, c)} == {a: None, b: ("@ready", 2), c: ("@ready", 1)}
    assert zmembers(raw, queue_name, "ready") == [b, c]
    [dl] = q.dead_letters()
    assert (dl.entry_id, dl.reason, dl.attempt, dl.worker_id) == (a, "max_attempts", 3, "w-silent")
    assert [(h["a"], h["w"], h["t"], h["r"]) for h in dl.history] == \
        [(1, "w-prep", "failed", "boom"), (2, "w-prep", "failed", "boom again"), (3, "w-silent", "lost", LOST_REASON)]
    assert dl.group is not None and dl.group.n == 2
    assert orjson.loads(raw.hget(keys(queue_name)["history"], a))["f"] == 3  # kept until prune
    assert a not in [p.s(e[0]) for e in raw.xrange(keys(queue_name)["src"])]
    hb = orjson.loads(raw.hget(keys(queue_name)["history"], b))
    assert hb["f"] == 2
    assert [(x["a"], x["w"], x["t"]) for x in hb["h"]] == [(1, "w-prep", "failed"), (2, "w-silent", "lost")]
    hc = orjson.loads(raw.hget(keys(queue_name)["history"], c))
    assert hc["f"] == 1
    assert [(x["a"], x["w"], x["t"], x["r"]) for x in hc["h"]] == [(1, "w-silent", "lost", LOST_REASON)]
    assert [ledger(raw, queue_name, e) for e in (a, b, c)] == \
        ["s|dead|3|w-silent|max_attempts", "a|2|w-silent|lost", "a|1|w-silent|lost"]
    s = q.stats()
    assert (s.executing_groups, s.executing_samples, s.ready, s.retained, s.dead) == (0, 0, 2, 2, 1)
    assert (s.terminals["lost"], s.terminals["failed"]) == (3, 3)
    assert [(r.entry_id, r.receipt.attempt) for r in q.worker("w-next").reserve(2)] == [(b, 3), (c, 2)]


def test_a_batch_boundary_exactly_at_batch(open_queue, raw, queue_name) -> None:
    # A worker owning exactly BATCH entries fills one call (done = 0: it may own more) and the next
    # call finds nothing and deregisters it; BATCH + 1 entries take a full call and a call of one.
    q = open_queue(QueueConfig(worker_timeout_s=0.5))
    ids = submit(q, 2 * flows.BATCH + 1, n=1)
    reserve_all(q.worker("w-full"), flows.BATCH)
    reserve_all(q.worker("w-over"), flows.BATCH + 1)
    wait_silent(q, 2)
    call = p.build(q.keys, "reap_worker", worker_id="w-full", count=flows.BATCH)
    assert _ints(execute(q, call)) == ["ok", flows.BATCH, 0, 0]
    assert "w-full" in _consumers(raw, queue_name), "not deregistered after a full batch"
    assert _ints(execute(q, call)) == ["ok", 0, 0, 1]
    assert "w-full" not in _consumers(raw, queue_name)
    call = p.build(q.keys, "reap_worker", worker_id="w-over", count=flows.BATCH)
    assert _ints(execute(q, call)) == ["ok", flows.BATCH, 0, 0]
    assert _ints(execute(q, call)) == ["ok", 1, 0, 1]
    assert pel(raw, queue_name) == {e: ("@ready", 1) for e in ids}
    assert zmembers(raw, queue_name, "ready") == ids
    assert all(ledger(raw, queue_name, e).endswith("|lost") for e in ids)
    s = q.stats()
    assert (s.executing_groups, s.executing_samples, s.ready, s.retained) == (0, 0, len(ids), len(ids))
    assert s.terminals["lost"] == len(ids)


def _closed(q, worker_id: str, groups: int):
    """A queue with ``groups`` submitted, one of them reserved by a worker that then closed."""
    submit(q, groups)
    w = q.worker(worker_id)
    reserve_all(w, 1)
    w.close()
    return q


def test_a_closed_workers_consumer_is_found_through_retired_and_deleted(open_queue, raw, queue_name) -> None:
    # close() leaves the consumer (the worker role may not delete it) and marks it retired; one reap
    # deletes it and the mark, without listing the group's consumers.
    q = _closed(open_queue(FAST), "w-closing", 1)
    k = keys(queue_name)
    assert "w-closing" in _consumers(raw, queue_name)
    assert raw.zscore(k["retired"], "w-closing") is not None
    report = q.reap()
    assert (report.lost, report.orphans) == (0, 0)
    assert "w-closing" not in _consumers(raw, queue_name)
    assert raw.zcard(k["retired"]) == 0


def test_a_retired_id_registered_again_keeps_its_consumer(open_queue, raw, queue_name) -> None:
    # A worker id that closed and came back (same host:gpu) is alive: the reaper only drops the mark.
    q = _closed(open_queue(FAST), "w-back", 2)
    again = q.worker("w-back")
    [res] = again.reserve(1)
    q.reap()
    k = keys(queue_name)
    assert raw.zcard(k["retired"]) == 0
    assert "w-back" in _consumers(raw, queue_name)
    assert owners(raw, queue_name, [res.entry_id]) == ["w-back"]


def test_an_orphan_behind_a_pel_longer_than_one_sweep_is_found_within_the_passes_the_sweep_needs(
        open_queue, raw, queue_name) -> None:
    # The owners sweep reads OWNERS_BATCH PEL entries a pass from a cursor: an orphan whose entries
    # sit past the first batch is found within ceil(PEL / batch) passes, and never sooner than its
    # entries come up (no pass lists every consumer).
    from rollout_queue.core.flows import reaper

    q = open_queue(QueueConfig(worker_timeout_s=60, max_executing_samples=10**6))
    batch = reaper.OWNERS_BATCH
    submit(q, 2 * batch + 2, n=1)
    reserve_all(q.worker("w-live"), 2 * batch)
    raw.xreadgroup("rollout", "ghost", {keys(queue_name)["src"]: ">"}, count=2)
    found, passes = 0, 0
    while not found:
        passes += 1
        assert passes <= 3, "the sweep must reach every PEL entry within ceil(PEL / batch) passes"
        found = q.reap().orphans
    assert passes == 3  # 2 * batch live entries come first
    assert "ghost" not in _consumers(raw, queue_name)
    assert q.stats().ready == 2
