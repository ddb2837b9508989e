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
   only commits after its optimizer step and rolls back on any error.
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

from rollout_queue.core.errors import InvalidInput, RolloutQueueError
from rollout_queue.ops.logs import fields
from rollout_queue.core.columns import SampleColumns
from rollout_queue.core.models import CompletedGroup

if TYPE_CHECKING:
    import torch

    from rollout_queue.api.lease import Lease
    from rollout_queue.api.queue import RolloutQueue

log = logging.getLogger("rollout_queue.rl.trainer")

__all__ = ["PolicyBatch", "grpo_advantages", "grpo_loss", "lease_batch", "publish_weights", "response_logprobs",
           "resume", "save_checkpoint", "save_weights", "training_step"]


def grpo_advantages(rewards: Sequence[Sequence[float]], *, scale_by_std: bool = True,
                    eps: float = 1e-6) -> list[list[float]]:
    """GRPO's group-normalised advantages: ``(r - mean(group)) / (std(group) + eps)``.

    ``std`` is the population standard deviation. ``scale_by_std=False`` keeps only the mean
    baseline (Dr. GRPO). A group whose rewards are all equal gets zero advantages (it teaches nothing).
    """
    out = []
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
    staleness is its oldest model turn's.
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


def lease_batch(lease: "Lease | Sequence[CompletedGroup]", *, tokenizer: Any = None, version: int | None = None,
                pad_token_id: int = 0, scale_by_std: bool = True, eps: float = 1e-6,
                device: "torch.device | str | None" = None) -> PolicyBatch:
    """The tensors a policy-gradient step needs, from a lease's completed groups.

    Prompts are tokenized with ``tokenizer`` (``.encode(text)`` or a callable; it must be the one the
    workers use) unless the groups carry ``prompt_token_ids``. ``version`` defaults to the lease's
    policy version (staleness = version - each sample's version, never negative).
    Raises InvalidInput for a sample without a reward or a lease without samples.
    """
    import torch

    groups = list(lease.groups) if hasattr(lease, "groups") else list(lease)
    at = version if version is not None else int(getattr(lease, "version", 0))
    rows, rewards = _rows(groups, tokenizer)
    advantages = [a for group in grpo_advantages(rewards, scale_by_std=scale_by_std, eps=eps) for a in group]
    input_ids, attention, response_mask, behaviour, width = _pad(rows, pad_token_id)
    batch = PolicyBatch(
        input_ids=input_ids, attention_mask=attention, position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
        response_mask=response_mask, behaviour_logprobs=behaviour,
        rewards=torch.tensor([r for group in rewards for r in group], dtype=torch.float32),
        advantages=torch.tensor(advantages, dtype=torch.float32),
        staleness=torch.tensor([max(0, at - cols.versions[s]) for _, cols, s, _ in rows], dtype=torch.long),
        version_span=torch.tensor([_span(cols.version_lists[s]) for _, cols, s, _ in rows], dtype=torch.long),
        group_index=torch.tensor([gi for _, _, _, gi in rows], dtype=torch.long),
        prompt_width=width, entry_ids=tuple(g.entry_id for g in groups), version=at,
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


def _pad(rows: list[Row], pad_token_id: int) -> tuple[Any, Any, Any, Any, int]:
    """(input_ids, attention_mask, response_mask, behaviour logprobs or None, prompt width): the
    module's rule 2, prompts left-padded and responses right-padded. Each group's token ids and
    logprobs are viewed as tensors in place (torch.frombuffer) and copied once, into the batch."""
    import torch

    width = max(len(p) for p, _, _, _ in rows)
    longest = max(1, max(cols.counts[s] for _, cols, s, _ in rows))
    n = len(rows)
    input_ids = torch.full((n, width + longest), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width + longest), dtype=torch.long)
    response_mask = torch.zeros((n, longest), dtype=torch.float32)
    behaviour = torch.zeros((n, longest), dtype=torch.float32)
    has_logprobs = all(cols.has_logprobs[s] or not cols.counts[s] for _, cols, s, _ in rows)
    views: dict[int, tuple[Any, Any, Any]] = {}  # group index -> (ids, logprobs, loss mask) tensors
    for i, (prompt, cols, s, gi) in enumerate(rows):
        k, m = len(prompt), cols.counts[s]
        input_ids[i, width - k:width] = torch.tensor(prompt, dtype=torch.long)
        attention[i, width - k:width + m] = 1
        if not m:
            continue
        if gi not in views:  # frombuffer refuses an empty buffer: only a group with tokens gets here
            views[gi] = (torch.frombuffer(cols.token_ids, dtype=torch.int32),
                         torch.frombuffer(cols.logprobs, dtype=torch.float32) if len(cols.logprobs) else None,
                         torch.frombuffer(cols.loss_mask(), dtype=torch.uint8) if cols.multi_turn else None)
        ids, lps, loss_mask = views[gi]
        input_ids[i, width:width + m] = ids[cols.offsets[s]:cols.offsets[s] + m]
        if loss_mask is None:
            response_mask[i, :m] = 1.0
        else:
            response_mask[i, :m] = loss_mask[cols.offsets[s]:cols.offsets[s] + m]
        if has_logprobs:
            behaviour[i, :m] = lps[cols.logprob_offsets[s]:cols.logprob_offsets[s] + m]
    return input_ids, attention, response_mask, behaviour if has_logprobs else None, width


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
              max_importance_weight: float = 2.0) -> tuple["torch.Tensor", dict[str, float]]:
    """The clipped policy-gradient loss of GRPO, averaged over response tokens (DAPO's token mean).

    ``decoupled`` (AReaL's decoupled PPO, the default): the trust region is taken around the current
    policy (the weights this step starts from) and the gap between the behaviour policy (the
    workers', up to ``max_staleness`` versions old) and the current one is corrected by a
    per-token importance weight, truncated at ``max_importance_weight``. Stale samples then keep
    their gradient instead of being clipped away. ``decoupled=False``: classic PPO clipping against
    the behaviour policy. Without behaviour logprobs the data is treated as on-policy.
    Returns (loss, metrics).
    """
    import torch

    mask = batch.response_mask
    current = logprobs.detach()
    behaviour = batch.behaviour_logprobs if batch.behaviour_logprobs is not None else current
    anchor = current if decoupled else behaviour
    ratio = torch.exp((logprobs - anchor) * mask)
    weight = torch.exp((current - behaviour) * mask).clamp(max=max_importance_weight) if decoupled else 1.0
    high = clip_eps if clip_eps_high is None else clip_eps_high
    advantages = batch.advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_eps, 1 + high) * advantages) * weight
    tokens = mask.sum().clamp(min=1.0)
    loss = -(surrogate * mask).sum() / tokens
    with torch.no_grad():
        drift = torch.exp((current - behaviour) * mask)
        clipped = ((drift < 1 - clip_eps) | (drift > 1 + high)).float()
        metrics = {
            "loss": float(loss.item()),
            "ratio_mean": float((drift * mask).sum().item() / tokens.item()),
            "clip_fraction": float((clipped * mask).sum().item() / tokens.item()),
            "approx_kl": float((((behaviour - current) * mask).sum() / tokens).item()),
        }
    return loss, metrics


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
