"""Leased groups -> the TransferQueue rows verl's V1 trainer reads (keys, fields, tags).

verl's own agent loops write one row per trajectory under ``{uid}_{session_id}_{index}``
(``AgentLoopWorkerTQ._agent_loop_postprocess``, verl 0.9.1): ``AgentLoopOutput.as_dict()`` plus the
prompt's columns, ``loss_mask``, ``input_ids``, ``position_ids`` and ``multi_modal_inputs``, tagged
with lengths and the global steps the trajectory spans. The rows here are built the same way from
the converter's ``AgentLoopOutput`` (convert/verl.py), so every later stage of verl's step (balance,
old log-probs, advantages grouped by ``uid``, the update) reads them like its own.

Owns only the shape; no TransferQueue or Redis calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.convert.verl import to_agent_loop_outputs

__all__ = ["KEY_PREFIX", "is_queue_key", "to_rows", "uid_of"]

#: Every uid this package writes starts with it, so a resumed sampler can tell its rows from verl's.
KEY_PREFIX = "rq-"


def uid_of(entry_id: str) -> str:
    """The verl uid of a group: its entry id, without ``_`` (verl splits keys on ``_``)."""
    return KEY_PREFIX + entry_id.replace("_", "-")


def is_queue_key(key: str) -> bool:
    """Whether a TransferQueue key (a uid or a trajectory key) was written by this package."""
    return key.startswith(KEY_PREFIX)


def to_rows(groups: Sequence[CompletedGroup], global_steps: int,
            tokenizer: Any = None) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """One row per sample. ``global_steps`` is the step that trains them (verl's staleness tags
    read ``min/max_global_steps`` from the samples' own policy versions, which equal verl's steps
    when its weights reach the workers through the ``rollout_queue`` checkpoint engine).
    Raises InvalidInput for a group with no prompt token ids and no tokenizer."""
    keys: list[str] = []
    fields: list[dict[str, Any]] = []
    tags: list[dict[str, Any]] = []
    for group in groups:
        uid = uid_of(group.entry_id)
        data_source = (group.group.metadata or {}).get("data_source", "rollout_queue")
        for session, output in enumerate(to_agent_loop_outputs(group, tokenizer)):
            field = output.as_dict()
            prompts, responses = field["prompts"], field["responses"]
            input_ids = torch.cat([prompts, responses], dim=0)
            versions = [v for v in field["extra_fields"]["token_versions"] if v >= 0] or [group.min_version]
            field["extra_fields"].update(min_global_steps=min(versions), max_global_steps=max(versions))
            field["extra_fields"].setdefault("reward_extra_info", {})
            field.update(uid=uid, session_id=session, global_steps=global_steps, data_source=data_source,
                         loss_mask=field["response_mask"], input_ids=input_ids,
                         position_ids=torch.arange(input_ids.size(0), dtype=torch.int64),
                         multi_modal_inputs={})
            keys.append(f"{uid}_{session}_0")
            fields.append(field)
            tags.append({"status": "success", "prompt_len": int(prompts.size(0)),
                         "response_len": int(responses.size(0)),
                         "seq_len": int(prompts.size(0) + responses.size(0)), "global_steps": global_steps,
                         "min_global_steps": min(versions), "max_global_steps": max(versions)})
    return keys, fields, tags
