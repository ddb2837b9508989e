"""TRL's AsyncGRPOTrainer protocols over the queue, on a CPU: TRL's own RolloutQueueDataset,
FixedCountBatcher and DataCollatorForRollout drain QueueRolloutWorker's buffer; groups commit only
when handed out and stepped, too-stale groups are requeued rather than dropped, a checkpoint
requeues what still waits in the buffer; QueueWeightTransfer publishes loadable weight folders.
(The trainer itself needs a GPU in TRL 1.16: FlashAttention-3.)"""

from __future__ import annotations

import queue as queues
from collections.abc import Iterator
from contextlib import contextmanager
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from trl.experimental.async_grpo.async_grpo_trainer import (  # noqa: E402
    DataCollatorForRollout,
    FixedCountBatcher,
    RolloutQueueDataset,
    RolloutWorkerProtocol,
    WeightTransferProtocol,
)

from rollout_queue import QueueConfig, RolloutQueue  # noqa: E402
from rollout_queue.integrations.trl_async import QueueRolloutWorker, QueueWeightTransfer  # noqa: E402
from tests.helpers import wait_until  # noqa: E402
from tests.integrations import helpers  # noqa: E402
from tests.integrations.helpers import committed_steps  # noqa: E402

pytestmark = pytest.mark.torch
N = 4  # num_generations


def fill(q: RolloutQueue, count: int, version: int = 0) -> None:
    """``count`` tokenized groups of N samples, completed at policy ``version``."""
    helpers.fill(q, count, n=N, version=version, tokenized=True)


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Any:
    queue = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=8))
    yield queue
    queue.close()


@contextmanager
def running(q: RolloutQueue, groups: int, version: int = 0, trainer_version: int = 0,
            **options: Any) -> Iterator[QueueRolloutWorker]:
    """A started QueueRolloutWorker over ``groups`` completed groups; stopped (its leases rolled back) after."""
    fill(q, groups, version=version)
    worker = QueueRolloutWorker(q, max_staleness=2, **options)
    worker.update_model_version(trainer_version)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


def trl_pipeline(worker: QueueRolloutWorker, version: list[int], groups_per_batch: int) -> Any:
    """TRL's own dataset -> batcher -> collator over the worker's buffer (what AsyncGRPOTrainer builds)."""
    dataset = RolloutQueueDataset(rollout_queue=worker.rollout_buffer, model_version_fn=lambda: version[0],
                                  check_health_fn=worker.check_health, stale_after_s=30.0,
                                  metrics=defaultdict(list), max_staleness=worker.max_staleness, poll_interval_s=0.2)
    batches = iter(FixedCountBatcher(dataset, num_processes=1, microbatch_size=groups_per_batch * N))
    collator = DataCollatorForRollout(pad_token_id=0, num_processes=1)
    return batches, collator


@pytest.mark.parametrize("protocol, make", [
    (RolloutWorkerProtocol, lambda q, tmp: QueueRolloutWorker(q)),
    (WeightTransferProtocol, lambda q, tmp: QueueWeightTransfer(q, weights_dir=tmp)),
])
def test_each_class_has_every_member_of_trls_protocol_with_its_parameters(q: RolloutQueue, tmp_path: Path,
                                                                          protocol: Any, make: Any) -> None:
    import inspect

    ours = make(q, tmp_path)
    methods = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert methods and set(getattr(protocol, "__annotations__", {})) <= set(vars(ours))
    for name in methods:
        theirs = list(inspect.signature(getattr(protocol, name)).parameters)[1:]
        assert list(inspect.signature(getattr(ours, name)).parameters) == theirs, name


def test_trls_dataset_and_collator_train_whole_groups_committed_once_per_step(q: RolloutQueue) -> None:
    with running(q, 8, buffer_groups=4) as worker:
        batches, collator = trl_pipeline(worker, [0], groups_per_batch=2)
        for step in (1, 2, 3):
            rows = next(batches)
            batch = collator([rows])
            assert batch["input_ids"].shape[0] == 1 and {"shift_labels", "attention_mask"} <= set(batch)
            assert len({s["group_id"] for s in rows[0].samples}) == 2  # two whole groups
            assert worker.settle(step) == 2
        assert [step for step, _ in committed_steps(q)] == [1, 1, 2, 2, 3, 3]
        assert q.stats().committed == 6
    s = q.stats()
    assert s.leased == 0 and s.committed == 6 and s.completed + s.ready == 2  # the buffered rest went back


def test_a_group_too_stale_for_the_trainer_is_requeued_not_dropped(q: RolloutQueue) -> None:
    with running(q, 3, version=0, trainer_version=5, buffer_groups=3) as worker:  # staleness 5 > 2
        wait_until(lambda: worker.rollout_buffer.qsize() == 3 * N, timeout=10, message="the buffer filled")
        with pytest.raises(queues.Empty):
            worker.rollout_buffer.get(timeout=0.5)  # every group skipped: none reaches TRL's stale drop
        s = q.stats()
        assert s.leased == 0 and s.committed == 0 and s.ready == 3  # back to be regenerated by fresh weights
        assert worker.metrics_queue.get_nowait() == {"queue/stale_requeued": 1.0}


def test_per_token_logprobs_reach_trl_and_each_token_is_judged_by_its_own_version(q: RolloutQueue) -> None:
    """Issue 30: a sample whose first token was generated under version 0 and the rest under 1 hands
    TRL its behaviour logprobs token by token (its loss's ratio) and its oldest version as
    model_version (TRL's staleness rule), and the group reports its tokens' staleness."""
    from rollout_queue import Sample, SourceGroup

    q.submit([SourceGroup("g", "p", N, {}, (1, 2, 3))])
    w = q.worker("w")
    [r] = w.reserve(max_groups=1, block_ms=2000)
    w.complete(r.receipt, [Sample(k, (10, 11, 12), (-0.5, -0.25, -0.125), reward=float(k), version=0, versions=(0, 1),
                                  segments=((0, 0), (1, 1))) for k in range(N)])
    worker = QueueRolloutWorker(q, max_staleness=3)
    worker.update_model_version(3)
    worker.start()
    try:
        sample = worker.rollout_buffer.get(timeout=10)
        assert sample.model_version == 0
        assert sample.old_log_probs.tolist() == [0.0, 0.0, 0.0, -0.5, -0.25, -0.125]
        assert worker.metrics_queue.get(timeout=5) == {"queue/token_staleness_max": 3.0,
                                                        "queue/token_staleness_mean": pytest.approx(7 / 3)}
    finally:
        worker.stop()


def test_a_checkpoint_requeues_the_groups_still_waiting_in_the_buffer(q: RolloutQueue) -> None:
    with running(q, 4, buffer_groups=4) as worker:
        batches, collator = trl_pipeline(worker, [0], groups_per_batch=1)
        collator([next(batches)])
        assert worker.settle(1) == 1
        wait_until(lambda: q.stats().leased == 3, timeout=10, message="three groups buffered")
        worker._stop.set()  # hold the filler, so the checkpoint sees a still buffer
        worker._thread.join(10)  # type: ignore[union-attr]
        worker.checkpoint(1)
        s = q.stats()
        assert s.leased == 0 and s.committed == 1 and s.ready + s.completed == 3


def test_check_health_raises_instead_of_letting_the_trainer_wait(q: RolloutQueue) -> None:
    worker = QueueRolloutWorker(q, wait_s=0.5)
    with pytest.raises(RuntimeError, match="not running"):
        worker.check_health(10)
    worker.start()
    wait_until(lambda: worker.error is not None, timeout=10, message="the filler gave up")
    with pytest.raises(Exception, match="no worker is alive|nothing is queued"):
        worker.check_health(10)
    worker.stop()


def test_weights_sent_are_published_as_a_folder_the_workers_load(q: RolloutQueue, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rollout_queue.workers.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(folder)
    transfer = QueueWeightTransfer(q, weights_dir=tmp_path / "weights", config_dir=folder)
    transfer.init_weight_transfer()
    transfer.pause()
    assert q.stats().active_holds == 1  # no reservation starts while the version moves
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    transfer.send_weights(iter(model.state_dict().items()))
    assert q.version == 0  # not published before resume
    transfer.resume()
    assert q.version == 1 and q.stats().active_holds == 0
    hb = q.worker("w").heartbeat()
    assert hb.weights_uri and Path(hb.weights_uri).name == "v0000001"
    loaded = AutoModelForCausalLM.from_pretrained(hb.weights_uri)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    transfer.destroy()


def test_a_fresh_start_after_a_crash_before_the_first_checkpoint_trains_its_commits_again(q: RolloutQueue) -> None:
    """Issue 29 item 17 for the async trainer: TRL begins a run resumed without a checkpoint at
    global_step 0; what the crashed run committed (kept, never covered by a checkpoint) is requeued."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    with running(q, 4, buffer_groups=4) as worker:
        batches, collator = trl_pipeline(worker, [0], groups_per_batch=2)
        collator([next(batches)])
        assert worker.settle(1) == 2  # then the process dies: no checkpoint was ever taken
    assert q.stats().committed == 2
    fresh = QueueRolloutWorker(q)
    state = TrainerState()
    assert state.global_step == 0
    fresh.callback.on_train_begin(TrainingArguments(output_dir="unused", report_to=[]), state, TrainerControl())
    s = q.stats()
    assert s.committed == 0 and s.kept == 0 and s.counters.get("restored") == 2


@pytest.mark.parametrize("budget, expected", [(0, 12), (None, None), (4096, None)], ids=["fixed", "auto", "tokens"])
def test_train_begin_sizes_admission_control_from_trls_step(q: RolloutQueue, budget: int | None,
                                                            expected: int | None) -> None:
    """Issue 30: the queue (its config leaves batch_groups unset) gets the groups TRL trains per weight
    sync: 8 x 2 samples per step / 4 generations x 3 steps per sync. With token budgeting the
    groups per step are not fixed: nothing is derived (admission control stays unset)."""
    from transformers import TrainerControl, TrainerState
    from trl.experimental.async_grpo import AsyncGRPOConfig

    args = AsyncGRPOConfig(output_dir="unused", report_to=[], use_cpu=True, bf16=False, token_budget=budget,
                           per_device_train_batch_size=8, gradient_accumulation_steps=2, num_generations=N,
                           weight_sync_steps=3)
    QueueRolloutWorker(q).callback.on_train_begin(args, TrainerState(), TrainerControl())
    assert q.stats().admission_batch == expected


def test_a_group_the_filler_cannot_turn_into_samples_goes_back_counted(q: RolloutQueue) -> None:
    """Issue 29 item 12: a group without prompt token ids cannot become TRL's samples; its lease is
    handed back as an errored rollback (counted, so it cannot loop for ever), and check_health raises."""
    helpers.fill(q, 1, n=N, tokenized=False)
    worker = QueueRolloutWorker(q, wait_s=5)
    worker.start()
    try:
        wait_until(lambda: worker.error is not None, timeout=10, message="the filler stopped on the group")
        with pytest.raises(Exception, match="prompt_token_ids"):
            worker.check_health(10)
    finally:
        worker.stop()
    [marked] = q.client.zrange(q.keys["suspects"], 0, -1)
    s = q.stats()
    assert s.leased == 0 and s.completed == 1 and q.client.zscore(q.keys["suspects"], marked) == 1
