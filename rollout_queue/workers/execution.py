"""Executing one attempt: its ``n`` engine requests, then exactly one settlement.

Why apart from ``runtime.py``: this is the only code that talks to the engine about a reservation,
and it reads top to bottom as the attempt does: generate every parent slot concurrently (request
id ``<entry_id>/<attempt>/<slot>``, one seed per slot), then abort (a weight update, a drain, or
the engine cut a request short: not counted), fail (a ``RequestFailed``: counted), or score and
complete or filter (``attempt.Settler``).

Partial rollouts (DESIGN: Partial rollouts): a reservation may carry the progress an earlier attempt
left (``Reservation.progress``). A slot that had ended is taken as it was; a slot cut short is
continued: its prompt plus its tokens so far go to the engine as the prompt, ``max_tokens`` less
what it has, and the sample keeps the prefix's behaviour logprobs and segments, with a new segment
for the continuation's version. An attempt aborted here hands its samples so far back with the abort
(``attempt.progress_of``), and one still generating saves them every interval on its way
(``saves.ProgressSaver``), so a worker killed mid-attempt loses at most one interval. A trajectory
is continued from its last complete turn when its environment can be snapshot and restored
(``trajectory.py``); else it starts over.

It must not reserve, keep the set of attempts, or decide that the worker stops: whatever escapes
``execute`` (``EngineError``, an engine bug, ``OutcomeUnknown``, ``EnvironmentsHung``) is the
runtime's to judge. An engine failure is remembered on the attempt whose own request raised it
(``engine_request``), so that the runtime counts that attempt and releases the others uncounted.
The queue's own aborts (``TrajectoryAborted``) settle aborted wherever they come from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from rollout_queue import Sample

from rollout_queue.core.errors import EnvironmentFailed, TrajectoryAborted
from rollout_queue.workers.attempt import Attempt, Output, Phase, Settler, progress_of, sampling_for
from rollout_queue.workers.engines.base import Engine, RequestFailed, SampleOutput, SamplingConfig
from rollout_queue.workers.saves import ProgressSaver
from rollout_queue.workers.tasks import cancel
from rollout_queue.workers.verdicts import Abort, Fail
from rollout_queue.workers.versions import PolicyVersions

if TYPE_CHECKING:  # trajectory.py imports engine_request from here
    from rollout_queue.workers.trajectory import TrajectoryRunner


async def engine_request(engine: Engine, a: Attempt, request_id: str, prompt: Sequence[int],
                         params: SamplingConfig) -> SampleOutput:
    """``engine.generate`` for one of ``a``'s requests. Anything it raises but ``RequestFailed`` (and
    a cancellation) is the engine failing under this request: kept as ``a.engine_error`` before it
    propagates, so the runtime can tell the attempt it is attributed to (DESIGN, Failure handling).
    The tokens it returns, an aborted request's partial ones too, are added to ``a.generated_tokens``:
    every engine request of an attempt passes here, single turns and trajectory turns alike."""
    try:
        out = await engine.generate(request_id, prompt, params)
    except RequestFailed:
        raise
    except Exception as exc:
        a.engine_error = exc
        raise
    a.generated_tokens += len(out.token_ids)
    return out


class AttemptExecutor:
    """Runs attempts on one engine; ``on_sample_done`` hears of every sample that ends, however.
    With ``trajectories`` (the worker has an environment) each sample is a multi-turn trajectory;
    ``saver`` saves the progress of single-turn attempts still generating (None: never)."""

    def __init__(self, engine: Engine, sampling: SamplingConfig, versions: PolicyVersions, settler: Settler,
                 on_sample_done: Callable[[Attempt], None], trajectories: TrajectoryRunner | None = None,
                 saver: ProgressSaver | None = None) -> None:
        self.engine, self.sampling, self.versions, self.settler = engine, sampling, versions, settler
        self.on_sample_done, self.trajectories, self.saver = on_sample_done, trajectories, saver

    async def execute(self, a: Attempt) -> None:
        """Generate, then settle by receipt. Raises what the engine or the settlement cannot handle."""
        a.phase = Phase.GENERATING
        try:
            outputs = await self._generate(a)
        except RequestFailed as exc:
            a.phase = Phase.SETTLING
            await self.settler.settle(a, Fail(f"request failed: {exc}"))
            return
        except EnvironmentFailed as exc:  # the environment's fault: counted, unless the queue aborted first
            a.phase = Phase.SETTLING
            await self.settler.settle(a, Abort(a.abort_reason) if a.abort_reason else Fail(str(exc)))
            return
        except TrajectoryAborted:  # the queue's own stop, wherever it landed: never counted, never fatal
            a.phase = Phase.SETTLING
            await self.settler.settle(a, Abort(a.abort_reason or "trajectory aborted"))
            return
        a.phase = Phase.SETTLING
        if a.abort_reason is None and any(out.aborted for out in outputs):
            a.abort_reason = "engine aborted a request"
        if a.abort_reason is not None:
            # Not the group's fault: its samples so far go back with it, for the next attempt.
            await self.settler.settle(a, Abort(a.abort_reason, progress_of(outputs)))
        else:
            await self.settler.score_and_settle(a, outputs)

    async def abort(self, attempts: list[Attempt], reason: str) -> None:
        """End ``attempts`` early: their requests in flight are aborted and they settle as aborted
        (the first reason given is kept)."""
        for a in attempts:
            a.abort_reason = a.abort_reason or reason
            a.aborted.set()
        await asyncio.gather(*(self.engine.abort(rid) for a in attempts for rid in list(a.rids)))

    async def _generate(self, a: Attempt) -> list[Output]:
        group = a.reservation.group
        prompt = list(group.prompt_token_ids) if group.prompt_token_ids else self.engine.encode(group.prompt)
        prefixes = {s.slot: s for s in a.reservation.progress}
        tasks = [asyncio.create_task(self._sample(a, slot, prompt, prefixes.get(slot))) for slot in range(group.n)]
        try:
            if self.saver is None:
                return list(await asyncio.gather(*tasks))
            async with self.saver.saving(a):
                return list(await asyncio.gather(*tasks))
        except BaseException:
            await cancel(tasks)  # cancelling a generate aborts it inside the engine
            raise

    async def _sample(self, a: Attempt, slot: int, prompt: list[int], prefix: Sample | None = None) -> Output:
        params = sampling_for(self.sampling, a.reservation.group.source_id, slot)
        try:
            if prefix is not None and prefix.finish_reason != "abort":
                out = Output.continued(prefix)  # it had ended before the earlier attempt was cut short
            elif self.trajectories is not None:
                out = await self.trajectories.run(a, slot, prompt, params, prefix)
            else:
                out = await self._single(a, slot, prompt, params, prefix)
            a.ended[slot] = out  # what a progress save takes as it is from now on
            return out
        finally:
            self.on_sample_done(a)

    async def _single(self, a: Attempt, slot: int, prompt: list[int], params: SamplingConfig,
                      prefix: Sample | None = None) -> Output:
        """A single-turn sample: one engine request, continuing ``prefix`` (an earlier attempt's
        tokens so far) when there is one this worker may continue."""
        rid = a.request_id(slot)
        started = time.monotonic()
        with self.versions.request(rid, a.rids) as seen:
            # A prefix newer than this worker's weights cannot be continued here (versions only rise
            # along a sample): start from the prompt. One past max_tokens is already done.
            if prefix is not None and max(prefix.versions or (prefix.version,)) > seen[0]:
                prefix = None
            if prefix is not None and len(prefix.token_ids) >= params.max_tokens:
                return Output.continued(prefix, "length")
            if a.abort_reason is not None:
                return Output.continued(prefix) if prefix is not None else Output((), (), "abort", tuple(seen))
            a.running[slot] = (rid, prefix, seen)  # what a progress save reads while the request runs
            try:
                if prefix is None:
                    out = await engine_request(self.engine, a, rid, prompt, params)
                    return Output.of(out, seen, time.monotonic() - started)
                a.continued_tokens += len(prefix.token_ids)
                params = replace(params, max_tokens=params.max_tokens - len(prefix.token_ids))
                out = await engine_request(self.engine, a, rid, [*prompt, *prefix.token_ids], params)
                return Output.of(out, seen, time.monotonic() - started).after(prefix)
            finally:
                del a.running[slot]
