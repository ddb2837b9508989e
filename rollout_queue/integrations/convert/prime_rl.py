"""prime-rl: a leased group -> one ``TrainingSample`` per sample (its rollout transport's unit).

Read at PrimeIntellect-ai/prime-rl 559b44772e471d1538537b8805cc77f3824a5e64
(``src/prime_rl/transports/rollouts/types.py``, a msgspec Struct): ``token_ids`` (prompt +
completion, one flat sequence), ``mask`` (False on the prompt), ``logprobs`` (0.0 on tokens the
model did not sample), ``temperatures`` per token, ``env_name``, and per-token ``advantages`` (the
group-normalised advantage on every completion token, required when any token is trainable). It has
no field for policy versions: a sample's staleness is bounded at lease time, and prime-rl's loss
takes its per-token importance ratio against ``logprobs``, the behaviour logprobs of each token.
"""

from __future__ import annotations

from typing import Any

from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.convert import flat, framework_class

__all__ = ["to_training_samples"]


def to_training_samples(group: CompletedGroup, tokenizer: Any = None, *, temperature: float = 1.0,
                        env_name: str | None = None, as_dicts: bool = False) -> list[Any]:
    """prime-rl ``TrainingSample``s (dicts of its fields when prime-rl is absent or ``as_dicts``).
    ``env_name`` defaults to the group's ``env`` metadata, else ``"rollout-queue"``."""
    env = env_name or str(group.group.metadata.get("env", "rollout-queue"))
    rows = []
    for s in flat(group, tokenizer):
        p, m = len(s.prompt_ids), len(s.response_ids)
        rows.append({
            "token_ids": s.prompt_ids + s.response_ids,
            "mask": [False] * p + [bool(b) for b in s.loss_mask],
            "logprobs": [0.0] * p + (s.logprobs if s.logprobs is not None else [0.0] * m),
            "temperatures": [float(temperature)] * (p + m),
            "env_name": env,
            "advantages": [0.0] * p + [s.advantage] * m,
        })
    cls = None if as_dicts else framework_class("TrainingSample", "prime_rl.transports.rollouts.types")
    return rows if cls is None else [cls(**row) for row in rows]
