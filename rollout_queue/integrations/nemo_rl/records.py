"""A leased group -> NeMo-RL's ``PromptGroupRecord`` (what its rollouts hand ``TQReplayBuffer.commit``).

Read at NVIDIA-NeMo/RL@7ea279abfbeb698b092856d0dab61e7cf39bc909 (``nemo_rl/experience/interfaces.py``:
``PromptGroupRecord(prompt_idx, prompt, extra_env_info, metadata, completions, rollout_metrics)``,
``Completion(message_log, env_extras, truncated, reward)``; ``nemo_rl/experience/payload.py``:
``record_to_train_batch``). A message is a dict with ``role``, ``content`` and ``token_ids`` (a 1-D
tensor); NeMo-RL trains exactly the tokens of assistant messages that carry ``generation_logprobs``
(``add_grpo_token_loss_masks_and_generation_logprobs``), so:

- the prompt is one ``user`` message of the group's ``prompt_token_ids``;
- a response is one ``assistant`` message with its behaviour logprobs, or, for a trajectory whose
  ``loss_mask`` marks observation tokens (a tool's output), alternating ``assistant`` runs (mask 1,
  with logprobs) and ``tool`` runs (mask 0, no logprobs: never trained);
- ``reward`` is the sample's; ``truncated`` a ``length`` finish. The queue's bookkeeping (entry,
  source id, policy versions) rides in ``metadata`` and ``rollout_metrics``.

NeMo-RL's loss needs behaviour logprobs and a reward per sample: a group without them is refused
(InvalidInput: the sampler then rolls the lease back counted, so such a group dead-letters after
``max_attempts`` instead of breaking every step). Owns only the shape: no Redis, no NeMo-RL I/O.
"""

from __future__ import annotations

from typing import Any

import torch

from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.convert import FlatSample, flat, framework_class

__all__ = ["to_record"]

_MODULE = "nemo_rl.experience.interfaces"


def _messages(sample: FlatSample) -> list[dict[str, Any]]:
    """The response as NeMo-RL messages: runs of trained tokens (assistant) and of observations (tool)."""
    if sample.logprobs is None or len(sample.logprobs) != len(sample.response_ids):
        raise InvalidInput(f"group {sample.entry_id} slot {sample.slot}: NeMo-RL trains on behaviour logprobs, and "
                           "this sample has none for its tokens: run the workers with logprobs on (the engines' "
                           "default) so every completion carries one per token")
    out: list[dict[str, Any]] = []
    start = 0
    mask = sample.loss_mask or [1] * len(sample.response_ids)
    for end in range(1, len(mask) + 1):
        if end < len(mask) and mask[end] == mask[start]:
            continue
        ids = torch.tensor(sample.response_ids[start:end], dtype=torch.long)
        if mask[start]:
            out.append({"role": "assistant", "content": "", "token_ids": ids,
                        "generation_logprobs": torch.tensor(sample.logprobs[start:end], dtype=torch.float32)})
        else:
            out.append({"role": "tool", "content": "", "token_ids": ids})
        start = end
    return out


def to_record(group: CompletedGroup, prompt_idx: int, tokenizer: Any = None, *, as_dict: bool = False) -> Any:
    """NeMo-RL's ``PromptGroupRecord`` of one leased group (a dict of its fields when NeMo-RL is absent
    or ``as_dict``). ``prompt_idx`` numbers the group within this run. Raises InvalidInput for a group
    with no prompt token ids (and no tokenizer), no logprobs or no reward."""
    samples = flat(group, tokenizer)
    prompt_ids = torch.tensor(samples[0].prompt_ids if samples else [], dtype=torch.long)
    completions = []
    for s in samples:
        if s.reward is None:
            raise InvalidInput(f"group {group.entry_id} slot {s.slot} has no reward: NeMo-RL's GRPO needs one per "
                               "sample; give the workers a reward function (--reward)")
        prompt = {"role": "user", "content": group.group.prompt, "token_ids": prompt_ids}  # one dict per log:
        # NeMo-RL writes its loss mask into each message in place
        completions.append({"message_log": [prompt, *_messages(s)], "env_extras": None,
                            "truncated": s.finish_reason == "length", "reward": float(s.reward)})
    record = {
        "prompt_idx": prompt_idx,
        "prompt": [{"role": "user", "content": group.group.prompt, "token_ids": prompt_ids}],
        "extra_env_info": None,
        "metadata": {**dict(group.group.metadata or {}), "queue_entry": group.entry_id,
                     "source_id": group.group.source_id, "attempt": group.attempt},
        "completions": completions,
        "rollout_metrics": {"rollout_queue/policy_version_min": float(group.min_version)},
    }
    record_cls = None if as_dict else framework_class("PromptGroupRecord", _MODULE)
    if record_cls is None:
        return record
    completion_cls = framework_class("Completion", _MODULE)
    return record_cls(**{**record, "completions": [completion_cls(**c) for c in completions]})
