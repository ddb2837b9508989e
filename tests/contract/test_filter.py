"""Contract of filter.lua: executing -> settled(filtered): consumed, never trained, never replayed.

Header outcomes: {'ok', 'filtered' | 'replay'} and {'stale_receipt', owner, count} (nothing
written). Invariant: XACKed and XDELed, executing and retained capacity released, counted by the
reason's token (at most 32 named counters, then 'other'), the reason's text kept in the ledger, and
idempotent per receipt (DESIGN rule 5).
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
    # Parked: the worker role holds no XACK; @filtered owns it with its record until settle_parked.
    assert pel(raw, queue_name) == {eid: ("@filtered", 2)} and q.stats().filtered == 1
    assert raw.hget(keys(queue_name)["parked"], eid).startswith(b"filtered|2|w1|")
    assert q.settle_parked() == 1
    assert pel(raw, queue_name) == {} and raw.hlen(keys(queue_name)["parked"]) == 0
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


@pytest.mark.parametrize("reason, token", [
    ("all rewards equal", "all_rewards_equal"), ("Zero STD!!", "zero_std"), ("__a__b__", "a_b"),
    ("zero_std.v2:a-b", "zero_std_v2_a_b"), ("a|b", "a_b"), ("", "other"), ("!!!", "other"), ("Other", "other"),
    ("éé ünïcode", "n_code"), ("line\nbreak \x1b[31mred", "line_break_31mred"),
    ("x" * 65, "x" * 48), ("y" * 47 + " z", "y" * 47), ("r" * 3000, "r" * 48),
])
def test_a_reason_is_free_text_kept_whole_and_counted_by_its_token(open_queue, raw: redis.Redis, queue_name: str,
                                                                   reason: str, token: str) -> None:
    """Issue 12 item 13: users write reasons as text. The ledger keeps the text (capped at 2,000
    characters, like every reason), the counter is its token: lowercase, runs of other characters one
    '_', trimmed, at most 48 characters ('other' when nothing is left)."""
    q = open_queue(CFG)
    [eid] = q.submit([group("txt")])
    w = q.worker("w1")
    [res] = w.reserve(1)
    assert w.filter(res.receipt, reason) == "filtered"
    assert ledger(raw, queue_name, eid) == "s|filtered|1|w1|" + reason[:2000]
    assert counter(raw, queue_name, f"filtered_reason:{token}") == 1
    assert q.stats().filtered_by_reason == {token: 1}
    assert w.filter(res.receipt, reason) == "replay"  # the full text is the replay key


def test_reason_counters_are_bounded_across_clients(open_queue, raw: redis.Redis, queue_name: str) -> None:
    """At most 32 distinct reason counters, the first ones seen, decided inside filter.lua: every later
    new reason counts as 'other', whichever client filters; a known reason keeps its own counter."""
    q = open_queue(QueueConfig())
    reasons = [f"reason {i}" for i in range(40)]
    ids = q.submit([group(f"b{i}") for i in range(len(reasons) + 2)])
    workers = [q.worker("w1"), open_queue(QueueConfig(), name=queue_name).worker("w2")]  # two clients
    for i, reason in enumerate(reasons + ["reason 3", "REASON 39"]):
        [res] = workers[i % 2].reserve(1)
        workers[i % 2].filter(res.receipt, reason)
    by = q.stats().filtered_by_reason
    assert len([k for k in by if k != "other"]) == 32 and by["other"] == 40 - 32 + 1  # 'REASON 39' too
    assert by["reason_0"] == 1 and by["reason_3"] == 2 and by["reason_31"] == 1 and "reason_32" not in by
    assert sum(by.values()) == q.stats().filtered == len(ids)
    assert counter(raw, queue_name, "filtered_reasons") == 32
    fields = [k for k in raw.hkeys(keys(queue_name)["counters"]) if k.startswith(b"filtered_reason:")]
    assert len(fields) == 33


@pytest.mark.parametrize("reason", [None, 3, b"zero_std", ["a"]])
def test_a_reason_must_be_text(open_queue, raw: redis.Redis, queue_name: str, reason: object) -> None:
    q = open_queue(CFG)
    q.submit([group("tok")])
    [res] = q.worker("w1").reserve(1)
    before = snapshot(raw, queue_name)
    with pytest.raises(InvalidInput, match="filter reason must be a string"):
        q.worker("w1").filter(res.receipt, reason)
    assert snapshot(raw, queue_name) == before
