"""The miles integration against miles' real classes (radixark/miles@31f1ca96, from ``$MILES_SRC``)
and a private Redis: miles' own buffer tests ported to the queue-backed buffer, its
``FullyAsyncRolloutFn`` driving our buffer and data source, and the exactly-once accounting across a
killed rollout process. Skipped with the reason when miles' source is absent; run by
``MILES_SRC=... scripts/test_frameworks.sh miles``.
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rollout_queue.integrations.miles as miles_integration
from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.integrations.miles.ledger import forget_ledgers, ledger_for
from tests.integrations.framework_src import add_source, stub_sglang
from tests.integrations.helpers import committed_steps

add_source("MILES_SRC")
stub_sglang()
data_buffer = pytest.importorskip("miles.rollout.fully_async_data_buffer",
                                  reason="miles is not importable: set MILES_SRC to a radixark/miles checkout "
                                         "(scripts/test_frameworks.sh miles)")
fully_async = pytest.importorskip("miles.rollout.fully_async_rollout")
base_types = pytest.importorskip("miles.rollout.base_types")
MilesSample = pytest.importorskip("miles.utils.types").Sample
QueueDataBuffer, QueueDataSource = miles_integration.QueueDataBuffer, miles_integration.QueueDataSource

N = 2  # miles' tests' N_SAMPLES_PER_PROMPT


@pytest.fixture
def q(env_queue: Callable[[QueueConfig], RolloutQueue]) -> Iterator[RolloutQueue]:
    yield env_queue(QueueConfig(max_staleness=100))
    forget_ledgers()  # before env_queue closes the queue


def submit(q: RolloutQueue, count: int, start: int = 0) -> None:
    q.submit([SourceGroup(f"p{i}", f"prompt {i}", N, {"miles": {"prompt": f"prompt {i}", "label": "ok"}})
              for i in range(start, start + count)])


def make_args(**overrides: Any) -> Namespace:
    """miles' tests' make_args (tests/fast/rollout/test_fully_async_rollout.py), plus start_rollout_id."""
    defaults = dict(rollout_global_dataset=True, rollout_batch_size=2, n_samples_per_prompt=N,
                    max_weight_staleness=None, async_max_concurrent_samples=None,
                    async_data_buffer_capacity_factor=1000.0, async_unused_samples_handler="drop",
                    custom_async_data_buffer_path=None, rollout_submission_granularity=None,
                    dynamic_sampling_filter_path=None, rollout_sample_filter_path=None,
                    sglang_router_ip="127.0.0.1", sglang_router_port=30000, eval_num_gpus=0, start_rollout_id=0)
    defaults.update(overrides)
    return Namespace(**defaults)


def finish(group: list[Any], weight_versions: list[str] | None = None, status: Any = None) -> list[Any]:
    """What a generate function does to a prompt group (miles' make_group's fields)."""
    for i, s in enumerate(group):
        s.tokens, s.response_length, s.response = [1, 2, 3, 40 + i], 1, "ok"
        s.rollout_log_probs, s.loss_mask, s.reward = [-0.5], [1], 1
        s.status = status or MilesSample.Status.COMPLETED
        s.weight_versions = list(weight_versions or [])
    return group


# -- miles' own buffer tests, against the queue-backed buffer --------------------------------------


def make_buffer(max_groups: float | None = None, max_staleness: int | None = None) -> tuple[Any, list, Any]:
    unused: list = []
    args = make_args(rollout_batch_size=1, async_data_buffer_capacity_factor=max_groups or 1000.0,
                     max_weight_staleness=max_staleness)
    buffer = QueueDataBuffer(data_buffer.DataBufferConstructorInput(args=args, unused_handler_fn=unused.append))
    return buffer, unused, QueueDataSource(args)


async def put_group(buffer: Any, group: list[Any]) -> None:
    await buffer.put(data_buffer.DataBufferInput(prompt_group=group, group=group))


def test_buffer_blocks_producer_when_full(q: RolloutQueue) -> None:
    submit(q, 3)

    async def run() -> None:
        buffer, _, source = make_buffer(max_groups=2)
        groups = [finish(g) for g in source.get_samples(3)]
        await put_group(buffer, groups[0])
        await put_group(buffer, groups[1])
        blocked = asyncio.create_task(put_group(buffer, groups[2]))
        await asyncio.sleep(0.2)
        assert not blocked.done()
        assert buffer.get_metrics()["rollout/fully_async/queue_size"] == 2
        assert (await buffer.get()).group[0].group_index == groups[0][0].group_index
        await asyncio.wait_for(blocked, 30)
        assert (await buffer.get()).group[0].group_index == groups[1][0].group_index
        assert (await buffer.get()).group[0].group_index == groups[2][0].group_index

    asyncio.run(run())


def test_buffer_get_ignores_unknown_context_keys(q: RolloutQueue) -> None:
    submit(q, 1)

    async def run() -> None:
        buffer, _, source = make_buffer()
        (group,) = source.get_samples(1)
        await put_group(buffer, finish(group))
        got = await buffer.get(current_version=1, some_future_key=2)
        assert got.group[0].group_index == group[0].group_index

    asyncio.run(run())


def test_buffer_get_skips_groups_stale_at_consumption_time(q: RolloutQueue) -> None:
    """Both groups were fresh when buffered; only the version passed to get() decides. The stale one
    goes back to the queue to be generated again (miles recycles it through its data source)."""
    submit(q, 2)

    async def run() -> None:
        buffer, unused, source = make_buffer(max_staleness=2)
        stale, fresh = source.get_samples(2)
        await put_group(buffer, finish(stale, ["5"]))
        await put_group(buffer, finish(fresh, ["9"]))
        assert (await buffer.get(current_version=10)).group[0].group_index == fresh[0].group_index
        assert [g[0].prompt for g in unused] == [stale[0].prompt]
        assert buffer.get_metrics()["rollout/fully_async/stale_groups_filtered"] == 1
        assert q.stats().ready == 1  # requeued for a new attempt, not lost

    asyncio.run(run())


def test_buffer_staleness_metrics(q: RolloutQueue) -> None:
    submit(q, 3)

    async def run() -> None:
        buffer, _, source = make_buffer(max_groups=8)
        g1, g2, g3 = source.get_samples(3)
        await put_group(buffer, finish(g1, ["4"]))
        assert "rollout/fully_async/buffer_avg_staleness" not in buffer.get_metrics()  # engine version never seen
        await put_group(buffer, finish(g2, ["6"]))
        await put_group(buffer, finish(g3, ["8"]))
        await buffer.get(current_version=10)
        metrics = buffer.get_metrics()
        assert metrics["rollout/fully_async/avg_staleness"] == 6.0
        assert metrics["rollout/fully_async/buffer_avg_staleness"] == 3.0
        assert metrics["rollout/fully_async/buffer_max_staleness"] == 4

    asyncio.run(run())


def test_round_trip_keeps_every_field(q: RolloutQueue) -> None:
    submit(q, 1)

    async def run() -> None:
        buffer, _, source = make_buffer()
        (group,) = source.get_samples(1)
        finish(group, ["3", "4"])
        group[0].loss_mask, group[0].reward = [0], {"acc": 1.0}
        group[0].metadata["turn"] = 7
        await put_group(buffer, group)
        got = (await buffer.get()).group
        for before, after in zip(group, got):
            assert after.tokens == before.tokens and after.response_length == before.response_length
            assert after.loss_mask == before.loss_mask and after.rollout_log_probs == before.rollout_log_probs
            assert after.weight_versions == before.weight_versions and after.reward == before.reward
            assert after.label == "ok" and after.prompt == before.prompt and after.status == before.status
        assert got[0].metadata["turn"] == 7 and "rollout_queue" not in got[0].metadata

    asyncio.run(run())


def test_aborted_and_malformed_groups_settle_their_attempts(q: RolloutQueue) -> None:
    submit(q, 2)

    async def run() -> None:
        buffer, unused, source = make_buffer()
        aborted, bad = source.get_samples(2)
        await put_group(buffer, finish(aborted, status=MilesSample.Status.ABORTED))
        finish(bad)[0].rollout_log_probs = [-0.1, -0.2, -0.3]  # garbage from a generate function
        await put_group(buffer, bad)
        metrics = buffer.get_metrics()
        assert metrics["rollout/fully_async/aborted_groups_filtered"] == 1
        assert metrics["rollout_queue/malformed_groups"] == 1 and len(unused) == 1
        s = q.stats()
        assert s.completed == 0 and s.executing_groups == 0 and s.filtered == 1 and s.ready == 1

    asyncio.run(run())


# -- miles' FullyAsyncRolloutFn driving the queue ---------------------------------------------------


def make_fn(monkeypatch: pytest.MonkeyPatch, args: Namespace, source: Any) -> Any:
    """miles' make_fn: its rollout function with generation replaced (no engines here)."""

    class FakeGenerateState:
        def __init__(self, args: Namespace) -> None:
            self.args, self.sampling_params, self.aborted = args, {}, False

    async def generate(state: Any, group: list, sampling_params: Any, evaluation: bool = False,
                       sample_done_callback: Any = None) -> list:
        await asyncio.sleep(0)
        return finish(group, ["1"])

    monkeypatch.setattr(fully_async, "GenerateState", FakeGenerateState)
    monkeypatch.setattr(fully_async, "generate_and_rm_group", generate)
    return fully_async.FullyAsyncRolloutFn(base_types.RolloutFnConstructorInput(args=args, data_source=source))


def drain(fn: Any, rollout_id: int) -> Any:
    return fn(base_types.RolloutFnTrainInput(rollout_id=rollout_id, weight_version=1))


def test_fully_async_rollout_commits_each_rollout_at_hand_out(q: RolloutQueue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each group commits as the buffer hands it to miles, as queue step rollout_id + 1 (ledger rule
    2): nothing is left leased across train_async.py's model save, and a resume from checkpoint k
    requeues exactly the rollouts after k."""
    submit(q, 40)
    args = make_args(custom_async_data_buffer_path="rollout_queue.integrations.miles.QueueDataBuffer",
                     async_max_concurrent_samples=4, async_data_buffer_capacity_factor=2.0)

    async def first_run() -> None:
        source = QueueDataSource(args)
        source.load(-1)  # RolloutManager: load(start_rollout_id - 1) on a fresh start
        fn = make_fn(monkeypatch, args, source)
        for rollout_id in range(3):
            out = await drain(fn, rollout_id)
            assert len(out.samples) == 2 and "rollout/fully_async/queue_size" in out.metrics
            assert q.stats().leased == 0
        assert committed_steps(q) == [(1, 1), (1, 1), (2, 1), (2, 1), (3, 1), (3, 1)]
        source.save(1)  # the model of rollout 1 is saved: the queue drops rollouts 0 and 1's payloads
        await drain(fn, 3)  # then the rollout process dies (no close: its reservations are left behind)
        fn._worker.cancel()

    asyncio.run(first_run())
    committed_before = q.stats().committed
    forget_ledgers_without_close()
    # the job restarts from the checkpoint of rollout 1: rollouts 2 and 3 must be trained again
    resumed = QueueDataSource(make_args(start_rollout_id=2))
    requeued = resumed._ledger.load(1)
    assert requeued == 4 and q.stats().committed == committed_before - 4


def forget_ledgers_without_close() -> None:
    """A SIGKILLed process: its ledger vanishes without handing anything back."""
    from rollout_queue.integrations.miles import ledger

    for led in list(ledger._LEDGERS.values()):
        led._stop.set()
    ledger._LEDGERS.clear()


def test_missing_environment_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_queue.core.errors import IntegrationConfigError

    monkeypatch.delenv("ROLLOUT_QUEUE", raising=False)
    with pytest.raises(IntegrationConfigError, match="ROLLOUT_QUEUE"):
        ledger_for(make_args(), environ={"REDIS_URL": "redis://x"})


def test_capacity_beyond_the_queue_buffer_is_refused(q: RolloutQueue) -> None:
    from rollout_queue.core.errors import IntegrationConfigError

    args = make_args(async_data_buffer_capacity_factor=1e6)
    with pytest.raises(IntegrationConfigError, match="max_completed_groups"):
        QueueDataBuffer(data_buffer.DataBufferConstructorInput(args=args, unused_handler_fn=print))
