"""verl fully_async's ``MessageQueue``, durable: the Ray actor between its rollouter and its trainer,
backed by the queue (read at verl 0.9.1, ``verl/experimental/fully_async_policy/``).

``fully_async_main.py`` builds ``MessageQueue.remote(config, max_queue_size)`` by name; the patch in
``patches/`` makes that name this class (docs/integrations/verl.md). Its interface is verl's, method
for method (verl's ``MessageQueueClient`` drives it unchanged); what a method does:

1. ``put_sample(bytes)``: the rollouter's finished group (verl cloudpickles it; it is carried as
   opaque bytes, never unpickled here) is submitted as a one-slot group whose payload holds it,
   keyed by its sha256, so a retried put stores it once; then this actor, as a queue worker,
   completes the ready groups with a placeholder sample, which makes them leasable. The group is
   durable once the submit returned; a death before the completion leaves it ready, and the next
   ``put_sample`` or ``get_sample`` (of this actor or of a restarted one) completes it.
2. ``get_sample()``: leases one group and commits it at once **at verl's step**: the k-th sample
   this actor hands out belongs to step ``resumed * trigger_parameter_sync_step + k // required_samples
   + 1``, with verl's ``required_samples = ppo_mini_batch_size * require_batches`` (the trainer asks
   for exactly that many per step, in order). A commit taken at hand-out is exactly-once relative to
   checkpoints, as the V1 sampler's (``sampler.py``, item 2): a checkpoint at that step or later
   covers it, a resume from an earlier one requeues it. A death between the lease and its commit
   leaves the lease to its deadline (the group comes back).
3. Checkpoints: verl's trainer writes ``latest_checkpointed_iteration.txt`` (a param version ``p``)
   after each save; at the first ``get_sample`` of each step this actor reads it and lets the queue
   drop what ``p``'s steps committed. At construction it reads the checkpoint verl will resume from
   (``trainer.resume_mode``, as ``FullyAsyncTrainer.load_checkpoint`` does) and restores the queue
   to it: every group handed out after it comes back, once.
4. ``put_sample(None)`` (the rollouter is done) is remembered in this process: ``get_sample`` answers
   ``(None, size)`` once nothing put is left to hand out, as verl's queue does after its last sample.
   ``clear_queue`` drops nothing durable (verl calls it in a ``finally`` on every exit, interrupted
   or not: the data must outlive it). Validation data (``put_validate``) stays in memory, as verl's.
5. The queue does no dropping of its own: verl's rollouter paces itself on ``get_queue_size``
   (every group put and not handed out), and ``put_sample`` always answers True.

Settings: ``+rollout_queue.url=...`` and ``+rollout_queue.queue=...`` in verl's config (or
REDIS_URL / ROLLOUT_QUEUE in the environment, as every process of the project reads them); the queue is created if missing (admission control off,
``max_completed_groups`` at least ``max_queue_size``). Redis calls run on a thread: the actor's event
loop keeps serving the rollouter while the trainer waits.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import os
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import ray

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import IntegrationConfigError, LeasesOpen, QueueNotFound
from rollout_queue.core.models import Sample, SourceGroup
from rollout_queue.integrations.environment import queue_address

log = logging.getLogger("rollout_queue.integrations.verl")

__all__ = ["MessageQueue", "QueueMessageQueue", "StepClock"]

#: The payload field that carries verl's bytes (base64: payloads are JSON).
BLOB = "verl_sample"
#: How long one wait for a completed group blocks a thread before the loop looks again (ms).
BLOCK_MS = 500
#: Ready groups one completion pass settles.
SETTLE_BATCH = 32


@dataclass(frozen=True)
class StepClock:
    """Which verl step the k-th sample handed out belongs to, and which step a param version's
    checkpoint covers (module docstring, items 2 and 3)."""

    per_step: int         # required_samples
    per_version: int      # trigger_parameter_sync_step
    resumed: int = 0      # the param version verl resumed from

    def step(self, handed: int) -> int:
        return self.resumed * self.per_version + handed // self.per_step + 1

    def covered(self, version: int) -> int:
        return version * self.per_version

    @classmethod
    def from_config(cls, config: Any) -> "StepClock":
        """From verl's config, the way FullyAsyncTrainer reads it. Raises IntegrationConfigError."""
        try:
            per_step = (int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
                        * int(config.async_training.require_batches))
            per_version = int(config.async_training.trigger_parameter_sync_step)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise IntegrationConfigError(
                "the queue's MessageQueue needs verl's actor_rollout_ref.actor.ppo_mini_batch_size, "
                f"async_training.require_batches and async_training.trigger_parameter_sync_step ({exc})") from exc
        if per_step < 1 or per_version < 1:
            raise IntegrationConfigError(f"required_samples={per_step} and trigger_parameter_sync_step={per_version} "
                                         "must be >= 1")
        return cls(per_step, per_version, resumed_version(config))


def resumed_version(config: Any) -> int:
    """The param version verl's trainer will resume from (``FullyAsyncTrainer.load_checkpoint``)."""
    mode = config.trainer.get("resume_mode", "auto")
    if mode == "disable":
        return 0
    if mode == "resume_path":
        return int(str(config.trainer.resume_from_path).split("global_step_")[-1].strip("/"))
    return checkpointed_version(config) or 0


def checkpointed_version(config: Any) -> int | None:
    """The param version of verl's newest durable checkpoint (its tracker file), or None."""
    folder = os.path.abspath(str(config.trainer.default_local_dir))
    try:
        with open(os.path.join(folder, "latest_checkpointed_iteration.txt")) as tracker:
            return int(tracker.read().strip())
    except (OSError, ValueError):
        return None  # no checkpoint yet, or one being written: the next look will see it


class QueueMessageQueue:
    """verl's ``MessageQueue`` interface over the queue (module docstring). ``MessageQueue`` below is
    this class as the Ray actor verl creates. Raises IntegrationConfigError, CheckpointPruned (verl
    resumes from a checkpoint older than one the queue already dropped data for)."""

    def __init__(self, config: Any, max_queue_size: int = 1000):
        self.config = config
        if max_queue_size is None:
            raise ValueError(f"max_queue_size cannot be None, got: {max_queue_size}")
        self.max_queue_size = int(max_queue_size)
        self.clock = StepClock.from_config(config)
        self.queue = open_queue(config, self.max_queue_size)
        self.worker = self.queue.worker(f"verl-mq-{uuid.uuid4().hex[:12]}")
        requeued = self.queue.restore(self.clock.covered(self.clock.resumed))
        self.checkpointed = self.clock.resumed
        self.val_queue: deque[Any] = deque()
        self.running, self.finished = True, False
        self.total_produced = self.total_consumed = self.handed = 0
        self._lock = asyncio.Lock()
        self._settle()
        log.info("queue %s restored to param version %d (%d group(s) requeued)", self.queue.name,
                 self.clock.resumed, requeued)

    async def put_sample(self, sample: Any) -> bool:
        """Store verl's sample durably (item 1); None: the rollouter is done (item 4)."""
        if sample is None:
            self.finished = True
            return True
        if not isinstance(sample, bytes):
            raise IntegrationConfigError(f"put_sample takes the bytes verl's rollouter sends "
                                         f"(ray.cloudpickle.dumps), got {type(sample).__name__}")
        digest = hashlib.sha256(sample).hexdigest()[:32]
        group = SourceGroup(f"verl-{digest}", "", 1, {BLOB: base64.b64encode(sample).decode()})
        await asyncio.to_thread(self.queue.submit, [group])
        self.total_produced += 1
        await asyncio.to_thread(self._settle)
        return True

    async def get_sample(self) -> Any | None:
        """The next sample and the groups left, committed at its verl step (item 2): waits until one
        is there; ``(None, size)`` once the rollouter is done and nothing is left; None after shutdown."""
        async with self._lock:  # one hand-out at a time: the step of each is its place in the order
            while self.running:
                if self.handed % self.clock.per_step == 0:
                    await asyncio.to_thread(self._drop_checkpointed)
                lease = await asyncio.to_thread(self._lease)
                if lease is not None:
                    await asyncio.to_thread(lease.commit, self.clock.step(self.handed))
                    self.handed += 1
                    self.total_consumed += 1
                    blob = base64.b64decode(lease.groups[0].group.metadata[BLOB])
                    return blob, await self.get_queue_size()
                if self.finished and await self.get_queue_size() == 0:
                    return None, 0
            return None

    async def get_queue_size(self) -> int:
        """Groups put and not handed out yet (what verl's rollouter paces itself on); a group in a lease
        not committed yet counts (its hand-out may have died: it comes back at the lease's deadline)."""
        stats = await asyncio.to_thread(self.queue.stats)
        return int(stats.ready + stats.executing_groups + stats.completed + stats.leased)

    async def get_statistics(self) -> dict[str, Any]:
        return {"queue_size": await self.get_queue_size(), "total_produced": self.total_produced,
                "total_consumed": self.total_consumed, "dropped_samples": 0, "max_queue_size": self.max_queue_size}

    async def clear_queue(self) -> None:
        """Drops nothing durable (item 4); the in-memory validation data goes."""
        self.val_queue.clear()
        log.info("clear_queue: queue %s keeps its groups (durable across restarts)", self.queue.name)

    async def shutdown(self) -> None:
        self.running = False

    async def get_memory_usage(self) -> dict:
        """The samples live in Redis, not in this process."""
        return {"queue_samples": await self.get_queue_size(), "estimated_memory_bytes": 0, "estimated_memory_mb": 0.0}

    async def put_validate(self, data: Any) -> None:
        self.val_queue.append(data)

    async def get_validate(self) -> Any | None:
        return self.val_queue.popleft() if self.val_queue else None

    # -- the queue's side ------------------------------------------------------------------------------

    def _settle(self) -> None:
        """Complete every ready group with a placeholder sample (its data is the submitted payload)."""
        while True:
            reservations = self.worker.reserve(SETTLE_BATCH)
            if not reservations:
                return
            placeholder = [Sample(slot=0, token_ids=(0,), logprobs=(0.0,), reward=0.0)]
            self.worker.complete_many([(r.receipt, placeholder) for r in reservations])

    def _lease(self) -> Any:
        """One completed group, or None after a short block; groups put but not completed (a death
        inside ``put_sample``) are completed first, and dead leases and workers reaped."""
        self._settle()
        lease = self.queue.lease(1, block_ms=BLOCK_MS)
        if lease is None:
            self.queue.reap()
        return lease

    def _drop_checkpointed(self) -> None:
        """Item 3: verl saved a newer checkpoint; the queue drops the data it covers."""
        version = checkpointed_version(self.config)
        if version is None or version <= self.checkpointed:
            return
        try:
            self.queue.checkpoint(self.clock.covered(version))
        except LeasesOpen:
            return  # a hand-out is mid-commit (never here: hand-outs hold the lock); the next step retries
        self.checkpointed = version


def open_queue(config: Any, max_queue_size: int) -> RolloutQueue:
    """The queue named in verl's config (``rollout_queue.url`` / ``.queue``, or the environment:
    ``queue_address``), created when missing. Raises IntegrationConfigError when neither names it."""
    node = config.get("rollout_queue") or {}
    url, name = queue_address(node.get("url"), node.get("queue"), needs="the queue's MessageQueue",
                              keys=("+rollout_queue.url", "+rollout_queue.queue"))
    try:
        queue = RolloutQueue.from_url(str(url), str(name), create=False)
    except QueueNotFound:
        # A hand-out is a lease and its commit, milliseconds apart: a lease left by a death in between
        # comes back after a minute, not after the default ten.
        config_new = QueueConfig(batch_groups=None, max_completed_groups=max(1024, max_queue_size),
                                 lease_timeout_s=60.0)
        return RolloutQueue.from_url(str(url), str(name), config_new)
    if queue.stats().version_published:
        # Its groups carry version 0 (verl tracks staleness itself): against a published version the
        # queue would judge every one stale and generate it again, forever.
        queue.close()
        raise IntegrationConfigError(f"queue {name!r} has a published policy version: verl's MessageQueue needs a "
                                     "queue of its own (not the one the rollout_queue checkpoint engine publishes to)")
    return queue


#: What ``fully_async_main.py`` creates (``MessageQueue.remote(config, max_queue_size)``), with verl's
#: own actor options.
MessageQueue = ray.remote(num_cpus=2, max_concurrency=20)(QueueMessageQueue)
