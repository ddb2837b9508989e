"""slime by configuration (THUDM/slime@624b824a): ``QueueDataSource`` behind ``--data-source-path`` and
``generate_rollout`` behind ``--rollout-function-path``, against a private Redis; against slime's
real ``DataSource`` ABC when ``$SLIME_SRC`` imports (scripts/test_frameworks.sh slime)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError
from rollout_queue.integrations.convert.slime import THIS_ROLLOUT_FUNCTION, QueueDataSource, generate_rollout
from tests.integrations.framework_src import add_source, stub_sglang
from tests.integrations.helpers import fill


@pytest.fixture
def q(private_redis_url: str, fresh_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RolloutQueue]:
    queue = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(max_staleness=8))
    monkeypatch.setenv("REDIS_URL", private_redis_url)
    monkeypatch.setenv("ROLLOUT_QUEUE", fresh_name)
    yield queue
    queue.close()


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
    assert q.stats().committed == 2  # ack_lag 1: asking for rollout 2 means rollout 0 was trained
    source.save(2)
    assert q.stats().committed == 6 and q.stats().leased == 0
    assert len(source) == 4


def test_evaluation_is_refused_at_start_with_the_fix(q: RolloutQueue) -> None:
    with pytest.raises(IntegrationConfigError, match="--eval-function-path slime.rollout.sglang_rollout"):
        QueueDataSource(args(eval_interval=5))
    QueueDataSource(args(eval_interval=5, eval_function_path="slime.rollout.sglang_rollout.generate_rollout"))


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
