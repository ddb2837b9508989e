"""A settlement that was applied answers as a replay, whatever happened later (issue 12 item 7).

The transport resends a settlement whose reply was lost; meanwhile the entry may have moved on (a
later attempt reserved and ended, the completion leased and rolled back, the group committed,
restored or dead-lettered). The ledger line then names the later event, so before the fix the
resend got StaleReceipt though its settlement had been applied. The attempt history, kept until
prune like the ledger line, answers it. A receipt that never settled still gets StaleReceipt.
"""

from __future__ import annotations

import pytest

from rollout_queue import QueueConfig, StaleReceipt
from rollout_queue.core import protocol as p
from tests.contract.lifecycle import execute, samples_for
from tests.contract.worker_support import group, samples

CFG = QueueConfig(max_attempts=5)


def resend(q, name: str, **argv):
    """The same script call sent again, as the transport would after a lost reply."""
    return [p.s(x) for x in execute(q, p.build(q.keys, name, **argv))]


def test_a_fail_resent_after_a_later_attempt_aborted_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    q.submit([group("a")])
    w1, w2 = q.worker("w1"), q.worker("w2")
    (r1,) = w1.reserve(1)
    assert w1.fail(r1.receipt, "boom") == "ready"
    (r2,) = w2.reserve(1)
    assert r2.receipt.attempt == 2
    w2.abort(r2.receipt)
    assert w1.fail(r1.receipt, "boom") == "replay"  # was StaleReceipt
    assert q.stats().terminals["failed"] == 1  # and it was not applied twice


def test_a_complete_resent_after_its_lease_was_rolled_back_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    q.submit([group("a")])
    w = q.worker("w1")
    (r,) = w.reserve(1)
    assert w.complete(r.receipt, samples(2)) == "buffered"
    q.lease(1).rollback()
    assert w.complete(r.receipt, samples(2)) == "replay"
    assert w.complete_many([(r.receipt, samples(2))]) == ["replay"]
    assert q.stats().completed == 0 and q.stats().ready == 1  # the resend buffered nothing


def test_a_complete_resent_after_a_stale_eviction_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_staleness=0))
    q.submit([group("a")])
    w = q.worker("w1")
    (r,) = w.reserve(1)
    w.complete(r.receipt, samples(2, version=0))
    q.publish_version(1)
    q.worker("w2").reserve(1)  # evicts the stale completion and re-grants it as attempt 2
    assert w.complete(r.receipt, samples(2)) == "replay"


def test_a_complete_resent_after_commit_and_restore_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    q.submit([group("a")])
    w = q.worker("w1")
    (r,) = w.reserve(1)
    w.complete(r.receipt, samples(2))
    q.lease(1).commit(step=1)
    assert q.restore(0) == 1
    assert w.complete(r.receipt, samples(2)) == "replay"
    assert q.stats().ready == 1


def test_a_fail_resent_after_the_group_died_on_a_later_attempt_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=2))
    q.submit([group("a")])
    w1, w2 = q.worker("w1"), q.worker("w2")
    (r1,) = w1.reserve(1)
    w1.fail(r1.receipt, "boom")
    (r2,) = w2.reserve(1)
    assert w2.fail(r2.receipt, "boom again") == "dead"
    assert w1.fail(r1.receipt, "boom") == "replay"
    assert w2.fail(r2.receipt, "boom again") == "replay"


def test_a_receipt_that_never_settled_is_still_stale(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    q.submit([group("a")])
    w1, w2 = q.worker("w1"), q.worker("w2")
    (r1,) = w1.reserve(1)
    w1.abort(r1.receipt)
    w2.reserve(1)
    with pytest.raises(StaleReceipt):
        w1.complete(r1.receipt, samples(2))  # attempt 1 was aborted, never completed
    with pytest.raises(StaleReceipt):
        w1.fail(r1.receipt, "late")  # aborted is not failed: no false replay
    from rollout_queue import Receipt
    with pytest.raises(StaleReceipt):
        q.worker("w3").complete(Receipt(r1.entry_id, 1, "w3"), samples(2))  # another worker's attempt


def test_an_abort_resent_after_the_group_was_committed_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue(CFG)
    q.submit([group("a")])
    w1, w2 = q.worker("w1"), q.worker("w2")
    (r1,) = w1.reserve(1)
    w1.abort(r1.receipt)
    (r2,) = w2.reserve(1)
    w2.complete(r2.receipt, samples_for(r2))
    q.lease(1).commit()
    assert w1.abort(r1.receipt) == "replay"
