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

Imported by the worker processes (``--env rollout_queue.demo.tools_task:ModeTool``), so it must stay
importable without torch.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from rollout_queue.workers.environments import ModelTurn, Step

ENV_SPEC = "rollout_queue.demo.tools_task:ModeTool"
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


def records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """The task's first ``count`` prompt records: ``{"id", "prompt", "mode"}``."""
    rng = random.Random(seed)
    return [{"id": f"t{i}", "prompt": _QUESTIONS[i % len(_QUESTIONS)].format(i=i), "mode": rng.choice(sorted(MODES))}
            for i in range(count)]


def write_dataset(path: Path, count: int, seed: int = 0) -> Path:
    """``count`` records as JSONL, the producer's input (``mode`` rides in each group's metadata)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for record in records(count, seed):
            f.write(orjson.dumps(record) + b"\n")
    return path
