"""A multi-call operation cut short between any two of its calls (issue 12 item 6).

Each operation below works in bounded batches. The caller may die after any batch; another process
(the same operation called again, or the reaper) must then finish it, and in the meantime nothing may
silently go wrong: a restore never replays fewer groups than were committed after its step, and a
commit is never requeued by the rest of an unfinished restore. Each case runs the operation to
completion once as the reference, then, on a fresh queue, stops it after k calls for every k and
checks the outcome against the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rollout_queue import CheckpointPruned, LeaseLost, QueueConfig, RestoreInProgress
from rollout_queue.core import flows
from rollout_queue.ops import actions
from tests.contract.lifecycle import execute, fill_buffer, history, keys, meta, pel, reserve_all, submit, train, zmembers
from tests.helpers import after_settling

CFG = QueueConfig(max_attempts=1)


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flows, "BATCH", 2)  # so every operation below takes several calls


def fresh(open_queue: Callable[..., Any], raw: Any, queue_name: str) -> Any:
    """The test's queue, emptied first: every cut point starts from the same state."""
    doomed = list(raw.scan_iter(match=keys(queue_name).pattern, count=1000))
    if doomed:
        raw.unlink(*doomed)
    return open_queue(CFG)


def run_calls(q: Any, flow: Any, calls: int | None) -> int:
    """Drive ``flow`` through the queue's transport for at most ``calls`` ops, then drop it (the
    process died). Returns how many ops it sent."""
    reply: Any = None
    sent = 0
    while calls is None or sent < calls:
        try:
            op = flow.send(reply)
        except StopIteration:
            return sent
        reply = execute(q, op)
        sent += 1
    flow.close()
    return sent


def cut_points(q_factory: Callable[[], Any], make_flow: Callable[[Any], Any]) -> range:
    """1 .. n-1 for an operation that takes n calls when it runs to the end."""
    q = q_factory()
    total = run_calls(q, make_flow(q), None)
    assert total >= 3, "the case must take several calls to be worth cutting"
    return range(1, total)


def _steps(q: Any, steps: list[int], per_step: int = 3) -> dict[int, list[str]]:
    out = {}
    for step in steps:
        fill_buffer(q, per_step)
        out[step] = [g.entry_id for g in train(q, per_step, step=step).groups]
    return out


def test_an_interrupted_checkpoint_never_lets_restore_replay_fewer(open_queue, raw, queue_name) -> None:
    def setup() -> Any:
        q = fresh(open_queue, raw, queue_name)
        q.raw_steps = _steps(q, [1, 2, 3])
        return q

    for k in cut_points(setup, lambda q: flows.checkpoint(q.keys, 2)):
        q = setup()
        by_step = q.raw_steps
        run_calls(q, flows.checkpoint(q.keys, 2), k)
        # Before the fix the checkpoint was recorded only when done: restore(1) then requeued only the
        # kept entries the dead checkpoint had not dropped yet, silently fewer than were committed.
        with pytest.raises(CheckpointPruned):
            q.restore(1)
        q.reap()  # the reaper finishes it
        assert sorted(zmembers(raw, queue_name, "kept")) == sorted(by_step[3])
        assert meta(raw, queue_name)["checkpoint"] == "2" and int(meta(raw, queue_name)["kept"]) == 3
        assert q.restore(2) == 3  # exactly what was committed after 2
        for entry in by_step[3]:
            assert pel(raw, queue_name)[entry][0] == "@ready"


def test_an_interrupted_restore_fences_commits_until_it_is_finished(open_queue, raw, queue_name) -> None:
    def setup() -> Any:
        q = fresh(open_queue, raw, queue_name)
        q.raw_steps = _steps(q, [1, 2, 3])
        fill_buffer(q, 1)  # one group a resumed trainer could lease meanwhile
        return q

    for k in cut_points(setup, lambda q: flows.restore(q.keys, 1)):
        for finisher in ("trainer", "reaper"):
            q = setup()
            by_step = q.raw_steps
            run_calls(q, flows.restore(q.keys, 1), k)
            lease = q.lease(1)
            assert lease is not None
            with pytest.raises(RestoreInProgress):
                lease.commit(step=2)  # the rest of the restore would requeue it: trained twice
            with pytest.raises(RestoreInProgress):
                q.checkpoint(3)
            with pytest.raises(RestoreInProgress):
                q.restore(2)  # another step: finish restore(1) first
            if finisher == "trainer":
                q.restore(1)
            else:
                q.reap()
            assert "restoring" not in meta(raw, queue_name)
            restored = by_step[2] + by_step[3]
            assert {e: pel(raw, queue_name)[e][0] for e in restored} == {e: "@ready" for e in restored}
            assert sorted(zmembers(raw, queue_name, "kept")) == sorted(by_step[1])
            lease.commit(step=2)  # allowed once the restore is done
            stats = q.stats()
            assert (stats.committed, stats.kept, stats.ready) == (4, 4, 6)


def test_an_interrupted_close_is_finished_by_the_reaper_with_its_own_terminal(open_queue, raw,
                                                                             queue_name) -> None:
    def setup() -> Any:
        q = fresh(open_queue, raw, queue_name)
        submit(q, 5)
        reserve_all(q.worker("w1"), 5)
        return q

    for k in cut_points(setup, lambda q: flows.close_worker(q.keys, "w1", "aborted", "drained")):
        q = setup()
        run_calls(q, flows.close_worker(q.keys, "w1", "aborted", "drained"), k)
        report = q.reap()  # at once: the close made the worker due, no worker_timeout to wait
        assert report.dead == 0  # max_attempts=1: 'aborted' is not counted, 'lost' would dead-letter
        stats = q.stats()
        assert (stats.ready, stats.executing_groups, stats.dead) == (5, 0, 0)
        assert raw.zscore(keys(queue_name)["workers"], "w1") is None
        assert "w1" not in {c["name"].decode() for c in raw.xinfo_consumers(keys(queue_name)["src"], "rollout")}
        for entry in pel(raw, queue_name):
            assert [h["t"] for h in history(raw, queue_name, entry)] == ["aborted"]


def test_an_interrupted_rollback_is_fenced_and_finished(open_queue, raw, queue_name) -> None:
    def setup() -> Any:
        q = fresh(open_queue, raw, queue_name)
        fill_buffer(q, 5)
        q.held_lease = q.lease(5)
        return q

    for k in cut_points(setup, lambda q: flows.rollback(q.keys, q.held_lease.lease_id, q.held_lease.token)):
        q = setup()
        lease = q.held_lease
        run_calls(q, flows.rollback(q.keys, lease.lease_id, lease.token), k)
        with pytest.raises(LeaseLost):
            lease.commit()
        q.reap()
        stats = q.stats()
        assert (stats.ready, stats.leased, stats.committed, stats.dead) == (5, 0, 0, 0)


def test_an_interrupted_purge_counts_each_dead_letter_once(open_queue, raw, queue_name) -> None:
    def setup() -> Any:
        q = fresh(open_queue, raw, queue_name)
        submit(q, 5)
        w = q.worker("w1")
        for r in reserve_all(w, 5):
            w.fail(r.receipt, "boom")
        return q

    def purge(q: Any) -> Any:
        return actions.purge_dead_letters(q.keys, [d.dlq_id for d in after_settling(q).dead_letters()])

    for k in cut_points(setup, purge):
        q = setup()
        ids = [d.dlq_id for d in after_settling(q).dead_letters()]
        run_calls(q, actions.purge_dead_letters(q.keys, ids), k)
        q.run(actions.purge_dead_letters(q.keys, ids))  # the operator repeats the command
        assert q.stats().dead == 0 and after_settling(q).dead_letters() == []
        assert int(meta(raw, queue_name)["dead_purged"]) == 5
