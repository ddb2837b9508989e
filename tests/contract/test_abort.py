"""Contract of abort.lua: executing -> ready (terminal aborted, not counted toward max_attempts).

Header outcomes: {'ok', 'ready' | 'replay'} and {'stale_receipt', owner, count} (nothing written).
DESIGN rule 4: an abort (weight update, drain) is not the group's fault: its counted failures stay
as they were, so aborting never dead-letters a group.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import QueueConfig, StaleReceipt
from tests.contract.conftest import snapshot
from tests.contract.worker_support import group, history, ledger, pel, ready_ids
from tests.helpers import after_settling

CFG = QueueConfig(max_attempts=2)


def test_abort_requeues_without_counting(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("ab", n=4)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.abort(res.receipt, "weight update") == "ready"
    assert pel(raw, queue_name) == {eid: ("@ready", 1)} and ready_ids(raw, queue_name) == [eid]
    h = history(raw, queue_name, eid)
    assert h["f"] == 0 and [(x["t"], x["r"]) for x in h["h"]] == [("aborted", "weight update")]
    assert ledger(raw, queue_name, eid) == "a|1|w1|aborted"
    stats = q.stats()
    assert (stats.terminals["aborted"], stats.executing_groups, stats.executing_samples) == (1, 0, 0)


def test_aborts_never_dead_letter(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)  # max_attempts=2
    [eid] = q.submit([group("many")])
    w = q.worker("w1")
    for attempt in range(1, 6):
        [res] = w.reserve(1)
        assert res.receipt.attempt == attempt
        assert w.abort(res.receipt) == "ready"
    assert after_settling(q).dead_letters() == [] and history(raw, queue_name, eid)["f"] == 0
    [res] = w.reserve(1)
    assert w.fail(res.receipt, "one") == "ready"  # aborts in between did not count
    [res] = w.reserve(1)
    assert w.abort(res.receipt) == "ready"
    [res] = w.reserve(1)
    assert (res.receipt.attempt, w.fail(res.receipt, "two")) == (8, "dead")
    [dead] = after_settling(q).dead_letters()
    assert [h["t"] for h in dead.history] == ["aborted"] * 5 + ["failed", "aborted", "failed"]


def test_a_repeated_abort_with_the_same_receipt_is_a_replay(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("rp")])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.abort(res.receipt) == "ready"
    before = snapshot(raw, queue_name)
    assert w.abort(res.receipt) == "replay"
    assert snapshot(raw, queue_name) == before


def test_a_stale_abort_changes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("st")])
    w1 = q.worker("w1")
    [res] = w1.reserve(1)
    w1.fail(res.receipt, "x")
    [res2] = q.worker("w2").reserve(1)
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as info:
        w1.abort(res.receipt)  # its attempt ended failed, not aborted: no replay
    assert (info.value.owner, info.value.delivery_count) == ("w2", 2)
    assert snapshot(raw, queue_name) == before
    assert res2.receipt.attempt == 2
