"""Environments for the trajectory tests, importable by worker subprocesses (``--env tests.workers.envs:...``).

``ScriptedTool`` answers every model turn with the observation ``<o{i}>`` (reward 0.25) and ends the
trajectory after ``metadata["turns"]`` model turns (default 3) with reward 1.0, so a test can
predict every token of a trajectory from the scripted engine's text function ``turn_text``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

from rollout_queue import SourceGroup
from rollout_queue.workers.environments import ModelTurn, Step


def turn_text(prompt: str, request_id: str) -> str:
    """The scripted engine's model turn: ``m{k}.`` where k is how many observations it has seen."""
    return f"m{prompt.count('<o')}."


class ScriptedTool:
    def __init__(self) -> None:
        self.turns = 3
        self.closed = False

    def reset(self, group: SourceGroup, slot: int) -> None:
        self.turns = int(group.metadata.get("turns", 3))

    def step(self, turn: ModelTurn) -> Step:
        if turn.index + 1 >= self.turns:
            return Step(reward=1.0, done=True, info={"tool": "finish", "i": turn.index})
        return Step(observation=f"<o{turn.index}>", reward=0.25, info={"tool": "probe", "i": turn.index})


class AsyncScriptedTool(ScriptedTool):
    """The same, with async methods (run on the event loop, not the pool)."""

    async def reset(self, group: SourceGroup, slot: int) -> None:  # type: ignore[override]
        super().reset(group, slot)

    async def step(self, turn: ModelTurn) -> Step:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().step(turn)


class NeverDone:
    """Observes forever: only the worker's limits end its trajectories."""

    def step(self, turn: ModelTurn) -> Step:
        return Step(observation="<o>", reward=0.5)


class Raising:
    """A tool that breaks on prompts containing "boom" (the first step raises)."""

    def reset(self, group: SourceGroup, slot: int) -> None:
        self.boom = "boom" in group.prompt

    def step(self, turn: ModelTurn) -> Step:
        if self.boom:
            raise RuntimeError("tool crashed")
        return Step(reward=1.0, done=True)


class HangingSync:
    """A blocking tool call that never returns in time on prompts containing "hang"."""

    def reset(self, group: SourceGroup, slot: int) -> None:
        self.hang = "hang" in group.prompt

    def step(self, turn: ModelTurn) -> Step:
        if self.hang:
            time.sleep(3)
        return Step(reward=1.0, done=True)


class HangingAsync:
    """An async tool that never returns on prompts containing "hang"."""

    def reset(self, group: SourceGroup, slot: int) -> None:
        self.hang = "hang" in group.prompt

    async def step(self, turn: ModelTurn) -> Step:
        if self.hang:
            await asyncio.Event().wait()
        return Step(reward=1.0, done=True)


class Garbage:
    def step(self, turn: ModelTurn) -> Any:
        return {"observation": "not a Step"}


class SlowTool(ScriptedTool):
    """ScriptedTool whose steps take 30 s (a worker is killed while they run)."""

    async def step(self, turn: ModelTurn) -> Step:  # type: ignore[override]
        await asyncio.sleep(30)
        return super().step(turn)


class Resumable(ScriptedTool):
    """ScriptedTool with ``snapshot``/``restore`` (environments.py rule 5): the state is the turn count
    and the steps that ran, which every step reports (info ``ran``), so a test tells a restored
    environment (``ran`` goes on) from a reset one (it starts over). In a process whose environment
    has ROLLOUT_TEST_SLOW_TOOL set, the last step (the slow tool) takes 30 s: a worker is stopped
    while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[int] = []

    async def step(self, turn: ModelTurn) -> Step:  # type: ignore[override]
        if turn.index + 1 >= self.turns and os.environ.get("ROLLOUT_TEST_SLOW_TOOL"):
            await asyncio.sleep(30)
        self.ran.append(turn.index)
        out = super().step(turn)
        return Step(out.observation, out.reward, out.done, {**(out.info or {}), "ran": list(self.ran)})

    def snapshot(self) -> dict[str, Any]:
        return {"turns": self.turns, "ran": self.ran}

    def restore(self, state: dict[str, Any]) -> None:
        self.turns, self.ran = int(state["turns"]), list(state["ran"])


class Flood:
    """One observation of 10 MB of text: the token budget must cut it, quickly."""

    def step(self, turn: ModelTurn) -> Step:
        return Step(observation="x" * 10_000_000, reward=0.5)


class OddInfo:
    """Step records that are not storable (a NaN, an object): the sample is kept, its steps dropped."""

    def step(self, turn: ModelTurn) -> Step:
        if turn.index == 0:
            return Step(observation="<o0>", reward=0.5, info={"score": float("nan")})
        return Step(reward=0.5, done=True, info={"obj": object()})


class Overflow:
    """Finite step rewards whose sum is not (two of 1e308)."""

    def step(self, turn: ModelTurn) -> Step:
        return Step(observation=None if turn.index else "<o0>", reward=1e308, done=turn.index == 1)


#: Lets every Stuck call return (set by a test when it ends; a worker process never sets it).
STUCK = threading.Event()


def mark_started() -> None:
    """Create the file ROLLOUT_TEST_MARK names, if any: a test in another process sees the call began."""
    mark = os.environ.get("ROLLOUT_TEST_MARK")
    if mark:
        Path(mark).touch()


class Stuck(HangingSync):
    """A synchronous tool call that does not return on prompts containing "hang" (until STUCK is set)."""

    def step(self, turn: ModelTurn) -> Step:
        if self.hang:
            mark_started()
            STUCK.wait()
        return Step(reward=1.0, done=True)


class Stubborn(HangingSync):
    """An async tool call on prompts containing "hang" that swallows every cancellation: it never ends."""

    async def step(self, turn: ModelTurn) -> Step:  # type: ignore[override]
        while self.hang:
            mark_started()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass
        return Step(reward=1.0, done=True)


class SlowBuild(ScriptedTool):
    """ScriptedTool whose constructor takes 50 ms (a blocking set-up): weight updates land in it."""

    def __init__(self) -> None:
        time.sleep(0.05)
        super().__init__()


class _Ambiguous:
    def __bool__(self) -> bool:
        raise ValueError("the truth value of an array with more than one element is ambiguous")


class BadStep:
    """Step values that cannot be read as they should, on prompts naming them: a reward too large
    for a float, a NaN reward, a text reward, a done flag whose truth raises."""

    def reset(self, group: SourceGroup, slot: int) -> None:
        self.kind = group.prompt.split()[0]

    def step(self, turn: ModelTurn) -> Any:
        steps: dict[str, Any] = {"huge": Step(reward=10**400, done=True), "nan": Step(reward=float("nan"), done=True),
                                 "text": Step(reward="1.0", done=True),  # type: ignore[arg-type]
                                 "ambiguous": Step(reward=1.0, done=_Ambiguous())}  # type: ignore[arg-type]
        return steps.get(self.kind, Step(reward=1.0, done=True))


class OutOfVocabulary:
    """Token-id observations holding an id the scripted engine's model cannot embed (1000 >= 259):
    after each model turn, never done (so with max_turns=1 the bad observation is the last turn)."""

    def step(self, turn: ModelTurn) -> Step:
        return Step(observation=(OBS_OK, 1000), reward=0.5)


OBS_OK = 3 + ord("o")  # a valid scripted-engine id: the byte "o"
