"""One multi-turn trajectory: model turns on the engine, environment steps in between.

Why apart from ``execution.py``: a single-turn sample is one engine request; a trajectory is a loop
(generate a turn, hand it to the environment, append the observation, generate again) with limits
of its own, and it reads best top to bottom in one place. ``AttemptExecutor`` runs one of these per
parent slot when the worker has an environment (``--env``).

Rules:
1. Each model turn is its own engine request (``<slot request id>#<turn>``), continuing from the
   prompt and everything so far; an observation is appended as tokens and never trained. The
   sample's tokens are the concatenation, its turns the spans (core/models.py ``Turn``).
2. Limits end a trajectory as data, not as an error: ``max_turns`` model turns without ``done``
   ends it ``finish_reason="turns"``; the token budget (``max_tokens``, model and observation
   tokens together; each turn is capped at what is left) ends it ``"length"``; the wall-clock
   ``timeout_s`` ends it ``"deadline"`` with the turns finished so far, also in the middle of an
   environment step (the trajectory's own deadline is not the environment's fault). Each is a
   valid sample.
3. Faults of the environment raise ``EnvironmentFailed`` (environments.py): the attempt fails and
   the failure counts. The queue's own stops (``Attempt.aborted``: a weight update, a drain) end it
   ``"abort"`` at once, wherever they land (while the environment is built, reset or stepped, while
   a model turn runs, between turns), and never count.
4. Each turn records the oldest policy version it ran under; the sample's ``version`` is the oldest
   of them (staleness counts from the oldest model turn).
5. Every turn's token ids are checked against the engine's vocabulary (``Engine.vocab_size``) as
   they are appended, observations included (also one after the last model turn): an id the model
   cannot embed would make the trainer's forward pass raise, so it never reaches the buffer. An
   observation's is the environment's fault (``EnvironmentFailed``), a model turn's the request's
   (``RequestFailed``); both fail the attempt, counted.
6. Progress (DESIGN: Partial rollouts): with an environment that has ``snapshot``/``restore``
   (environments.py rule 5), each step that does not end the trajectory is followed by a snapshot,
   kept with the turns so far as the slot's checkpoint (``Attempt.checkpoints``: the step rewards
   and records in its metadata, the state under ``env``). An abort returns the checkpoint, and a
   periodic save writes it; the next attempt given it builds a new environment, restores it in place
   of ``reset`` and goes on from the next turn (a model turn cut short is generated again). Without
   them, or with a checkpoint newer than the worker's weights, it starts from ``reset``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Sequence, TypeVar

from rollout_queue.core.errors import EnvironmentFailed, InvalidInput, RequestFailed, TrajectoryAborted
from rollout_queue.core.models import MODEL, OBSERVATION, Sample, Turn, check_trajectory
from rollout_queue.workers.attempt import Attempt, Output
from rollout_queue.workers.engines.base import Engine, SamplingConfig
from rollout_queue.workers.environments import Env, EnvironmentHost, ModelTurn
from rollout_queue.workers.rewards import finite
from rollout_queue.workers.execution import engine_request
from rollout_queue.workers.tasks import cancel, wait_tasks
from rollout_queue.workers.versions import PolicyVersions

T = TypeVar("T")
_LATE: Any = object()  # what _until_aborted returns when the trajectory's deadline passed first


@dataclass(frozen=True)
class TrajectoryLimits:
    """How far one trajectory may go (rule 2): model turns, tokens after the prompt, wall seconds."""

    max_turns: int = 8
    max_tokens: int = 4096
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {self.max_turns!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"the trajectory token budget must be an integer >= 1, got {self.max_tokens!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"the trajectory timeout must be > 0 seconds, got {self.timeout_s!r}")


class TrajectoryRunner:
    """Runs trajectories for one worker (rules above)."""

    def __init__(self, engine: Engine, host: EnvironmentHost, versions: PolicyVersions,
                 limits: TrajectoryLimits | None = None) -> None:
        self.engine, self.host, self.versions = engine, host, versions
        self.limits = limits or TrajectoryLimits()

    async def run(self, a: Attempt, slot: int, prompt: list[int], params: SamplingConfig,
                  prefix: Sample | None = None) -> Output:
        """The trajectory of parent ``slot``, resumed from ``prefix`` (an earlier attempt's checkpoint)
        where it can be (rule 6); raises EnvironmentFailed, RequestFailed, EngineError (and
        EnvironmentsHung, before any user code runs)."""
        started = time.monotonic()
        deadline = started + self.limits.timeout_s
        t = _Trajectory(self.engine.vocab_size)
        env = self.host.open()
        try:
            await self._until_aborted(a, self.host.create(env))
            first_turn = await self._begin(a, env, t, slot, prefix, deadline)
            if first_turn is None:
                return t.output("deadline", time.monotonic() - started, self.versions.loaded)
            finish = "turns"
            for index in range(first_turn, self.limits.max_turns):
                left = self.limits.max_tokens - len(t.token_ids)
                if left <= 0:
                    finish = "length"
                    break
                if time.monotonic() >= deadline:
                    finish = "deadline"
                    break
                out, seen = await self._turn(a, slot, index, prompt + t.token_ids, _turn_params(params, index, left),
                                             deadline)
                if out is None:  # the deadline passed during the turn: what was finished stays
                    finish = "deadline"
                    break
                t.model_turn(out.token_ids, out.logprobs, seen)
                turn = ModelTurn(index, self.engine.decode(out.token_ids), tuple(out.token_ids), out.finish_reason)
                step = await self._until_aborted(a, self.host.step(env, turn), deadline)
                if step is _LATE:  # the trajectory's own deadline, not the environment's fault: truncate
                    finish = "deadline"
                    break
                t.step(step.reward, step.info)
                if step.done:
                    finish = "stop"
                    break
                room = self.limits.max_tokens - len(t.token_ids)
                if step.observation and t.observe(self._tokens(step.observation, room), self.limits.max_tokens):
                    finish = "length"
                    break
                if index + 1 < self.limits.max_turns and self.host.restorable(env):
                    await self._checkpoint(a, env, t, slot, deadline)
        except TrajectoryAborted:
            # The last complete turn, for the next attempt (rule 6); nothing when there is none.
            return a.checkpoints.get(slot) or Output((), (), "abort", t.seen or (self.versions.loaded,),
                                                     time.monotonic() - started)
        finally:
            await self.host.close(env)
        return t.output(finish, time.monotonic() - started, self.versions.loaded)

    async def _begin(self, a: Attempt, env: Env, t: "_Trajectory", slot: int, prefix: Sample | None,
                     deadline: float) -> int | None:
        """Reset the environment (its first observation appended), or restore it from ``prefix``'s
        snapshot and take its turns (rule 6). The index of the first model turn to run; None when the
        deadline passed."""
        resumable = (prefix is not None and self.host.restorable(env) and t.can_resume(prefix)
                     and max(prefix.versions or (prefix.version,)) <= self.versions.loaded)
        if prefix is not None and resumable:
            assert prefix.metadata is not None  # can_resume checked it
            if await self._until_aborted(a, self.host.restore(env, prefix.metadata["env"]), deadline) is _LATE:
                return None
            a.continued_tokens += len(prefix.token_ids)
            a.checkpoints[slot] = Output.continued(prefix)  # an abort before the next checkpoint keeps it
            return t.resume(prefix)
        first = await self._until_aborted(a, self.host.reset(env, a.reservation.group, slot), deadline)
        if first is _LATE:
            return None
        if first:
            t.observe(self._tokens(first, self.limits.max_tokens), self.limits.max_tokens)
        return 0

    async def _checkpoint(self, a: Attempt, env: Env, t: "_Trajectory", slot: int, deadline: float) -> None:
        """Snapshot the environment after a complete turn and keep it with the turns so far (rule 6)."""
        state = await self._until_aborted(a, self.host.snapshot(env), deadline)
        if state is not _LATE:  # past the deadline the loop ends the trajectory next
            a.checkpoints[slot] = t.checkpoint(state)

    async def _turn(self, a: Attempt, slot: int, index: int, context: list[int], params: SamplingConfig,
                    deadline: float) -> tuple[Any, tuple[int, ...]]:
        """One model turn: (engine output, versions it ran under), or (None, ()) at the deadline."""
        rid = f"{a.request_id(slot)}#{index}"
        with self.versions.request(rid, a.rids) as seen:
            if a.abort_reason is not None:
                raise TrajectoryAborted
            try:
                out = await asyncio.wait_for(engine_request(self.engine, a, rid, context, params),
                                             max(0.0, deadline - time.monotonic()))
            except TimeoutError:  # wait_for cancelled the request, which aborts it inside the engine
                return None, ()
            if out.finish_reason == "abort":
                raise TrajectoryAborted
            return out, tuple(seen)

    async def _until_aborted(self, a: Attempt, work: Awaitable[T], deadline: float | None = None) -> Any:
        """``await work``, unless the attempt is aborted first (TrajectoryAborted) or ``deadline``
        (monotonic) passes first (``_LATE``); either way the work is cancelled."""
        if a.abort_reason is not None:
            if asyncio.iscoroutine(work):
                work.close()
            raise TrajectoryAborted
        task = asyncio.ensure_future(work)
        timeout = math.inf if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            late = await wait_tasks([task], timeout, a.aborted)
        except BaseException:
            # This trajectory was cancelled itself (a sibling slot failed, a drain): cancel the work
            # and retrieve whatever it ends with, so a step failing later is not an orphan error
            # ("Task exception was never retrieved") in the worker's log.
            task.cancel()
            task.add_done_callback(_retrieved)
            raise
        if late:
            await cancel([task])
            if a.abort_reason is not None:
                raise TrajectoryAborted
            return _LATE
        return task.result()

    def _tokens(self, observation: str | tuple[int, ...], room: int) -> list[int]:
        """An observation's tokens. Text far longer than the room left is cut before it is tokenized
        (a token covers at least one character, 16 is generous), so a 100 MB tool output costs
        what fits, not a tokenizer pass over all of it on the event loop."""
        if isinstance(observation, str):
            return list(self.engine.encode_continuation(observation[:16 * max(1, room) + 16]))
        return list(observation[:max(0, room) + 1])


def _retrieved(task: "asyncio.Future[Any]") -> None:
    """Mark a left-behind task's outcome as read (its caller is gone; nothing else will)."""
    if not task.cancelled():
        task.exception()


class _Trajectory:
    """The tokens, logprobs, turns, versions, step rewards and step records gathered so far; every
    turn's ids within ``vocab_size`` (rule 5)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.turns: list[Turn] = []
        self.seen: tuple[int, ...] = ()
        self.rewards: list[float] = []
        self.infos: list[Any] = []

    def model_turn(self, token_ids: tuple[int, ...], logprobs: tuple[float, ...], seen: tuple[int, ...]) -> None:
        bad = self._outside(token_ids)
        if bad is not None:
            raise RequestFailed(f"the engine returned token id {bad}, outside its vocabulary of {self.vocab_size}")
        self.token_ids += token_ids
        self.logprobs += logprobs
        self.turns.append(Turn(MODEL, len(token_ids), min(seen)))
        self.seen += seen

    def observe(self, token_ids: list[int], budget: int) -> bool:
        """Append an observation, cut to the token budget; True when it was cut (the budget is spent)."""
        room = budget - len(self.token_ids)
        cut = len(token_ids) > room
        token_ids = token_ids[:max(0, room)]
        bad = self._outside(token_ids)
        if bad is not None:
            raise EnvironmentFailed(f"the environment's observation holds token id {bad}, outside the model's "
                                    f"vocabulary of {self.vocab_size}: the trainer could not embed it")
        if token_ids:
            self.token_ids += token_ids
            self.logprobs += [0.0] * len(token_ids)
            self.turns.append(Turn(OBSERVATION, len(token_ids)))
        return cut

    def step(self, reward: float, info: dict[str, Any] | None) -> None:
        self.rewards.append(reward)
        self.infos.append(info)

    def _outside(self, token_ids: Sequence[int]) -> int | None:
        """The first id of ``token_ids`` outside ``[0, vocab_size)``, or None."""
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < self.vocab_size):
            return None
        return next(t for t in token_ids if not 0 <= t < self.vocab_size)

    def can_resume(self, prefix: Sample) -> bool:
        """Whether ``prefix`` is a checkpoint this class wrote (a garbage record starts over): turns
        with a model turn, one finite step reward per model turn, an environment state."""
        meta = prefix.metadata or {}
        rewards, steps = meta.get("step_rewards"), meta.get("steps")
        model_turns = sum(1 for turn in prefix.turns if turn.trained)
        return (model_turns > 0 and "env" in meta and isinstance(rewards, list) and len(rewards) == model_turns
                and all(finite(r) is not None for r in rewards)
                and (steps is None or (isinstance(steps, list) and len(steps) == model_turns)))

    def resume(self, prefix: Sample) -> int:
        """Take a checkpoint's turns (``can_resume``); the index of the next model turn."""
        meta = prefix.metadata or {}
        self.token_ids, self.logprobs = list(prefix.token_ids), list(prefix.logprobs)
        self.turns, self.seen = list(prefix.turns), tuple(prefix.versions or (prefix.version,))
        self.rewards = [float(r) for r in meta["step_rewards"]]
        self.infos = list(meta.get("steps") or [None] * len(self.rewards))
        return len(self.rewards)

    def checkpoint(self, state: Any) -> Output:
        """The turns so far with the environment's ``state``: what the next attempt resumes from.
        Raises EnvironmentFailed when the state does not fit a sample's metadata with the step
        rewards (the step records are dropped first)."""
        # Copies: the lists grow with the next step, and this checkpoint must keep matching its turns.
        metadata: dict[str, Any] = {"step_rewards": list(self.rewards), "env": state}
        if any(info is not None for info in self.infos):
            metadata["steps"] = list(self.infos)
        error: InvalidInput | None = None
        for record in (metadata, {"step_rewards": list(self.rewards), "env": state}):
            try:
                check_trajectory((), record, 0, 0)  # JSON within MAX_SAMPLE_METADATA
            except InvalidInput as exc:
                error = exc
                continue
            return Output(tuple(self.token_ids), tuple(self.logprobs), "abort", self.seen, turns=tuple(self.turns),
                          metadata=record)
        raise EnvironmentFailed(f"the environment's snapshot does not fit a progress record: {error} "
                                "(keep snapshot() small: the state a tool needs, not a transcript)")

    def output(self, finish: str, seconds: float, loaded: int) -> Output:
        """The sample so far. Raises EnvironmentFailed when the step rewards sum to no finite number."""
        if not any(t.trained for t in self.turns):  # ended before any model turn: one empty one
            self.turns.append(Turn(MODEL, 0, loaded))
            self.seen += (loaded,)
        reward = sum(self.rewards)
        if not math.isfinite(reward):
            raise EnvironmentFailed(f"the environment's step rewards sum to {reward}: rewards must stay finite")
        metadata: dict[str, Any] = {"step_rewards": self.rewards}
        if any(info is not None for info in self.infos):
            metadata["steps"] = self.infos
        try:
            check_trajectory((), metadata, 0, 0)  # JSON, no NaN, within MAX_SAMPLE_METADATA
        except InvalidInput:  # an info record too big or not JSON: the steps are dropped, the sample kept
            metadata = {"step_rewards": self.rewards[:256], "steps_dropped": True}
        return Output(tuple(self.token_ids), tuple(self.logprobs), finish, self.seen, seconds, tuple(self.turns),
                      reward, metadata)


def _turn_params(params: SamplingConfig, index: int, left: int) -> SamplingConfig:
    """The slot's sampling with the turn's token cap, and (seeded) a seed of its own per turn."""
    seed = params.seed
    if seed is not None and index:
        seed = int.from_bytes(hashlib.sha256(f"{seed}#{index}".encode()).digest()[:8], "big") & (2**63 - 1)
    return replace(params, max_tokens=min(params.max_tokens, left), seed=seed)
