"""Contract of close_worker.lua: every attempt a worker owns -> ready; then deregister the worker.

Header outcome: {'ok', requeued, dead_lettered, done} (call again until done = 1). Invariant: once
done, the worker owns nothing in the PEL and is not registered (not in `workers`, `reserves` or
XINFO CONSUMERS). Terminal 'aborted' (clean close, drain, a worker's fatal error) does not count
toward max_attempts; 'lost' does (DESIGN rule 4).
"""

from __future__ import annotations

import redis

from rollout_queue import QueueConfig
from tests.contract.worker_support import call, consumers, group, history, keys, ledger, pel, ready_ids, samples
from tests.helpers import after_settling

CFG = QueueConfig(max_attempts=2)


def _registered(raw: redis.Redis, queue_name: str, worker_id: str) -> bool:
    k = keys(queue_name)
    # Its consumer in the group stays until the reaper deletes it (the worker role may not).
    return raw.zscore(k["workers"], worker_id) is not None or raw.hexists(k["reserves"], worker_id)


def test_close_requeues_everything_the_worker_owns_and_deregisters_it(open_queue, raw: redis.Redis,
                                                                      queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group(f"cl{i}") for i in range(4)])
    w, other = q.worker("w1"), q.worker("w2")
    got = w.reserve(3)
    w.complete(got[0].receipt, samples(2))  # completed: the queue's, not the worker's
    [theirs] = other.reserve(1)
    assert _registered(raw, queue_name, "w1")
    assert w.close() == (2, 0)
    assert pel(raw, queue_name) == {ids[0]: ("@done", 1), ids[1]: ("@ready", 1), ids[2]: ("@ready", 1),
                                    theirs.entry_id: ("w2", 1)}
    assert ready_ids(raw, queue_name) == ids[1:3]
    assert all(history(raw, queue_name, i)["f"] == 0 for i in ids[1:3])  # not counted
    assert not _registered(raw, queue_name, "w1") and _registered(raw, queue_name, "w2")
    stats = q.stats()
    assert (stats.terminals["aborted"], stats.executing_groups, stats.executing_samples) == (2, 1, 2)


def test_close_with_terminal_lost_counts(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)  # max_attempts=2
    [eid] = q.submit([group("lost")])
    q.worker("w1").reserve(1)
    assert q.worker("w1").close("lost", "engine died") == (1, 0)
    assert history(raw, queue_name, eid)["f"] == 1
    q.worker("w2").reserve(1)
    assert q.worker("w2").close("lost", "engine died again") == (0, 1)
    [dead] = after_settling(q).dead_letters()
    assert (dead.entry_id, dead.reason) == (eid, "max_attempts")
    assert [(h["t"], h["r"]) for h in dead.history] == [("lost", "engine died"), ("lost", "engine died again")]
    assert q.stats().terminals["lost"] == 2
    assert not _registered(raw, queue_name, "w1") and not _registered(raw, queue_name, "w2")


def test_close_works_in_batches_until_done(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group(f"b{i}") for i in range(3)])
    q.worker("w1").reserve(3)
    first = call(q, "close_worker", worker_id="w1", terminal="aborted", reason="drain", count=2)
    assert first == ["ok", 2, 0, 0]
    assert _registered(raw, queue_name, "w1")  # still owns one: not deregistered yet
    assert call(q, "close_worker", worker_id="w1", terminal="aborted", reason="drain", count=2) == ["ok", 1, 0, 1]
    assert not _registered(raw, queue_name, "w1")
    assert len(ready_ids(raw, queue_name)) == 3


def test_closing_a_worker_that_owns_nothing_deregisters_it(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    w = q.worker("idle")
    w.heartbeat()
    assert w.close() == (0, 0)
    assert not _registered(raw, queue_name, "idle")
    assert w.close() == (0, 0)  # closing again is harmless


def test_one_close_batch_mixes_a_dead_letter_and_a_requeue(open_queue, raw: redis.Redis, queue_name: str) -> None:
    # close_worker ends the whole batch in one script: a, at its second counted failure, is dead;
    # b goes back to ready with its own delivery count; the counters move once for both.
    q = open_queue(CFG)  # max_attempts=2
    a, b = q.submit([group("mix-a", n=2), group("mix-b", n=3)])
    [first] = q.worker("w1").reserve(1)
    q.worker("w1").fail(first.receipt, "flaky")
    got = q.worker("w2").reserve(2)
    assert [(r.entry_id, r.receipt.attempt) for r in got] == [(a, 2), (b, 1)]
    assert call(q, "close_worker", worker_id="w2", terminal="lost", reason="engine died", count=64) == \
        ["ok", 1, 1, 1]
    assert pel(raw, queue_name) == {a: ("@dead", 2), b: ("@ready", 1)}  # a parked until settle_parked
    assert q.settle_parked() == 1
    assert pel(raw, queue_name) == {b: ("@ready", 1)}
    assert ready_ids(raw, queue_name) == [b]
    [dead] = after_settling(q).dead_letters()
    assert (dead.entry_id, dead.reason, dead.attempt, dead.worker_id) == (a, "max_attempts", 2, "w2")
    assert [(h["a"], h["t"], h["r"]) for h in dead.history] == [(1, "failed", "flaky"), (2, "lost", "engine died")]
    # The dead entry's history is kept (until prune) beside its dead letter's copy.
    assert history(raw, queue_name, a)["f"] == 2 and history(raw, queue_name, b)["f"] == 1
    assert (ledger(raw, queue_name, a), ledger(raw, queue_name, b)) == ("s|dead|2|w2|max_attempts", "a|1|w2|lost")
    s = q.stats()
    assert (s.executing_groups, s.executing_samples, s.ready, s.retained, s.dead) == (0, 0, 1, 1, 1)
    assert s.terminals["lost"] == 2
