"""A real GRPO trainer on the queue: lease -> tensors -> clipped policy-gradient step -> commit ->
publish weights; checkpoints (model + optimizer) wired to the queue's commit(step)/checkpoint(step).

Used by ``rollout-queue demo`` (on the tiny model) and ``rollout-queue train`` (docker-compose's
trainer service). It owns the optimizer loop and its checkpoint files; everything about the queue
goes through ``rollout_queue.rl.trainer``. Checkpoints are safetensors + JSON (never pickle), so a
resumed trainer is exactly the one that stopped: ``resume`` requeues what was committed after it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.rl.trainer import (
    grpo_loss,
    lease_batch,
    response_logprobs,
    resume,
    save_checkpoint,
)
from rollout_queue.rl.trainer import training_step
from rollout_queue.weights.publisher import Transport, WeightPublisher

log = logging.getLogger("rollout_queue.demo.grpo")


@dataclass(frozen=True)
class GrpoSettings:
    """The trainer's knobs (the demo's defaults suit the tiny model on a CPU)."""

    steps: int = 60
    batch_groups: int = 8
    lr: float = 5e-4
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    lease_timeout_s: float = 120.0
    checkpoint_every: int = 20
    threads: int = 1
    device: str = "cpu"
    seed: int = 0
    trainer_id: str = "grpo-trainer"
    weights_transport: Transport = "folder"  # or "delta": only the tensors that changed; "dist": pushed
    lora_rank: int = 0  # > 0: train a LoRA adapter of this rank on the attention projections, publish adapters
    lora_alpha: float | None = None  # None: 2 * lora_rank
    push_backend: str = "gloo"  # dist: gloo (CPU tensors) or nccl (GPU tensors)
    push_join_s: float = 2.0  # dist: how long workers may join a round
    push_deadline_s: float = 60.0  # dist: the longest a round may take
    weights_uri_base: str | None = None  # workers fetch weights_dir from there (HTTP(S), S3): no shared storage
    weights_upload: bool = False  # copy every version to weights_uri_base (an object store) before recording it


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step saw and did."""

    step: int
    elapsed_s: float
    reward: float
    groups: int
    tokens: int
    staleness_max: int
    staleness_mean: float
    loss: float
    ratio_mean: float
    entry_ids: tuple[str, ...]
    wait_s: float = 0.0      # waiting for a lease (the trainer idle: generation is behind)
    compute_s: float = 0.0   # tensors, forward, backward, optimizer step, commit
    publish_s: float = 0.0   # weights folder + hold + version (+ checkpoint)
    metric: float | None = None  # the task's own per-sample metric (an environment's final "metric"), mean
    #: s from publishing the newest version to this lease, when it is the first to bring samples
    #: generated (at least partly) on that version; None otherwise
    version_lag_s: float | None = None
    #: the trained groups' source_ids, in lease order: what a demo counts its long groups by
    sources: tuple[str, ...] = ()
    #: per group (as ``sources``): the most policy versions one of its samples spanned (its newest
    #: tokens' version minus its oldest's; 0: generated on one version)
    spans: tuple[int, ...] = ()
    #: the largest staleness of a group's newest tokens (the newest any of its samples has, a
    #: trajectory's last model turn): what staleness_mode 'continue', and the fairness rule once it
    #: widened a group's bound, keep within the bound while older tokens (``staleness_max``) may be
    #: past it (importance-corrected in the loss, or masked: grpo_loss stale_tokens)
    newest_staleness_max: int = 0


@dataclass
class TrainerState:
    """Shared with the dashboard thread (append-only lists; read under ``lock``)."""

    records: list[StepRecord] = field(default_factory=list)
    started_at: float | None = None
    resumed_from: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def lora_model(model: Any, rank: int, alpha: float | None = None) -> Any:
    """``model`` with a LoRA adapter on its attention projections (peft): only the adapter trains, and
    ``WeightPublisher`` publishes only the adapter (workers apply it over the base they serve)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise RuntimeError("training a LoRA adapter needs peft: pip install peft") from exc
    # peft annotates lora_alpha as int, yet only divides by it (scaling = lora_alpha / r) and writes it to
    # adapter_config.json as given: a float alpha (--lora-alpha 24.5) is one peft takes, and one
    # weights/lora.py reads back; the cast states peft's real contract, not ours.
    config = LoraConfig(r=rank, lora_alpha=cast(int, alpha if alpha is not None else 2 * rank), lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    return get_peft_model(model, config)


class GrpoTrainer:
    """Runs ``settings.steps`` GRPO steps on ``queue``, publishing weights under ``weights_dir``."""

    def __init__(self, queue: RolloutQueue, model_dir: str | os.PathLike[str], weights_dir: str | os.PathLike[str],
                 settings: GrpoSettings, *, checkpoint_dir: str | os.PathLike[str] | None = None,
                 stop: threading.Event | None = None, state: TrainerState | None = None,
                 on_step: Callable[[StepRecord], None] | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.queue, self.settings = queue, settings
        self.weights_dir = Path(weights_dir)
        push = None
        if settings.weights_transport == "dist":
            from rollout_queue.weights.push import WeightPush

            push = WeightPush(queue, backend=settings.push_backend, join_s=settings.push_join_s,
                              deadline_s=settings.push_deadline_s)
        self.publisher = WeightPublisher(queue, weights_dir, transport=settings.weights_transport,
                                         uri_base=settings.weights_uri_base, push=push,
                                         upload=settings.weights_upload)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.stop = stop or threading.Event()
        self.state = state or TrainerState()
        self.on_step = on_step
        torch.manual_seed(settings.seed)
        torch.set_num_threads(max(1, settings.threads))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # Held as the torch Module it is: transformers declares its ``to`` through functools.wraps, which
        # the type checker reads as an unbound function (wanting the model again as its first argument).
        loaded: torch.nn.Module = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model: Any = loaded.to(settings.device)
        if settings.lora_rank > 0:
            self.model = lora_model(self.model, settings.lora_rank, settings.lora_alpha)
        self.model.train()
        self.optimizer = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=settings.lr)
        self.step = self._resume()
        # Policy versions only grow: a trainer resumed from checkpoint k continues after the last
        # version it published before it stopped (fresh runs: version == step).
        self.version = queue.version
        self._published_at: dict[int, float] = {}  # version -> when published, until its first samples arrive

    def _resume(self) -> int:
        """Load the newest checkpoint, if any, and requeue what was committed after it."""
        if self.checkpoint_dir is None:
            return 0
        done = sorted(int(p.name[5:]) for p in self.checkpoint_dir.glob("step-*") if p.name[5:].isdigit())
        if not done:
            return 0
        step = done[-1]
        folder = self.checkpoint_dir / f"step-{step}"
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(os.fspath(folder / "model.safetensors"), device=self.settings.device))
        load_optimizer(self.optimizer, folder)
        restored = resume(self.queue, step)
        log.info("resumed from checkpoint", extra={"step": step, "requeued": restored})
        self.state.resumed_from = step
        return step

    def run(self) -> list[StepRecord]:
        """Train until ``settings.steps`` or ``stop``; returns every step's record."""
        waited_since = time.monotonic()
        while self.step < self.settings.steps and not self.stop.is_set():
            lease = self.queue.lease(self.settings.batch_groups, timeout_s=self.settings.lease_timeout_s,
                                     block_ms=500, trainer_id=self.settings.trainer_id)
            if lease is None:
                continue
            if self.state.started_at is None:
                self.state.started_at = waited_since = time.monotonic()
            self._train_on(lease, time.monotonic() - waited_since)
            waited_since = time.monotonic()
        return list(self.state.records)

    def _train_on(self, lease: Any, wait_s: float) -> None:
        import torch

        step = self.step + 1
        began = time.monotonic()
        lag = self._version_lag(lease, began)
        with training_step(lease, step=step if self.checkpoint_dir else None):
            batch = lease_batch(lease, tokenizer=self.tokenizer, pad_token_id=self.tokenizer.pad_token_id or 0,
                                device=self.settings.device)
            loss, metrics = grpo_loss(response_logprobs(self.model, batch), batch, clip_eps=self.settings.clip_eps)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
            self.optimizer.step()
        self.step = step
        computed = time.monotonic()
        self.version += 1
        self.publisher.publish(self.model, self.version)
        self._published_at[self.version] = time.monotonic()
        if self.checkpoint_dir and (step % self.settings.checkpoint_every == 0 or step == self.settings.steps):
            save_checkpoint(self.queue, step, self._save)
        staleness = batch.staleness.float()
        assert self.state.started_at is not None
        record = StepRecord(step, time.monotonic() - self.state.started_at, float(batch.rewards.mean()),
                            len(batch.entry_ids), batch.num_response_tokens, int(staleness.max()),
                            float(staleness.mean()), metrics["loss"], metrics["ratio_mean"], batch.entry_ids,
                            wait_s, computed - began, time.monotonic() - computed, _task_metric(lease.groups), lag,
                            *_versions_seen(lease))
        with self.state.lock:
            self.state.records.append(record)
        if self.on_step:
            self.on_step(record)

    def _version_lag(self, lease: Any, now: float) -> float | None:
        """Publish-to-lease time of the newest version, for the first lease with samples on it."""
        newest = max((v for g in lease.groups for s in g.samples for v in (s.versions or (s.version,))), default=None)
        if newest is None or newest not in self._published_at:
            return None
        lag = now - self._published_at[newest]
        for version in [v for v in self._published_at if v <= newest]:  # older ones are no news any more
            del self._published_at[version]
        return lag

    def _save(self, step: int) -> None:
        """Model + optimizer as one folder, written aside and renamed (a crash leaves the last one)."""
        assert self.checkpoint_dir is not None
        folder = self.checkpoint_dir / f"step-{step}"
        staging = self.checkpoint_dir / f".step-{step}.tmp"
        shutil.rmtree(staging, ignore_errors=True)  # a leftover of a crash mid-save: never loaded
        from safetensors.torch import save_file

        staging.mkdir(parents=True)
        save_file({k: v.detach().contiguous() for k, v in self.model.state_dict().items()},
                  os.fspath(staging / "model.safetensors"))
        save_optimizer(self.optimizer, staging)
        os.rename(staging, folder)


def save_optimizer(optimizer: Any, folder: Path) -> None:
    """An optimizer's state as safetensors (tensors) + JSON (the rest): no pickle."""
    from safetensors.torch import save_file

    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entry in sd["state"].items():
        for key, value in entry.items():
            if hasattr(value, "detach"):
                tensors[f"{index}/{key}"] = value.detach().contiguous()
            else:
                scalars[f"{index}/{key}"] = value
    save_file(tensors, os.fspath(folder / "optimizer.safetensors"))
    (folder / "optimizer.json").write_text(json.dumps({"param_groups": sd["param_groups"], "scalars": scalars}))


def load_optimizer(optimizer: Any, folder: Path) -> None:
    from safetensors.torch import load_file

    meta = json.loads((folder / "optimizer.json").read_text())
    state: dict[int, dict[str, Any]] = {}
    tensors = load_file(os.fspath(folder / "optimizer.safetensors"))
    for name, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, key = name.split("/", 1)
        state.setdefault(int(index), {})[key] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


__all__ = ["GrpoSettings", "GrpoTrainer", "StepRecord", "TrainerState", "load_optimizer", "save_optimizer"]


def _versions_seen(lease: Any) -> tuple[tuple[str, ...], tuple[int, ...], int]:
    """(source_ids, version span per group, newest-token staleness max) of a lease's groups."""
    sources = tuple(g.group.source_id for g in lease.groups)
    spans = tuple(max((max(0, s.newest_version - s.version) for s in g.samples), default=0) for g in lease.groups)
    # A group's newest tokens are the newest any of its samples has: what the queue's 'continue' judges.
    newest = max((max(0, lease.version - max(s.newest_version for s in g.samples)) for g in lease.groups
                  if g.samples), default=0)
    return sources, spans, newest


def _task_metric(groups: Any) -> float | None:
    """Mean over samples of the ``metric`` their environment recorded in its last step (None: none did)."""
    values = []
    for g in groups:
        for s in g.samples:
            steps = (s.metadata or {}).get("steps") or []
            last = steps[-1] if steps else None
            if isinstance(last, dict) and isinstance(last.get("metric"), (int, float)):
                values.append(float(last["metric"]))
    return sum(values) / len(values) if values else None
