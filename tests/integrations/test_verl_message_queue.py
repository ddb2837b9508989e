"""verl 0.9.1 fully_async's MessageQueue seam, for real: the queue-backed class against verl's own
``MessageQueue`` (every public method's signature, async-ness, the Ray actor options), driven through
verl's ``MessageQueueClient`` on a local Ray the way ``FullyAsyncRollouter`` puts and
``FullyAsyncTrainer`` gets, with verl's checkpoint tracker file and restarts; and the shipped patch
applied (dry run) to verl's installed ``fully_async_main.py`` with the command the docs show.

verl is not in the default environment; ``scripts/test_frameworks.sh verl`` runs this file.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import QueueConfig, RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError

mq = pytest.importorskip("rollout_queue.integrations.verl.message_queue",
                         reason="verl 0.9.1 is not installed (scripts/test_frameworks.sh verl)")
verl_mq = pytest.importorskip("verl.experimental.fully_async_policy.message_queue")
OmegaConf = pytest.importorskip("omegaconf").OmegaConf

REPO = Path(__file__).resolve().parents[2]
PER_STEP = 2   # ppo_mini_batch_size * require_batches


def doc_block(tag: str, lang: str) -> str:
    text = (REPO / "docs" / "integrations" / "verl.md").read_text()
    block = re.search(rf"^<!-- {tag}:.*?-->\n```{lang}\n(.*?)^```$", text, re.S | re.M)
    assert block, f"docs/integrations/verl.md lost its {tag} block"
    return block.group(1)


def verl_config(url: str, name: str, ckpt: Path) -> Any:
    """The documented block over the slice of verl's fully_async config the trainer and this class read."""
    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(ckpt), "resume_mode": "auto"},
                            "async_training": {"require_batches": 1, "trigger_parameter_sync_step": 1},
                            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": PER_STEP}}})
    cfg = OmegaConf.merge(cfg, OmegaConf.create(doc_block("verl-mq-config", "yaml")))
    cfg.rollout_queue.url, cfg.rollout_queue.queue = url, name
    return cfg


def saved(ckpt: Path, version: int) -> None:
    """The tail of ``FullyAsyncTrainer._save_checkpoint``: the tracker, written after the save."""
    ckpt.mkdir(exist_ok=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(version))


def rollout_sample(i: int) -> bytes:
    """What ``_process_single_sample_streaming`` puts: a cloudpickled RolloutSample."""
    import ray
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample

    return ray.cloudpickle.dumps(RolloutSample(full_batch=None, sample_id=f"sample_0_{i}", epoch=0,
                                               rollout_status={}))


def test_the_class_has_verls_message_queue_interface() -> None:
    theirs, ours = verl_mq.MessageQueue.__ray_actor_class__, mq.MessageQueue.__ray_actor_class__
    public = {n for n, f in vars(theirs).items() if callable(f) and not n.startswith("_")} | {"__init__"}
    assert public <= set(dir(ours))
    for name in sorted(public):
        a, b = getattr(theirs, name), getattr(ours, name)
        sig = [[(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()] for f in (a, b)]
        assert sig[0] == sig[1], name
        assert inspect.iscoroutinefunction(a) == inspect.iscoroutinefunction(b), name
    assert mq.MessageQueue._default_options == verl_mq.MessageQueue._default_options   # num_cpus, max_concurrency
    client_calls = {n for n, f in vars(verl_mq.MessageQueueClient).items() if callable(f) and not n.startswith("_")}
    used = {re.sub(r"_sync$", "", n) for n in client_calls}   # every actor method verl's client calls exists
    assert used <= set(dir(ours)), used - set(dir(ours))


def test_the_documented_patch_applies_to_verls_installed_file(tmp_path: Path) -> None:
    """The docs' one-liner with --dry-run, against verl 0.9.1's installed fully_async_main.py; and the
    patched file imports MessageQueue from here and verl's own client."""
    import verl

    command = re.search(r"^<!-- not run: it edits the installed verl.*?-->\n```bash\n(.*?)^```$",
                        (REPO / "docs" / "integrations" / "verl.md").read_text(), re.S | re.M)
    assert command
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command.group(1).replace("patch -p1", "patch --dry-run -p1")],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    site = Path(verl.__file__).parent.parent
    copy = tmp_path / "site"
    target = copy / "verl" / "experimental" / "fully_async_policy" / "fully_async_main.py"
    target.parent.mkdir(parents=True)
    target.write_text((site / "verl/experimental/fully_async_policy/fully_async_main.py").read_text())
    patch = REPO / "rollout_queue" / "integrations" / "verl" / "patches" / "fully_async_message_queue.patch"
    subprocess.run(["patch", "-p1", "-d", str(copy), "-i", str(patch)], check=True, capture_output=True)
    text = target.read_text()
    assert "from rollout_queue.integrations.verl.message_queue import MessageQueue" in text
    assert "from verl.experimental.fully_async_policy.message_queue import MessageQueueClient\n" in text
    assert "MessageQueue.remote(config, max_queue_size)" in text   # verl's call, unchanged


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        yield ray
    finally:
        ray.shutdown()


def test_a_restarted_run_trains_every_put_group_exactly_once(local_ray: Any, private_redis_url: str,
                                                             fresh_name: str, tmp_path: Path) -> None:
    """Rollouter puts through verl's client; the trainer gets PER_STEP per step; a checkpoint after
    step 2; step 3 handed out, then everything dies (verl's finally: clear_queue). The restarted run
    resumes from param version 2: step 3's groups come back, the unconsumed ones are still there, a
    re-put of the same bytes is stored once, and None ends the stream after the last group."""
    ray = local_ray
    ckpt = tmp_path / "ckpt"
    cfg = verl_config(private_redis_url, fresh_name, ckpt)
    actor = mq.MessageQueue.remote(cfg, 100)
    client = verl_mq.MessageQueueClient(actor)

    async def run_first() -> list[list[str]]:
        for i in range(7):
            assert await client.put_sample(rollout_sample(i)) is True
        steps = []
        for step in (1, 2, 3):
            got = [await client.get_sample() for _ in range(PER_STEP)]
            steps.append([ray.cloudpickle.loads(blob).sample_id for blob, _ in got])
            if step == 2:
                saved(ckpt, 2)
        assert await client.get_queue_size() == 1 and client.get_queue_size_sync() == 1
        stats = await client.get_statistics()
        assert (stats["total_produced"], stats["total_consumed"], stats["dropped_samples"]) == (7, 6, 0)
        await client.clear_queue()           # fully_async_main's finally
        assert await client.get_queue_size() == 1
        return steps
    steps = asyncio.run(run_first())
    ray.kill(actor, no_restart=True)        # the run dies

    actor = mq.MessageQueue.remote(cfg, 100)
    client = verl_mq.MessageQueueClient(actor)

    async def run_resumed() -> list[str]:
        assert await client.get_queue_size() == 3          # step 3's two requeued, one never handed out
        await client.put_sample(rollout_sample(0))          # the same bytes again: stored once
        await client.put_sample(rollout_sample(7))
        await client.put_sample(None)                       # the rollouter is done
        got = []
        while True:
            blob, _ = await client.get_sample()
            if blob is None:
                return got
            got.append(ray.cloudpickle.loads(blob).sample_id)
    resumed = asyncio.run(run_resumed())
    lineage = steps[0] + steps[1] + resumed                  # what the final weights trained
    assert Counter(lineage) == Counter(f"sample_0_{i}" for i in range(8))
    assert set(steps[2]) <= set(resumed)
    q = RolloutQueue.from_url(private_redis_url, fresh_name, create=False)
    stats = q.stats()
    assert stats.committed == 8 and stats.counters.get("restored") == 2 and stats.counters.get("checkpoint") == 2
    q.close()
    ray.kill(actor, no_restart=True)


class Killed(BaseException):
    """The process dies here: nothing after it runs."""


def die(*_: Any, **__: Any) -> Any:
    raise Killed


@pytest.mark.parametrize("window", ["submit-complete", "lease-commit"])
def test_killed_between_two_redis_calls_nothing_is_lost_or_handed_out_twice(
        private_redis_url: str, fresh_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        window: str) -> None:
    """submit-complete: put_sample dies after its submit (the group is ready, not leasable: the next
    instance completes it); lease-commit: get_sample dies after its lease (it comes back at its deadline)."""
    RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(batch_groups=None, lease_timeout_s=1.0)).close()
    cfg = verl_config(private_redis_url, fresh_name, tmp_path / "ckpt")
    first = mq.QueueMessageQueue(cfg, 100)
    asyncio.run(first.put_sample(b"one"))
    with monkeypatch.context() as m:
        if window == "submit-complete":
            m.setattr(first, "_settle", die)
            with pytest.raises(Killed):
                asyncio.run(first.put_sample(b"two"))
        else:
            from rollout_queue.api.lease import Lease
            m.setattr(Lease, "commit", die)
            with pytest.raises(Killed):
                asyncio.run(first.get_sample())
    second = mq.QueueMessageQueue(cfg, 100)
    if window == "lease-commit":
        asyncio.run(second.put_sample(b"two"))

    async def drain() -> list[bytes]:
        await second.put_sample(None)
        got = []
        while (item := await asyncio.wait_for(second.get_sample(), 60))[0] is not None:
            got.append(item[0])
        return got
    assert sorted(asyncio.run(drain())) == [b"one", b"two"]


def test_misconfigured_runs_fail_at_construction(private_redis_url: str, fresh_name: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg = verl_config(private_redis_url, fresh_name, tmp_path)
    del cfg.rollout_queue
    with pytest.raises(IntegrationConfigError, match=r"\+rollout_queue.url"):
        mq.QueueMessageQueue(cfg, 10)
    cfg = verl_config(private_redis_url, fresh_name, tmp_path)
    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(batch_groups=None))
    q.publish_version(1)
    with pytest.raises(IntegrationConfigError, match="queue of its own"):
        mq.QueueMessageQueue(cfg, 10)
    q.close()
    with pytest.raises(IntegrationConfigError, match="bytes"):
        asyncio.run(mq.QueueMessageQueue(verl_config(private_redis_url, fresh_name + "b", tmp_path), 10)
                    .put_sample({"not": "bytes"}))


def test_the_queue_may_come_from_the_projects_environment(private_redis_url: str, fresh_name: str,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """REDIS_URL / ROLLOUT_QUEUE name the queue when verl's config does not; the config wins over them."""
    monkeypatch.setenv("REDIS_URL", private_redis_url)
    monkeypatch.setenv("ROLLOUT_QUEUE", fresh_name)
    cfg = verl_config(private_redis_url, fresh_name, tmp_path)
    del cfg.rollout_queue
    queue = mq.open_queue(cfg, 10)
    assert queue.name == fresh_name
    queue.close()
    queue = mq.open_queue(verl_config(private_redis_url, fresh_name + "-config", tmp_path), 10)
    assert queue.name == fresh_name + "-config"
    queue.close()


@pytest.mark.parametrize(("handed", "resumed", "per_version", "step"), [
    (0, 0, 1, 1), (1, 0, 1, 1), (2, 0, 1, 2), (0, 3, 2, 7), (5, 3, 2, 9)])
def test_step_clock(handed: int, resumed: int, per_version: int, step: int) -> None:
    assert mq.StepClock(PER_STEP, per_version, resumed).step(handed) == step
