"""checkpoint.lua and restore.lua: data consumption that matches the model state, on real servers.

Proves each header outcome ('ok' batch by batch; 'checkpoint_pruned' with every key byte-identical)
and DESIGN: commit(step=k) keeps the pristine entries until q.checkpoint(j >= k) drops them; restore(s)
puts every entry committed after s back to ready under the same entry ID (XCLAIM FORCE), reservable,
trainable and committable again, with committed + retained unchanged so admission control stays
right; and a trainer that crashes and resumes from checkpoint s retrains exactly the later groups.
"""

from __future__ import annotations

from collections import Counter

import pytest

from rollout_queue import CheckpointRegression, CheckpointPruned, QueueConfig
from rollout_queue.core import protocol as p
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    complete_all,
    execute,
    fill_buffer,
    keys,
    meta,
    pel,
    reserve_all,
    stream_ids,
    submit,
    wait_past,
    zmembers,
)


def test_headers_match_builders() -> None:
    check_header("checkpoint", ["src", "meta", "kept", "settled", "counters"], ["step", "count"])
    check_header("restore", ["src", "meta", "ready", "kept", "history", "ledger", "wake_work", "counters"], ["step", "count"])


def _train_steps(q, steps, per_step: int = 1) -> dict[int, list[str]]:
    """Generate and commit ``per_step`` groups at each step; returns step -> entry IDs."""
    out = {}
    for step in steps:
        fill_buffer(q, per_step)
        lease = q.lease(per_step)
        lease.commit(step=step)
        out[step] = [g.entry_id for g in lease.groups]
    return out


def _trained(raw, queue_name) -> Counter:
    """How many committed leases each entry ID appears in (from the commits stream)."""
    c: Counter = Counter()
    for _, kv in raw.xrange(keys(queue_name)["commits"]):
        c.update(x for x in kv[b"ids"].decode().split(",") if x)
    return c


def test_checkpoint_drops_exactly_the_steps_it_covers(open_queue, raw, queue_name) -> None:
    q = open_queue()
    by_step = _train_steps(q, [1, 2, 3, 4])
    assert q.checkpoint(2) == 2
    assert stream_ids(raw, queue_name) == by_step[3] + by_step[4]
    assert zmembers(raw, queue_name, "kept") == by_step[3] + by_step[4]
    m = meta(raw, queue_name)
    assert (m["checkpoint"], m["kept"], m["committed"]) == ("2", "2", "4")
    assert q.stats().backlog == 0
    assert q.checkpoint(2) == 0, "a repeated checkpoint drops nothing more"
    with pytest.raises(CheckpointRegression) as info:  # issue 12 item 6: a regression is refused, loudly
        q.checkpoint(1)
    assert (info.value.step, info.value.checkpoint) == (1, 2)
    assert meta(raw, queue_name)["checkpoint"] == "2", "the checkpoint never goes backwards"


def test_checkpoint_works_in_batches(open_queue, raw, queue_name) -> None:
    q = open_queue()
    _train_steps(q, [1], per_step=3)
    call = p.build(q.keys, "checkpoint", step=1, count=2)
    assert [int(x) for x in execute(q, call)[1:]] == [2, 0]
    # Recorded by the first batch (the fence): a caller that dies here cannot let restore go below it.
    assert meta(raw, queue_name)["checkpoint"] == "1"
    assert [int(x) for x in execute(q, call)[1:]] == [1, 1]
    assert meta(raw, queue_name)["checkpoint"] == "1"


def test_restore_requeues_what_was_committed_after_the_step(open_queue, raw, queue_name) -> None:
    q = open_queue()
    by_step = _train_steps(q, [1, 2, 3])
    before = meta(raw, queue_name)
    assert q.restore(1) == 2
    restored = by_step[2] + by_step[3]
    # Pending again, owned by @ready, same entry IDs, delivery count = the committed attempt.
    assert pel(raw, queue_name) == {e: ("@ready", 1) for e in restored}
    assert zmembers(raw, queue_name, "ready") == restored
    assert zmembers(raw, queue_name, "kept") == by_step[1]
    after = meta(raw, queue_name)
    assert int(after["committed"]) + int(after["retained"]) == int(before["committed"]) + int(before["retained"])
    assert (after["committed"], after["retained"], after["kept"]) == ("1", "2", "1")
    s = q.stats()
    assert (s.ready, s.backlog, s.kept) == (2, 0, 1)
    assert q.restore(1) == 0, "nothing is left to restore"
    # Reservable (attempt 2, pristine), trainable and committable again.
    w = q.worker("w-again")
    again = reserve_all(w, 2)
    assert [(r.entry_id, r.receipt.attempt) for r in again] == [(e, 2) for e in restored]
    complete_all(w, again)
    lease = q.lease(2)
    assert [g.entry_id for g in lease.groups] == restored
    lease.commit(step=2)
    assert _trained(raw, queue_name) == Counter({by_step[1][0]: 1, **{e: 2 for e in restored}})
    s = q.stats()
    assert (s.committed, s.retained, s.kept) == (3, 0, 3)


def test_restore_below_a_pruned_checkpoint_is_refused(open_queue, raw, queue_name) -> None:
    q = open_queue()
    by_step = _train_steps(q, [1, 2, 3, 4])
    q.checkpoint(3)
    before = snapshot(raw, queue_name)
    with pytest.raises(CheckpointPruned) as err:
        q.restore(2)
    assert (err.value.step, err.value.checkpoint) == (2, 3)
    assert snapshot(raw, queue_name) == before
    assert q.restore(3) == 1
    assert zmembers(raw, queue_name, "ready") == by_step[4]


def test_restore_keeps_admission_control_right(open_queue, raw, queue_name) -> None:
    # (version 0 + max_staleness 0 + 1) * batch_groups 2: two reservations may be consumed.
    q = open_queue(QueueConfig(batch_groups=2, max_staleness=0))
    ids = fill_buffer(q, 2)
    q.lease(2).commit(step=1)
    submit(q, 1)
    w = q.worker("w-b")
    reply = execute(q, p.build(q.keys, "reserve", worker_id="w-b", max_groups=1, max_samples=0, request_id="", overcommit=0))
    assert p.s(reply[0]) == "admission"
    assert q.restore(0) == 2
    m = meta(raw, queue_name)
    assert int(m["committed"]) + int(m["retained"]) == 2
    # The restored groups are reservable; the backlog is still closed by admission control.
    got = w.reserve(max_groups=3)
    assert [r.entry_id for r in got] == ids
    assert w.reserve(1) == []
    assert q.stats().backlog == 1


def test_a_trainer_that_crashes_retrains_exactly_the_later_steps(open_queue, raw, queue_name) -> None:
    q = open_queue()
    by_step = _train_steps(q, range(1, 7), per_step=2)
    q.checkpoint(3)
    # The trainer also held a lease for step 7 when it crashed; it expires and is regenerated.
    fill_buffer(q, 2)
    in_flight = q.lease(2, timeout_s=0.05)
    crashed = [g.entry_id for g in in_flight.groups]
    # It restarts from checkpoint 3.
    later = [e for s in (4, 5, 6) for e in by_step[s]]
    assert q.restore(3) == len(later)
    assert zmembers(raw, queue_name, "ready") == later
    wait_past(raw, in_flight.deadline_ms)
    assert q.reap().expired == 2
    # Train until nothing is left: generate again, lease, commit with the resumed step numbers.
    w = q.worker("w-resumed")
    complete_all(w, reserve_all(w, len(later) + 2))
    step = 4
    while (lease := q.lease(2, partial=True)) is not None:
        lease.commit(step=step)
        step += 1
    trained = _trained(raw, queue_name)
    assert {e for e, n in trained.items() if n == 2} == set(later), "exactly steps 4..6 were retrained"
    assert all(n == 1 for e, n in trained.items() if e not in later)
    assert set(trained) == {e for s in by_step.values() for e in s} | set(crashed)
    s = q.stats()
    assert (s.ready, s.completed, s.leased, s.executing_groups, s.retained) == (0, 0, 0, 0, 0)


def test_a_checkpoint_with_groups_still_leased_is_refused_and_changes_nothing(open_queue, raw, queue_name) -> None:
    """Issue 12 item 6: a checkpoint taken while a lease is open may cover a batch that later goes back
    to ready (the lease expires) and is trained twice after a resume: LeasesOpen, nothing dropped."""
    from rollout_queue import LeasesOpen

    q = open_queue()
    _train_steps(q, [1, 2])
    fill_buffer(q, 2)
    lease = q.lease(2)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeasesOpen) as err:
        q.checkpoint(2)
    assert (err.value.step, err.value.leased) == (2, 2)
    assert snapshot(raw, queue_name) == before
    lease.commit(step=3)
    assert q.checkpoint(2) == 2  # once committed, the checkpoint goes through and drops steps 1 and 2
