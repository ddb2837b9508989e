"""Converters from a leased group to other RL frameworks' sample shapes.

Each module reads a CompletedGroup (the pristine prompt, its ``n`` samples with token ids, behaviour
logprobs, rewards and policy versions, per token where a sample spans several: Sample.segments) and builds the framework's own class when its package is
installed, else the same fields as a dict (``as_dicts=True`` forces dicts): verl's ``AgentLoopOutput``
(verl.py), AReaL's trajectory tensors (areal.py), slime / miles ``Sample`` and their data-source
checkpoint hooks (slime.py), prime-rl's ``TrainingSample`` (prime_rl.py). The field lists, and the
commit each was read at, are in docs/integrations/<framework>.md and tests/integrations/test_convert.py.

This module holds what they share: one flat view of each sample (``flat``) and the lookup of the
framework's class (``framework_class``). Per-token versions go in the framework's own field where it
has one (AReaL's ``versions``; slime's ``weight_versions`` lists one per version, as its generate
calls do), else beside the sample (verl's ``extra_fields``, slime's ``metadata``: ``token_versions``);
prime-rl's sample has no place for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import CompletedGroup
from rollout_queue.rl.trainer import grpo_advantages

__all__ = ["FlatSample", "flat", "framework_class"]


def framework_class(name: str, *modules: str) -> Any:
    """Class ``name`` from the first of ``modules`` that imports (None when the framework is absent)."""
    for module in modules:
        try:
            return getattr(__import__(module, fromlist=[name]), name)
        except ImportError:
            continue
    return None


@dataclass(frozen=True)
class FlatSample:
    """One sample of a group, as every converter needs it."""

    entry_id: str
    source_id: str
    slot: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None      # behaviour logprobs of response_ids, None if the worker sent none
    reward: float | None
    advantage: float                  # GRPO's, within the group (0 when a reward is missing)
    version: int                      # policy version of the sample (its oldest token's)
    token_versions: list[int]         # per response token: the version that generated it (Sample.segments;
                                      # the sample's version on every token when it has none), -1 on a
                                      # trajectory's observation tokens (never trained)
    finish_reason: str
    loss_mask: list[int]              # per response token: 1 trained (the model's), 0 an observation's
    num_turns: int                    # messages as chat frameworks count them: the prompt + each turn
    metadata: dict[str, Any]          # the sample's own record (tool calls, per-step rewards), {} if none


def flat(group: CompletedGroup, tokenizer: Any = None, *, scale_by_std: bool = True) -> list[FlatSample]:
    """The group's samples, flat. Prompts come from ``prompt_token_ids`` or ``tokenizer.encode``.
    Raises InvalidInput for a group with neither."""
    prompt = group.group.prompt_token_ids
    if prompt is None:
        if tokenizer is None:
            raise InvalidInput(f"group {group.entry_id} has no prompt_token_ids: pass tokenizer= (the workers' one)")
        prompt = tuple(int(t) for t in tokenizer.encode(group.group.prompt))
    rewards = [s.reward for s in group.samples]
    scored = all(r is not None for r in rewards)
    advantages = (grpo_advantages([[float(r) for r in rewards]], scale_by_std=scale_by_std)[0]  # type: ignore[arg-type]
                  if scored else [0.0] * len(rewards))
    out = []
    for sample, advantage in zip(group.samples, advantages):
        versions = list(sample.token_versions)
        if sample.turns:
            versions = [v if trained else -1 for v, trained in zip(versions, sample.loss_mask)]
        out.append(FlatSample(group.entry_id, group.group.source_id, sample.slot, list(prompt),
                              list(sample.token_ids), list(sample.logprobs) if sample.logprobs else None,
                              sample.reward, float(advantage), sample.version, versions, sample.finish_reason,
                              list(sample.loss_mask), 1 + max(1, len(sample.turns)), dict(sample.metadata or {})))
    return out
