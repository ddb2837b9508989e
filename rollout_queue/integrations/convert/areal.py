"""AReaL: a leased group -> the trajectory tensors its RLVR workflow returns for a group.

Read at inclusionAI/AReaL 4aef98d8d818af55b43621aaadba047ae10f4e77 (``areal/workflow/rlvr.py``,
identical at v1.0.4): per completion ``input_ids`` int32 [1, seq] (prompt + output), ``loss_mask``
int32 (0 on the prompt), ``logprobs`` float32 (0.0 on the prompt), ``versions`` int32 (-1 on the
prompt, the generating policy version per output token: ``Sample.segments`` expanded),
``attention_mask`` bool, ``rewards``
float32 [1]; ``GroupedRolloutWorkflow`` concatenates a group to [G, max_seq], padding with 0 /
False (so padded ``versions`` are 0, as AReaL's own padding makes them).
"""

from __future__ import annotations

from typing import Any

from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.convert import flat

__all__ = ["to_areal_trajectory"]


def to_areal_trajectory(group: CompletedGroup, tokenizer: Any = None) -> dict[str, Any]:
    """The group as AReaL's grouped trajectory: a dict of [G, max_seq] tensors and ``rewards`` [G]."""
    import torch

    samples = flat(group, tokenizer)
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    g = len(samples)
    out = {
        "input_ids": torch.zeros((g, width), dtype=torch.int32),
        "loss_mask": torch.zeros((g, width), dtype=torch.int32),
        "logprobs": torch.zeros((g, width), dtype=torch.float32),
        "versions": torch.zeros((g, width), dtype=torch.int32),
        "attention_mask": torch.zeros((g, width), dtype=torch.bool),
        "rewards": torch.tensor([float(s.reward or 0.0) for s in samples], dtype=torch.float32),
    }
    for i, s in enumerate(samples):
        p, m = len(s.prompt_ids), len(s.response_ids)
        out["input_ids"][i, :p + m] = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.int32)
        out["loss_mask"][i, p:p + m] = torch.tensor(s.loss_mask, dtype=torch.int32)
        if s.logprobs is not None:
            out["logprobs"][i, p:p + m] = torch.tensor(s.logprobs, dtype=torch.float32)
        out["versions"][i, :p] = -1
        out["versions"][i, p:p + m] = torch.tensor(s.token_versions, dtype=torch.int32)
        out["attention_mask"][i, :p + m] = True
    return out
