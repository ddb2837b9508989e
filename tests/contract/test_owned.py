"""Contract of ``Worker.owned()``: the read-only view of what the PEL gives one worker.

It must say exactly what ``XPENDING`` says for that consumer (entry, delivery count = attempt, idle
ms since the delivery), change nothing, and hand out receipts that settle: the runtime's
reconciliation (workers/reconcile.py) aborts an orphan with exactly such a receipt.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import InvalidInput, QueueConfig, StaleReceipt
from rollout_queue.core.flows import owned as owned_module
from tests.contract.conftest import snapshot
from tests.contract.worker_support import group, keys, ledger, pel, samples

CFG = QueueConfig(max_attempts=5)


def xpending_of(raw: redis.Redis, queue_name: str, worker_id: str) -> list[tuple[str, int, int]]:
    """(entry, delivery count, idle ms) of every entry the PEL gives ``worker_id``: Redis truth."""
    rows = raw.xpending_range(keys(queue_name)["src"], "rollout", "-", "+", 10_000, consumername=worker_id)
    return [(r["message_id"].decode(), int(r["times_delivered"]), int(r["time_since_delivered"])) for r in rows]


def test_owned_lists_exactly_the_pel_of_this_worker(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    ids = q.submit([group(f"o{i}") for i in range(5)])
    w1, w2 = q.worker("w1"), q.worker("w2")
    mine = w1.reserve(3)
    [theirs] = w2.reserve(1)
    w1.complete(mine[0].receipt, samples(2))  # completed: the PEL gives it to @done, not to w1
    w1.abort(mine[1].receipt)                 # back to @ready ...
    [again] = w1.reserve(1)                   # ... and granted again: attempt 2
    assert again.entry_id == mine[1].entry_id and again.receipt.attempt == 2

    got = w1.owned()
    truth = xpending_of(raw, queue_name, "w1")
    assert [(a.entry_id, a.receipt.attempt) for a in got] == [(e, c) for e, c, _ in truth]
    assert {a.receipt for a in got} == {again.receipt, mine[2].receipt}
    for a, (_, _, idle) in zip(got, truth):
        assert a.receipt.worker_id == "w1" and 0 <= a.idle_ms <= idle + 1000
    assert [a.receipt for a in w2.owned()] == [theirs.receipt]
    assert q.worker("nobody").owned() == []
    assert ids[4] not in {a.entry_id for a in got}  # backlog: owned by no one


def test_idle_is_the_time_since_delivery_and_filters(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("old"), group("new")])
    w = q.worker("w1")
    old, new = w.reserve(2)
    # Age one grant by hand, keeping its owner and delivery count (XCLAIM IDLE ... RETRYCOUNT).
    raw.xclaim(keys(queue_name)["src"], "rollout", "w1", 0, [old.entry_id], idle=120_000, retrycount=1, justid=True)
    by_id = {a.entry_id: a for a in w.owned()}
    assert by_id[old.entry_id].idle_ms >= 120_000 and by_id[new.entry_id].idle_ms < 60_000
    assert [a.receipt for a in w.owned(min_idle_ms=60_000)] == [old.receipt]
    assert w.owned(min_idle_ms=10**9) == []


def test_owned_changes_nothing(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    q.submit([group("ro1"), group("ro2")])
    w = q.worker("w1")
    w.reserve(2)
    before = snapshot(raw, queue_name)
    assert len(w.owned()) == 2 and len(w.owned(min_idle_ms=0)) == 2
    w.owned(min_idle_ms=1)  # the IDLE form too
    assert snapshot(raw, queue_name) == before


def test_pages_cover_every_owned_entry(open_queue, raw: redis.Redis, queue_name: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owned_module, "PAGE", 2)
    q = open_queue(CFG)
    q.submit([group(f"p{i}") for i in range(5)])
    w = q.worker("w1")
    w.reserve(5)
    q.worker("w2")  # another consumer's entries never show
    got = w.owned()
    assert [a.entry_id for a in got] == [e for e, _, _ in xpending_of(raw, queue_name, "w1")]
    assert len(got) == 5


def test_an_owned_receipt_aborts_and_then_is_stale(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("ab")])
    w = q.worker("w1")
    w.reserve(1)  # the reply is dropped: only the PEL remembers this grant
    [orphan] = w.owned()
    assert w.abort(orphan.receipt, "orphaned") == "ready"
    assert pel(raw, queue_name) == {eid: ("@ready", 1)} and ledger(raw, queue_name, eid) == "a|1|w1|aborted"
    assert w.owned() == []
    [r] = q.worker("w2").reserve(1)
    with pytest.raises(StaleReceipt):
        w.fail(orphan.receipt, "late")  # the attempt is over: a late settlement changes nothing
    assert r.receipt.attempt == 2


def test_a_queue_owner_name_is_not_a_worker(open_queue) -> None:
    q = open_queue(CFG)
    with pytest.raises(InvalidInput):
        q.worker("@ready").owned()
