"""NeMo-RL (single-controller GRPO): the queue behind its custom ``PromptGroupSampler`` seam.

``async_rl.sampler: {name: custom, target: rollout_queue.integrations.nemo_rl.sampler:QueueSampler,
url: ..., queue: ...}``; docs/integrations/nemo-rl.md. ``records`` converts a leased group to
NeMo-RL's ``PromptGroupRecord`` and imports without NeMo-RL; ``sampler`` subclasses NeMo-RL's
``BaseSampler`` where NeMo-RL imports (a plain class otherwise, for the signature checks).
"""

from rollout_queue.integrations.nemo_rl.records import to_record

__all__ = ["to_record"]
