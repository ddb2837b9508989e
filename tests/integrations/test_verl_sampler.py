"""verl 0.9.1's V1 trainer seam, for real: its ReplayBuffer subclass loaded the way verl loads a custom
sampler, real TransferQueue (on a local Ray), a private Redis and two ``rollout-queue worker``
processes (scripted engine) generating the groups.

Driven the way ``PPOTrainer.fit`` drives it: ``sample(global_steps=g, "train", B)`` inside step g,
the batch read back from TransferQueue and cleared, ``on_save`` of the checkpoint callback after a
save. A "crash" drops the sampler without a word to Redis (the process is gone), and the resumed run
builds a new one whose first call has ``g = resumed + 1``. The lineage of the final weights (the
checkpointed steps of the killed run, then every step of the resumed one) holds every prompt exactly
once, and Redis's counters show what the queue kept.

verl is not in the default environment (its pins conflict with the shared one: omegaconf needs
antlr4 4.9); ``scripts/test_frameworks.sh verl`` runs this file in a side environment.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core.errors import IntegrationConfigError, QueueNotFound, StreamStarved
from tests.helpers import wait_until
from tests.workers.runtime_helpers import spawn_worker

sampler = pytest.importorskip("rollout_queue.integrations.verl.sampler",
                              reason="verl 0.9.1 is not installed (scripts/test_frameworks.sh verl)")
tq = pytest.importorskip("transfer_queue")
OmegaConf = pytest.importorskip("omegaconf").OmegaConf
QueueCheckpointCallback, QueueReplayBuffer = sampler.QueueCheckpointCallback, sampler.QueueReplayBuffer

B = 2          # groups per step
N = 2          # samples per group
GROUPS = 12
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[Any]:
    """verl's TransferQueue, for real: a local Ray with its controller and storage units."""
    import ray

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init()
    try:
        yield tq
    finally:
        tq.close()
        ray.shutdown()


def documented_config() -> Any:
    """The YAML block docs/integrations/verl.md tells a verl user to add, as verl reads it."""
    text = (REPO / "docs" / "integrations" / "verl.md").read_text()
    block = re.search(r"^<!-- verl-config:.*?-->\n```yaml\n(.*?)^```$", text, re.S | re.M)
    assert block, "docs/integrations/verl.md lost its verl-config block"
    return OmegaConf.create(block.group(1))


def verl_config(url: str, name: str, *, threshold: int | None = 2, strategy: str = "drop") -> Any:
    """The documented lines, with this test's queue and bounds, over the slice of verl's config
    ``PPOTrainer._build_replay_buffer`` reads."""
    cfg = documented_config()
    cfg.trainer.v1.trainer_mode = "separate_async"
    cfg.trainer.v1.separate_async = {"parameter_sync_step": 1}
    sampler = cfg.trainer.v1.sampler
    sampler.max_off_policy_threshold, sampler.max_off_policy_strategy = threshold, strategy
    sampler.sampler_kwargs.update(url=url, queue=name, wait_s=60, lease_timeout_s=30)
    return cfg


def build(config: Any) -> Any:
    """verl's own ``PPOTrainer._build_replay_buffer`` on a bare separate-async trainer holding ``config``
    (no Ray workers: only the sampler is built)."""
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    trainer = object.__new__(PPOTrainerSeparateAsync)
    trainer.config, trainer.trainer_mode = config, config.trainer.v1.trainer_mode
    trainer._add_prompts_to_generate = lambda n: pytest.fail("the queue sampler never refills through verl")
    return trainer._build_replay_buffer()


class Trainer:
    """What the checkpoint callback reads of verl's trainer."""

    def __init__(self, buffer: Any) -> None:
        self.replay_buffer = buffer


def saved(buffer: Any, step: int, *, async_save: bool = False) -> None:
    """verl's ``_save_checkpoint`` tail: the callback the documented config names, built by verl."""
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback

    callback = build_checkpoint_callback(documented_config())
    assert isinstance(callback, QueueCheckpointCallback)
    callback.on_save(trainer=Trainer(buffer), global_step=step, checkpoint_dir=f"/ckpt/global_step_{step}",
                     async_save=async_save)


def step(buffer: Any, g: int) -> list[str]:
    """Step g as ``fit`` runs it: sample, read the batch out of TransferQueue, clear it. Returns the
    source ids of the groups trained."""
    meta, metrics = buffer.sample(global_steps=g, partition_id="train", batch_size=B)
    assert len(meta.keys) == B * N and metrics["rollout_queue/groups"] == B
    data = tq.kv_batch_get(keys=meta.keys, partition_id="train")
    rows = [data[i] for i in range(len(meta.keys))]
    assert all(int(r["global_steps"]) == g for r in rows)
    uids = Counter(str(r["uid"]) for r in rows)
    assert len(uids) == B and set(uids.values()) == {N}     # verl groups advantages by uid: one per group
    for r in rows:
        assert r["input_ids"].tolist() == r["prompts"].tolist() + r["responses"].tolist()
        assert r["rm_scores"].shape == r["responses"].shape
        assert r["loss_mask"].tolist() == r["response_mask"].tolist() and r["data_source"] == "toy"
    tq.kv_clear(keys=meta.keys, partition_id="train")
    return sorted({str(r["extra_fields"]["source_id"]) for r in rows})


@pytest.fixture
def run(private_redis_url: str, fresh_name: str) -> Iterator[tuple[str, str, RolloutQueue]]:
    """A queue of GROUPS prompts (max_staleness 1, as verl's threshold 2) and two scripted workers."""
    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(max_staleness=1, lease_timeout_s=3.0))
    q.submit([SourceGroup(f"p{i}", f"prompt {i}", N, {"data_source": "toy"}, (1, 2, 3 + i)) for i in range(GROUPS)])
    workers = [spawn_worker(private_redis_url, fresh_name, f"w{i}", "--reward", "length_reward") for i in (1, 2)]
    try:
        yield private_redis_url, fresh_name, q
    finally:
        for w in workers:
            w.kill()
            w.wait()
        q.close()


def finish(buffer: Any, q: RolloutQueue, g: int, lineage: list[str]) -> None:
    """Train steps g, g+1, ... until every prompt is in ``lineage`` (a dead lease comes back at its
    deadline: reap it rather than wait for a reaper process)."""
    def more() -> bool:
        q.reap()
        if q.stats().completed >= B:
            nonlocal g
            lineage.extend(step(buffer, g))
            g += 1
        return len(set(lineage)) >= GROUPS
    wait_until(more, timeout=120, interval=0.05, message="every prompt trained")


def test_killed_after_its_checkpoint_a_resumed_run_trains_each_group_once(transfer_queue: Any, run: Any) -> None:
    url, name, q = run
    first = build(verl_config(url, name))
    assert isinstance(first, QueueReplayBuffer)
    trained = {g: step(first, g) for g in (1, 2)}
    saved(first, 2)
    lost = step(first, 3) + step(first, 4)
    assert q.stats().retained == 2 * B    # steps 3 and 4 kept by the queue; steps 1 and 2 dropped at checkpoint 2
    # SIGKILL after step 4: the sampler is gone without a word to Redis. verl resumes from global_step_2.
    resumed = build(verl_config(url, name))
    lineage = trained[1] + trained[2]
    finish(resumed, q, 3, lineage)
    assert resumed.resumed_from == 2
    assert Counter(lineage) == Counter(f"p{i}" for i in range(GROUPS))  # each prompt once in the final weights
    assert set(lost) <= set(lineage[2 * B:])                           # the lost steps' groups trained again


@pytest.mark.parametrize("window", ["lease-commit", "commit-write"])
def test_killed_between_two_redis_calls_of_a_step_nothing_is_lost_or_trained_twice(
        transfer_queue: Any, run: Any, monkeypatch: pytest.MonkeyPatch, window: str) -> None:
    """lease-commit: the process dies after the lease, before its commit (the lease returns at its
    deadline); commit-write: after the commit, before the batch reached TransferQueue (the resumed
    run requeues it: committed after the checkpoint verl resumed from)."""
    url, name, q = run
    first = build(verl_config(url, name))
    lineage = step(first, 1)
    saved(first, 1)

    class Killed(BaseException):
        """The process dies here: nothing after it runs (no rollback, no except)."""

    def die(*_: Any, **__: Any) -> Any:
        raise Killed
    with monkeypatch.context() as m:
        if window == "lease-commit":
            m.setattr(first.stream, "ack", die)
        else:
            m.setattr(tq, "kv_batch_put", die)
        with pytest.raises(Killed):
            step(first, 2)
    resumed = build(verl_config(url, name))
    finish(resumed, q, 2, lineage)
    assert Counter(lineage) == Counter(f"p{i}" for i in range(GROUPS))


def test_async_save_drops_nothing_and_a_sampler_of_verl_is_refused(transfer_queue: Any, run: Any) -> None:
    url, name, q = run
    buffer = build(verl_config(url, name))
    step(buffer, 1)
    saved(buffer, 1, async_save=True)
    assert q.stats().counters.get("checkpoint") is None   # not durable yet: the queue keeps step 1's payloads
    saved(buffer, 1)
    assert q.stats().counters.get("checkpoint") == 1
    with pytest.raises(IntegrationConfigError, match="custom_sampler"):
        QueueCheckpointCallback().on_save(trainer=Trainer(object()), global_step=1, checkpoint_dir="x")


@pytest.mark.parametrize(("threshold", "strategy", "queue_cfg", "match"), [
    (3, "drop", QueueConfig(max_staleness=1), "max_staleness to 2"),
    (1, "drop", QueueConfig(max_staleness=1), "strictly on-policy"),
    (2, "wait", QueueConfig(max_staleness=1, batch_groups=None), "admission control"),
])
def test_staleness_pairings_that_cannot_hold_are_refused_at_construction(
        private_redis_url: str, fresh_name: str, threshold: int, strategy: str, queue_cfg: QueueConfig,
        match: str) -> None:
    RolloutQueue.from_url(private_redis_url, fresh_name, queue_cfg).close()
    with pytest.raises(IntegrationConfigError, match=match):
        build(verl_config(private_redis_url, fresh_name, threshold=threshold, strategy=strategy))


def test_missing_settings_and_unknown_queues_fail_before_verl_starts(private_redis_url: str,
                                                                      fresh_name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg = verl_config(private_redis_url, fresh_name)
    cfg.trainer.v1.sampler.sampler_kwargs = {}
    with pytest.raises(IntegrationConfigError, match="sampler_kwargs.url"):
        build(cfg)
    cfg.trainer.v1.sampler.sampler_kwargs = {"url": private_redis_url, "queue": fresh_name, "groups": 3}
    with pytest.raises(IntegrationConfigError, match="unknown"):
        build(cfg)
    with pytest.raises(QueueNotFound):
        build(verl_config(private_redis_url, fresh_name))


def test_the_queue_may_come_from_the_projects_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """REDIS_URL / ROLLOUT_QUEUE fill in what sampler_kwargs leaves out; sampler_kwargs wins over them."""
    monkeypatch.setenv("REDIS_URL", "redis://env-host:6379/0")
    monkeypatch.setenv("ROLLOUT_QUEUE", "env-queue")
    settings = sampler.SamplerSettings.from_kwargs({"wait_s": 5})
    assert (settings.url, settings.queue, settings.wait_s) == ("redis://env-host:6379/0", "env-queue", 5.0)
    settings = sampler.SamplerSettings.from_kwargs({"url": "redis://config-host:6379/0"})
    assert (settings.url, settings.queue) == ("redis://config-host:6379/0", "env-queue")
    monkeypatch.delenv("ROLLOUT_QUEUE")
    with pytest.raises(IntegrationConfigError, match=r"sampler_kwargs\.queue or ROLLOUT_QUEUE"):
        sampler.SamplerSettings.from_kwargs({"url": "redis://config-host:6379/0"})


def test_wait_blocks_for_fresh_groups_then_says_why_none_came(transfer_queue: Any, private_redis_url: str,
                                                              fresh_name: str) -> None:
    """max_off_policy_strategy=wait with no worker alive: a bounded wait, then the queue's state."""
    RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(max_staleness=1)).close()
    cfg = verl_config(private_redis_url, fresh_name, strategy="wait")
    cfg.trainer.v1.sampler.sampler_kwargs.wait_s = 1.0
    buffer = build(cfg)
    with pytest.raises(StreamStarved) as got:
        buffer.sample(global_steps=1, partition_id="train", batch_size=B)
    assert got.value.waited_s < 30
