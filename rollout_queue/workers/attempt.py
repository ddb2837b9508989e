"""One attempt of the worker runtime: its state, request ids, seeds, samples, and its settlement.

Owns what happens to a reservation after generation: turning engine outputs into ``Sample`` values
(behaviour logprobs, reward, the policy versions each sample ran under), running the reward and
the filter, and settling by receipt exactly once with one ``Verdict`` (``verdicts.py``): complete,
filter, fail or abort. It reports what happened as events (``events.py``) and logs nothing itself.
It must not reserve, touch the engine or decide when to stop; that is ``runtime.py``.

Why a stale receipt is only reported (``StaleSettlement``): the reaper already requeued the attempt
(our heartbeat was late), so another worker owns it now; our result must be dropped, never written
(DESIGN rule 1).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from rollout_queue import (
    AsyncWorker,
    MalformedCompletion,
    PartialTooLarge,
    PayloadTooLarge,
    Receipt,
    Reservation,
    Sample,
    StaleReceipt,
    Turn,
)
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS, bucket_index, empty_counts
from rollout_queue.workers.engines.base import SampleOutput, SamplingConfig
from rollout_queue.workers.events import CompletionRefused, Observer, Settled, StaleSettlement
from rollout_queue.workers.rewards import Generated, Scorer, ScoringError
from rollout_queue.workers.served import ServedQueues, receipt_scope
from rollout_queue.workers.verdicts import VERDICTS, Abort, Complete, Fail, Filter, Verdict

@dataclass(frozen=True)
class Output:
    """What one parent slot produced: its tokens and behaviour logprobs, why it ended, the policy
    versions its requests ran under, how long it took, and for a trajectory its turns (model turns
    and observations), the environment's reward (the sum of its steps') and metadata record."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    seen: tuple[int, ...]
    seconds: float = 0.0
    turns: tuple[Turn, ...] = ()
    reward: float | None = None
    metadata: Mapping[str, Any] | None = None
    #: per-token versions as run lengths (Sample.segments): set on a sample continued from an
    #: earlier attempt's progress; () means every token is at min(seen)
    segments: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, out: SampleOutput, seen: Sequence[int], seconds: float = 0.0) -> "Output":
        """A single-turn sample: one engine output."""
        return cls(out.token_ids, out.logprobs, out.finish_reason, tuple(seen), seconds)

    @classmethod
    def continued(cls, prefix: Sample, finish_reason: str | None = None) -> "Output":
        """An earlier attempt's sample taken as it is (it had ended, or fills max_tokens already); a
        trajectory's with its turns, metadata and the environment's reward (its steps' sum)."""
        return cls(prefix.token_ids, prefix.logprobs, finish_reason or prefix.finish_reason,
                   prefix.versions or (prefix.version,), turns=prefix.turns, reward=step_reward(prefix),
                   metadata=prefix.metadata, segments=prefix.segments)

    def after(self, prefix: Sample) -> "Output":
        """This continuation joined to the ``prefix`` it continued: the prefix's tokens, logprobs and
        segments, then this output's tokens at the oldest version they ran under (its own segment,
        unless that is the prefix's last version). Versions never decrease along it: the caller
        continues only a prefix no newer than its weights."""
        before = prefix.segments or ((0, prefix.version),)
        segments = before
        if self.token_ids and min(self.seen) != before[-1][1]:
            segments = (*before, (len(prefix.token_ids), min(self.seen)))
        seen = (*(prefix.versions or (prefix.version,)), *(self.seen if self.token_ids else ()))
        return replace(self, token_ids=prefix.token_ids + self.token_ids, logprobs=prefix.logprobs + self.logprobs,
                       seen=seen, segments=segments if len(segments) > 1 else ())

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


def step_reward(sample: Sample) -> float | None:
    """A trajectory's environment reward, the sum of its ``step_rewards`` record; None for a
    single-turn sample or a record that holds no list of numbers."""
    rewards = sample.metadata.get("step_rewards") if sample.turns and sample.metadata else None
    if not isinstance(rewards, list) or not all(isinstance(r, (int, float)) and not isinstance(r, bool)
                                                for r in rewards):
        return None
    return float(sum(rewards))


def _per_ending() -> dict[str, int]:
    """One counter per way an attempt ends: each verdict's, and ``stale``."""
    return dict.fromkeys([v.counter for v in VERDICTS] + ["stale"], 0)


@dataclass
class RuntimeStats:
    """Counters a test or a log line reads; ``reserves`` lists (monotonic time, groups granted).

    ``generated``: tokens the engine produced for the attempts settled, by how each ended (the keys of
    ``settled``), aborted requests' partial outputs included and observations not: what the worker
    kept (``completed``) and what it threw away. Tokens of requests cut by a cancellation (a fatal
    error) are unknown and not counted. The worker reports them when it closes (``WorkerClosed``)."""

    reserves: list[tuple[float, int]] = field(default_factory=list)
    settled: dict[str, int] = field(default_factory=_per_ending)
    generated: dict[str, int] = field(default_factory=_per_ending)
    weight_updates: int = 0
    weight_refusals: int = 0  # versions whose weights the engine refused (nothing applied)
    pushes_received: int = 0  # versions received over torch.distributed (weights/push.py)
    pushes_missed: int = 0  # rounds joined but not completed (the version then loads from its folder)
    reconciled: int = 0  # orphaned attempts handed back by reconcile.py
    samples: int = 0
    tokens: int = 0
    #: tokens taken from earlier attempts' progress instead of generated again (partial rollouts),
    #: over the attempts settled; not in ``generated``, which counts what this engine produced
    continued: int = 0
    # Every sample's length and duration, counted into the shared buckets (core/histograms.py): the
    # heartbeat reports them, so operators see the long tail of trajectories.
    sample_tokens: list[int] = field(default_factory=lambda: empty_counts(TOKEN_BUCKETS))
    sample_seconds: list[int] = field(default_factory=lambda: empty_counts(SECOND_BUCKETS))

    def record_sample(self, n_tokens: int, seconds: float) -> None:
        self.sample_tokens[bucket_index(TOKEN_BUCKETS, n_tokens)] += 1
        self.sample_seconds[bucket_index(SECOND_BUCKETS, seconds)] += 1


class Phase(enum.Enum):
    """Where an attempt is: what a weight update may abort and what a fatal error may cancel."""

    WAITING = "waiting"  # reserved, waiting for weights to be ready
    GENERATING = "generating"  # engine requests in flight
    SETTLING = "settling"  # done with the engine: scoring and settling by receipt


@dataclass(eq=False)
class Attempt:
    """A reservation being executed: the engine requests in flight and why it must end early."""

    reservation: Reservation
    rids: set[str] = field(default_factory=set)
    phase: Phase = Phase.WAITING
    abort_reason: str | None = None
    task: asyncio.Task[None] | None = None
    aborted: asyncio.Event = field(default_factory=asyncio.Event)  # set with abort_reason: ends environment waits
    #: what the engine raised under one of this attempt's own requests (not RequestFailed): the
    #: runtime counts an engine failure against this attempt only (execution.engine_request)
    engine_error: BaseException | None = None
    #: tokens the engine returned for this attempt's requests so far (execution.engine_request)
    generated_tokens: int = 0
    #: tokens taken from an earlier attempt's progress instead of generated again (partial rollouts)
    continued_tokens: int = 0
    #: what a periodic progress save reads (execution.py), by slot: the output of each slot that
    #: ended, and for each request in flight its id, the prefix it continues and its versions so far
    ended: dict[int, Output] = field(default_factory=dict)
    running: dict[int, tuple[str, Sample | None, list[int]]] = field(default_factory=dict)
    #: a trajectory's last complete turn by slot (trajectory.py), with its environment's snapshot in
    #: the metadata (``env``): what an abort or a save keeps, where the next attempt resumes
    checkpoints: dict[int, Output] = field(default_factory=dict)

    @property
    def receipt(self) -> Receipt:
        return self.reservation.receipt

    def request_id(self, slot: int) -> str:
        """Unique among requests in flight: a retry of the same entry has a higher attempt, and an
        entry ID repeated in another queue or partition carries that one's name in front."""
        scope = receipt_scope(self.receipt)
        base = f"{self.receipt.entry_id}/{self.receipt.attempt}/{slot}"
        return f"{scope}|{base}" if scope else base


def sampling_for(base: SamplingConfig, source_id: str, slot: int) -> SamplingConfig:
    """With a base seed, one seed per (source, slot): a group's samples differ from each other,
    and a retry of the group reproduces them."""
    if base.seed is None:
        return base
    digest = hashlib.sha256(f"{base.seed}|{source_id}|{slot}".encode()).digest()
    return replace(base, seed=int.from_bytes(digest[:8], "big") & (2**63 - 1))


class Settler:
    """Scores finished attempts and settles attempts by receipt, for one worker."""

    def __init__(self, worker: AsyncWorker | ServedQueues, scorer: Scorer, decode: Callable[[Sequence[int]], str],
                 stats: RuntimeStats, emit: Observer) -> None:
        self.worker, self.scorer, self.decode, self.stats, self.emit = worker, scorer, decode, stats, emit

    async def score_and_settle(self, a: Attempt, outputs: Sequence[Output]) -> None:
        """Reward, filter, then complete or filter; a reward or filter error fails the attempt."""
        group = a.reservation.group
        generated = [Generated(slot, self.decode(out.token_ids) if self.scorer.needs_text else "",
                               out.token_ids, out.logprobs, out.finish_reason, out.turns)
                     for slot, out in enumerate(outputs)]
        try:
            rewards = await self.scorer.score(group, generated)
            # The reward function, when there is one, scores trajectories too; else the environment's.
            samples = [to_sample(slot, out, out.reward if reward is None else reward)
                       for slot, (out, reward) in enumerate(zip(outputs, rewards))]
            reason = await self.scorer.check(group, samples)
        except ScoringError as exc:
            await self.settle(a, Fail(str(exc)))
            return
        self.stats.samples += len(samples)
        tokens = sum(len(s.token_ids) for s in samples)
        self.stats.tokens += tokens
        for out in outputs:
            self.stats.record_sample(len(out.token_ids), out.seconds)
        await self.settle(a, Complete(tuple(samples)) if reason is None else Filter(reason, tokens))

    async def settle(self, a: Attempt, verdict: Verdict) -> None:
        """End the attempt by receipt with ``verdict``. Raises only what the worker cannot handle
        (OutcomeUnknown: Redis unreachable past the retry window)."""
        if isinstance(verdict, Abort) and not verdict.progress:
            # No record keeps what it generated: the queue counts those tokens as thrown away.
            verdict = replace(verdict, discarded=a.generated_tokens)
        try:
            outcome = await verdict.send(self.worker, a.receipt)
        except StaleReceipt as exc:
            self._count("stale", a)
            self.emit(StaleSettlement(a.receipt, str(exc)))
            return
        except MalformedCompletion as exc:  # the script already ended it malformed and requeued it
            self._count(Fail.counter, a)
            self.emit(CompletionRefused(a.receipt, str(exc)))
            return
        except PartialTooLarge:  # over max_partial_bytes, nothing written: abort without it (starts over)
            assert isinstance(verdict, Abort)
            await self.settle(a, replace(verdict, progress=()))
            return
        except PayloadTooLarge as exc:  # nothing was written and we still own it: fail it instead
            await self.settle(a, Fail(str(exc)))
            return
        self._count(verdict.counter, a)
        self.emit(Settled(a.receipt, verdict, outcome))

    def _count(self, ending: str, a: Attempt) -> None:
        self.stats.settled[ending] += 1
        self.stats.generated[ending] += a.generated_tokens
        self.stats.continued += a.continued_tokens


def to_sample(slot: int, out: Output, reward: float | None) -> Sample:
    """``version`` is the oldest policy version the sample ran under; ``versions`` all of them."""
    return Sample(slot=slot, token_ids=out.token_ids, logprobs=out.logprobs, reward=reward, version=min(out.seen),
                  finish_reason=out.finish_reason, versions=tuple(sorted(set(out.seen))), turns=out.turns,
                  metadata=out.metadata, segments=out.segments)


def progress_of(outputs: Sequence[Output]) -> tuple[Sample, ...]:
    """An aborted attempt's samples so far, as the progress record the next attempt continues from:
    every slot with tokens and one logprob each (a slot cut short keeps finish_reason "abort", one
    that had ended its own; a trajectory cut short is its last checkpoint, with its turns). No
    reward: the next attempt scores the group."""
    return tuple(to_sample(slot, out, None) for slot, out in enumerate(outputs)
                 if out.token_ids and len(out.logprobs) == len(out.token_ids))
