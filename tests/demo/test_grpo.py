"""The GRPO trainer process (``rollout_queue.demo.grpo``, also ``rollout-queue train``) against a real
queue, with a worker played by the test: it trains, publishes a version per step, checkpoints model
and optimizer (no pickle), and a trainer restarted from its checkpoint resumes there and requeues
exactly the groups committed after it."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from rollout_queue import QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.core.errors import QueueNotFound

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from rollout_queue.demo.grpo import GrpoSettings, GrpoTrainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollout_queue.workers.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("grpo") / "tiny")


def play_worker(q: RolloutQueue, stop: threading.Event) -> None:
    """Completes every reservation with random tokens, logprobs and rewards (the version it was given)."""
    w, rng = q.worker("test-worker"), random.Random(0)
    while not stop.is_set():
        for r in w.reserve(max_groups=4, block_ms=100):
            samples = []
            for slot in range(r.group.n):
                ids = tuple(rng.randrange(3, 400) for _ in range(4))
                samples.append(Sample(slot, ids, tuple(-rng.random() * 5 for _ in ids), reward=rng.random(),
                                      version=r.version))
            w.complete(r.receipt, samples)


def test_train_checkpoint_and_resume_from_the_checkpoint(redis_url: str, queue_name: str, model_dir: Path,
                                                         tmp_path: Path) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=2, batch_groups=2))
    q.submit([SourceGroup(f"g{i}", f"prompt {i}", 2) for i in range(8)])
    stop = threading.Event()
    worker = threading.Thread(target=play_worker, args=(q, stop), daemon=True)
    worker.start()
    try:
        settings = GrpoSettings(steps=3, batch_groups=2, checkpoint_every=2, lr=1e-3)
        first = GrpoTrainer(q, model_dir, tmp_path / "weights", settings, checkpoint_dir=tmp_path / "ckpt")
        save = first._save

        def crash_at_step_3(step: int) -> None:  # the trainer dies while writing checkpoint 3
            if step == 3:
                raise KeyboardInterrupt("killed mid-checkpoint")
            save(step)

        first._save = crash_at_step_3  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            first.run()
        records = first.state.records
        assert [r.step for r in records] == [1, 2] and q.version == 3  # step 3 was committed and published
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-2"]
        assert not list((tmp_path / "ckpt").rglob("*.pt")) and not list((tmp_path / "ckpt").rglob("*.pkl"))
        stop.set()
        worker.join(5)
        resumed = GrpoTrainer(q, model_dir, tmp_path / "weights", GrpoSettings(steps=4, batch_groups=2),
                              checkpoint_dir=tmp_path / "ckpt")
        assert resumed.step == 2 and resumed.state.resumed_from == 2
        assert q.stats().ready == 2  # step 3's two groups are back, to be trained again from step 2's weights
        saved = first.optimizer.state_dict()["state"]
        loaded = resumed.optimizer.state_dict()["state"]
        assert set(saved) == set(loaded)
        assert float(loaded[0]["step"]) == 2.0  # the optimizer is back at step 2, as the checkpoint saw it
        # Training goes on from step 3 under a new policy version (4): versions never go back.
        stop.clear()
        worker = threading.Thread(target=play_worker, args=(q, stop), daemon=True)
        worker.start()
        assert [r.step for r in resumed.run()] == [3, 4] and q.version == 5
        assert q.worker("probe").heartbeat().weights_uri.endswith("v0000005")
    finally:
        stop.set()
        worker.join(5)
        q.close()


def test_the_settings_defaults() -> None:
    s = GrpoSettings()
    assert (s.device, s.batch_groups, s.checkpoint_every) == ("cpu", 8, 20)
    assert isinstance(s.lease_timeout_s, float)




def test_the_train_command_runs_the_trainer(redis_url: str, queue_name: str, model_dir: Path, tmp_path: Path) -> None:
    from rollout_queue.cli import main

    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=2, batch_groups=2,
                                                                 max_completed_groups=256, lease_timeout_s=600.0))
    q.submit([SourceGroup(f"g{i}", f"prompt {i}", 2) for i in range(4)])
    stop = threading.Event()
    worker = threading.Thread(target=play_worker, args=(q, stop), daemon=True)
    worker.start()
    try:
        code = main(["--url", redis_url, "--queue", queue_name, "train", "--model", str(model_dir),
                     "--weights-dir", str(tmp_path / "w"), "--steps", "2", "--batch-groups", "2", "--threads", "1"])
    finally:
        stop.set()
        worker.join(5)
    assert code == 0 and q.version == 2 and q.stats().committed == 4
    q.close()


@pytest.mark.parametrize("flags, expected", [((), 2), (("--no-admission-control",), None)],
                         ids=["admission", "opt-out"])
def test_the_train_command_creates_its_queue_with_admission_control(redis_url: str, queue_name: str,
                                                                    model_dir: Path, tmp_path: Path,
                                                                    flags: tuple[str, ...],
                                                                    expected: int | None) -> None:
    """Issue 30: the trainer's queue admits at most max_staleness + 1 steps of groups ahead of training
    (batch_groups = its batch), unless --no-admission-control."""
    from rollout_queue.cli import main

    code = main(["--url", redis_url, "--queue", queue_name, "train", "--model", str(model_dir),
                 "--weights-dir", str(tmp_path / "w"), "--steps", "0", "--batch-groups", "2", "--threads", "1",
                 *flags])
    q = RolloutQueue.from_url(redis_url, queue_name, create=False)
    assert code == 0 and q.config.batch_groups == expected
    q.close()


def test_the_train_command_sets_the_staleness_mode(redis_url: str, queue_name: str, model_dir: Path,
                                                  tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30 section 2: the trainer's queue takes the staleness mode and the fairness bound it is given;
    pace without admission control is refused before any queue exists, naming the setting."""
    from rollout_queue.cli import main

    base = ["--url", redis_url, "--queue", queue_name, "train", "--model", str(model_dir),
            "--weights-dir", str(tmp_path / "w"), "--steps", "0", "--batch-groups", "2", "--threads", "1"]
    assert main([*base, "--staleness-mode", "pace", "--no-admission-control"]) != 0
    assert "batch_groups" in capsys.readouterr().err
    with pytest.raises(QueueNotFound):
        RolloutQueue.from_url(redis_url, queue_name, create=False)
    assert main([*base, "--staleness-mode", "continue", "--max-stale-evictions", "3"]) == 0
    q = RolloutQueue.from_url(redis_url, queue_name, create=False)
    assert (q.config.staleness_mode, q.config.max_stale_evictions) == ("continue", 3)
    q.close()
