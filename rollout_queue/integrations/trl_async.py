"""TRL's ``AsyncGRPOTrainer`` (``trl.experimental.async_grpo``, TRL 1.16) with rollout-queue workers.

::

    worker = QueueRolloutWorker(queue, max_staleness=config.max_staleness)
    transfer = QueueWeightTransfer(queue, weights_dir="/shared/weights", config_dir=model_dir)
    trainer = AsyncGRPOTrainer(model=..., args=config, train_dataset=..., reward_funcs=...,
                               rollout_worker=worker, weight_transfer=transfer, callbacks=[worker.callback])

``QueueRolloutWorker`` is TRL's ``RolloutWorkerProtocol``: a thread leases completed groups (one per
lease) and puts their samples, TRL's own ``RolloutSample`` objects with group-normalised advantages
and the workers' behaviour logprobs, on ``rollout_buffer``. What TRL's own worker cannot do, it does:

1. A group is committed only once all its samples were handed to the trainer and the optimizer
   step that trained them ended (``worker.callback``: ``on_step_end``); ``on_save`` rolls back the
   groups still waiting in the buffer (untouched: requeued, not counted) and checkpoints the queue;
   every run restores the queue to the step it starts from (0 for a fresh start). TRL's own
   worker restarts from a prompt index and loses what was buffered.
2. A group the trainer would drop as too stale (``model_version - version > max_staleness``,
   TRL's ``RolloutQueueDataset`` rule) is not handed out: it is rolled back and regenerated with fresh
   weights, so a stale drop never loses a prompt or pins the resume position (trl#7274). A sample's
   ``model_version`` is its oldest token's (``Sample.version``), so no token older than TRL's bound is
   trained; its ``old_log_probs`` are the workers' behaviour logprobs token by token, which TRL's
   loss takes its per-token ratio against (a sample whose generation spanned weight updates is
   corrected token by token). Each group handed out reports its tokens' staleness
   (``queue/token_staleness_max`` / ``_mean``, by ``Sample.segments``) on ``metrics_queue``.
3. ``check_health`` raises the feeding thread's error (StreamStarved when no batch came; WorkersGone,
   within ``worker_timeout_s + fleet_grace_s`` of the last heartbeat, when every worker died) instead
   of letting the trainer wait on an empty buffer.
4. Admission control: at train begin, a queue whose config left ``batch_groups`` to the trainer
   (QueueConfig's default) gets the groups TRL trains per weight sync (``size_admission``), so the
   workers run at most ``max_staleness + 1`` versions ahead instead of without bound. A number or
   None (off) in the queue's config is the user's and is kept.

Whole groups per step: use TRL's ``FixedCountBatcher`` (``token_budget=0``) with a micro-batch size
that is a multiple of ``num_generations``, so no group straddles two optimizer steps; a checkpoint
while a group is half handed out raises IntegrationConfigError.

``QueueWeightTransfer`` is TRL's ``WeightTransferProtocol``: ``pause`` opens an admission hold,
``send_weights`` writes the streamed tensors as a safetensors folder (with the model's config files),
``resume`` publishes it as the next policy version under the hold and releases it. Workers load it
before their next reservation; no NCCL group that a dead peer could hang.

The trainer itself loads its model with FlashAttention-3 in TRL 1.16 and needs a GPU; everything here
(the buffer, TRL's dataset, batcher and collator over it, the weight folders) runs on a CPU and is
tested there (tests/integrations/test_trl_async.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import queue as queues
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from rollout_queue.api.lease import Hold, Lease, error_reason
from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.config import DERIVED
from rollout_queue.core.errors import IntegrationConfigError, InvalidInput, RolloutQueueError
from rollout_queue.integrations.stream import TrainingStream, derive_admission
from rollout_queue.ops.logs import fields
from rollout_queue.rl.trainer import grpo_advantages

log = logging.getLogger("rollout_queue.integrations.trl_async")

__all__ = ["QueueRolloutWorker", "QueueWeightTransfer", "rollout_samples", "token_staleness"]


def rollout_samples(lease: Lease, group_ids: Iterator[int], *, scale_by_std: bool = True) -> list[RolloutSample]:
    """TRL's RolloutSamples of a lease: per sample ``input_ids`` = prompt + completion,
    ``completion_mask`` 0 on the prompt (and on a trajectory's observations), ``old_log_probs`` the behaviour
    logprobs (0 on the prompt),
    the GRPO advantage within its group, the sample's policy version and one ``group_id`` per group.
    ``prompt`` and ``completion`` are chat messages, as TRL declares them (its trace logging concatenates
    them): the group's prompt text as one user message, and no completion message (the samples are
    token ids; nothing here decodes them)."""
    out = []
    now = time.time()
    for group in lease.groups:
        prompt = group.group.prompt_token_ids
        if prompt is None:
            raise InvalidInput(f"group {group.entry_id} has no prompt_token_ids: submit tokenized prompts for "
                               "TRL's token-level samples (the producer's tokenize=, e.g. "
                               "run_producer(..., tokenize=tok.encode))")
        rewards = [s.reward for s in group.samples if s.reward is not None]
        if len(rewards) != len(group.samples):
            raise InvalidInput(f"group {group.entry_id} has samples without a reward: configure the workers' --reward")
        (advantages,) = grpo_advantages([[float(r) for r in rewards]], scale_by_std=scale_by_std)
        gid = next(group_ids)
        for sample, advantage in zip(group.samples, advantages):
            ids = list(prompt) + list(sample.token_ids)
            logprobs = list(sample.logprobs) if sample.logprobs else [0.0] * len(sample.token_ids)
            out.append(RolloutSample(
                prompt=[{"role": "user", "content": group.group.prompt}], completion=[], input_ids=np.asarray(ids, dtype=np.int64),
                completion_mask=np.asarray([0] * len(prompt) + list(sample.loss_mask), dtype=np.int64),
                old_log_probs=np.asarray([0.0] * len(prompt) + logprobs, dtype=np.float32),
                advantage=float(advantage), model_version=int(sample.version), group_id=gid,
                metrics={"reward": float(sample.reward or 0.0)}, enqueued_at=now))
    return out


def token_staleness(lease: Lease, model_version: int) -> dict[str, float]:
    """The staleness of a lease's trained tokens at ``model_version``, each by its own version
    (``Sample.segments``): ``queue/token_staleness_max`` and ``_mean``."""
    worst, total, count = 0, 0, 0
    for group in lease.groups:
        cols = group.columns()
        trained = np.frombuffer(cols.loss_mask(), dtype=np.uint8).astype(bool)
        ages = np.maximum(model_version - np.frombuffer(cols.token_versions(), dtype=np.int32)[trained], 0)
        if ages.size:
            worst, total, count = max(worst, int(ages.max())), total + int(ages.sum()), count + int(ages.size)
    return {"queue/token_staleness_max": float(worst), "queue/token_staleness_mean": total / max(1, count)}


@dataclass
class _Held:
    """A lease whose samples sit in (or left) the buffer."""

    lease: Lease
    total: int
    taken: int = 0
    skipped: bool = False


class _Buffer(queues.Queue):
    """``rollout_buffer``: a queue.Queue that tells its worker which sample left it, so a group's
    lease is settled by what the trainer actually took (and a too-stale group is never handed out)."""

    def __init__(self, worker: "QueueRolloutWorker") -> None:
        super().__init__()
        self.worker = worker

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        while True:
            item = super().get(block, timeout)
            if self.worker._hand_out(item):
                return item


class QueueRolloutWorker:
    """TRL's RolloutWorkerProtocol over the queue (module docstring)."""

    def __init__(self, queue: RolloutQueue, *, max_staleness: int = 4, buffer_groups: int = 8,
                 wait_s: float = 600.0, lease_timeout_s: float | None = None, scale_by_std: bool = True,
                 trainer_id: str | None = None, fleet_grace_s: float | None = None) -> None:
        """``fleet_grace_s``: how long no worker may be live, while groups wait for one, before the
        filler stops with WorkersGone (check_health raises it; None: the queue's worker_timeout_s)."""
        self.queue = queue
        self.max_staleness = max_staleness
        self.buffer_groups = buffer_groups
        self.scale_by_std = scale_by_std
        self.stream = TrainingStream(queue, groups_per_step=1, wait_s=wait_s, lease_timeout_s=lease_timeout_s,
                                     trainer_id=trainer_id, block_ms=200, publish_every=None,
                                     fleet_grace_s=fleet_grace_s)
        self.rollout_buffer = _Buffer(self)
        self.metrics_queue: queues.Queue[dict[str, Any]] = queues.Queue()
        self.model_version = 0
        self.error: BaseException | None = None
        self.last_put = time.monotonic()
        self._held: dict[int, _Held] = {}       # id(sample) -> its lease's record, until handed out
        self._leases: list[_Held] = []          # every lease not yet committed or rolled back, oldest first
        self._lock = threading.RLock()          # the filler thread and the trainer's thread share _leases
        self._group_ids = itertools.count()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- RolloutWorkerProtocol ------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._fill, name="queue-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop filling and roll back every lease not committed (its groups go back to ready)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        with self._lock:
            for held in self._leases:
                self._rollback(held, "the trainer stopped")
            self._leases.clear()
            self._held.clear()

    def update_model_version(self, model_version: int) -> None:
        self.model_version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise the filler's error (StreamStarved, a queue error), or if it died or stalled."""
        if self.error is not None:
            raise self.error
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("QueueRolloutWorker is not running: call start() (the trainer does at train begin)")
        if time.monotonic() - self.last_put > stale_after_s and self.rollout_buffer.empty():
            raise RuntimeError(f"no rollout in {stale_after_s:.0f} s: are `rollout-queue worker` processes running?")

    # -- the filler thread ---------------------------------------------------------------------

    def _fill(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    waiting = sum(1 for h in self._leases if not h.taken)
                if waiting >= self.buffer_groups:
                    self._stop.wait(0.05)
                    continue
                lease = self.stream.take(stop=self._stop)  # settled here, group by group, not by ack()
                if lease is None:
                    break
                try:
                    samples = rollout_samples(lease, self._group_ids, scale_by_std=self.scale_by_std)
                except Exception as exc:  # the data: handed back counted (DESIGN rule 4), then surfaced
                    self._rollback(_Held(lease, 0), "its samples could not be built", error_reason(exc))
                    raise
                held = _Held(lease, len(samples))
                with self._lock:
                    self._leases.append(held)
                    for sample in samples:
                        self._held[id(sample)] = held
                for sample in samples:
                    self.rollout_buffer.put(sample)
                self.last_put = time.monotonic()
        except BaseException as exc:  # surfaced by check_health: a thread must not die silently
            log.error("the rollout worker stopped on an error", exc_info=exc)
            self.error = exc

    def _hand_out(self, sample: Any) -> bool:
        """The trainer takes ``sample``: True to hand it out, False to skip it (its group is too stale
        for the trainer and was rolled back to be regenerated)."""
        with self._lock:
            held = self._held.pop(id(sample), None)
            if held is None:
                return True  # not ours (a test put it there): pass it through
            if held.skipped:
                return False
            if held.taken == 0 and self.model_version - sample.model_version > self.max_staleness:
                held.skipped = True
                self._leases.remove(held)
                self._rollback(held, "too stale for the trainer")
                self.metrics_queue.put({"queue/stale_requeued": 1.0})
                return False
            if held.taken == 0:
                self.metrics_queue.put(token_staleness(held.lease, self.model_version))
            held.taken += 1
            return True

    def _rollback(self, held: _Held, why: str, error: str | None = None) -> None:
        """Hand a lease back: plain (stop, staleness, checkpoint), or errored with ``error``."""
        try:
            held.lease.rollback(error)
        except (RolloutQueueError, OSError) as exc:
            log.warning("rollback failed; the reaper requeues the lease at its deadline", exc_info=exc,
                        extra=fields(queue=self.queue.name, lease=held.lease.lease_id, reason=why))

    # -- settlement (worker.callback) ----------------------------------------------------------

    def settle(self, step: int) -> int:
        """The optimizer step ``step`` ended: commit every group whose samples were all handed out.
        Returns how many groups were committed."""
        with self._lock:
            done = [h for h in self._leases if h.taken == h.total]
            for held in done:
                held.lease.commit(step=step)
                self._leases.remove(held)
        if done:
            self.metrics_queue.put({"queue/committed_groups": float(len(done))})
        return len(done)

    def checkpoint(self, step: int) -> int:
        """Before the queue checkpoints ``step``: roll back the groups still waiting in the buffer
        (the checkpoint must not cover an open lease), then drop the data the checkpoint covers."""
        with self._lock:
            partial = [h for h in self._leases if 0 < h.taken < h.total]
            if partial:
                raise IntegrationConfigError(
                    f"checkpoint {step}: {len(partial)} group(s) half handed to the trainer. Use FixedCountBatcher "
                    "(token_budget=0) with a micro-batch size that is a multiple of num_generations")
            for held in self._leases:
                held.skipped = True  # its samples still in the buffer are skipped when taken
                self._rollback(held, "checkpoint")
            self._leases.clear()
            return self.stream.checkpoint(step)

    def size_admission(self, args: TrainingArguments) -> None:
        """Item 4: where the queue's config left ``batch_groups`` to the trainer, set it to the groups
        TRL trains per weight sync: with FixedCountBatcher (``token_budget <= 0``) an optimizer step
        takes per_device_train_batch_size x gradient_accumulation_steps x processes samples, and a
        version is published every ``weight_sync_steps`` steps. With token budgeting the samples per
        step are not fixed, so nothing is derived (logged: set batch_groups on the queue yourself)."""
        if self.queue.config.batch_groups is not DERIVED:
            return
        # AsyncGRPOConfig's fields, read by name: a plain TrainingArguments has none of them.
        given_generations, given_sync_steps = (getattr(args, name, None) for name in ("num_generations",
                                                                                       "weight_sync_steps"))
        budget = getattr(args, "token_budget", None)
        if given_generations is None or given_sync_steps is None or budget is None or budget > 0:
            log.warning("admission control not derived: the groups per weight sync are not fixed (token budgeting, "
                        "or not an AsyncGRPOConfig); open the queue with QueueConfig(batch_groups=<groups per "
                        "weight sync>)", extra=fields(queue=self.queue.name, token_budget=budget))
            return
        generations, sync_steps = max(1, int(given_generations)), max(1, int(given_sync_steps))
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * max(1, args.world_size)
        derive_admission(self.queue, -(-samples // generations) * sync_steps)

    @property
    def callback(self) -> TrainerCallback:
        """The TrainerCallback that settles groups, checkpoints and restores the queue."""
        return _SettleCallback(self)


class _SettleCallback(TrainerCallback):
    def __init__(self, worker: QueueRolloutWorker) -> None:
        self.worker = worker

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **_: Any) -> None:
        # From scratch too (step 0): a run that crashed before its first checkpoint committed groups
        # the weights now training never saw.
        self.worker.stream.restore(state.global_step)
        if state.is_world_process_zero:
            self.worker.size_admission(args)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **_: Any) -> None:
        self.worker.settle(state.global_step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        self.worker.checkpoint(state.global_step)


class QueueWeightTransfer:
    """TRL's WeightTransferProtocol over the queue: weight folders published under a hold."""

    def __init__(self, queue: RolloutQueue, *, weights_dir: str | os.PathLike[str],
                 config_dir: str | os.PathLike[str] | None = None, keep: int = 4,
                 hold_timeout_s: float = 120.0) -> None:
        self.queue, self.root, self.keep, self.hold_timeout_s = queue, Path(weights_dir), keep, hold_timeout_s
        self.config_dir = Path(config_dir) if config_dir is not None else None
        self.hold: Hold | None = None
        self.pending: Path | None = None
        self.version = 0
        self.published: list[Path] = []

    def init_weight_transfer(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.version = int(self.queue.version)

    def pause(self) -> None:
        """Close admission: no reservation starts while the version moves."""
        if self.hold is None:
            self.hold = self.queue.hold(timeout_s=self.hold_timeout_s)

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Write the streamed ``(name, tensor)`` pairs as a folder workers load (atomic: written aside,
        then renamed), with the model's config files when ``config_dir`` is given."""
        from safetensors.torch import save_file

        tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in iterator}
        target = self.root / f"v{self.version + 1:07d}"
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=self.root))
        try:
            save_file(tensors, os.fspath(staging / "model.safetensors"))
            for name in ("config.json", "generation_config.json"):
                if self.config_dir is not None and (self.config_dir / name).exists():
                    shutil.copy(self.config_dir / name, staging / name)
            os.chmod(staging, 0o755)
            if target.exists():
                shutil.rmtree(target)  # a failed earlier send of this version that nobody published
            os.rename(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        self.pending = target

    def resume(self) -> None:
        """Publish the folder just sent as the next policy version, then reopen admission."""
        try:
            if self.pending is not None:
                if self.hold is None:
                    raise IntegrationConfigError("resume() without pause(): the version must move under a hold")
                self.hold.record_weight_update(self.version + 1, os.fspath(self.pending.resolve()))
                self.version += 1
                self.published.append(self.pending)
                self.pending = None
                for old in self.published[:-self.keep]:
                    shutil.rmtree(old, ignore_errors=True)
                self.published = self.published[-self.keep:]
        finally:
            if self.hold is not None:
                self.hold.release()
                self.hold = None

    def destroy(self) -> None:
        if self.hold is not None:
            self.hold.release()
            self.hold = None
