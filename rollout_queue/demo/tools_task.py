"""The demo's multi-turn task (``rollout-queue demo --task tools``): ask a tool how to answer, then obey it.

Each trajectory has two model turns. The first is the model's request (any text: the tool answers
whatever is asked); the environment then appends the tool's observation, which says in what to
answer: ``tool: reply with digits: 1234`` or ``tool: reply with letters: abcd``, chosen at random per
prompt and never in the prompt; the second model turn is the answer, right after it, and ends the
trajectory. Only the model's turns are trained (the observation's tokens have loss mask 0).

The reward of the answer is the share of its non-space characters of the class the tool asked for
(digits or letters), 0 to 1. A policy that ignores the observation can earn 0.5 at most (half the
prompts want each class); only one that reads it can earn more. The summary also reports the
``tool-follow rate``: the share of answers mostly of the asked class (0.5 is chance).

The observation ends with examples of the asked class, so a model this small can learn to use it
within a demo's few dozen steps (continue in the class it just read); the first demos asked it to
repeat a secret digit, which a 2-layer model from random weights did not learn in 80 steps (it
settled on one favourite digit: 0.1 of the answers right, chance).

``--task tools-heavy`` is the same task with a heavy tail: the tool answers about one prompt in ten
(``LONG_SHARE``) 10-30x slower than the median (``MEDIAN_TOOL_S``), the latency drawn per prompt from
the seed and carried in the group's metadata (``tool_s``), so a long trajectory's two model turns lie
several policy versions apart, as an agent's slow tool call (a test suite, a web search) does. It is
what the queue's staleness modes and fairness rule are for: on-policy, the trainer waits for the
slowest trajectory of every batch; async, short work keeps it fed while the long ones run.

Imported by the worker processes (``--env rollout_queue.demo.tools_task:ModeTool``, or
``:SlowModeTool``), so it must stay importable without torch.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from rollout_queue.workers.environments import ModelTurn, Step

ENV_SPEC = "rollout_queue.demo.tools_task:ModeTool"
HEAVY_ENV_SPEC = "rollout_queue.demo.tools_task:SlowModeTool"
HEAVY_TASK = ("tools-heavy: the tools task with a heavy-tailed tool: about one prompt in ten waits 10-30x the "
              "median tool latency between its two model turns, so it spans several policy versions")
MEDIAN_TOOL_S = 0.15  # a short prompt's tool latency is drawn from 0.5-1.5x this (its median)
LONG_SHARE = 0.1      # the share of prompts whose tool is slow
LONG_FACTOR = (10.0, 30.0)  # a slow tool's latency, in medians (1.5-4.5 s: under the worker's 30 s step deadline)
TASK = ("tools: ask a tool in what to answer (digits or letters, hidden in its reply), then answer in it; "
        "reward = share of the answer in the asked class (ignoring the tool: 0.5 at most); only the model's "
        "turns are trained")
METRIC = "tool-follow rate"  # the per-sample value the environment records as the final step's "metric"
MODES = {"digits": ("1234", str.isdigit), "letters": ("abcd", str.isalpha)}
_QUESTIONS = (
    "Task {i}: ask the tool how to reply, then reply.",
    "Puzzle {i}. The tool knows the format; ask it.",
    "Step {i}: call the tool and follow it.",
    "Game {i}: what does the tool want?",
)


def shares(text: str, mode: str) -> tuple[float, float]:
    """(share of the non-space characters in ``mode``'s class, share in the other class)."""
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0, 0.0
    other = "letters" if mode == "digits" else "digits"
    wanted, unwanted = MODES[mode][1], MODES[other][1]
    return sum(map(wanted, chars)) / len(chars), sum(map(unwanted, chars)) / len(chars)


def answer_reward(text: str, mode: str) -> float:
    """The share of the answer's non-space characters in the class ``mode`` asks for."""
    return shares(text, mode)[0]


class ModeTool:
    """The environment: turn 0 gets the tool's reply (the mode), turn 1 is scored and ends it."""

    def __init__(self) -> None:
        self.mode = "digits"

    def reset(self, group: Any, slot: int) -> None:
        mode = group.metadata.get("mode")
        if mode not in MODES:
            raise ValueError(f"group {group.source_id!r} has no metadata['mode'] (digits or letters)")
        self.mode = mode

    def step(self, turn: ModelTurn) -> Step:
        if turn.index == 0:
            return Step(observation=f"\ntool: reply with {self.mode}: {MODES[self.mode][0]}", info={"tool": "mode"})
        wanted, unwanted = shares(turn.text, self.mode)
        return Step(reward=wanted, done=True, info={"metric": 1.0 if wanted > unwanted else 0.0})


class SlowModeTool:
    """``ModeTool`` behind a tool that takes the group's ``tool_s`` seconds to answer (``--task tools-heavy``).

    The wait is ``asyncio.sleep`` (the runtime awaits an ``async`` step on its loop), so a slow tool
    holds no thread and stalls neither generation nor the heartbeat, as a real remote tool call would
    not. The latency is recorded in the step's info, so a trained sample shows what it waited for."""

    def __init__(self) -> None:
        self.tool = ModeTool()
        self.tool_s = 0.0

    def reset(self, group: Any, slot: int) -> None:
        self.tool.reset(group, slot)
        tool_s = group.metadata.get("tool_s")
        if isinstance(tool_s, bool) or not isinstance(tool_s, (int, float)) or not 0 <= tool_s < 30:
            raise ValueError(f"group {group.source_id!r} has no metadata['tool_s'] (the tool's latency in seconds, "
                             "0 to 30): write its dataset with tools_task.write_dataset(..., heavy=True)")
        self.tool_s = float(tool_s)

    async def step(self, turn: ModelTurn) -> Step:
        answer = self.tool.step(turn)
        if turn.index != 0:
            return answer
        await asyncio.sleep(self.tool_s)
        return Step(observation=answer.observation, info={"tool": "mode", "tool_s": round(self.tool_s, 3)})


def tool_latency(seed: int, index: int) -> float:
    """Prompt ``index``'s tool latency in seconds: its own seeded draw, so the same prompts are slow in
    every run and mode of one seed (and adding prompts changes no earlier prompt's)."""
    rng = random.Random(f"tool-latency:{seed}:{index}")
    if rng.random() < LONG_SHARE:
        return round(MEDIAN_TOOL_S * rng.uniform(*LONG_FACTOR), 3)
    return round(MEDIAN_TOOL_S * rng.uniform(0.5, 1.5), 3)


def is_long(metadata: Mapping[str, Any]) -> bool:
    """Whether a group's tool is one of the slow ones (at least LONG_FACTOR[0] medians)."""
    tool_s = metadata.get("tool_s")
    return isinstance(tool_s, (int, float)) and tool_s >= MEDIAN_TOOL_S * LONG_FACTOR[0]


def records(count: int, seed: int = 0, heavy: bool = False) -> list[dict[str, Any]]:
    """The task's first ``count`` prompt records: ``{"id", "prompt", "mode"}``, and ``tool_s`` (the
    tool's latency) when ``heavy``; the modes are the same either way."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(count):
        record: dict[str, Any] = {"id": f"t{i}", "prompt": _QUESTIONS[i % len(_QUESTIONS)].format(i=i),
                                  "mode": rng.choice(sorted(MODES))}
        if heavy:
            record["tool_s"] = tool_latency(seed, i)
        out.append(record)
    return out


def write_dataset(path: Path, count: int, seed: int = 0, heavy: bool = False) -> Path:
    """``count`` records as JSONL, the producer's input (``mode``, and ``tool_s`` when ``heavy``, ride in
    each group's metadata)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for record in records(count, seed, heavy):
            f.write(orjson.dumps(record) + b"\n")
    return path
