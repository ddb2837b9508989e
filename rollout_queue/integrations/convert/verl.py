"""verl: a leased group -> one ``AgentLoopOutput`` per sample (what ``AgentLoopBase.run`` returns).

Read at verl-project/verl 1dda039b9c6311889a9c9a26040677e1254814f9
(``verl/experimental/agent_loop/agent_loop.py``; PyPI verl 0.9.1 has the same fields plus
``mm_processor_output``). ``response_mask`` is 1 on generated tokens and 0 on a trajectory's tool
observations (verl's ToolAgentLoop marks them the same way); ``response_logprobs`` the behaviour
logprobs; ``num_turns`` counts the prompt and each turn (2 for a single-turn sample, as verl's
single-turn loop counts a user and an assistant turn); the queue's bookkeeping, each response token's
policy version (``token_versions``, -1 on observations: AgentLoopOutput has no field of its own for
them) and the sample's own metadata ride in ``extra_fields``.
"""

from __future__ import annotations

from typing import Any

from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.convert import flat, framework_class

__all__ = ["to_agent_loop_outputs"]


def to_agent_loop_outputs(group: CompletedGroup, tokenizer: Any = None, *, as_dicts: bool = False) -> list[Any]:
    """verl ``AgentLoopOutput``s (dicts of its fields when verl is absent or ``as_dicts``)."""
    rows = [{
        "prompt_ids": s.prompt_ids,
        "response_ids": s.response_ids,
        "response_mask": s.loss_mask,
        "response_logprobs": s.logprobs,
        "reward_score": s.reward,
        "num_turns": s.num_turns,
        "metrics": {},
        "extra_fields": {**s.metadata, "queue_entry": s.entry_id, "source_id": s.source_id, "slot": s.slot,
                         "policy_version": s.version, "token_versions": s.token_versions,
                         "finish_reason": s.finish_reason},
    } for s in flat(group, tokenizer)]
    cls = None if as_dicts else framework_class("AgentLoopOutput", "verl.experimental.agent_loop.agent_loop")
    return rows if cls is None else [cls(**row) for row in rows]
