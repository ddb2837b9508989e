"""The demo's task: teach a randomly initialised tiny model to answer in digits.

Every prompt asks for a number; the reward of a sample is the share of its non-space characters
that are digits (0.0 - 1.0). The tiny model's byte-level vocabulary has about 23 digit tokens out
of 480, so a random policy scores about 0.05 and GRPO has signal from the first step: most groups
of 8 samples contain a sample with more digits than the others. On a CPU the reward climbs past
0.8 within a few dozen optimizer steps. It is a toy task chosen to learn fast, not a benchmark.

This module is imported by the worker processes (``--reward rollout_queue.demo.task:digit_reward``),
so it must stay importable without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
