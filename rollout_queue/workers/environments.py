"""Environments: what a multi-turn trajectory talks to between the model's turns.

An environment is a class loaded like a reward (``--env package.module:Class``, or a built-in's bare
name); the worker builds one instance per trajectory (one per parent slot of each attempt) and drives
it::

    class Calculator:
        def reset(self, group, slot):           # optional: an observation before the first turn
            return None
        def step(self, turn):                   # after each model turn
            return Step(observation="= 42\\n", reward=0.0, done=False, info={"tool": "calc"})
        def close(self):                        # optional: always called once, however it ended
            ...
        def snapshot(self):                     # optional, with restore: the state after a step, as
            return {"memory": self.memory}      #   small JSON (orjson), so a cut trajectory continues
        def restore(self, state):               # instead of a reset, in a later attempt on any worker
            self.memory = state["memory"]

Rules:
1. Any method may be ``async def``; a synchronous one runs on the environment's own daemon thread
   (``tasks.Lane``), never on the event loop, so a blocking tool call (a subprocess, an HTTP request)
   stalls neither generation nor the heartbeat. An instance is always called from that one thread,
   never from two at once, so it need not be thread-safe.
2. An observation is text (tokenized by the engine's tokenizer without special tokens) or token ids
   (used as they are). It is appended to the trajectory and never trained (loss mask 0).
3. The environment's faults are the attempt's faults: a method that raises, returns something that
   is not a ``Step`` (or an observation, or a Step whose reward is not a finite number), or exceeds
   the per-step deadline raises ``EnvironmentFailed``; the runtime ends the attempt ``failed`` with
   that reason, which counts toward ``max_attempts`` (an environment that always breaks on a prompt
   ends in the dead letters). The queue's own reasons to stop (a weight update, a drain, a hold)
   abort the trajectory instead, which never counts.
4. A synchronous call past its deadline cannot be killed: it is left running on its own thread, and
   holds nothing but that thread, so every other trajectory goes on. Such hung calls are counted;
   at ``max_hung`` of them the worker stops (``EnvironmentsHung``, a fatal error: its work goes back
   uncounted), because only a new process frees their threads. Nothing waits for a hung call: not a
   drain, not ``close`` (queued behind it), not the process's exit (its thread is a daemon).
5. ``snapshot()`` and ``restore(state)`` (both, or neither) let a trajectory cut short through no
   fault of its own (a weight update in abort mode, a drain, a worker killed between periodic saves)
   continue in the next attempt from its last complete turn (DESIGN: Partial rollouts): the worker
   takes a snapshot after each step that does not end the trajectory, keeps it with the turns so far
   in the group's progress record, and the next attempt builds a new instance and calls
   ``restore(state)`` in place of ``reset``. The state must be JSON (what orjson writes; the
   restored instance gets it read back) and small: with the step records it must fit a sample's
   metadata (``MAX_SAMPLE_METADATA``, 16 KiB), else the step fails (``EnvironmentFailed``). An
   environment without them restarts from ``reset`` in each attempt: its turns are not kept. A
   ``restore`` that raises is the environment's fault (rule 3).

Built-in: ``echo`` (repeats the model's turn back as the observation; tests and drills).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import orjson

from rollout_queue.core.checks import describe
from rollout_queue.core.errors import EnvironmentFailed, EnvironmentsHung
from rollout_queue.core.models import SourceGroup
from rollout_queue.workers.rewards import explain, finite, load_function
from rollout_queue.core.errors import GaveUp
from rollout_queue.workers.tasks import Lane, abandonable

__all__ = ["Echo", "Environment", "EnvironmentFailed", "EnvironmentHost", "ModelTurn", "Step", "load_environment"]

#: Default hung synchronous calls at which a worker stops (rule 4): far more than a healthy worker
#: ever leaves behind, far fewer threads than a host runs out of.
MAX_HUNG = 256


@dataclass(frozen=True)
class ModelTurn:
    """One model turn as the environment sees it: its index (0 first), decoded text, tokens, and
    why generation stopped (``stop``, ``length``)."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True)
class Step:
    """The environment's answer to a model turn.

    ``observation``: text or token ids appended before the next model turn (None or empty: none).
    ``reward``: this step's reward (a trajectory's reward is the sum of its steps' unless the worker
    also has a ``--reward``). ``done``: the trajectory ends here. ``info``: a small JSON record kept
    in the sample's metadata (``steps``), e.g. which tool ran.
    """

    observation: str | Sequence[int] | None = None
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] | None = None


@runtime_checkable
class Environment(Protocol):
    """What the worker calls; ``reset`` and ``close`` are optional (see the module docstring)."""

    def step(self, turn: ModelTurn) -> Step | Any:
        ...


EnvironmentFactory = Callable[[], Any]


def load_environment(spec: str) -> EnvironmentFactory:
    """The environment class (or zero-argument factory) named by ``module:Class`` or a built-in's bare
    name. Raises ValueError with what to fix."""
    return load_function(spec, builtins=__name__, names=_BUILTINS, kind="Class")


@dataclass(eq=False)
class Env:
    """One trajectory's environment: the lane its synchronous methods run on (there before any user
    code runs, so ``close`` can always follow), and the instance once its constructor returned."""

    lane: Lane
    instance: Any = None
    built: bool = False
    closed: bool = field(default=False, repr=False)


class EnvironmentHost:
    """Builds and calls the environments of one worker: each instance on its own lane, every call
    within the per-step deadline (rules 1, 3 and 4). Shared by every trajectory of the worker."""

    def __init__(self, factory: EnvironmentFactory, *, step_timeout_s: float = 30.0, max_hung: int = MAX_HUNG) -> None:
        if not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        if isinstance(max_hung, bool) or not isinstance(max_hung, int) or max_hung < 1:
            raise ValueError(f"max_hung must be an integer >= 1, got {max_hung!r}")
        self.factory, self.step_timeout_s, self.max_hung = factory, step_timeout_s, max_hung
        self._names = itertools.count()
        self._abandoned: set[Lane] = set()  # lanes a caller gave up on, until their call returns

    @property
    def hung(self) -> int:
        """Synchronous calls given up on (at their deadline, or at an abort) that are still running
        past the step deadline, one thread each."""
        self._abandoned = {lane for lane in self._abandoned if lane.hung}
        return sum(1 for lane in self._abandoned if lane.running_s >= self.step_timeout_s)

    def open(self) -> Env:
        """The handle of a new trajectory's environment (no user code runs yet). Raises
        EnvironmentsHung once ``max_hung`` calls are hung (rule 4)."""
        hung = self.hung
        if hung >= self.max_hung:
            raise EnvironmentsHung(f"{hung} synchronous environment calls are still running past their "
                                   f"{self.step_timeout_s:g} s deadline, one thread each: the worker stops so that a "
                                   "restart frees them (give the tool calls timeouts of their own, or raise "
                                   "--env-max-hung)")
        return Env(Lane(f"env-{next(self._names)}"))

    async def create(self, env: Env) -> None:
        """Build ``env``'s instance; EnvironmentFailed if its constructor raises or hangs."""
        factory = self.factory
        if inspect.iscoroutinefunction(factory):
            instance = await self._call(env, factory, (), "constructor")
        else:
            def build() -> Any:  # on the lane: an instance built after its caller gave up is still closed
                env.instance, env.built = factory(), True
                return env.instance

            instance = await self._call(env, build, (), "constructor")
        env.instance, env.built = instance, True

    async def reset(self, env: Env, group: SourceGroup, slot: int) -> str | tuple[int, ...] | None:
        method = _method(env, "reset")
        if method is None:
            return None
        result = await self._call(env, method, (group, slot), "reset")
        return _checked("reset", lambda: check_observation(
            result.observation if isinstance(result, Step) else result, "reset"))  # a Step: its observation

    async def step(self, env: Env, turn: ModelTurn) -> Step:
        """The environment's answer to ``turn``, as a Step of checked values (reward a finite float,
        done a bool, info a dict, observation text or a tuple of token ids)."""
        method = _method(env, "step")
        if method is None:
            raise EnvironmentFailed("the environment has no step method")
        result = await self._call(env, method, (turn,), "step")
        if not isinstance(result, Step):
            raise EnvironmentFailed(f"environment step returned {type(result).__name__}, not a Step")
        return _checked("step", lambda: _check_step(result))

    def restorable(self, env: Env) -> bool:
        """Whether ``env`` can be snapshot and restored (rule 5)."""
        return _method(env, "snapshot") is not None and _method(env, "restore") is not None

    async def snapshot(self, env: Env) -> Any:
        """``env``'s state now, read back from its JSON (what ``restore`` will be given). Call only
        when ``restorable``. EnvironmentFailed when it raises, hangs or returns something not JSON."""
        method = _method(env, "snapshot")
        if method is None:
            raise EnvironmentFailed("the environment has no snapshot method")
        state = await self._call(env, method, (), "snapshot")
        try:
            return orjson.loads(orjson.dumps(state))
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise EnvironmentFailed(f"environment snapshot returned something orjson cannot write: {exc} "
                                    "(return small JSON: dicts, lists, str, numbers)") from exc

    async def restore(self, env: Env, state: Any) -> None:
        """Bring ``env`` (just built) to ``state``, an earlier attempt's snapshot, in place of a reset."""
        method = _method(env, "restore")
        if method is None:
            raise EnvironmentFailed("the environment has no restore method")
        await self._call(env, method, (state,), "restore")

    async def close(self, env: Env) -> None:
        """Close ``env`` once, if it was built and can be; its errors are ignored (the trajectory is
        already decided). Behind a call still running (hung, or given up on at an abort), the close is
        queued on the lane and nobody waits for it; either way the lane then ends."""
        if env.closed:
            return
        env.closed = True
        try:
            if env.lane.busy:
                loop = asyncio.get_running_loop()
                env.lane.submit(lambda: _close_later(env, loop))
            elif env.built and (method := _method(env, "close")) is not None:
                await self._call(env, method, (), "close")
        except EnvironmentFailed:
            pass
        finally:
            env.lane.stop()

    async def _call(self, env: Env, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
        """``fn(*args)`` within the step deadline: a coroutine function on the loop, anything else on
        the environment's lane (and what it returns awaited on the loop when awaitable)."""
        deadline = time.monotonic() + self.step_timeout_s
        try:
            if inspect.iscoroutinefunction(fn):
                result = await abandonable(fn(*args), self.step_timeout_s)
            else:
                result = await env.lane.call(lambda: fn(*args), self.step_timeout_s)
            if inspect.isawaitable(result):
                result = await abandonable(result, max(0.0, deadline - time.monotonic()))
            return result
        except GaveUp:
            raise EnvironmentFailed(f"environment {what} exceeded its {self.step_timeout_s:g} s deadline") from None
        except EnvironmentFailed:
            raise
        except Exception as exc:  # user code: any error breaks this trajectory, with the reason
            raise EnvironmentFailed(f"environment {what} raised {explain(exc)}") from exc
        finally:
            if env.lane.hung:  # given up on (deadline, abort): it holds its thread until it returns
                self._abandoned.add(env.lane)


def _method(env: Env, name: str) -> Callable[..., Any] | None:
    """``env``'s method ``name`` (None when it has none); EnvironmentFailed when looking raises."""
    try:
        method = getattr(env.instance, name, None)
    except Exception as exc:
        raise EnvironmentFailed(f"environment {name} cannot be looked up: {explain(exc)}") from exc
    return method if callable(method) else None


def _checked(what: str, check: Callable[[], Any]) -> Any:
    """``check()``: what an environment returned, read into checked values. Reading user objects may
    raise anything (an iterator that raises, an array whose truth is ambiguous): EnvironmentFailed."""
    try:
        return check()
    except EnvironmentFailed:
        raise
    except Exception as exc:
        raise EnvironmentFailed(f"environment {what} returned something that cannot be read: {explain(exc)}") from exc


def _check_step(step: Step) -> Step:
    reward = finite(step.reward)
    if reward is None:
        raise EnvironmentFailed(f"environment step returned reward {describe(step.reward)}: "
                                "rewards must be finite numbers")
    info = step.info
    if info is not None and not isinstance(info, Mapping):
        raise EnvironmentFailed(f"environment step info must be a mapping, got {type(info).__name__}")
    return Step(check_observation(step.observation, "step"), reward, bool(step.done),
                None if info is None else dict(info))


def _close_later(env: Env, loop: asyncio.AbstractEventLoop) -> None:
    """On ``env``'s lane, after a call given up on returned: close what was built, errors ignored
    (an async close is handed to the loop, if the worker still runs)."""
    if not env.built:
        return
    try:
        result = getattr(env.instance, "close", lambda: None)()
        if inspect.iscoroutine(result):
            try:
                loop.call_soon_threadsafe(asyncio.ensure_future, result)
            except RuntimeError:  # the loop is closed: the worker is gone
                result.close()
    except Exception:  # the trajectory is long decided; nobody is left to tell
        pass


def check_observation(value: Any, what: str) -> str | tuple[int, ...] | None:
    """An observation as text, a tuple of token ids, or None; EnvironmentFailed for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Sequence):
        raise EnvironmentFailed(f"environment {what} observation must be text or token ids, got {type(value).__name__}")
    ids = tuple(value)
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**31 for t in ids):
        raise EnvironmentFailed(f"environment {what} observation token ids must be integers in 0..2^31-1")
    return ids


class Echo:
    """Built-in ``echo``: the observation repeats the model's turn; done after ``turns`` model turns
    (the group's ``metadata["turns"]``, default 2). Reward 0. For tests and drills."""

    def __init__(self) -> None:
        self.turns = 2

    def reset(self, group: SourceGroup, slot: int) -> None:
        self.turns = int(group.metadata.get("turns", 2))

    def step(self, turn: ModelTurn) -> Step:
        done = turn.index + 1 >= self.turns
        return Step(observation=None if done else turn.token_ids, done=done, info={"echoed": len(turn.token_ids)})


_BUILTINS = {"echo": "Echo"}
