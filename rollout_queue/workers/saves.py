"""Periodic progress saves: an attempt still generating records its samples so far every interval.

Why: a worker SIGKILLed (or lost with its host) mid-attempt settles nothing; the reaper requeues its
group and, without a progress record, the next attempt starts from the prompt. Under
``WorkerOptions.save_progress_every_s`` (``--save-progress-every-s``) an attempt still generating
after S seconds saves its progress (``save_partial``) and again every S seconds, so the next attempt,
on any worker, continues from at most S seconds back (DESIGN: Partial rollouts).

What a save holds: each slot that ended, its output; each request in flight, the tokens the engine
has so far (``Engine.partial``, read without stopping the request) after the prefix it continues;
each trajectory, its last checkpoint (its complete turns and its environment's snapshot:
``trajectory.py`` rule 6; none without ``snapshot``/``restore``). An engine that cannot tell before a
request ends (vLLM) contributes the ended slots and the prefixes only. A save that would add no token to the last one is skipped, so an attempt that makes no
progress (waiting for its weights, or in the engine's queue) writes nothing.

Rules:
1. A save never changes the attempt: whatever it meets (a stale receipt, a record over
   ``max_partial_bytes``, Redis not answering) ends or skips the saves, never the attempt, which
   settles by receipt as before. The script fences the write by the receipt, so a save racing its own
   attempt's settlement writes nothing once the attempt has ended.
2. A save in flight is never cancelled when generation ends (its outcome would be unknown): the
   attempt settles after it. Only a failing attempt (an exception, a cancellation) cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from rollout_queue import AsyncWorker, OutcomeUnknown, PartialTooLarge, Sample, StaleReceipt
from rollout_queue.workers.attempt import Attempt, Output, progress_of
from rollout_queue.workers.engines.base import Engine
from rollout_queue.workers.events import Observer, ProgressNotSaved, ProgressSaved
from rollout_queue.workers.served import ServedQueues
from rollout_queue.workers.tasks import cancel

_NOTHING = Output((), (), "abort", ())


def progress_now(a: Attempt, engine: Engine) -> tuple[Sample, ...]:
    """The attempt's samples so far, as a progress record holds them (``attempt.progress_of``)."""
    prefixes = {s.slot: s for s in a.reservation.progress}
    return progress_of([_slot_so_far(a, slot, engine, prefixes) for slot in range(a.reservation.group.n)])


def _slot_so_far(a: Attempt, slot: int, engine: Engine, prefixes: Mapping[int, Sample]) -> Output:
    if slot in a.ended:
        return a.ended[slot]
    if slot in a.checkpoints:
        return a.checkpoints[slot]
    rid, prefix, seen = a.running.get(slot, ("", prefixes.get(slot), []))
    now = engine.partial(rid) if rid else None
    if now is not None and now.token_ids and seen:
        out = Output.of(now, seen)
        return out.after(prefix) if prefix is not None else out
    return Output.continued(prefix) if prefix is not None else _NOTHING


class ProgressSaver:
    """Saves the progress of attempts generating on one engine, every ``every_s`` (0: never)."""

    def __init__(self, engine: Engine, worker: AsyncWorker | ServedQueues, emit: Observer, every_s: float) -> None:
        self.engine, self.worker, self.emit, self.every_s = engine, worker, emit, every_s

    @asynccontextmanager
    async def saving(self, a: Attempt) -> AsyncIterator[None]:
        """Save ``a``'s progress periodically while the block (its generation) runs."""
        if self.every_s <= 0:
            yield
            return
        done = asyncio.Event()
        task = asyncio.create_task(self._run(a, done), name=f"save:{a.receipt.entry_id}")
        try:
            yield
        except BaseException:
            await cancel([task])
            raise
        done.set()
        await task  # rule 2: a save in flight finishes before the attempt settles

    async def _run(self, a: Attempt, done: asyncio.Event) -> None:
        saved = sum(len(s.token_ids) for s in a.reservation.progress)  # what the record already holds
        while not await _wait(done, self.every_s):
            if a.abort_reason is not None:
                return  # the abort carries the progress in the same call
            samples = progress_now(a, self.engine)
            tokens = sum(len(s.token_ids) for s in samples)
            if tokens <= saved:
                continue
            try:
                outcome = await self.worker.save_partial(a.receipt, samples)
            except StaleReceipt:
                return  # another attempt owns the group: the settlement reports it (StaleSettlement)
            except PartialTooLarge as exc:  # nothing written; larger next time: stop saving this attempt
                self.emit(ProgressNotSaved(a.receipt, str(exc)))
                return
            except OutcomeUnknown as exc:  # Redis past the retry window: the settlement will judge; try again
                self.emit(ProgressNotSaved(a.receipt, str(exc)))
                continue
            saved = tokens
            self.emit(ProgressSaved(a.receipt, tokens, outcome))


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """True once ``event`` is set, False after ``timeout_s`` without it."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except asyncio.TimeoutError:
        return False
    return True
