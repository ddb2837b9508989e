"""NeMo-RL by configuration (NVIDIA-NeMo/RL@7ea279ab): ``QueueSampler`` behind ``async_rl.sampler``
(``name: custom``), against NeMo-RL's real ``create_sampler``, ``PromptGroupSampler``,
``BaseSampler``, ``TQReplayBuffer`` and in-process data plane, a private Redis and real worker
processes. NeMo-RL is not on PyPI (its ``nemo-rl`` is an empty placeholder) and needs Python 3.13:
these tests run where ``$NEMO_RL_SRC`` imports (``scripts/test_frameworks.sh nemo-rl``) and skip
with that reason elsewhere; tests/integrations/test_framework_seams.py checks the pinned
signatures in the default suite."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.core.errors import IntegrationConfigError, InvalidInput
from tests.helpers import wait_until
from tests.integrations.framework_src import add_source
from tests.integrations.crash_runs import kill_until_done, trained_lineage
from tests.integrations.helpers import committed_steps, fill

REPO = Path(__file__).resolve().parents[2]
TARGET = "rollout_queue.integrations.nemo_rl.sampler:QueueSampler"

add_source("NEMO_RL_SRC")
if sys.version_info < (3, 13):
    pytest.skip("NeMo-RL needs Python 3.13 (its pydantic configs): run scripts/test_frameworks.sh nemo-rl",
                allow_module_level=True)
staleness = pytest.importorskip("nemo_rl.algorithms.async_utils.staleness_sampler",
                                reason="NeMo-RL is not importable: set NEMO_RL_SRC to an NVIDIA-NeMo/RL checkout "
                                       "(scripts/test_frameworks.sh nemo-rl)")
from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer  # noqa: E402
from nemo_rl.data_plane.adapters.noop import NoOpDataPlaneClient  # noqa: E402


@pytest.fixture
def q(private_redis_url: str, fresh_name: str) -> Iterator[RolloutQueue]:
    queue = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(max_staleness=4, lease_timeout_s=3))
    yield queue
    queue.close()


def plane() -> tuple[NoOpDataPlaneClient, TQReplayBuffer]:
    dp = NoOpDataPlaneClient()
    dp.register_partition(partition_id="train", fields=["input_ids"], num_samples=1024, consumer_tasks=["train"])
    return dp, TQReplayBuffer(dp, "train", pad_value_dict={"token_ids": 0})


def sampler_for(q: RolloutQueue, buffer: TQReplayBuffer, **extra: Any) -> Any:
    cfg = staleness.CustomSamplerConfig(target=TARGET, queue=q.name, **extra)
    return staleness.create_sampler(buffer, cfg)   # NeMo-RL's own factory: import by FQN, protocol check


def select(sampler: Any, weight: int, groups: int = 2) -> tuple[Any, int]:
    return asyncio.run(sampler.select(current_train_weight=weight, min_prompt_groups=groups,
                                      max_prompt_groups=groups))


def test_built_by_nemo_rls_factory_as_its_protocol(q: RolloutQueue, private_redis_url: str) -> None:
    _, buffer = plane()
    sampler = sampler_for(q, buffer, url=private_redis_url)
    assert isinstance(sampler, staleness.PromptGroupSampler) and isinstance(sampler, staleness.BaseSampler)
    assert sampler.supports_buffer_checkpoint is False and sampler.is_on_policy is False
    assert sampler.required_buffer_capacity(8) is None
    with pytest.raises(IntegrationConfigError, match="set_dispatch_index"):
        select(sampler, 0)
    sampler.close()


def test_select_writes_nemo_rls_rows_and_commits_at_the_step(q: RolloutQueue, private_redis_url: str) -> None:
    fill(q, 6, n=2, tokenized=True)
    dp, buffer = plane()
    sampler = sampler_for(q, buffer, url=private_redis_url)
    sampler.set_dispatch_index(0)
    meta, n = select(sampler, 0)
    assert n == 2 and len(meta.sample_ids) == 4 and len(buffer) == 0   # selected: out of NeMo-RL's buffer
    rows = dp.get_samples(sample_ids=meta.sample_ids, partition_id="train", select_fields=meta.fields)
    # NeMo-RL's own record_to_train_batch: prompt (1, 2, 3) + response (10 + k, 11), loss on the response
    assert rows["input_ids"][0].tolist() == [1, 2, 3, 10, 11] and rows["input_ids"][1].tolist() == [1, 2, 3, 11, 11]
    assert rows["token_mask"][0].tolist() == [0, 0, 0, 1, 1]
    assert rows["generation_logprobs"][0].tolist() == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert rows["total_reward"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert committed_steps(q) == [(1, 2)]                                 # committed with step w + 1
    assert asyncio.run(sampler.evict(current_train_weight=1)) == 0
    select(sampler, 1)
    assert committed_steps(q) == [(1, 2), (2, 2)] and q.stats().leased == 0
    sampler.close()


def test_resume_requeues_what_was_committed_after_the_checkpoint(q: RolloutQueue, private_redis_url: str,
                                                                 tmp_path: Path) -> None:
    fill(q, 8, n=2, tokenized=True)
    _, buffer = plane()
    sampler = sampler_for(q, buffer, url=private_redis_url, checkpoint_dir=str(tmp_path))
    sampler.set_dispatch_index(0)
    select(sampler, 0)
    select(sampler, 1)
    (tmp_path / "tmp_step_3").mkdir()       # not finalized: the queue keeps step 3's data
    (tmp_path / "step_2").mkdir()
    select(sampler, 2)
    assert sampler.checkpointed == 2 and q.stats().kept == 2   # step 3's payloads kept, 1-2's dropped
    sampler.close()                          # the process is gone; NeMo-RL resumes from step_2
    _, buffer = plane()
    again = sampler_for(q, buffer, url=private_redis_url, checkpoint_dir=str(tmp_path))
    again.set_dispatch_index(2)
    stats = q.stats()                        # step 3's two groups are requeued, to be generated again
    assert (stats.ready, stats.completed, stats.committed) == (2, 2, 4)
    select(again, 2)
    assert [s for s, _ in committed_steps(q)][-1] == 3
    again.close()


def test_a_group_nemo_rl_cannot_train_rolls_back_counted(q: RolloutQueue, private_redis_url: str) -> None:
    q.submit([SourceGroup("s0", "prompt", 2, {}, (1, 2))])
    w = q.worker("w")
    (r,) = w.reserve(max_groups=1, block_ms=500)
    w.complete(r.receipt, [Sample(slot=k, token_ids=(5, 6), logprobs=(-0.1, -0.2), reward=None, version=0)
                           for k in range(2)])
    dp, buffer = plane()
    sampler = sampler_for(q, buffer, url=private_redis_url, wait_s=5)
    sampler.set_dispatch_index(0)
    with pytest.raises(InvalidInput, match="no reward"):
        select(sampler, 0, groups=1)
    assert len(buffer) == 0 and not dp._partitions["train"].rows      # nothing left in NeMo-RL's plane
    stats = q.stats()
    assert stats.leased == 0 and stats.committed == 0 and stats.terminals["rolled_back"] == 1
    sampler.close()


def test_a_cancelled_select_hands_the_late_lease_back(q: RolloutQueue, private_redis_url: str) -> None:
    _, buffer = plane()
    sampler = sampler_for(q, buffer, url=private_redis_url, block_ms=1500)
    sampler.set_dispatch_index(0)

    async def cancel_then_fill() -> None:
        task = asyncio.create_task(sampler.select(current_train_weight=0, min_prompt_groups=1, max_prompt_groups=1))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(fill, q, 1, n=2, tokenized=True)   # arrives while the wait is still in Redis
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_then_fill())
    # handed back uncounted: requeued to be generated again, nothing committed, nothing left leased
    wait_until(lambda: (q.stats().leased, q.stats().ready) == (0, 1), timeout=30)
    assert q.stats().committed == 0 and not sampler.stream.open
    sampler.close()


def test_every_worker_killed_raises_workers_gone_within_the_bound(private_redis_url: str, fresh_name: str,
                                                                  tmp_path: Path) -> None:
    from tests.integrations.test_hang_to_error import SLACK, bench

    row = bench.measure_nemo_rl(private_redis_url, fresh_name, tmp_path, timeout_s=1.0)
    assert row["grace_s"] <= row["kill_to_error_s"] <= row["bound_s"] + SLACK, row
    assert "no worker has been alive" in row["error"], row["error"]


def test_sigkilled_at_random_points_nothing_skipped_nothing_trained_twice(
        q: RolloutQueue, private_redis_url: str, tmp_path: Path) -> None:
    """NeMo-RL #3599's count (prompts skipped or trained twice across save/restore), the trainer
    SIGKILLed at random points of a NeMo-RL-shaped loop (tests/integrations/nemo_rl_trainer.py) while a
    real worker regenerates what comes back: 0 and 0."""
    from tests.integrations.test_hang_to_error import bench

    groups, steps, per_step = 24, 12, 2
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2, {}, (1, 2, 3)) for i in range(groups)])
    worker = bench.spawn_worker(private_redis_url, q.name, "w1", tmp_path / "w1.log", "--reward", "length_reward",
                                "--engine", "scripted", "--engine-arg", "latency_s=0.02")
    out, ckpt = tmp_path / "trained.jsonl", tmp_path / "ckpt"
    cmd = [sys.executable, str(REPO / "tests/integrations/nemo_rl_trainer.py"), "--url", private_redis_url,
           "--queue", q.name, "--out", str(out), "--checkpoints", str(ckpt), "--steps", str(steps),
           "--groups", str(per_step), "--save", "3", "--step-s", "0.2"]
    try:
        # the reaper's part: the dead incarnation's lease goes back at its deadline
        kills = kill_until_done(cmd, out, random.Random(31), 4, after_kill=q.reap)
    finally:
        bench.kill_all([worker])
    kept, trained = trained_lineage(out, "step", "entries")
    assert sorted(kept) == list(range(1, steps + 1))
    assert [e for e, c in trained.items() if c > 1] == []                  # none trained twice
    assert len(trained) == groups                                           # none skipped
    assert kills >= 1 and q.stats().leased == 0


def _resumes(out: Path) -> int:
    return out.read_text().count('"resume"') if out.exists() else 0


def test_the_documented_config_builds_nemo_rls_sampler(q: RolloutQueue, private_redis_url: str) -> None:
    """docs/integrations/nemo-rl.md's block, as NeMo-RL reads it (its pydantic sampler config)."""
    import re

    import yaml

    page = (REPO / "docs/integrations/nemo-rl.md").read_text()
    block = re.search(r"<!-- nemo-rl-config: [^\n]*-->\n```yaml\n(.*?)```", page, re.S)
    assert block is not None
    cfg = yaml.safe_load(block.group(1))["async_rl"]["sampler"]
    cfg.update(url=private_redis_url, queue=q.name)
    adapter = __import__("pydantic").TypeAdapter(staleness.SamplerConfig)
    _, buffer = plane()
    sampler = staleness.create_sampler(buffer, adapter.validate_python(cfg))
    assert sampler.checkpoint_dir == Path("results/grpo") and sampler.stream.wait_s == 600
    sampler.close()
