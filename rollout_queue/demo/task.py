"""The demo's tasks: ``digits`` (the default, below), ``tools`` (multi-turn, tools_task.py) and
``tools-heavy`` (``tools`` with a slow tool on about one prompt in ten: a heavy-tailed workload).

The ``digits`` task: teach a randomly initialised tiny model to answer in digits.

Every prompt asks for a number; the reward of a sample is the share of its non-space characters
that are digits (0.0 - 1.0). The tiny model's byte-level vocabulary has about 23 digit tokens out
of 480, so a random policy scores about 0.05 and GRPO has signal from the first step: most groups
of 8 samples contain a sample with more digits than the others. On a CPU the reward climbs past
0.8 within a few dozen optimizer steps. It is a toy task chosen to learn fast, not a benchmark.

This module is imported by the worker processes (``--reward rollout_queue.demo.task:digit_reward``),
so it must stay importable without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import orjson

REWARD_SPEC = "rollout_queue.demo.task:digit_reward"
TASK = "answer in digits: reward = share of the generated non-space characters that are digits"
_QUESTIONS = (
    "Question {i}: what number comes next?",
    "Q{i}. Pick a number between 0 and 100.",
    "Count with me, step {i}:",
    "How many shells did she sell on day {i}?",
    "Task {i}: write the answer as a number.",
)


def digit_reward(group: Any, output: Any) -> float:
    """Share of the non-space characters of the completion that are digits (0 for an empty one)."""
    chars = [c for c in output.text if not c.isspace()]
    return sum(c.isdigit() for c in chars) / len(chars) if chars else 0.0


def prompts(count: int) -> list[str]:
    """The task's first ``count`` prompts (the same ones ``write_dataset`` writes)."""
    return [_QUESTIONS[i % len(_QUESTIONS)].format(i=i) for i in range(count)]


def write_dataset(path: Path, count: int) -> Path:
    """``count`` prompt records as JSONL (``{"id", "prompt"}``), the producer's input."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for i, prompt in enumerate(prompts(count)):
            f.write(orjson.dumps({"id": f"q{i}", "prompt": prompt}) + b"\n")
    return path


@dataclass(frozen=True)
class DemoTask:
    """What the demo needs to know of a task: its dataset, what the workers run, and its defaults."""

    name: str
    description: str
    write_dataset: Callable[[Path, int, int], Path]  # (path, count, seed) -> path
    metadata_fields: tuple[str, ...]                # dataset columns kept in each group's metadata
    reward: str | None                              # the workers' --reward (None: the environment's)
    target: float                                   # the reward --compare measures time to
    metric: str | None = None                       # name of the per-sample "metric" an environment records
    env: str | None = None                          # the workers' --env
    steps: int = 80                                 # default optimizer steps
    max_tokens: int = 16                            # default tokens per model turn
    #: whether a group (by its metadata) is one of a heavy-tailed task's long ones; None: none is
    is_long: Callable[[Mapping[str, Any]], bool] | None = None

    def worker_args(self, max_tokens: int) -> list[str]:
        """The task's worker options beyond the demo's own (a multi-turn task's environment and limits)."""
        if self.env is None:
            return []
        return ["--env", self.env, "--max-turns", "2", "--trajectory-tokens", str(2 * max_tokens + 64)]


def _tools(heavy: bool) -> DemoTask:
    from rollout_queue.demo import tools_task

    if heavy:
        return DemoTask("tools-heavy", tools_task.HEAVY_TASK,
                        lambda path, count, seed: tools_task.write_dataset(path, count, seed, heavy=True),
                        ("id", "mode", "tool_s"), None, 0.8, tools_task.METRIC, tools_task.HEAVY_ENV_SPEC,
                        steps=120, max_tokens=3, is_long=tools_task.is_long)
    return DemoTask("tools", tools_task.TASK, tools_task.write_dataset, ("id", "mode"), None, 0.8,
                    tools_task.METRIC, tools_task.ENV_SPEC, steps=120, max_tokens=3)


TASKS = ("digits", "tools", "tools-heavy")


def demo_task(name: str) -> DemoTask:
    """The task called ``name`` (one of TASKS); ValueError for any other."""
    if name == "digits":
        return DemoTask("digits", TASK, lambda path, count, seed: write_dataset(path, count), ("id",), REWARD_SPEC, 0.8)
    if name in ("tools", "tools-heavy"):
        return _tools(name == "tools-heavy")
    raise ValueError(f"unknown demo task {name!r}: choose {', '.join(TASKS)}")
