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

Rules:
1. Any method may be ``async def``; a synchronous one runs on the environments' thread pool, never
   on the event loop, so a blocking tool call (a subprocess, an HTTP request) stalls neither
   generation nor the heartbeat. Instances are never called from two threads at once.
2. An observation is text (tokenized by the engine's tokenizer without special tokens) or token ids
   (used as they are). It is appended to the trajectory and never trained (loss mask 0).
3. The environment's faults are the attempt's faults: a method that raises, returns something that
   is not a ``Step`` (or an observation), or exceeds the per-step deadline raises
   ``EnvironmentFailed``; the runtime ends the attempt ``failed`` with that reason, which counts
   toward ``max_attempts`` (an environment that always breaks on a prompt ends in the dead letters).
   The queue's own reasons to stop (a weight update, a drain, a hold) abort the trajectory instead,
   which never counts.

Built-in: ``echo`` (repeats the model's turn back as the observation; tests and drills).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from rollout_queue.core.errors import EnvironmentFailed
from rollout_queue.core.models import SourceGroup
from rollout_queue.workers.rewards import load_function

__all__ = ["Echo", "Environment", "EnvironmentFailed", "EnvironmentHost", "ModelTurn", "Step", "load_environment"]


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


class EnvironmentHost:
    """Builds and calls the environments of one worker: the thread pool for synchronous methods and
    the per-step deadline (rule 3). Shared by every trajectory of the worker."""

    def __init__(self, factory: EnvironmentFactory, *, step_timeout_s: float = 30.0, threads: int = 32) -> None:
        if not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s must be > 0, got {step_timeout_s}")
        self.factory, self.step_timeout_s = factory, step_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="env")

    async def create(self) -> Any:
        """A fresh environment instance; EnvironmentFailed if its constructor raises."""
        return await self._call(self.factory, "constructor")

    async def reset(self, env: Any, group: SourceGroup, slot: int) -> str | tuple[int, ...] | None:
        method = getattr(env, "reset", None)
        if method is None:
            return None
        result = await self._call(lambda: method(group, slot), "reset")
        if isinstance(result, Step):  # a Step is accepted for symmetry: its observation counts
            result = result.observation
        return check_observation(result, "reset")

    async def step(self, env: Any, turn: ModelTurn) -> Step:
        result = await self._call(lambda: env.step(turn), "step")
        if not isinstance(result, Step):
            raise EnvironmentFailed(f"environment step returned {type(result).__name__}, not a Step")
        reward = result.reward
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EnvironmentFailed(f"environment step returned reward {reward!r}: rewards must be finite numbers")
        if result.info is not None and not isinstance(result.info, Mapping):
            raise EnvironmentFailed(f"environment step info must be a mapping, got {type(result.info).__name__}")
        check_observation(result.observation, "step")
        return result

    async def close(self, env: Any) -> None:
        """Close ``env`` if it can be; its errors are ignored (the trajectory is already decided)."""
        method = getattr(env, "close", None)
        if method is None:
            return
        try:
            await self._call(method, "close")
        except EnvironmentFailed:
            pass

    async def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """``fn()`` within the step deadline: coroutines on the loop, the rest on the pool."""
        try:
            async with asyncio.timeout(self.step_timeout_s):
                if inspect.iscoroutinefunction(fn):
                    return await fn()
                result = await asyncio.get_running_loop().run_in_executor(self._pool, fn)
                return await result if inspect.isawaitable(result) else result
        except TimeoutError:
            # A synchronous call keeps its thread until it returns; the pool has room for a few.
            raise EnvironmentFailed(f"environment {what} exceeded its {self.step_timeout_s:g} s deadline") from None
        except EnvironmentFailed:
            raise
        except Exception as exc:  # user code: any error breaks this trajectory, with the reason
            raise EnvironmentFailed(f"environment {what} raised {exc!r}") from exc

    def close_pool(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def check_observation(value: Any, what: str) -> str | tuple[int, ...] | None:
    """An observation as text, a tuple of token ids, or None; EnvironmentFailed for anything else."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Sequence):
        raise EnvironmentFailed(f"environment {what} observation must be text or token ids, got {type(value).__name__}")
    if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**31 for t in value):
        raise EnvironmentFailed(f"environment {what} observation token ids must be integers in 0..2^31-1")
    return tuple(value)


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
