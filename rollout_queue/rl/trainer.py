"""Trainer helpers: a lease -> the tensors of a policy-gradient step; publishing weights; commit or
rollback around the optimizer step; the queue's checkpoints wired to the trainer's own.

The integration into an existing loop is three calls::

    with training_step(q.lease(groups=32, block_ms=60_000), step) as lease:   # commit(step) after,
        batch = lease_batch(lease, tokenizer=tok)                              # rollback on any error
        loss, _ = grpo_loss(response_logprobs(model, batch), batch); loss.backward(); opt.step()
    publish_weights(q, model, q.version + 1, "/shared/weights")                # workers load it next

Rules this module keeps:
1. torch is imported inside the functions that build or use tensors, so ``import rollout_queue.rl.trainer``
   works with only redis + orjson (the pure parts, such as ``grpo_advantages``, work without torch).
2. Layout of a batch: each prompt is left-padded to the widest prompt ``P``, each response right-padded
   to the longest response ``R``; response token ``j`` of a sample is column ``P + j``, so the logits
   that predict it are column ``P + j - 1`` for every row. Position ids count from each row's first
   real token, as the generating engine (no padding) saw them.
3. A weight folder is complete the instant its name exists (written aside, then renamed), and the
   update is recorded through an admission hold, so no reservation starts while the version moves.
4. It decides nothing the queue decides: staleness and exactly-once are the scripts' job; the trainer
   only commits after its optimizer step and rolls back on any error. What it does decide is how each
   token is trained: by its own policy version (``Sample.segments``; a sample spans several when its
   generation outlived a weight update), a token older than the bound is masked or importance-
   corrected (``grpo_loss``'s ``stale_tokens``), never trained as if it were on-policy.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_queue.core.checks import check_choice, check_flag, check_number, check_optional_int
from rollout_queue.core.errors import InvalidInput, RolloutQueueError
from rollout_queue.ops.logs import fields
from rollout_queue.core.columns import SampleColumns
from rollout_queue.core.models import CompletedGroup

if TYPE_CHECKING:
    import torch

    from rollout_queue.api.lease import Lease
    from rollout_queue.api.queue import RolloutQueue

log = logging.getLogger("rollout_queue.rl.trainer")

__all__ = ["IMPORTANCE_SAMPLING_MODES", "PolicyBatch", "STALE_TOKENS", "grpo_advantages", "grpo_loss", "lease_batch",
           "publish_weights", "response_logprobs", "resume", "save_checkpoint", "save_weights", "stale_tokens_of",
           "staleness_bound", "training_step"]

#: How the importance ratio of the current to the behaviour policy weights the loss: TRL's
#: ``vllm_importance_sampling_mode`` values (trl/trainer/grpo_trainer.py, 1.16), with the same
#: meaning: per token or one ratio per sequence (the sum of its tokens' log-ratios), and a ratio
#: outside [min, max] truncated to the bound or masked (weight 0).
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: What becomes of a token older than the staleness bound: ``mask`` (not trained: out of the loss
#: mask) or ``correct`` (trained under the importance correction, as every token is).
STALE_TOKENS = ("mask", "correct")


def grpo_advantages(rewards: Sequence[Sequence[float]], *, scale_by_std: bool = True,
                    eps: float = 1e-6) -> list[list[float]]:
    """GRPO's group-normalised advantages: ``(r - mean(group)) / (std(group) + eps)``.

    ``std`` is the population standard deviation. ``scale_by_std=False`` keeps only the mean
    baseline (Dr. GRPO). A group whose rewards are all equal gets zero advantages (it teaches nothing).
    """
    out: list[list[float]] = []
    for group in rewards:
        values = [float(r) for r in group]
        if not values:
            out.append([])
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((r - mean) ** 2 for r in values) / len(values))
        denominator = (std + eps) if scale_by_std else 1.0
        if max(values) == min(values):  # exactly: the float mean of equal values may differ from them
            out.append([0.0] * len(values))
            continue
        out.append([(r - mean) / denominator for r in values])
    return out


@dataclass(frozen=True)
class PolicyBatch:
    """The tensors of one policy-gradient step over a lease (layout: the module's rule 2).

    S samples; ``T = prompt_width + R``. ``behaviour_logprobs`` is None when a sample came without
    logprobs (then the loss treats the data as on-policy). A trajectory's response is everything after
    its prompt, model turns and observations alike (the model attends to all of it); its loss mask
    (``Sample.loss_mask``) is ``response_mask``, so only the model's tokens are trained, and its
    staleness is its oldest model turn's. ``token_versions`` holds each response token's own policy
    version (``Sample.segments``), so a sample whose generation spanned weight updates is judged token
    by token (``token_staleness``) against ``max_staleness``, the lease's queue's bound.
    """

    input_ids: "torch.Tensor"                   # [S, T] long
    attention_mask: "torch.Tensor"              # [S, T] long, 0 on padding
    position_ids: "torch.Tensor"                # [S, T] long
    response_mask: "torch.Tensor"               # [S, R] float, 1 on tokens trained (the model's), 0 on
                                                # padding and on a trajectory's observation tokens
    behaviour_logprobs: "torch.Tensor | None"   # [S, R] float, the generating policy's, 0 on padding
    rewards: "torch.Tensor"                     # [S] float
    advantages: "torch.Tensor"                  # [S] float, group-normalised
    staleness: "torch.Tensor"                   # [S] long: lease version - the sample's policy version
    version_span: "torch.Tensor"                # [S] long: newest - oldest version a sample ran under
    group_index: "torch.Tensor"                 # [S] long: which group of the lease
    prompt_width: int
    entry_ids: tuple[str, ...]
    version: int
    token_versions: "torch.Tensor | None" = None  # [S, R] long: each response token's policy version, -1 on padding
    max_staleness: int | None = None            # the bound of the lease's queue (0: strictly on-policy); None: unknown

    @property
    def token_staleness(self) -> "torch.Tensor":
        """[S, R] long: ``version`` minus each response token's policy version (never negative), 0 on
        padding. Without ``token_versions`` (a batch built by hand), each sample's ``staleness``."""
        import torch

        if self.token_versions is None:
            return self.staleness.unsqueeze(-1) * (self.response_mask > 0)
        return torch.where(self.token_versions >= 0, (self.version - self.token_versions).clamp(min=0), 0)

    @property
    def response_ids(self) -> "torch.Tensor":
        return self.input_ids[:, self.prompt_width:]

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_response_tokens(self) -> int:
        return int(self.response_mask.sum().item())


def _prompt_ids(group: CompletedGroup, tokenizer: Any) -> list[int]:
    if group.group.prompt_token_ids is not None:
        return list(group.group.prompt_token_ids)
    if tokenizer is None:
        raise InvalidInput(f"group {group.entry_id} has no prompt_token_ids: pass tokenizer= (the workers' one)")
    ids = tokenizer.encode(group.group.prompt) if hasattr(tokenizer, "encode") else tokenizer(group.group.prompt)
    return [int(t) for t in ids]


def staleness_bound(queue: "RolloutQueue") -> int:
    """The queue's staleness bound as a number of versions: ``max_staleness``, 0 when it is None
    (strictly on-policy, DESIGN: Buffer and staleness)."""
    bound = queue.config.max_staleness
    return 0 if bound is None else int(bound)


def lease_batch(lease: "Lease | Sequence[CompletedGroup]", *, tokenizer: Any = None, version: int | None = None,
                pad_token_id: int = 0, scale_by_std: bool = True, eps: float = 1e-6,
                device: "torch.device | str | None" = None, max_staleness: int | None = None) -> PolicyBatch:
    """The tensors a policy-gradient step needs, from a lease's completed groups.

    Prompts are tokenized with ``tokenizer`` (``.encode(text)`` or a callable; it must be the one the
    workers use) unless the groups carry ``prompt_token_ids``. ``version`` defaults to the lease's
    policy version (staleness = version - each sample's version, never negative; per token, version
    - each token's). ``max_staleness`` (the batch's bound for ``grpo_loss``) defaults to the lease's
    queue's (``staleness_bound``), None for groups given without their lease.
    Raises InvalidInput for a sample without a reward or a lease without samples.
    """
    import torch

    groups = list(lease.groups) if hasattr(lease, "groups") else list(lease)
    at = version if version is not None else int(getattr(lease, "version", 0))
    bound = check_optional_int(max_staleness, "max_staleness")
    if bound is None and getattr(getattr(lease, "queue", None), "config", None) is not None:
        bound = staleness_bound(lease.queue)  # type: ignore[union-attr]
    rows, rewards = _rows(groups, tokenizer)
    advantages = [a for group in grpo_advantages(rewards, scale_by_std=scale_by_std, eps=eps) for a in group]
    input_ids, attention, response_mask, behaviour, token_versions, width = _pad(rows, pad_token_id)
    batch = PolicyBatch(
        input_ids=input_ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        response_mask=response_mask, behaviour_logprobs=behaviour,
        rewards=torch.tensor([r for group in rewards for r in group], dtype=torch.float32),
        advantages=torch.tensor(advantages, dtype=torch.float32),
        staleness=torch.tensor([max(0, at - cols.versions[s]) for _, cols, s, _ in rows], dtype=torch.long),
        version_span=torch.tensor([_span(cols.version_lists[s]) for _, cols, s, _ in rows], dtype=torch.long),
        group_index=torch.tensor([gi for _, _, _, gi in rows], dtype=torch.long),
        prompt_width=width, entry_ids=tuple(g.entry_id for g in groups), version=at,
        token_versions=token_versions, max_staleness=bound,
    )
    return batch if device is None else _to(batch, device)


def _span(versions: Sequence[int]) -> int:
    """How many weight updates a sample's generation spanned (0: one version throughout)."""
    return max(versions) - min(versions) if versions else 0


#: (prompt ids, the columns of the sample's group, the sample's index in them, the group's index in the lease)
Row = tuple[list[int], SampleColumns, int, int]


def _rows(groups: Sequence[CompletedGroup], tokenizer: Any) -> tuple[list[Row], list[list[float]]]:
    """One row per sample, and the rewards grouped as the lease groups them. Reads each group's
    columns, never its Samples: a lease's groups then never build a Python object per token."""
    rows: list[Row] = []
    rewards: list[list[float]] = []
    for gi, g in enumerate(groups):
        prompt = _prompt_ids(g, tokenizer)
        cols = g.columns()
        if any(r is None for r in cols.rewards):
            raise InvalidInput(f"group {g.entry_id} has samples without a reward: configure the workers' --reward")
        rewards.append([float(r) for r in cols.rewards])  # type: ignore[arg-type]  # checked above
        rows += [(prompt, cols, i, gi) for i in range(len(cols.counts))]
    if not rows:
        raise InvalidInput("the lease has no samples")
    return rows, rewards


def _pad(rows: list[Row], pad_token_id: int) -> tuple[Any, Any, Any, Any, Any, int]:
    """(input_ids, attention_mask, response_mask, behaviour logprobs or None, token versions, prompt
    width): the module's rule 2, prompts left-padded and responses right-padded. Each group's token
    ids, logprobs and token versions are viewed as tensors in place (torch.frombuffer) and copied
    once, into the batch."""
    import torch

    width = max(len(p) for p, _, _, _ in rows)
    longest = max(1, max(cols.counts[s] for _, cols, s, _ in rows))
    n = len(rows)
    input_ids = torch.full((n, width + longest), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width + longest), dtype=torch.long)
    response_mask = torch.zeros((n, longest), dtype=torch.float32)
    behaviour = torch.zeros((n, longest), dtype=torch.float32)
    token_versions = torch.full((n, longest), -1, dtype=torch.long)
    has_logprobs = all(cols.has_logprobs[s] or not cols.counts[s] for _, cols, s, _ in rows)
    views: dict[int, tuple[Any, Any, Any, Any]] = {}  # group index -> (ids, logprobs, loss mask, versions) tensors
    for i, (prompt, cols, s, gi) in enumerate(rows):
        k, m = len(prompt), cols.counts[s]
        input_ids[i, width - k:width] = torch.tensor(prompt, dtype=torch.long)
        attention[i, width - k:width + m] = 1
        if not m:
            continue
        if gi not in views:  # frombuffer refuses an empty buffer: only a group with tokens gets here
            views[gi] = (torch.frombuffer(cols.token_ids, dtype=torch.int32),
                         torch.frombuffer(cols.logprobs, dtype=torch.float32) if len(cols.logprobs) else None,
                         torch.frombuffer(cols.loss_mask(), dtype=torch.uint8) if cols.multi_turn else None,
                         torch.frombuffer(cols.token_versions(), dtype=torch.int32)
                         if cols.segment_lists or cols.multi_turn else None)  # else: each sample's version
        ids, lps, loss_mask, versions = views[gi]
        input_ids[i, width:width + m] = ids[cols.offsets[s]:cols.offsets[s] + m]
        if versions is None:
            token_versions[i, :m] = cols.versions[s]
        else:
            token_versions[i, :m] = versions[cols.offsets[s]:cols.offsets[s] + m]
        if loss_mask is None:
            response_mask[i, :m] = 1.0
        else:
            response_mask[i, :m] = loss_mask[cols.offsets[s]:cols.offsets[s] + m]
        if has_logprobs:
            behaviour[i, :m] = lps[cols.logprob_offsets[s]:cols.logprob_offsets[s] + m]
    return input_ids, attention, response_mask, behaviour if has_logprobs else None, token_versions, width


def _to(batch: PolicyBatch, device: "torch.device | str") -> PolicyBatch:
    moved = {name: (value.to(device) if hasattr(value, "to") else value) for name, value in batch.__dict__.items()}
    return PolicyBatch(**moved)


def response_logprobs(model: Any, batch: PolicyBatch) -> "torch.Tensor":
    """The model's log-probability of each response token, [S, R] (0 where the mask is 0).

    ``model`` is a causal LM called as ``model(input_ids=, attention_mask=, position_ids=)`` returning
    ``.logits`` (transformers) or the logits tensor itself.
    """
    import torch

    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    logits = out.logits if hasattr(out, "logits") else out
    width = batch.prompt_width
    predicting = logits[:, width - 1:-1].float()  # column P+j-1 predicts response token j
    logp = torch.log_softmax(predicting, dim=-1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    return logp * batch.response_mask


def grpo_loss(logprobs: "torch.Tensor", batch: PolicyBatch, *, clip_eps: float = 0.2,
              clip_eps_high: float | None = None, decoupled: bool = True,
              max_importance_weight: float | None = 2.0, min_importance_weight: float | None = None,
              importance_sampling_mode: str = "token_truncate", max_staleness: int | None = None,
              stale_tokens: str = "correct") -> tuple["torch.Tensor", dict[str, float]]:
    """The clipped policy-gradient loss of GRPO, averaged over the tokens trained (DAPO's token mean).

    ``decoupled`` (AReaL's decoupled PPO, the default): the trust region is taken around the current
    policy (the weights this step starts from) and the gap between the behaviour policy (the
    workers', token by token: ``Sample.segments``) and the current one is corrected by an importance
    weight, ``exp(current - behaviour)``, shaped by ``importance_sampling_mode`` as TRL shapes it
    (``IMPORTANCE_SAMPLING_MODES``: per token or per sequence, truncated to or masked outside
    [``min_importance_weight``, ``max_importance_weight``], TRL's ``vllm_importance_sampling_clip_min``
    / ``_clip_max``; None: no bound). Stale tokens then keep their gradient instead of being clipped
    away. ``decoupled=False``: classic PPO clipping against the behaviour policy, no weight.

    Staleness per token: a token whose version is more than ``max_staleness`` (default: the batch's,
    its lease's queue's bound) behind ``batch.version`` is corrected (``stale_tokens="correct"``, the
    default: trained under the correction above, like every token; the queue's default staleness
    mode, ``continue``, hands over samples whose prefix is past the bound, DESIGN: Staleness modes)
    or masked (``"mask"``: out of the loss and its token count). Without behaviour logprobs nothing can be corrected: the data is treated as
    on-policy, and a stale token is masked whatever ``stale_tokens`` says. Returns (loss, metrics):
    ``ratio_mean`` (of the raw ratio), ``weight_mean`` (the weight applied), ``masked_fraction``
    (tokens trained with weight 0 by the importance mask), ``stale_masked_fraction`` and
    ``stale_corrected_fraction`` (response tokens older than the bound, masked or corrected),
    ``token_staleness_max`` / ``_mean`` (over the response tokens), ``clip_fraction``, ``approx_kl``.
    Raises InvalidInput for an unknown mode or a bad bound.
    """
    import torch

    weights = _importance_bounds(importance_sampling_mode, min_importance_weight, max_importance_weight)
    check_choice(stale_tokens, STALE_TOKENS, "stale_tokens")
    check_flag(decoupled, "decoupled")
    bound = batch.max_staleness if max_staleness is None else check_optional_int(max_staleness, "max_staleness")
    response = batch.response_mask
    current = logprobs.detach()
    behaviour = batch.behaviour_logprobs if batch.behaviour_logprobs is not None else current
    staleness = batch.token_staleness
    stale = stale_tokens_of(staleness, response, bound)
    masking = stale_tokens == "mask" or batch.behaviour_logprobs is None
    mask = response * ~stale if masking else response  # the tokens trained
    if batch.behaviour_logprobs is not None:
        # A token the behaviour policy gave probability 0 (-inf) has no importance weight: never trained.
        mask = mask * torch.isfinite(batch.behaviour_logprobs)
    log_ratio = _log_ratio(current, behaviour, mask)
    drift = torch.exp(log_ratio)
    weight = _importance_weight(log_ratio, importance_sampling_mode, *weights) if decoupled else None
    anchor = current if decoupled else behaviour
    ratio = torch.exp(_log_ratio(logprobs, anchor, mask))
    high = clip_eps if clip_eps_high is None else clip_eps_high
    advantages = batch.advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + high) * advantages)
    if weight is not None:
        surrogate = surrogate * weight
    tokens = mask.sum().clamp(min=1.0)
    loss = -(surrogate * mask).sum() / tokens
    with torch.no_grad():
        applied = (weight if weight is not None else torch.ones_like(mask)).expand_as(mask)
        clipped = ((drift < 1 - clip_eps) | (drift > 1 + high)).float()
        responses = response.sum().clamp(min=1.0)
        stale_count = float((stale.float() * response).sum().item())
        arrived = staleness * (response > 0)  # every response token's, masked ones included
        metrics = {
            "loss": float(loss.item()),
            "ratio_mean": float((drift * mask).sum().item() / tokens.item()),
            "weight_mean": float((applied * mask).sum().item() / tokens.item()),
            "masked_fraction": float((((applied == 0).float()) * mask).sum().item() / tokens.item()),
            "stale_masked_fraction": stale_count / responses.item() if masking else 0.0,
            "stale_corrected_fraction": 0.0 if masking else stale_count / responses.item(),
            "token_staleness_max": float(arrived.max().item()) if arrived.numel() else 0.0,
            "token_staleness_mean": float(arrived.sum().item() / responses.item()),
            "clip_fraction": float((clipped * mask).sum().item() / tokens.item()),
            "approx_kl": float((-log_ratio.sum() / tokens).item()),
        }
    return loss, metrics


def stale_tokens_of(staleness: "torch.Tensor", mask: "torch.Tensor", bound: int | None) -> "torch.Tensor":
    """Which tokens are older than ``bound`` versions (bool, the shape of ``staleness``): those of
    ``mask`` whose staleness exceeds it; none when the bound is None (not known). The one rule
    grpo_loss and the TRL adapter judge a token by."""
    import torch

    if bound is None:
        return torch.zeros_like(staleness, dtype=torch.bool)
    return (staleness > bound) & (mask > 0)


def _importance_bounds(mode: str, low: float | None, high: float | None) -> tuple[float | None, float | None]:
    """The importance weight's mode and bounds, checked (InvalidInput)."""
    check_choice(mode, IMPORTANCE_SAMPLING_MODES, "importance_sampling_mode")
    bounds = tuple(None if b is None else check_number(b, name) for b, name in
                   ((low, "min_importance_weight"), (high, "max_importance_weight")))
    if any(b is not None and b < 0 for b in bounds) or (None not in bounds and bounds[0] > bounds[1]):  # type: ignore[operator]
        raise InvalidInput(f"importance weight bounds must be >= 0 and min <= max, got [{low}, {high}]")
    return bounds  # type: ignore[return-value]


def _log_ratio(logprobs: "torch.Tensor", anchor: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor":
    """logprobs - anchor on the tokens of ``mask``, 0 elsewhere (and where it is NaN, as TRL does): a
    -inf behaviour logprob on a token not trained must not turn a sum, or the loss, into NaN."""
    import torch

    return torch.nan_to_num(torch.where(mask > 0, logprobs - anchor, torch.zeros_like(logprobs)), nan=0.0)


def _importance_weight(log_ratio: "torch.Tensor", mode: str, low: float | None,
                       high: float | None) -> "torch.Tensor":
    """The importance weight of the current over the behaviour policy from their per-token log-ratio,
    [S, R] or [S, 1] for the sequence modes, truncated or masked as TRL's
    ``vllm_importance_sampling_mode`` does."""
    import torch

    diff = log_ratio
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return ratio if low is None and high is None else torch.clamp(ratio, min=low, max=high)
    outside = (ratio < (-math.inf if low is None else low)) | (ratio > (math.inf if high is None else high))
    return ratio.masked_fill(outside, 0.0)


@contextmanager
def training_step(lease: "Lease | None", step: int | None = None) -> Iterator["Lease"]:
    """Commit the lease after the block (the optimizer step) ran; roll it back on any error.

    ``step`` is recorded with the commit, so the data stays restorable until ``save_checkpoint``
    covers it (pass None if the trainer never checkpoints: the payloads are dropped at once).
    An exception from the block may be the data's fault: the rollback is an errored one, with the
    exception as its reason (``error_reason``: counted, so a group that always breaks the step is
    dead-lettered after max_attempts such leases, DESIGN rule 4); an interrupt or exit rolls back
    plain. Raises ValueError for a None lease (nothing was leased in time), LeaseLost if the lease
    expired during the step: the update was applied to data the queue took back, so resume from a
    checkpoint (or extend() leases whose steps outlast lease_timeout_s).
    """
    from rollout_queue.api.lease import error_reason

    if lease is None:
        raise ValueError("no lease: nothing was leased before block_ms ran out")
    try:
        yield lease
    except BaseException as exc:
        try:
            lease.rollback(error_reason(exc))
        except (RolloutQueueError, OSError) as exc:  # the lease is gone: the reaper requeues it
            log.warning("rollback after a failed step failed; the reaper requeues the lease", exc_info=exc,
                        extra=fields(lease=getattr(lease, "lease_id", "")))
        raise
    lease.commit(step=step)


def save_weights(model: Any, folder: str | os.PathLike[str]) -> Path:
    """Write ``model`` as a safetensors folder that exists complete or not at all (write, then rename).

    A transformers model is saved with ``save_pretrained``; any other ``torch.nn.Module`` as
    ``model.safetensors`` of its state dict. Raises FileExistsError: one folder per version.
    """
    from rollout_queue.weights.store import atomic_folder, save_model

    return atomic_folder(Path(folder), lambda staging: save_model(model, staging))


def publish_weights(queue: "RolloutQueue", model: Any, version: int, root: str | os.PathLike[str], *,
                    wait_s: float = 0.0, keep: int = 4, hold_timeout_s: float = 60.0) -> str:
    """Save ``model`` in full as policy ``version`` under ``root`` and record the update through a hold.

    The hold closes admission while the version moves; ``wait_s > 0`` also waits (that long at most)
    for the attempts executing when it opened to end, for trainers that want no generation to span
    the update. Only the newest ``keep`` version folders are kept. Returns the weights URI (the
    folder's absolute path, what ``--engine vllm|torch`` workers load). A trainer that publishes
    often keeps one ``rollout_queue.weights.WeightPublisher`` instead, which can write deltas.
    Raises VersionRegression for a version below the current one (or the current one with other
    weights: a trainer resumed from a checkpoint continues from ``queue.version + 1``), HoldLost if
    the hold expired.
    """
    from rollout_queue.weights.publisher import WeightPublisher

    return WeightPublisher(queue, root, keep=keep, wait_s=wait_s, hold_timeout_s=hold_timeout_s).publish(model, version)


def save_checkpoint(queue: "RolloutQueue", step: int, save: Callable[[int], Any]) -> int:
    """Run the trainer's own ``save(step)`` (model + optimizer), then let the queue drop the data
    committed at or before ``step``. The order matters: the data goes only once the weights that
    consumed it are durable. Returns how many kept payloads were dropped."""
    save(step)
    return queue.checkpoint(step)


def resume(queue: "RolloutQueue", step: int) -> int:
    """The trainer restarted from its checkpoint ``step``: requeue every group committed after it, so
    each group is trained exactly once relative to the weights resumed from. Returns how many."""
    return queue.restore(step)
