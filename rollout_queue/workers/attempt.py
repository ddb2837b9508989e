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
from typing import Callable, Sequence

from rollout_queue import (
    AsyncWorker,
    MalformedCompletion,
    PayloadTooLarge,
    Receipt,
    Reservation,
    Sample,
    StaleReceipt,
)
from rollout_queue.workers.engines.base import SampleOutput, SamplingConfig
from rollout_queue.workers.events import CompletionRefused, Observer, Settled, StaleSettlement
from rollout_queue.workers.rewards import Generated, Scorer, ScoringError
from rollout_queue.workers.served import ServedQueues, receipt_scope
from rollout_queue.workers.verdicts import VERDICTS, Complete, Fail, Filter, Verdict

#: An engine output and the policy versions its request ran under (in order, oldest first).
Output = tuple[SampleOutput, tuple[int, ...]]


@dataclass
class RuntimeStats:
    """Counters a test or a log line reads; ``reserves`` lists (monotonic time, groups granted)."""

    reserves: list[tuple[float, int]] = field(default_factory=list)
    settled: dict[str, int] = field(default_factory=lambda: dict.fromkeys([v.counter for v in VERDICTS] + ["stale"], 0))
    weight_updates: int = 0
    weight_refusals: int = 0  # versions whose weights the engine refused (nothing applied)
    reconciled: int = 0  # orphaned attempts handed back by reconcile.py
    samples: int = 0
    tokens: int = 0


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
                               out.token_ids, out.logprobs, out.finish_reason)
                     for slot, (out, _) in enumerate(outputs)]
        try:
            rewards = await self.scorer.score(group, generated)
            samples = [to_sample(slot, out, seen, reward)
                       for slot, ((out, seen), reward) in enumerate(zip(outputs, rewards))]
            reason = await self.scorer.check(group, samples)
        except ScoringError as exc:
            await self.settle(a, Fail(str(exc)))
            return
        self.stats.samples += len(samples)
        self.stats.tokens += sum(len(s.token_ids) for s in samples)
        await self.settle(a, Complete(tuple(samples)) if reason is None else Filter(reason))

    async def settle(self, a: Attempt, verdict: Verdict) -> None:
        """End the attempt by receipt with ``verdict``. Raises only what the worker cannot handle
        (OutcomeUnknown: Redis unreachable past the retry window)."""
        try:
            outcome = await verdict.send(self.worker, a.receipt)
        except StaleReceipt as exc:
            self.stats.settled["stale"] += 1
            self.emit(StaleSettlement(a.receipt, str(exc)))
            return
        except MalformedCompletion as exc:  # the script already ended it malformed and requeued it
            self.stats.settled[Fail.counter] += 1
            self.emit(CompletionRefused(a.receipt, str(exc)))
            return
        except PayloadTooLarge as exc:  # nothing was written and we still own it: fail it instead
            await self.settle(a, Fail(str(exc)))
            return
        self.stats.settled[verdict.counter] += 1
        self.emit(Settled(a.receipt, verdict, outcome))


def to_sample(slot: int, out: SampleOutput, seen: tuple[int, ...], reward: float | None) -> Sample:
    """``version`` is the oldest policy version the sample ran under; ``versions`` all of them."""
    return Sample(slot=slot, token_ids=out.token_ids, logprobs=out.logprobs, reward=reward, version=min(seen),
                  finish_reason=out.finish_reason, versions=tuple(sorted(set(seen))))
