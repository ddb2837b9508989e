"""The miles integration across crashes, in the default suite (no miles needed): NeMo-RL #3599's count
(prompts skipped or trained twice across save/restore) for miles' ``train_async.py``.

miles does not import here, so a trainer that models miles' loop order exactly as its source has it
at radixark/miles@31f1ca96 (tests/integrations/miles_trainer.py, with file and line) drives the
same ``MilesLedger`` calls ``QueueDataBuffer`` and ``QueueDataSource`` make, while a real worker
regenerates what comes back. tests/integrations/test_miles.py runs the real classes where miles is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.integrations.miles.ledger import MilesLedger
from tests.helpers import wait_until
from tests.integrations.crash_runs import resumes, rollout_crash_run, trained_lineage
from tests.integrations.helpers import committed_steps, fill


@pytest.fixture
def q(env_queue: Callable[[QueueConfig], RolloutQueue]) -> RolloutQueue:
    return env_queue(QueueConfig(max_staleness=8))


def test_a_group_commits_as_it_is_handed_out_and_async_save_keeps_what_a_resume_needs(q: RolloutQueue) -> None:
    """Ledger rules 2 and 3: nothing stays leased across miles' model save; with --async-save a save
    drops only what the previous (certainly written) checkpoint covers."""
    fill(q, 8)
    ledger = MilesLedger(q, SimpleNamespace(start_rollout_id=0, async_save=True))
    try:
        ledger.load(-1)
        for _ in range(4):   # rollouts 0..3, two groups each
            for _ in range(2):
                lease = ledger.lease_one(block_ms=500)
                assert lease is not None
                ledger.hand_out(lease)
            assert q.stats().leased == 0
            ledger.end_drain()
        assert committed_steps(q) == [(s, 1) for s in (1, 1, 2, 2, 3, 3, 4, 4)]
        assert ledger.save(1) == 0          # checkpoint 1 may be unwritten: nothing dropped
        assert ledger.save(3) == 4          # save_model(3) finalised checkpoint 1: rollouts 0 and 1 go
        # killed before checkpoint 3 was written: the resume from 1 requeues rollouts 2 and 3
        assert ledger.load(1) == 4 and (q.stats().committed, q.stats().ready) == (4, 4)   # 0 and 1 stay trained
    finally:
        ledger.close()


@pytest.mark.parametrize("async_save", [False, True], ids=["sync-save", "async-save"])
def test_sigkilled_at_random_points_nothing_skipped_nothing_trained_twice(
        q: RolloutQueue, private_redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        async_save: bool) -> None:
    """A train_async.py-shaped trainer killed once where the earlier ledger failed: between its
    model's save and the rollout manager's (a commit deferred to save(k) trained 2 prompts twice), or
    with --async-save after the rollout manager's save while the model's checkpoint was still being
    written (a queue checkpoint at k refused the resume from the previous one: CheckpointPruned);
    then SIGKILLed three times at random points: every prompt in the surviving lineage trained
    exactly once."""
    # a lease lives from get's lease to its hand-out; one a killed incarnation held comes back in 5 s
    monkeypatch.setenv("ROLLOUT_MILES_LEASE_TIMEOUT_S", "5")
    prompts, rollouts = 24, 12
    first_kill = ["--die-after-save", "5"] if async_save else ["--die-after-model-save", "2"]
    kills, out = rollout_crash_run(q, private_redis_url, tmp_path, "miles_trainer.py", first_kill,
                                   ["--async-save"] if async_save else [], before_start=lambda: _back_in_queue(q),
                                   prompts=prompts, rollouts=rollouts)
    kept, trained = trained_lineage(out, "rollout", "prompts")
    assert sorted(kept) == list(range(rollouts))
    assert [p for p, c in trained.items() if c > 1] == []                  # none trained twice
    assert len(trained) == prompts                                          # none skipped
    assert kills >= 1 and resumes(out) >= 3 and q.stats().leased == 0


def _back_in_queue(q: RolloutQueue) -> None:
    """The reaper's part: a lease a dead incarnation never handed out goes back at its deadline."""
    wait_until(lambda: q.reap() is not None and q.stats().leased == 0, timeout=30)
