"""The dead-letter stream and dlq_requeue.lua, against real servers over both transports.

Proves that after_settling(q).dead_letters() gives the reason, every attempt's history and the pristine group; that
q.requeue_dead_letter(id) ('ok') submits the group again under a new entry ID its source_id maps to,
trainable from attempt 1, and removes the dead letter; and that an unknown id ('not_found') raises
NotFound with every key byte-identical.
"""

from __future__ import annotations

import pytest

from rollout_queue import NotFound, QueueConfig
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import check_header, complete_all, keys, make_groups, pel, samples_for
from tests.helpers import after_settling


def test_header_matches_builder() -> None:
    check_header("dlq_requeue", ["src", "meta", "ids", "intake", "dlq", "wake_work", "settled", "history", "counters"], ["dlq_id"])


def _kill(q, group, reasons) -> str:
    """Fail the group once per reason (max_attempts = len(reasons)); returns its entry ID."""
    [entry_id] = q.submit([group])
    for i, reason in enumerate(reasons, 1):
        [res] = q.worker(f"w-{i}").reserve(1)
        assert (res.entry_id, res.receipt.attempt) == (entry_id, i)
        outcome = q.worker(f"w-{i}").fail(res.receipt, reason)
        assert outcome == ("dead" if i == len(reasons) else "ready")
    return entry_id


def test_dead_letters_give_reasons_history_and_the_pristine_group(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=2))
    [group] = make_groups(1, n=3)
    entry_id = _kill(q, group, ["CUDA OOM", "engine crashed"])
    [dl] = after_settling(q).dead_letters()
    assert (dl.entry_id, dl.source_id, dl.reason, dl.attempt, dl.worker_id) == \
        (entry_id, group.source_id, "max_attempts", 2, "w-2")
    assert [(h["a"], h["w"], h["t"], h["r"]) for h in dl.history] == \
        [(1, "w-1", "failed", "CUDA OOM"), (2, "w-2", "failed", "engine crashed")]
    assert dl.group == group
    # Settled: not pending, not in the stream, counted.
    assert entry_id not in pel(raw, queue_name)
    assert raw.xlen(keys(queue_name)["src"]) == 0
    s = q.stats()
    assert (s.dead, s.retained, s.ready) == (1, 0, 0)


def test_requeue_dead_letter_submits_it_again(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=1))
    [group] = make_groups(1)
    old_id = _kill(q, group, ["bad prompt"])
    [dl] = after_settling(q).dead_letters()
    new_id = q.requeue_dead_letter(dl.dlq_id)
    assert new_id != old_id
    assert raw.hget(keys(queue_name)["ids"], group.source_id).decode() == new_id
    assert q.submit([group]) == [new_id], "its source_id now maps to the new entry"
    assert after_settling(q).dead_letters() == []
    s = q.stats()
    assert (s.dead, s.backlog, s.counters["dead_requeued"]) == (0, 1, 1)
    # Trainable: attempts start again from 1 on the pristine group.
    w = q.worker("w-fixed")
    [res] = w.reserve(1)
    assert (res.entry_id, res.receipt.attempt, res.group) == (new_id, 1, group)
    complete_all(w, [res])
    lease = q.lease(1)
    assert lease.groups[0].group == group
    lease.commit()
    s = q.stats()
    assert (s.committed, s.retained, s.dead) == (1, 0, 0)


def test_requeue_unknown_dead_letter_is_not_found(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(max_attempts=1))
    _kill(q, make_groups(1)[0], ["x"])
    [dl] = after_settling(q).dead_letters()
    q.requeue_dead_letter(dl.dlq_id)
    before = snapshot(raw, queue_name)
    with pytest.raises(NotFound):
        q.requeue_dead_letter(dl.dlq_id)
    with pytest.raises(NotFound):
        q.requeue_dead_letter("1-1")
    assert snapshot(raw, queue_name) == before


def test_a_malformed_reservation_is_dead_lettered_with_its_raw_fields(open_queue, raw, queue_name) -> None:
    q = open_queue()
    # Garbage written into the stream by hand: no parents, n = 0.
    bad = raw.xadd(keys(queue_name)["src"], {"v": "1", "sid": "junk", "n": "0", "p": "[]", "g": "{}"}).decode()
    [good] = q.submit(make_groups(1))
    [res] = q.worker("w-a").reserve(1)
    assert res.entry_id == good, "garbage never blocks the entries behind it"
    [dl] = after_settling(q).dead_letters()
    assert dl.entry_id == bad and dl.reason.startswith("malformed_reservation")
    assert dl.fields[b"sid"] == b"junk" and dl.group is None
    assert q.worker("w-a").complete(res.receipt, samples_for(res)) == "buffered"
