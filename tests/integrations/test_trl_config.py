"""QueueGRPOTrainer without workers: the settings it refuses (each would break exactly-once) and its
staleness correction (TRL's importance-sampling modes applied to the workers' behaviour logprobs)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from rollout_queue import QueueConfig, RolloutQueue  # noqa: E402
from rollout_queue.core.errors import IntegrationConfigError, InvalidInput  # noqa: E402
from rollout_queue.integrations.trl import QueueGRPOTrainer, worker_reward  # noqa: E402
from rollout_queue.ops.views import entry  # noqa: E402
from tests.integrations.helpers import committed_steps, fill  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture
def redis_url(private_redis_url: str) -> str:
    return private_redis_url


@pytest.fixture
def queue_name(fresh_name: str) -> str:
    return fresh_name


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollout_queue.workers.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def reward(completions: list[str], **_: Any) -> list[float]:
    return [0.0 for _ in completions]


def make(tiny: Path, tmp_path: Path, redis_url: str, queue_name: str, queue_config: QueueConfig | None = None,
         **config: Any) -> QueueGRPOTrainer:
    extra = {k: config.pop(k) for k in ("rollout_func", "eval_dataset", "callbacks", "feed", "wait_s",
                                        "publish_every", "stale_tokens") if k in config}
    settings = {"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 8, "beta": 0.0,
                "max_steps": 4, "save_steps": 2, **config}
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], **settings)
    queue = RolloutQueue.from_url(redis_url, queue_name, queue_config or QueueConfig(max_staleness=4))
    return QueueGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny), reward_funcs=[reward], args=args,
                            train_dataset=Dataset.from_list([{"prompt": f"q{i}"} for i in range(8)]),
                            processing_class=AutoTokenizer.from_pretrained(tiny), queue=queue, **extra)


@pytest.mark.parametrize("config, match", [
    ({"rollout_func": lambda prompts, trainer: {}}, "drop rollout_func"),
    ({"eval_strategy": "steps", "eval_steps": 1, "eval_dataset": Dataset.from_list([{"prompt": "e"}])},
     "evaluation during training"),
    ({"num_iterations": 2, "save_steps": 3}, "spans 2 optimizer steps"),
    # issue 29 item 18: 0.5 of 2 steps is a checkpoint at step 1, inside the first two-step lease
    ({"num_iterations": 2, "max_steps": 2, "save_steps": 0.5}, "spans 2 optimizer steps"),
    ({"steps_per_generation": 3, "gradient_accumulation_steps": 2, "per_device_train_batch_size": 4},
     "one must divide the other"),
    ({"loss_type": "vespo", "vllm_importance_sampling_mode": "token_truncate"}, "vespo"),
])
def test_settings_that_would_break_exactly_once_are_refused(tiny: Path, tmp_path: Path, redis_url: str,
                                                            queue_name: str, config: dict[str, Any],
                                                            match: str) -> None:
    with pytest.raises(IntegrationConfigError, match=match):
        make(tiny, tmp_path, redis_url, queue_name, **config)


@pytest.mark.parametrize("config, expected", [
    ({}, 2),                                                    # 8 rows / 4 generations, a version per step
    ({"publish_every": 3}, 6),                                  # three leases per version
    ({"num_iterations": 2, "save_steps": 4}, 2),                # a lease spans 2 steps, a version per lease
    ({"num_iterations": 2, "save_steps": 4, "publish_every": 3}, 6),  # published every lcm(3, 2) = 6 steps
])
def test_a_queue_left_to_the_trainer_gets_admission_control_from_it(tiny: Path, tmp_path: Path, redis_url: str,
                                                                    queue_name: str, config: dict[str, Any],
                                                                    expected: int) -> None:
    """Issue 30: QueueGRPOTrainer sizes batch_groups (the groups it commits per published version)
    where the queue's config left it unset, so the workers run at most max_staleness + 1 versions
    ahead; the resumed trainer, opening with the same config, adopts it (no ConfigMismatch)."""
    trainer = make(tiny, tmp_path, redis_url, queue_name, **config)
    assert trainer.queue.config.batch_groups == expected
    assert trainer.queue.stats().admission_batch == expected
    again = make(tiny, tmp_path, redis_url, queue_name, **{**config, "publish_every": 1})
    assert again.queue.config.batch_groups == expected  # derived once: a later trainer keeps it


@pytest.mark.parametrize("given", [None, 7], ids=["opt-out", "set"])
def test_the_users_batch_groups_is_kept(tiny: Path, tmp_path: Path, redis_url: str, queue_name: str,
                                        given: int | None) -> None:
    trainer = make(tiny, tmp_path, redis_url, queue_name, QueueConfig(max_staleness=4, batch_groups=given))
    assert trainer.queue.config.batch_groups == given and trainer.queue.stats().admission_batch == given


PROMPT = (5, 6, 7)
COMPLETIONS = [(8, 9, 10, 11), (12, 13, 14, 15), (16, 17, 18, 19), (20, 21, 22, 23)]


def serve(trainer: QueueGRPOTrainer, gap: float, *, segments: tuple[tuple[int, int], ...] = ((0, 0), (2, 1)),
          logprobs: bool = True) -> dict[str, Any]:
    """One group of four, completed by hand: each sample's first two tokens generated under version 0
    with behaviour logprobs ``gap`` nats below the current policy's, the last two under version 1 at
    the current policy's own. Then TRL's real generation-and-scoring step leases and scores it."""
    from rollout_queue import Sample, SourceGroup

    ids = torch.tensor([list(PROMPT) + list(c) for c in COMPLETIONS])
    with torch.no_grad():
        current, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), 4)
    behaviour = (current - torch.tensor([gap, gap, 0.0, 0.0])).clamp(max=0.0)
    q = trainer.queue
    q.submit([SourceGroup("q0", "q0", 4, {}, PROMPT)])
    w = q.worker("w")
    [r] = w.reserve(max_groups=1, block_ms=2000)
    w.complete(r.receipt, [Sample(i, c, tuple(behaviour[i].tolist()) if logprobs else (), reward=float(i), version=0,
                                  versions=(0, 1), segments=segments) for i, c in enumerate(COMPLETIONS)])
    trainer.model.train()
    return trainer._generate_and_score_completions([{"prompt": "q0"}] * 4)


def config(mode: str, clip_max: float = 3.0, **extra: Any) -> dict[str, Any]:
    return {"vllm_importance_sampling_mode": mode, "vllm_importance_sampling_clip_max": clip_max,
            "per_device_train_batch_size": 4, "feed": False, **extra}


@pytest.mark.parametrize("mode, clip_max, expect", [
    ("token_truncate", 3.0, 2.0),       # exp(log 2) = 2, within the bound: the weight itself
    ("token_truncate", 1.5, 1.5),       # truncated at the bound
    ("token_mask", 1.5, 0.0),           # outside the bound: masked
])
def test_the_workers_per_token_logprobs_reach_trls_own_importance_correction(
        tiny: Path, tmp_path: Path, redis_url: str, queue_name: str, mode: str, clip_max: float,
        expect: float) -> None:
    """Issue 30: TRL's own correction (its use_vllm path) computes the ratio of the current weights'
    logprobs to the workers' behaviour logprobs token by token: the tokens of the older segment get
    ``expect``, the others 1; the loss multiplies it in (TRL's compute_loss)."""
    trainer = make(tiny, tmp_path, redis_url, queue_name, **config(mode, clip_max))
    output = serve(trainer, math.log(2.0))
    ratio = output["importance_sampling_ratio"]
    assert ratio.shape == (4, 4) and "tool_mask" not in output
    assert torch.allclose(ratio, torch.tensor([[expect, expect, 1.0, 1.0]] * 4), atol=1e-3)
    assert output["advantages"].dim() == 1  # the advantages are TRL's own, not rescaled by the adapter
    metrics = trainer._metrics["train"]
    assert metrics["sampling/importance_sampling_ratio/max"][-1] == pytest.approx(max(expect, 1.0), abs=1e-3)
    assert metrics["queue/token_staleness_max"][-1] == 0.0 and metrics["queue/stale_tokens_masked"][-1] == 0.0
    # Issue 30: where the workers' tokens went (4 samples x 4 tokens generated, leased, not yet trained).
    assert (metrics["queue/tokens_generated"][-1], metrics["queue/tokens_trained"][-1]) == (16.0, 0.0)
    assert metrics["queue/tokens_discarded"][-1] == 0.0 and "queue/tokens_generated_per_trained" not in metrics
    # TRL's loss multiplies each token's by the ratio: with advantages to weigh, the ratio changes it.
    trainer.current_gradient_accumulation_steps = 1  # set by TRL's training loop, which is not running
    output["advantages"] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    with torch.no_grad():
        weighted = trainer.compute_loss(trainer.model, output)
        plain = trainer.compute_loss(trainer.model, {**output, "importance_sampling_ratio": torch.ones_like(ratio)})
    # dapo: -(sum of the first sample's token weights) / the generation batch's 16 tokens
    assert weighted.item() == pytest.approx(-(2 * expect + 2) / 16, abs=1e-3) and plain.item() == pytest.approx(-0.25)


def test_sequence_modes_weigh_whole_sequences(tiny: Path, tmp_path: Path, redis_url: str, queue_name: str) -> None:
    trainer = make(tiny, tmp_path, redis_url, queue_name, **config("sequence_truncate", 100.0))
    ratio = serve(trainer, math.log(2.0))["importance_sampling_ratio"]
    assert ratio.shape == (4, 1) and torch.allclose(ratio.squeeze(-1), torch.full((4,), 4.0), rtol=1e-3)


def test_on_policy_samples_are_not_reweighted(tiny: Path, tmp_path: Path, redis_url: str, queue_name: str) -> None:
    trainer = make(tiny, tmp_path, redis_url, queue_name, **config("token_truncate"))
    ratio = serve(trainer, 0.0)["importance_sampling_ratio"]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-3)


@pytest.mark.parametrize("stale_tokens", ["mask", "correct"])
def test_tokens_older_than_the_bound_are_masked_or_left_to_the_correction(
        tiny: Path, tmp_path: Path, redis_url: str, queue_name: str, stale_tokens: str) -> None:
    """The trainer is at version 5, the queue's bound 4: each sample's version-0 tokens are too old.
    Masked, they leave TRL's loss through its tool_mask (and its ratio); corrected, they stay, under
    TRL's ratio. Either way the version-1 tokens are trained as they are."""
    trainer = make(tiny, tmp_path, redis_url, queue_name, **config("token_truncate"), stale_tokens=stale_tokens)
    trainer.policy_version = 5
    output = serve(trainer, math.log(2.0))
    metrics = trainer._metrics["train"]
    assert metrics["queue/token_staleness_max"][-1] == 5.0 and metrics["queue/token_staleness_mean"][-1] == 4.5
    if stale_tokens == "mask":
        assert output["tool_mask"].tolist() == [[0, 0, 1, 1]] * 4
        assert torch.allclose(output["importance_sampling_ratio"], torch.ones(4, 4), atol=1e-3)
        assert metrics["queue/stale_tokens_masked"][-1] == 0.5 and metrics["queue/stale_tokens_corrected"][-1] == 0
    else:
        assert "tool_mask" not in output
        assert torch.allclose(output["importance_sampling_ratio"], torch.tensor([[2.0, 2.0, 1.0, 1.0]] * 4), atol=1e-3)
        assert metrics["queue/stale_tokens_corrected"][-1] == 0.5 and metrics["queue/stale_tokens_masked"][-1] == 0


def test_a_stale_token_without_a_logprob_is_masked_even_when_correction_is_asked(
        tiny: Path, tmp_path: Path, redis_url: str, queue_name: str) -> None:
    trainer = make(tiny, tmp_path, redis_url, queue_name, **config("token_truncate"), stale_tokens="correct")
    trainer.policy_version = 5
    output = serve(trainer, math.log(2.0), logprobs=False)
    assert output["tool_mask"].tolist() == [[0, 0, 1, 1]] * 4
    assert trainer._metrics["train"]["queue/stale_tokens_masked"][-1] == 0.5


@pytest.mark.parametrize("config, match", [
    ({"use_vllm": True}, "use_vllm=False"),
    ({"stale_tokens": "drop"}, "stale_tokens must be one of mask, correct"),
])
def test_settings_the_queue_cannot_serve_are_refused(tiny: Path, tmp_path: Path, redis_url: str, queue_name: str,
                                                     config: dict[str, Any], match: str) -> None:
    with pytest.raises((IntegrationConfigError, InvalidInput), match=match):
        make(tiny, tmp_path, redis_url, queue_name, **config)


def test_worker_reward_passes_the_workers_rewards_through() -> None:
    assert worker_reward(["a", "b"], worker_reward=[0.5, None]) == [0.5, None]
    with pytest.raises(InvalidInput):
        worker_reward(["a"])


def test_trajectories_reach_trls_tool_mask_so_observations_are_never_trained(tiny: Path, tmp_path: Path,
                                                                             redis_url: str, queue_name: str) -> None:
    """TRL's own generation path (``_generate``: rollout_func, then its env_mask handling) turns the
    leased trajectories' loss masks into its ``tool_mask``, which its loss multiplies in."""
    from rollout_queue import CompletedGroup, Sample, SourceGroup, Turn

    trainer = make(tiny, tmp_path, redis_url, queue_name)
    samples = [Sample(i, (10, 11, 12, 13, 14), (-0.5, -0.5, 0.0, 0.0, -0.25), reward=float(i), version=0,
                      turns=(Turn("model", 2, 0), Turn("observation", 2), Turn("model", 1, 0))) for i in range(4)]
    trainer._serving = [CompletedGroup("1-0", SourceGroup("t", "q0", 4, {}, (5, 6, 7)), samples, 1, 0)]
    trainer.model.train()
    prompt_ids, completion_ids, tool_mask, *_ = trainer._generate(["q0"] * 4)
    assert completion_ids == [[10, 11, 12, 13, 14]] * 4 and prompt_ids == [[5, 6, 7]] * 4
    assert tool_mask == [[1, 1, 0, 0, 1]] * 4


class _CrashAt(TrainerCallback):  # type: ignore[misc]
    """Raises at the end of optimizer step ``step``: a trainer that crashes mid-run."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
        if state.global_step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


def test_a_run_resumed_after_crashing_before_its_first_checkpoint_trains_its_commits_again(
        tiny: Path, tmp_path: Path, redis_url: str, queue_name: str) -> None:
    """Issue 29 item 17: TRL resumes a run that crashed before its first checkpoint from scratch
    (global_step 0); the groups that run committed must be requeued (restore(0)), else they are
    never trained by the weights that go on."""
    first = make(tiny, tmp_path, redis_url, queue_name, max_steps=3, save_steps=10, callbacks=[_CrashAt(2)],
                 feed=False)
    fill(first.queue, 6, n=4, tokenized=True)
    with pytest.raises(RuntimeError, match="crash at step 2"):
        first.train()
    assert first.queue.stats().committed == 2  # step 1's lease: committed at step 1, no checkpoint covers it
    assert not list((tmp_path / "out").glob("checkpoint-*"))
    # Item 12: the exception rolled step 2's lease back as an errored rollback, counted per group.
    step2 = first.queue.run(entry(first.queue.keys, _marked(first.queue)[0]))
    assert [(a.terminal, a.reason) for a in step2.history][-1:] == [("trainer_error", "RuntimeError: crash at step 2")]
    assert len(_marked(first.queue)) == 2
    second = make(tiny, tmp_path, redis_url, queue_name, max_steps=1, save_steps=10, feed=False)
    second.train()  # --resume finds no checkpoint: a fresh start on the same queue
    assert [step for step, _ in committed_steps(second.queue)] == [1, 1]
    s = second.queue.stats()
    assert s.committed == 2, "the crashed run's step-1 groups were not requeued at the fresh start"
    assert s.counters.get("restored") == 2


def test_a_save_steps_ratio_of_an_epoch_based_run_is_checked_before_the_first_step(
        tiny: Path, tmp_path: Path, redis_url: str, queue_name: str) -> None:
    """Issue 29 item 18: without max_steps, TRL resolves a save_steps ratio only at train begin; a
    checkpoint inside a two-step lease is refused there, before any step or checkpoint."""
    trainer = make(tiny, tmp_path, redis_url, queue_name, num_iterations=2, max_steps=-1, num_train_epochs=3,
                   save_steps=0.34, feed=False, wait_s=2.0)
    with pytest.raises(IntegrationConfigError, match="spans 2 optimizer steps"):
        trainer.train()
    assert trainer.state.global_step == 0 and not list((tmp_path / "out").glob("checkpoint-*"))
    assert committed_steps(trainer.queue) == []


def _marked(q: RolloutQueue) -> list[str]:
    """The entry IDs a trainer error marked (rollout:{q}:suspects), read through the queue's client."""
    return sorted(m.decode() for m in q.client.zrange(q.keys["suspects"], 0, -1))


def test_trl_vllm_version_warning_is_replaced_by_one_line_of_ours() -> None:
    """Issue 32, item 3: `make setup` puts vLLM 0.32 (the workers') beside TRL 1.16, which names
    0.22-0.31 and warned five times per start. The adapter silences that warning only (TRL never runs
    vLLM under it) and says why in one line; a Python run with every warning shown proves it."""
    import subprocess
    import sys
    from importlib import metadata

    code = ("import warnings; warnings.simplefilter('always')\n"
            "import rollout_queue.integrations.trl as t\n"  # imports TRL's GRPOTrainer: its vLLM probes run
            "import trl.generation.vllm_client, trl.experimental.async_grpo\n"
            "warnings.warn('another warning still shows')\n"
            "print(t.vllm_note())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "TRL currently supports vLLM" not in done.stderr and "another warning still shows" in done.stderr
    dists = metadata.packages_distributions().get("vllm")
    version = metadata.version(dists[0]) if dists else None
    if version is None or (0, 22) <= tuple(int(x) for x in version.split(".")[:2]) <= (0, 31):
        assert done.stdout.strip() == "None"  # nothing silenced, nothing to say
        return
    assert f"vLLM {version} is installed beside TRL" in done.stdout and "harmless" in done.stdout
