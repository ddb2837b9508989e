"""slime by configuration (THUDM/slime@624b824a): ``QueueDataSource`` behind ``--data-source-path`` and
``generate_rollout`` behind ``--rollout-function-path``, against a private Redis; against slime's
real ``DataSource`` ABC when ``$SLIME_SRC`` imports (scripts/test_frameworks.sh slime)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError
from rollout_queue.integrations.convert.slime import THIS_ROLLOUT_FUNCTION, QueueDataSource, generate_rollout
from tests.integrations.framework_src import add_source, stub_sglang
from tests.integrations.crash_runs import resumes, rollout_crash_run, trained_lineage
from tests.integrations.helpers import committed_steps, fill


@pytest.fixture
def q(env_queue: Callable[[QueueConfig], RolloutQueue]) -> RolloutQueue:
    return env_queue(QueueConfig(max_staleness=8))


def args(**extra: object) -> SimpleNamespace:
    fields: dict[str, object] = dict(rollout_batch_size=2, rollout_function_path=THIS_ROLLOUT_FUNCTION,
                                     eval_interval=None, eval_function_path=None)
    return SimpleNamespace(**{**fields, **extra})


def test_data_source_serves_rollouts_and_checkpoints(q: RolloutQueue) -> None:
    fill(q, 10, n=2, tokenized=True)
    source = QueueDataSource(args())
    source.load(None)
    for rollout_id in range(3):
        groups = generate_rollout(args(), rollout_id, source)
        assert len(groups) == 2 and all(len(g) == 2 for g in groups)
        # committed at hand-out with the rollout's id: nothing is left leased across slime's model save
        assert q.stats().leased == 0
    assert committed_steps(q) == [(1, 2), (2, 2), (3, 2)]  # rollout k is queue step k + 1
    source.save(1)
    assert len(source) == 4
    source.load(1)  # a resume from the checkpoint at rollout 1: rollout 2 comes back, once
    assert (q.stats().committed, q.stats().ready, q.stats().completed) == (4, 2, 4)  # requeued to generate again


def test_evaluation_is_refused_at_start_with_the_fix(q: RolloutQueue) -> None:
    with pytest.raises(IntegrationConfigError, match="--eval-function-path slime.rollout.sglang_rollout"):
        QueueDataSource(args(eval_interval=5))
    QueueDataSource(args(eval_interval=5, eval_function_path="slime.rollout.sglang_rollout.generate_rollout"))


def test_without_slimes_global_dataset_it_refuses_at_start(q: RolloutQueue) -> None:
    """slime calls the data source's save/load only with its global dataset on (its default)."""
    with pytest.raises(IntegrationConfigError, match="--disable-rollout-global-dataset"):
        QueueDataSource(args(rollout_global_dataset=False))


def test_rollout_function_needs_the_queue_data_source() -> None:
    with pytest.raises(IntegrationConfigError, match="--data-source-path"):
        generate_rollout(args(), 0, object())


def test_real_slime_data_source_abc(q: RolloutQueue) -> None:
    add_source("SLIME_SRC")
    stub_sglang()
    real = pytest.importorskip("slime.rollout.data_source",
                               reason="slime is not importable: set SLIME_SRC (scripts/test_frameworks.sh slime)")
    # every abstract method of slime's ABC is implemented (instantiation refuses otherwise); where slime
    # was importable when this package was imported (its side environment), it is the base class itself
    checked = type("Checked", (QueueDataSource, real.DataSource), {})(args())
    assert isinstance(checked, real.DataSource)
    with pytest.raises(IntegrationConfigError, match="rollout-function-path"):
        checked.get_samples(1)


def test_sigkilled_at_random_points_nothing_skipped_nothing_trained_twice(q: RolloutQueue, private_redis_url: str,
                                                                         tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """NeMo-RL #3599's count (prompts skipped or trained twice across save/restore) for slime: a
    train.py-shaped trainer (tests/integrations/slime_trainer.py) killed once between its model's save
    and its data source's, then SIGKILLed at random points, while a real worker regenerates what comes
    back: every prompt in the surviving lineage exactly once."""
    # a lease lives from hand-out to its commit; one a killed incarnation held comes back in 5 s
    monkeypatch.setenv("ROLLOUT_SLIME_LEASE_TIMEOUT_S", "5")
    prompts, rollouts = 24, 12
    # the first incarnation dies between actor_model.save_model(2) and the data source's save(2); after
    # each later kill, the reaper's part: a lease the dead incarnation never committed goes back
    kills, out = rollout_crash_run(q, private_redis_url, tmp_path, "slime_trainer.py", ["--die-after-model-save", "2"],
                                   after_kill=q.reap, prompts=prompts, rollouts=rollouts)
    kept, trained = trained_lineage(out, "rollout", "prompts")
    assert sorted(kept) == list(range(rollouts))
    assert [p for p, c in trained.items() if c > 1] == []                  # none trained twice
    assert len(trained) == prompts                                          # none skipped
    assert kills >= 1 and resumes(out) >= 3 and q.stats().leased == 0
