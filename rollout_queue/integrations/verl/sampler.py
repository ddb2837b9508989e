"""verl's V1 trainer trained from the queue: its ``ReplayBuffer`` seam and its checkpoint hook.

Configuration only (docs/integrations/verl.md)::

    trainer.v1.sampler.custom_sampler.path=pkg://rollout_queue.integrations.verl.sampler
    trainer.v1.sampler.custom_sampler.name=QueueReplayBuffer
    +trainer.v1.sampler.sampler_kwargs.url=redis://queue-host:6379
    +trainer.v1.sampler.sampler_kwargs.queue=math
    +trainer.checkpoint_callback_class=rollout_queue.integrations.verl.sampler.QueueCheckpointCallback

Where verl knows what (verl 0.9.1, ``verl/trainer/ppo/v1/trainer_base.py``):

1. ``fit`` calls ``sample(global_steps=g, partition_id="train", ...)`` inside step ``g`` and trains
   what it returns in that same step, before it saves; the first call after a resume has
   ``g = resumed + 1`` (``_load_checkpoint`` sets ``global_steps`` from the ``global_step_N`` folder).
   So the first "train" call restores the queue to ``g - 1``: every group committed after the
   checkpoint verl resumed from is requeued, and is trained exactly once by the weights that never
   saw it.
2. Each lease is committed with step ``g`` when it is handed out, not after the update: verl has no
   hook between its optimizer step and its checkpoint write, and a commit after that write would
   leave a window (a kill between the two) in which a group trained into checkpoint ``g`` returns at
   its lease deadline and is trained again. A commit at ``g`` taken early is exactly-once relative
   to checkpoints all the same: a checkpoint at ``g`` or later covers it, and a resume from ``c < g``
   requeues it (1). A kill between the lease and its commit leaves the lease to its deadline.
3. ``_save_checkpoint`` calls ``trainer.checkpoint_callback_class``'s ``on_save`` after it wrote
   ``latest_checkpointed_iteration.txt``: QueueCheckpointCallback then lets the queue drop the data
   that checkpoint covers (``checkpoint(g)``). With ``async_save`` the checkpoint is not durable yet
   when the hook runs, so nothing is dropped (a later synchronous save drops it).
4. Staleness. verl's ``max_off_policy_threshold`` T counts the steps a trajectory spans
   (``g - dispatch step + 1``); the queue's ``max_staleness`` counts policy versions, one per step
   when verl's weights reach the workers through the ``rollout_queue`` checkpoint engine, so the two
   agree when ``max_staleness = T - 1`` (None, strictly on-policy, for T = 1); any other pairing is
   refused at construction. ``drop``: the queue's bound evicts a stale group at lease time and it is
   generated again. ``wait`` (dropless): the queue's admission control keeps generation within the
   bound, so nothing goes stale, and the sampler blocks for fresh groups up to ``wait_s``, then
   raises StreamStarved with the queue's state; a queue with admission control off is refused.
5. "val" goes to verl's own sampler unchanged (verl's rollout generates validation). verl still
   dispatches its dataloader's prompts each step (``prepare_step``); nothing trains those groups,
   so each "train" call clears the terminal ones from TransferQueue.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.checkpoint_callback import CheckpointCallback
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from rollout_queue.api.lease import error_reason
from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError, StreamStarved
from rollout_queue.integrations.environment import queue_address
from rollout_queue.integrations.stream import TrainingStream
from rollout_queue.integrations.verl.trajectories import is_queue_key, to_rows

log = logging.getLogger("rollout_queue.integrations.verl")

__all__ = ["QueueCheckpointCallback", "QueueReplayBuffer", "SamplerSettings"]

_SAMPLER_KWARGS = "trainer.v1.sampler.sampler_kwargs"


@dataclass(frozen=True)
class SamplerSettings:
    """``trainer.v1.sampler.sampler_kwargs``: where the queue is and how long a step may wait."""

    url: str
    queue: str
    wait_s: float = 600.0
    lease_timeout_s: float | None = None
    tokenizer: str | None = None   # only for groups submitted without prompt_token_ids

    @classmethod
    def from_kwargs(cls, kwargs: Any) -> "SamplerSettings":
        """From verl's DictConfig (or a dict); ``url``/``queue`` fall back to the environment
        (``queue_address``). Raises IntegrationConfigError naming the missing or unknown key."""
        given = dict(kwargs or {})
        unknown = set(given) - {"url", "queue", "wait_s", "lease_timeout_s", "tokenizer"}
        if unknown:
            raise IntegrationConfigError(f"unknown trainer.v1.sampler.sampler_kwargs {sorted(unknown)}: the queue "
                                         "sampler takes url, queue, wait_s, lease_timeout_s, tokenizer")
        url, queue = queue_address(given.get("url"), given.get("queue"), needs="the queue sampler",
                                   keys=(f"+{_SAMPLER_KWARGS}.url", f"+{_SAMPLER_KWARGS}.queue"))
        wait_s = float(given.get("wait_s", 600.0))
        timeout = given.get("lease_timeout_s")
        if wait_s <= 0 or (timeout is not None and float(timeout) <= 0):
            raise IntegrationConfigError(f"wait_s and lease_timeout_s must be > 0, got {wait_s}, {timeout}")
        return cls(url, queue, wait_s, None if timeout is None else float(timeout),
                   given.get("tokenizer"))


def check_staleness(queue: RolloutQueue, threshold: int | None, strategy: str) -> None:
    """Item 4 of the module docstring. Raises IntegrationConfigError saying which setting to change."""
    bound = queue.config.max_staleness
    if threshold is not None and bound != (None if threshold == 1 else threshold - 1):
        want = "null (strictly on-policy)" if threshold == 1 else str(threshold - 1)
        have = "strictly on-policy" if bound is None else f"max_staleness={bound}"
        raise IntegrationConfigError(
            f"trainer.v1.sampler.max_off_policy_threshold={threshold} spans {threshold} steps, but queue "
            f"{queue.name!r} is {have}: set the queue's max_staleness to {want}, or the threshold to "
            f"{1 if bound is None else bound + 1} (the queue enforces its own bound at lease time)")
    if threshold is None:
        log.info("max_off_policy_threshold is null: the queue's own bound applies (max_staleness=%s)", bound)
    if strategy == "wait" and queue.config.batch_groups is None:
        raise IntegrationConfigError(
            f"max_off_policy_strategy=wait is dropless: it needs the queue's admission control, and queue "
            f"{queue.name!r} has batch_groups=None (off); leave batch_groups to the trainer (the default) or set "
            "it, or use max_off_policy_strategy=drop (the queue then evicts stale groups and generates them again)")


class QueueReplayBuffer(ReplayBufferAsync):
    """verl's ``ReplayBuffer`` whose "train" batches are leases of the queue (module docstring).

    The constructor is verl's custom-sampler contract (``PPOTrainer._build_replay_buffer``); it
    connects at once, so a wrong URL, queue name or staleness pairing fails before verl starts
    its workers. Raises IntegrationConfigError, QueueNotFound.
    """

    def __init__(self, trainer_mode: str, trainer_config: Any, max_off_policy_threshold: int | None,
                 max_off_policy_strategy: str, sampler_kwargs: Any, poll_interval: float = 2.0,
                 refill_fn: Any = None, **kwargs: Any) -> None:
        super().__init__(trainer_mode=trainer_mode, trainer_config=trainer_config,
                         max_off_policy_threshold=max_off_policy_threshold,
                         max_off_policy_strategy=max_off_policy_strategy, sampler_kwargs=sampler_kwargs,
                         poll_interval=poll_interval, refill_fn=refill_fn, **kwargs)
        self.settings = SamplerSettings.from_kwargs(sampler_kwargs)
        queue = RolloutQueue.from_url(self.settings.url, self.settings.queue, create=False)
        check_staleness(queue, max_off_policy_threshold, max_off_policy_strategy)
        # Acks per published version: verl publishes once per step, after parameter_sync_step samples.
        per_version = int((trainer_config or {}).get("parameter_sync_step", 1) or 1)
        self.stream = TrainingStream(queue, wait_s=self.settings.wait_s,
                                     lease_timeout_s=self.settings.lease_timeout_s, publish_every=per_version)
        self._tokenizer: Any = None
        #: the step verl resumed from, once the first "train" call restored the queue to it
        self.resumed_from: int | None = None

    # -- verl's sampler contract ------------------------------------------------------------------

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """``batch_size`` leased groups for step ``global_steps``, committed at that step and written
        into TransferQueue; "val" is verl's. Raises StreamStarved after ``wait_s``, LeaseLost,
        CheckpointPruned (verl resumed from a checkpoint older than one the queue already took)."""
        if partition_id != "train":
            return super().sample(global_steps, partition_id, batch_size)
        self._resume(global_steps)
        self._clear_verl_dispatched()
        started = time.monotonic()
        lease = self.stream.next(batch_size)
        try:
            keys, fields, tags = to_rows(lease.groups, global_steps, self._tokenizer_for(lease.groups))
            stale_max, stale_mean = lease.staleness
        except Exception as exc:
            self.stream.rollback(error_reason(exc))   # counted: a group that cannot be converted dead-letters
            raise
        self.stream.ack(global_steps)                 # item 2: committed at the step that trains it
        tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
        metrics = {"rollout_queue/lease_wait_s": time.monotonic() - started,
                   "rollout_queue/staleness/max": float(stale_max), "rollout_queue/staleness/mean": stale_mean,
                   "rollout_queue/groups": float(len(lease))}
        return KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """Completed groups the queue holds (what a lease could take now)."""
        if partition_id != "train":
            return super().get_sampleable_count(global_steps, partition_id)
        self._resume(global_steps)
        return int(self.stream.stats().completed)

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int) -> tuple[set[str], dict]:
        """Block until the queue holds ``target_count`` completed groups (verl's hybrid switch waits
        here); raises StreamStarved after ``wait_s`` with the queue's state."""
        if partition_id != "train":
            return super().wait_for_sampleable(global_steps, partition_id, target_count)
        self._resume(global_steps)
        started = time.monotonic()
        while True:
            stats = self.stream.stats()
            if stats.completed >= target_count:
                return set(), {}
            waited = time.monotonic() - started
            if waited >= self.settings.wait_s:
                raise StreamStarved(self.stream.queue.name, target_count, waited, stats)
            time.sleep(min(self.poll_interval, 0.5))

    # -- the queue's side of verl's checkpoints ---------------------------------------------------

    def checkpoint(self, global_step: int) -> int:
        """verl saved ``global_step`` durably: let the queue drop the data that checkpoint covers."""
        return self.stream.checkpoint(global_step)

    def _resume(self, global_steps: int) -> None:
        """Item 1, once: restore the queue to the step verl resumed from, and clear this package's rows
        a TransferQueue checkpoint brought back (their groups are requeued or were trained)."""
        if self.resumed_from is not None:
            return
        if global_steps < 1:
            raise IntegrationConfigError(f"sample(global_steps={global_steps}): verl's steps start at 1")
        requeued = self.stream.restore(global_steps - 1)
        self.resumed_from = global_steps - 1
        own = [k for k in (tq.kv_list("train") or {}).get("train", {}) if is_queue_key(k)]
        if own:
            tq.kv_clear(keys=own, partition_id="train")
        log.info("queue %s restored to step %d: %d group(s) requeued, %d stale row(s) cleared",
                 self.stream.queue.name, self.resumed_from, requeued, len(own))

    def _clear_verl_dispatched(self) -> None:
        """Item 5: verl's own terminal prompt groups (and their trajectories) go; nothing trains them."""
        items = (tq.kv_list("train") or {}).get("train", {})
        done = {k for k, tag in items.items()
                if tag.get("is_prompt") and tag.get("status") in ("finished", "failure") and not is_queue_key(k)}
        if done:
            tq.kv_clear(keys=[*done, *(k for k in items if k.split("_")[0] in done and k not in done)],
                        partition_id="train")

    def _tokenizer_for(self, groups: Any) -> Any:
        """The tokenizer of ``sampler_kwargs.tokenizer``, loaded once and only when a group lacks
        prompt token ids."""
        if self._tokenizer is None and self.settings.tokenizer and any(
                g.group.prompt_token_ids is None for g in groups):
            from transformers import AutoTokenizer
            self._tokenizer = AutoTokenizer.from_pretrained(self.settings.tokenizer)
        return self._tokenizer


class QueueCheckpointCallback(CheckpointCallback):
    """``trainer.checkpoint_callback_class``: after verl saved step ``global_step``, the queue drops the
    data it covers (module docstring, item 3)."""

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False,
                **kwargs: Any) -> None:
        buffer = getattr(trainer, "replay_buffer", None)
        if not isinstance(buffer, QueueReplayBuffer):
            raise IntegrationConfigError(
                "QueueCheckpointCallback needs the queue sampler: set trainer.v1.sampler.custom_sampler.path="
                "pkg://rollout_queue.integrations.verl.sampler and .name=QueueReplayBuffer")
        if async_save:
            log.warning("step %d saved asynchronously (not durable yet): the queue keeps its data until a "
                        "synchronous save covers it", global_step)
            return
        dropped = buffer.checkpoint(global_step)
        log.info("queue %s checkpointed at step %d (%d payloads dropped, %s)", buffer.stream.queue.name,
                 global_step, dropped, checkpoint_dir)
