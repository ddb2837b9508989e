"""Trainer helpers on hand-made leases (no Redis): GRPO advantages, the batch layout (padding,
masks, positions), behaviour logprobs, staleness, the loss, commit/rollback around a step; then
publishing weights (atomic folders, recorded through a hold) against a real Redis."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest

from rollout_queue import CompletedGroup, InvalidInput, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.rl.trainer import grpo_advantages, training_step

torch = pytest.importorskip("torch")

from rollout_queue.rl.trainer import grpo_loss, lease_batch, publish_weights, response_logprobs, save_weights


def group(entry_id: str, prompt_ids: list[int], samples: list[Sample], min_version: int = 0) -> CompletedGroup:
    return CompletedGroup(entry_id, SourceGroup(f"s-{entry_id}", "p", len(samples), {}, tuple(prompt_ids)),
                          tuple(samples), attempt=1, min_version=min_version)


def sample(slot: int, ids: list[int], reward: float, version: int = 0, logprobs: list[float] | None = None) -> Sample:
    lps = logprobs if logprobs is not None else [-0.5 - 0.1 * i for i in range(len(ids))]
    return Sample(slot, tuple(ids), tuple(lps), reward=reward, version=version)


class FakeLease:
    """What the helpers read of a Lease, plus a record of how it was settled."""

    def __init__(self, groups: list[CompletedGroup], version: int = 0) -> None:
        self.groups, self.version, self.calls = groups, version, []

    def commit(self, step: int | None = None) -> str:
        self.calls.append(("commit", step))
        return "1-0"

    def rollback(self, reason: str | None = None) -> int:
        self.calls.append(("rollback", reason))
        return len(self.groups)


# -- GRPO advantages --------------------------------------------------------------------------------


def test_advantages_are_normalised_within_each_group() -> None:
    (a, b) = grpo_advantages([[1.0, 0.0, 0.0, 1.0], [0.2, 0.4]])
    assert a == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)  # mean 0.5, population std 0.5
    assert b == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert sum(a) == pytest.approx(0.0)


def test_a_group_with_equal_rewards_teaches_nothing_and_one_sample_is_no_baseline() -> None:
    assert grpo_advantages([[0.7, 0.7, 0.7], [3.0], []]) == [[0.0, 0.0, 0.0], [0.0], []]


def test_without_std_scaling_only_the_mean_is_subtracted() -> None:
    assert grpo_advantages([[1.0, 0.0, 0.0, 3.0]], scale_by_std=False) == [[0.0, -1.0, -1.0, 2.0]]


# -- the batch layout -------------------------------------------------------------------------------


def two_groups() -> FakeLease:
    g1 = group("1-0", [5, 6, 7], [sample(0, [10, 11], 1.0, version=3), sample(1, [12], 0.0, version=2)])
    g2 = group("2-0", [8], [sample(0, [13, 14, 15], 0.5, version=4), sample(1, [16, 17, 18], 0.5, version=4),
                            sample(1, [], 0.5, version=4)])
    return FakeLease([g1, g2], version=4)


def test_prompts_are_left_padded_and_responses_right_padded() -> None:
    b = lease_batch(two_groups(), pad_token_id=0)
    assert b.prompt_width == 3 and b.num_samples == 5
    assert b.input_ids.tolist() == [
        [5, 6, 7, 10, 11, 0],
        [5, 6, 7, 12, 0, 0],
        [0, 0, 8, 13, 14, 15],
        [0, 0, 8, 16, 17, 18],
        [0, 0, 8, 0, 0, 0],
    ]
    assert b.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 1, 0, 0, 0],
    ]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [0, 0, 0]]
    # Positions count from each row's first real token, as the engine (no padding) saw them.
    assert b.position_ids[2].tolist() == [0, 0, 0, 1, 2, 3] and b.position_ids[0].tolist()[:5] == [0, 1, 2, 3, 4]
    assert b.response_ids.tolist()[0] == [10, 11, 0] and b.num_response_tokens == 9


def test_rewards_advantages_staleness_and_groups_per_sample() -> None:
    b = lease_batch(two_groups())
    assert b.rewards.tolist() == pytest.approx([1.0, 0.0, 0.5, 0.5, 0.5])
    assert b.advantages.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0, 0.0], abs=1e-5)
    assert b.staleness.tolist() == [1, 2, 0, 0, 0]  # lease version 4 minus each sample's version
    assert b.group_index.tolist() == [0, 0, 1, 1, 1]
    assert b.entry_ids == ("1-0", "2-0") and b.version == 4
    assert lease_batch(two_groups(), version=6).staleness.tolist() == [3, 4, 2, 2, 2]
    assert b.version_span.tolist() == [0, 0, 0, 0, 0]  # each generated under one version


def test_version_span_counts_the_updates_a_sample_ran_across() -> None:
    spanning = [Sample(0, (5, 6), (-0.1, -0.2), reward=1.0, version=2, versions=(2, 3, 5)),
                Sample(1, (7,), (-0.3,), reward=0.0, version=4, versions=(4,))]
    b = lease_batch(FakeLease([group("1-0", [1], spanning)], version=5))
    assert b.version_span.tolist() == [3, 0] and b.staleness.tolist() == [3, 1]


def test_behaviour_logprobs_sit_under_their_tokens_and_are_zero_on_padding() -> None:
    b = lease_batch(two_groups())
    assert b.behaviour_logprobs is not None
    assert b.behaviour_logprobs[0].tolist() == pytest.approx([-0.5, -0.6, 0.0])
    assert b.behaviour_logprobs[1].tolist() == pytest.approx([-0.5, 0.0, 0.0])
    no_logprobs = FakeLease([group("1-0", [1], [Sample(0, (2, 3), (), reward=1.0), Sample(1, (4,), (), reward=0.0)])])
    assert lease_batch(no_logprobs).behaviour_logprobs is None


def test_prompts_without_token_ids_are_tokenized_with_the_given_tokenizer() -> None:
    g = CompletedGroup("1-0", SourceGroup("s", "abc", 1), (sample(0, [9], 1.0),), 1, 0)

    class Tok:
        def encode(self, text: str) -> list[int]:
            return [ord(c) - 96 for c in text]

    assert lease_batch([g], tokenizer=Tok()).input_ids.tolist() == [[1, 2, 3, 9]]
    assert lease_batch([g], tokenizer=lambda text: [7]).input_ids.tolist() == [[7, 9]]
    with pytest.raises(InvalidInput, match="tokenizer"):
        lease_batch([g])


def test_a_sample_without_a_reward_is_refused() -> None:
    g = group("1-0", [1], [Sample(0, (2,), (-0.1,), reward=None)])
    with pytest.raises(InvalidInput, match="reward"):
        lease_batch([g])


# -- logprobs and the loss ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from rollout_queue.workers.tiny_model import build_tiny_model

    folder = build_tiny_model(tmp_path_factory.mktemp("trainer") / "tiny")
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_padded_batch_logprobs_equal_each_sequence_run_alone(tiny: Any) -> None:
    lease = two_groups()
    b = lease_batch(lease)
    with torch.no_grad():
        got = response_logprobs(tiny, b)
        for row, (prompt, resp) in enumerate([([5, 6, 7], [10, 11]), ([5, 6, 7], [12]), ([8], [13, 14, 15])]):
            ids = torch.tensor([prompt + resp])
            logits = tiny(input_ids=ids).logits[0].float()
            want = torch.log_softmax(logits, -1)[len(prompt) - 1:-1].gather(-1, torch.tensor(resp)[:, None])[:, 0]
            assert got[row, :len(resp)].tolist() == pytest.approx(want.tolist(), abs=1e-4)
            assert got[row, len(resp):].abs().sum().item() == 0.0


def test_on_policy_loss_is_the_token_mean_policy_gradient() -> None:
    b = lease_batch(two_groups())
    logprobs = b.behaviour_logprobs.clone().requires_grad_(True)  # type: ignore[union-attr]
    loss, metrics = grpo_loss(logprobs, b)
    # ratio 1 everywhere: loss = -sum(A * mask) / tokens, gradient = -A / tokens on each token
    assert loss.item() == pytest.approx(-(1.0 * 2 + -1.0 * 1) / 9, abs=1e-5)
    loss.backward()
    assert logprobs.grad[0, :2].tolist() == pytest.approx([-1 / 9, -1 / 9], abs=1e-5)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_fraction"] == 0.0


def test_stale_samples_keep_a_truncated_importance_weighted_gradient() -> None:
    b = lease_batch(two_groups())
    assert b.behaviour_logprobs is not None
    # The current policy gives the first sample's tokens 3x the behaviour probability.
    current = (b.behaviour_logprobs + math.log(3.0) * b.response_mask).requires_grad_(True)
    loss, metrics = grpo_loss(current, b, max_importance_weight=2.0)
    loss.backward()
    assert current.grad[0, :2].tolist() == pytest.approx([-2.0 / 9, -2.0 / 9], abs=1e-5)  # weight 3, truncated to 2
    assert metrics["clip_fraction"] > 0
    classic = (b.behaviour_logprobs + math.log(3.0) * b.response_mask).requires_grad_(True)
    loss, _ = grpo_loss(classic, b, decoupled=False)
    loss.backward()
    assert classic.grad[0, :2].tolist() == [0.0, 0.0]  # PPO clipping against the behaviour policy drops them


# -- per-token versions: importance weights and staleness token by token (issue 30) ---------------


def spanning_lease() -> FakeLease:
    """Two samples at lease version 5: the first generated under versions 1 then 5 (an update landed
    after its first token), the second under 5 alone. Rewards 1 and 0: advantages +1 and -1."""
    a = Sample(0, (10, 11, 12), (-1.0, -0.5, -2.0), reward=1.0, version=1, versions=(1, 5), segments=((0, 1), (1, 5)))
    b = Sample(1, (13, 14), (-0.25, -1.5), reward=0.0, version=5)
    return FakeLease([group("1-0", [5, 6], [a, b])], version=5)


def test_each_response_token_carries_its_own_version_and_staleness() -> None:
    b = lease_batch(spanning_lease())
    assert b.token_versions is not None
    assert b.token_versions.tolist() == [[1, 5, 5], [5, 5, -1]]  # -1 on padding
    assert b.token_staleness.tolist() == [[4, 0, 0], [0, 0, 0]]
    assert b.staleness.tolist() == [4, 0]  # per sample: its oldest token's
    assert lease_batch(spanning_lease(), version=7).token_staleness.tolist() == [[6, 2, 2], [2, 2, 0]]
    assert b.max_staleness is None  # groups without their queue: no bound known


#: log(current / behaviour) per response token: the current policy moved away from the workers'
DELTAS = [[math.log(3.0), 0.0, math.log(0.25)], [math.log(4.0), 0.0, 0.0]]


def _hand_loss(b: Any, weights: list[list[float]], trained: list[list[int]]) -> tuple[float, list[list[float]]]:
    """The decoupled loss at ratio 1 (the current policy is the anchor), by hand: -sum(A * w) over the
    trained tokens / their count, and its gradient -A * w / count on each trained token."""
    adv = b.advantages.tolist()
    count = sum(map(sum, trained))
    grad = [[-adv[i] * w * t / count for w, t in zip(weights[i], trained[i])] for i in range(len(weights))]
    return sum(map(sum, grad)), grad


@pytest.mark.parametrize("mode, weights", [
    # per token: 3 truncated to 2, 0.25 raised to 0.5; or those outside [0.5, 2] given weight 0
    ("token_truncate", [[2.0, 1.0, 0.5], [2.0, 1.0]]),
    ("token_mask", [[0.0, 1.0, 0.0], [0.0, 1.0]]),
    # per sequence: exp(sum of its log-ratios), 0.75 and 4 (truncated to 2 / masked)
    ("sequence_truncate", [[0.75] * 3, [2.0] * 2]),
    ("sequence_mask", [[0.75] * 3, [0.0] * 2]),
])
def test_importance_weights_per_token_or_sequence_equal_a_hand_computation(mode: str,
                                                                           weights: list[list[float]]) -> None:
    b = lease_batch(spanning_lease())
    assert b.behaviour_logprobs is not None
    current = (b.behaviour_logprobs + torch.tensor(DELTAS) * b.response_mask).requires_grad_(True)
    loss, metrics = grpo_loss(current, b, importance_sampling_mode=mode, min_importance_weight=0.5,
                              max_importance_weight=2.0)
    want, grad = _hand_loss(b, weights, [[1, 1, 1], [1, 1]])
    assert loss.item() == pytest.approx(want, abs=1e-5)
    loss.backward()
    assert current.grad[0].tolist() == pytest.approx(grad[0], abs=1e-5)
    assert current.grad[1, :2].tolist() == pytest.approx(grad[1], abs=1e-5)
    assert metrics["weight_mean"] == pytest.approx(sum(map(sum, weights)) / 5, abs=1e-5)
    assert metrics["ratio_mean"] == pytest.approx((3 + 1 + 0.25 + 4 + 1) / 5, abs=1e-5)
    assert metrics["masked_fraction"] == pytest.approx(sum(w == 0 for ws in weights for w in ws) / 5)


def test_a_token_older_than_the_bound_is_masked_not_trained_as_on_policy() -> None:
    """Token 0 of the first sample is 4 versions old, the bound is 2: masked, it leaves the loss and
    its token count, and the first sample's sequence ratio is its other tokens' (0.25 -> 0.5)."""
    b = lease_batch(spanning_lease())
    current = (b.behaviour_logprobs + torch.tensor(DELTAS) * b.response_mask).requires_grad_(True)
    loss, metrics = grpo_loss(current, b, max_staleness=2, importance_sampling_mode="sequence_truncate",
                              min_importance_weight=0.5, stale_tokens="mask")
    want, grad = _hand_loss(b, [[0.0, 0.5, 0.5], [2.0, 2.0]], [[0, 1, 1], [1, 1]])
    assert loss.item() == pytest.approx(want, abs=1e-5)
    loss.backward()
    assert current.grad[0].tolist() == pytest.approx(grad[0], abs=1e-5) and current.grad[0, 0].item() == 0.0
    assert metrics["stale_masked_fraction"] == pytest.approx(1 / 5) and metrics["stale_corrected_fraction"] == 0.0
    assert metrics["token_staleness_max"] == 4.0
    # Corrected instead: the old token stays, weighted like every token (3 truncated to 2).
    loss, metrics = grpo_loss(current, b, max_staleness=2, stale_tokens="correct")
    assert loss.item() == pytest.approx(_hand_loss(b, [[2.0, 1.0, 0.25], [2.0, 1.0]], [[1, 1, 1], [1, 1]])[0],
                                        abs=1e-5)
    assert metrics["stale_corrected_fraction"] == pytest.approx(1 / 5) and metrics["stale_masked_fraction"] == 0.0
    # Within the bound nothing is masked: the default bound is the batch's (none known here).
    assert grpo_loss(current, b, max_staleness=4)[1]["stale_masked_fraction"] == 0.0
    assert grpo_loss(current, b)[1]["stale_masked_fraction"] == 0.0


def test_a_minus_infinity_logprob_on_a_masked_token_leaves_the_loss_finite() -> None:
    a = Sample(0, (10, 11, 12), (-math.inf, -0.5, -2.0), reward=1.0, version=1, versions=(1, 5),
               segments=((0, 1), (1, 5)))
    b = lease_batch(FakeLease([group("1-0", [5], [a, Sample(1, (13,), (-1.0,), reward=0.0, version=5)])], version=5))
    for decoupled in (True, False):
        current = torch.full((2, 3), -1.0, requires_grad=True)
        loss, metrics = grpo_loss(current, b, max_staleness=2, decoupled=decoupled,
                                  importance_sampling_mode="sequence_mask")
        loss.backward()
        assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values()), metrics
        assert torch.isfinite(current.grad).all() and current.grad[0, 0].item() == 0.0


def test_without_behaviour_logprobs_a_stale_token_cannot_be_corrected_so_it_is_masked() -> None:
    a = Sample(0, (10, 11), (), reward=1.0, version=1, versions=(1, 5), segments=((0, 1), (1, 5)))
    b = lease_batch(FakeLease([group("1-0", [5], [a, Sample(1, (12, 13), (), reward=0.0, version=5)])], version=5))
    assert b.behaviour_logprobs is None
    logprobs = torch.full((2, 2), -1.0, requires_grad=True)
    loss, metrics = grpo_loss(logprobs, b, max_staleness=0, stale_tokens="correct")
    loss.backward()
    assert logprobs.grad[0, 0].item() == 0.0 and logprobs.grad[0, 1].item() != 0.0
    assert metrics["stale_masked_fraction"] == pytest.approx(1 / 4)


def test_bad_importance_settings_are_refused() -> None:
    b = lease_batch(spanning_lease())
    for kwargs in ({"importance_sampling_mode": "token"}, {"min_importance_weight": 3.0},
                   {"max_importance_weight": -1.0}, {"stale_tokens": "drop"}, {"max_staleness": -1},
                   {"max_importance_weight": float("nan")}):
        with pytest.raises(InvalidInput):
            grpo_loss(b.behaviour_logprobs, b, **kwargs)  # type: ignore[arg-type]


def test_a_leased_batch_takes_its_bound_from_the_queue(redis_url: str, queue_name: str) -> None:
    from tests.integrations.helpers import fill

    for bound, expect in ((3, 3), (None, 0)):  # None: strictly on-policy, bound 0
        q = RolloutQueue.from_url(redis_url, f"{queue_name}-{expect}", QueueConfig(max_staleness=bound))
        fill(q, 1, tokenized=True)
        lease = q.lease(groups=1)
        assert lease is not None
        b = lease_batch(lease)
        assert b.max_staleness == expect and b.token_versions.tolist() == [[0, 0], [0, 0]]
        assert lease_batch(lease, max_staleness=7).max_staleness == 7
        lease.rollback()
        q.close()


# -- commit after the step, rollback on any error ---------------------------------------------------


def test_training_step_commits_with_the_step_after_the_block() -> None:
    lease = FakeLease([])
    with training_step(lease, step=7) as got:  # type: ignore[arg-type]
        assert got is lease and lease.calls == []
    assert lease.calls == [("commit", 7)]


def test_training_step_rolls_back_on_any_error_and_reraises() -> None:
    """An error the data may have caused is an errored rollback (its reason: counted, DESIGN rule 4);
    an interrupt or exit is the trainer stopping: plain."""
    for error, reason in ((RuntimeError("nan loss"), "RuntimeError: nan loss"), (KeyboardInterrupt(), None),
                          (SystemExit(2), None)):
        lease = FakeLease([])
        with pytest.raises(type(error)):
            with training_step(lease, step=1):  # type: ignore[arg-type]
                raise error
        assert lease.calls == [("rollback", reason)]
    with pytest.raises(ValueError, match="no lease"):
        with training_step(None):
            pass


def test_a_group_that_breaks_every_training_step_is_dead_lettered_not_retried_for_ever(
        redis_url: str, queue_name: str) -> None:
    """Issue 29 item 12 through training_step: a group whose data makes the step raise comes back
    counted each time and is dead-lettered with the step's error after max_attempts; the groups
    beside it are trained."""
    from tests.integrations.helpers import fill

    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=2))
    fill(q, 12)
    poison = "s5"
    step = 0
    while (lease := q.lease(groups=2)) is not None:
        step += 1
        try:
            with training_step(lease, step=step):
                if any(g.group.source_id == poison for g in lease.groups):
                    raise ValueError("reward is nan")
        except ValueError:
            pass
    [letter] = q.dead_letters()
    assert letter.source_id == poison and letter.reason == "trainer_error: ValueError: reward is nan"
    s = q.stats()
    assert s.dead == 1 and s.committed + s.completed == 11 and s.completed < 2


# -- weights: atomic folders, recorded through a hold --------------------------------------------------


class Partial(torch.nn.Module):
    """save_pretrained writes one file, then fails: a crash in the middle of a save."""

    def save_pretrained(self, folder: Path, **_: Any) -> None:
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full")


def test_save_weights_is_all_or_nothing(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    target = save_weights(model, tmp_path / "v1")
    assert sorted(os.listdir(target)) == ["model.safetensors"] and oct(target.stat().st_mode)[-3:] == "755"
    with pytest.raises(OSError, match="disk full"):
        save_weights(Partial(), tmp_path / "v2")
    assert sorted(os.listdir(tmp_path)) == ["v1"]  # no v2, no staging folder left behind
    with pytest.raises(FileExistsError):
        save_weights(model, tmp_path / "v1")


def test_publish_weights_records_the_version_through_a_hold(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=2))
    model = torch.nn.Linear(3, 2)
    uris = [publish_weights(q, model, v, tmp_path / "weights", keep=2) for v in (1, 2, 3)]
    assert q.version == 3
    beat = q.worker("w").heartbeat()
    assert beat.weights_uri == uris[-1] and not beat.held  # the hold is released
    assert q.stats().active_holds == 0
    assert sorted(os.listdir(tmp_path / "weights")) == ["v0000002", "v0000003"]  # only the newest `keep`
    from safetensors.torch import load_file

    assert torch.equal(load_file(os.path.join(uris[-1], "model.safetensors"))["weight"], model.weight.detach())
    q.close()


def test_a_version_is_never_published_over_another_folder(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    from rollout_queue import VersionRegression

    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_staleness=2))
    model = torch.nn.Linear(3, 2)
    (tmp_path / "weights" / "v0000001").mkdir(parents=True)  # left by a publish that died before recording
    uri = publish_weights(q, model, 1, tmp_path / "weights")
    assert Path(uri).name.startswith("v0000001-") and q.version == 1  # fresh folder, the stale one untouched
    with pytest.raises(VersionRegression):  # version 1 is recorded with other weights: pick a new version
        publish_weights(q, model, 1, tmp_path / "weights")
    q.close()


def test_only_errors_the_data_may_cause_count() -> None:
    """error_reason: errors about the queue (a lost lease, Redis, a refused checkpoint, starvation, a
    setting) and a stopping trainer roll back plain; anything else, bad data included, counts."""
    from rollout_queue.api.lease import error_reason
    from rollout_queue.core.errors import (IntegrationConfigError, LeaseLost, LeasesOpen, OutcomeUnknown, RankFailed,
                                           StreamStarved)

    plain = [KeyboardInterrupt(), SystemExit(1), GeneratorExit(), LeaseLost("L", "expired"), OutcomeUnknown("down"),
             LeasesOpen(3, 2), StreamStarved("q", 2, 1.0, None), RankFailed("a rank died"),
             IntegrationConfigError("checkpoint with a lease open")]
    assert [error_reason(e) for e in plain] == [None] * len(plain)
    assert error_reason(InvalidInput("group 1-0 has samples without a reward")) == (
        "InvalidInput: group 1-0 has samples without a reward")
    assert error_reason(RuntimeError("CUDA out of memory")) == "RuntimeError: CUDA out of memory"


@pytest.mark.parametrize("stale_tokens", ["correct", "mask"])
def test_a_token_the_behaviour_policy_gave_probability_zero_is_never_trained(stale_tokens: str) -> None:
    """A -inf behaviour logprob has no importance weight (its ratio is infinite): the token is left out of
    the loss whether it is fresh or stale, so the loss and every gradient stay finite."""
    a = Sample(0, (10, 11, 12), (-0.5, -math.inf, -2.0), reward=1.0, version=5)
    b = lease_batch(FakeLease([group("1-0", [5], [a, Sample(1, (13,), (-1.0,), reward=0.0, version=5)])], version=5))
    for decoupled in (True, False):
        current = torch.full((2, 3), -1.0, requires_grad=True)
        loss, metrics = grpo_loss(current, b, decoupled=decoupled, stale_tokens=stale_tokens)
        loss.backward()
        assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values()), metrics
        assert torch.isfinite(current.grad).all() and current.grad[0, 1].item() == 0.0
        assert current.grad[0, 0].item() != 0.0
