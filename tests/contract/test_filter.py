"""Contract of filter.lua: executing -> settled(filtered): consumed, never trained, never replayed.

Header outcomes: {'ok', 'filtered' | 'replay'} and {'stale_receipt', owner, count} (nothing
written). Invariant: XACKed and XDELed, executing and retained capacity released, counted by reason,
and idempotent per receipt (DESIGN rule 5).
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import InvalidInput, QueueConfig, StaleReceipt
from tests.contract.conftest import snapshot
from tests.contract.worker_support import counter, group, history, keys, ledger, pel

CFG = QueueConfig(max_retained_groups=1)


def test_filter_settles_the_group(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("zs", n=3)])
    w = q.worker("w1")
    [res] = w.reserve(1)
    w.abort(res.receipt)  # some history, which settlement keeps until prune
    [res] = w.reserve(1)
    assert w.filter(res.receipt, "zero_std") == "filtered"
    assert pel(raw, queue_name) == {}
    assert raw.xlen(keys(queue_name)["src"]) == 0
    assert [h["t"] for h in history(raw, queue_name, eid)["h"]] == ["aborted"]
    assert ledger(raw, queue_name, eid) == "s|filtered|2|w1|zero_std"
    assert counter(raw, queue_name, "filtered_reason:zero_std") == 1
    stats = q.stats()
    assert (stats.filtered, stats.filtered_by_reason, stats.retained) == (1, {"zero_std": 1}, 0)
    assert (stats.executing_groups, stats.executing_samples, stats.backlog, stats.ready) == (0, 0, 0, 0)
    assert w.reserve(1) == []  # never replayed


def test_filtering_reopens_retained_capacity_and_counts_each_reason(open_queue, queue_name: str) -> None:
    q = open_queue(CFG)  # max_retained_groups=1
    ids = q.submit([group(f"fr{i}") for i in range(3)])
    w = q.worker("w1")
    for eid, reason in zip(ids, ["zero_std", "too_long", "zero_std"]):
        [res] = w.reserve(3)
        assert res.entry_id == eid
        w.filter(res.receipt, reason)
    assert q.stats().filtered_by_reason == {"zero_std": 2, "too_long": 1}


def test_filter_is_idempotent_per_receipt(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("id")])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.filter(res.receipt, "zero_std") == "filtered"
    before = snapshot(raw, queue_name)
    assert w.filter(res.receipt, "zero_std") == "replay"
    assert snapshot(raw, queue_name) == before
    assert q.stats().filtered == 1


def test_a_stale_filter_changes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("st")])
    w1 = q.worker("w1")
    [res] = w1.reserve(1)
    w1.abort(res.receipt)
    [res2] = q.worker("w2").reserve(1)
    before = snapshot(raw, queue_name)
    with pytest.raises(StaleReceipt) as info:
        w1.filter(res.receipt, "zero_std")
    assert (info.value.owner, info.value.delivery_count) == ("w2", 2)
    assert snapshot(raw, queue_name) == before
    assert res2.receipt.attempt == 2


@pytest.mark.parametrize("reason", ["", "has space", "x" * 65, "a|b"])
def test_a_reason_must_be_a_short_token(open_queue, raw: redis.Redis, queue_name: str, reason: str) -> None:
    q = open_queue(CFG)
    q.submit([group("tok")])
    [res] = q.worker("w1").reserve(1)
    before = snapshot(raw, queue_name)
    with pytest.raises(InvalidInput):
        q.worker("w1").filter(res.receipt, reason)
    assert snapshot(raw, queue_name) == before
