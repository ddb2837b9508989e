"""Contract of fail.lua: executing -> ready (failed or malformed, counted), or -> dead at max_attempts.

Header outcomes: {'ok', 'ready' | 'dead' | 'replay'} and {'stale_receipt', owner, count} (nothing
written). DESIGN rule 4: failures count toward max_attempts, and the last one dead-letters the group
with every attempt's reason; rule 5: repeating a settlement with the same receipt replays its answer.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import InvalidInput, QueueConfig, StaleReceipt
from tests.contract.conftest import snapshot
from tests.contract.worker_support import call, group, history, keys, ledger, pel, ready_ids
from tests.helpers import after_settling

CFG = QueueConfig(max_attempts=3)


def test_fail_requeues_the_group_and_counts_the_attempt(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("f", n=3)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.fail(res.receipt, "engine crashed") == "ready"
    assert pel(raw, queue_name) == {eid: ("@ready", 1)}
    assert ready_ids(raw, queue_name) == [eid]
    h = history(raw, queue_name, eid)
    assert h["f"] == 1 and [(x["a"], x["w"], x["t"], x["r"]) for x in h["h"]] == [(1, "w1", "failed", "engine crashed")]
    assert ledger(raw, queue_name, eid) == "a|1|w1|failed"
    stats = q.stats()
    assert (stats.terminals["failed"], stats.executing_groups, stats.executing_samples, stats.retained) == (1, 0, 0, 1)
    assert stats.ready == 1


def test_the_last_failure_dead_letters_with_every_attempts_reason(open_queue, raw: redis.Redis,
                                                                  queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("doomed")])
    answers = []
    for i in range(3):
        w = q.worker(f"w{i}")
        [res] = w.reserve(1)
        assert res.receipt.attempt == i + 1
        answers.append(w.fail(res.receipt, f"reason {i}"))
    assert answers == ["ready", "ready", "dead"]
    [dead] = after_settling(q).dead_letters()
    assert (dead.entry_id, dead.source_id, dead.reason, dead.attempt, dead.worker_id) == (
        eid, "doomed", "max_attempts", 3, "w2")
    assert [(h["a"], h["w"], h["t"], h["r"]) for h in dead.history] == [
        (1, "w0", "failed", "reason 0"), (2, "w1", "failed", "reason 1"), (3, "w2", "failed", "reason 2")]
    assert dead.group == group("doomed")
    assert pel(raw, queue_name) == {} and raw.xlen(keys(queue_name)["src"]) == 0
    assert ready_ids(raw, queue_name) == []
    # Kept after settlement (until prune), the same attempts as the dead letter's copy.
    assert [(h["a"], h["t"]) for h in history(raw, queue_name, eid)["h"]] == [(1, "failed"), (2, "failed"), (3, "failed")]
    assert ledger(raw, queue_name, eid) == "s|dead|3|w2|max_attempts"
    stats = q.stats()
    assert (stats.dead, stats.retained, stats.terminals["failed"]) == (1, 0, 3)
    assert q.worker("w9").reserve(1) == []  # dead work is never handed out again


def test_a_repeated_fail_with_the_same_receipt_is_a_replay(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG.replace(max_attempts=2))
    q.submit([group("rp")])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.fail(res.receipt, "x") == "ready"
    before = snapshot(raw, queue_name)
    assert w.fail(res.receipt, "x") == "replay"
    assert snapshot(raw, queue_name) == before
    [res2] = w.reserve(1)
    assert w.fail(res2.receipt, "y") == "dead"
    before = snapshot(raw, queue_name)
    assert w.fail(res2.receipt, "y") == "replay"  # the dead-lettering fail replays too
    assert snapshot(raw, queue_name) == before


def test_a_receipt_that_lost_its_attempt_is_stale(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("st")])
    w1, w2 = q.worker("w1"), q.worker("w2")
    [res] = w1.reserve(1)
    w1.abort(res.receipt)
    [res2] = w2.reserve(1)
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as info:
        w1.fail(res.receipt, "late")
    assert (info.value.entry_id, info.value.attempt, info.value.owner, info.value.delivery_count) == (
        res.entry_id, 1, "w2", 2)
    assert snapshot(raw, queue_name) == before
    reply = call(q, "fail", entry_id=res.entry_id, attempt=3, worker_id="w2", terminal="failed", reason="r")
    assert reply == ["stale_receipt", b"w2", 2]  # the owner, at another attempt
    assert snapshot(raw, queue_name) == before
    assert w2.fail(res2.receipt, "ok") == "ready"


def test_fail_with_terminal_malformed_counts_as_malformed(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("mf")])
    [res] = q.worker("w1").reserve(1)
    reply = call(q, "fail", entry_id=eid, attempt=1, worker_id="w1", terminal="malformed", reason="bad output")
    assert reply == ["ok", b"ready"]
    assert history(raw, queue_name, eid)["f"] == 1
    assert q.stats().terminals["malformed"] == 1 and res.receipt.attempt == 1


def test_a_worker_cannot_settle_another_workers_receipt(open_queue) -> None:
    q = open_queue(CFG)
    q.submit([group("own")])
    [res] = q.worker("w1").reserve(1)
    with pytest.raises(InvalidInput):
        q.worker("w2").fail(res.receipt, "not mine")
