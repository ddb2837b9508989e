"""The chaos run's trajectory groups: which are hostile, the environment and reward that make them so.

The shipped worker (``python -m rollout_queue.workers --engine scripted --env ...:ChaosEnv --reward
...:chaos_reward``) runs every group it reserves as a multi-turn trajectory against ``ChaosEnv``.
What the environment and the reward do is a deterministic function of the group alone (its
``metadata``: ``i``, ``hostile``, ``turns``, ``hang_s``, written by the producer from the group's
index), so the checker knows, for every entry, whether a counted failure of it was the group's own
doing and with which reason (``HOSTILITIES``), without reading any worker's mind.

Most groups are healthy: ``turns`` model turns (1-3), each answered with a short text observation,
the last with ``done``; their reward is ``reward_of(token_ids)``, which the trainer recomputes from
the trained sample (``trajectory_mismatch``). A hostile group breaks the worker's user code in one of
the ways issue 29 found (``HOSTILITIES``): a tool call that hangs past the step deadline (in a
thread, or in a coroutine), raises, returns something that is not a ``Step``, a reward of 10**400,
NaN or text, observation ids outside the model's vocabulary, and a ``--reward`` that overflows or
(a ``@group_reward``) returns a scalar. Each must fail only its own attempt, with that reason, and
never the worker. Poison prompts (``<poison>`` in the prompt) fail in the scripted engine itself
(``--engine-arg fail_prompt=<poison>``). A test-engine worker ignores all of this: there, a hostile
group is an ordinary one.

It imports nothing heavy (no torch): the trainer role imports ``reward_of`` and ``trajectory_mismatch``.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass
from typing import Any, Sequence

from rollout_queue.workers.environments import ModelTurn, Step
from rollout_queue.workers.rewards import group_reward

#: In a poison group's prompt: the scripted engine fails every request whose prompt contains it.
POISON_MARK = "<poison>"
#: A valid scripted-engine id (byte "o") and one far outside its 259-token vocabulary.
OBS_OK, OBS_OUTSIDE = 3 + ord("o"), 100_000
#: The environment's constructor takes this long (a blocking set-up): weight updates land in it.
BUILD_S = 0.005


@dataclass(frozen=True)
class Hostility:
    """One way a group breaks the shipped worker's user code, and the reason its attempts fail with
    (a regular expression the attempt history's ``r`` must match, ``re.search``)."""

    name: str
    reason: str


#: Every hostile kind, in the order groups are assigned them (``hostile_kind``).
HOSTILITIES: tuple[Hostility, ...] = (
    Hostility("hang", r"exceeded its [0-9.]+ s deadline"),
    Hostility("raise", r"raised RuntimeError\('chaos: tool crashed"),
    Hostility("reward_huge", r"rewards must be finite numbers"),
    Hostility("reward_nan", r"rewards must be finite numbers"),
    Hostility("reward_text", r"rewards must be finite numbers"),
    Hostility("oov", r"outside the model's vocabulary"),
    Hostility("garbage", r"not a Step"),
    Hostility("hang_async", r"exceeded its [0-9.]+ s deadline"),
    Hostility("reward_overflow", r"rewards must be finite numbers"),
    Hostility("group_scalar", r"a group reward returns a list"),
)
BY_NAME = {h.name: h for h in HOSTILITIES}
#: The reasons a poison prompt's attempts fail with: the test engine's, the scripted engine's.
POISON_REASON = r"test engine: poison prompt|scripted failure: the prompt contains"


def hostile_kind(i: int, every: int) -> str | None:
    """The hostility of group ``i`` when every ``every``-th group is hostile (0: none): the kinds in
    turn, so a run of ``len(HOSTILITIES) * every`` groups has each of them."""
    if every <= 0 or i % every != every // 2:
        return None
    return HOSTILITIES[(i // every) % len(HOSTILITIES)].name


def reward_of(token_ids: Sequence[int]) -> float:
    """A healthy trajectory's reward: a function of its tokens, so the trainer can recompute it."""
    return (sum(token_ids) % 101) / 100


def trajectory_mismatch(metadata: dict[str, Any], token_ids: Sequence[int], logprobs: Sequence[float],
                        reward: float | None, turns: Sequence[Any]) -> str | None:
    """Why a trained trajectory sample is not what a healthy ``ChaosEnv`` group gives (None: it is):
    a hostile or poison group trained at all, turns that do not cover the tokens, a logprob on an
    observation, more model turns than the group asks for, or a reward that is not ``reward_of``."""
    if metadata.get("hostile") or metadata.get("poison"):
        return f"a hostile group ({metadata.get('hostile') or 'poison'}) was trained with a trajectory"
    if sum(t.n_tokens for t in turns) != len(token_ids):
        return "turns do not cover the tokens"
    at = 0
    for t in turns:
        if not t.trained and any(lp != 0.0 for lp in logprobs[at:at + t.n_tokens]):
            return "an observation token carries a logprob"
        at += t.n_tokens
    if sum(1 for t in turns if t.trained) > int(metadata.get("turns", 1)):
        return "more model turns than the environment allows"
    if reward is None or not math.isclose(reward, reward_of(token_ids)):
        return f"reward {reward} is not the chaos reward of its tokens {reward_of(token_ids)}"
    return None


class ChaosEnv:
    """The environment of every trajectory a shipped worker runs in a chaos run (module docstring)."""

    def __init__(self) -> None:
        time.sleep(BUILD_S)
        self.kind: str | None = None
        self.turns, self.hang_s = 1, 0.0

    def reset(self, group: Any, slot: int) -> None:
        meta = group.metadata
        self.kind, self.turns, self.hang_s = meta.get("hostile"), int(meta.get("turns", 1)), float(meta.get("hang_s", 0))

    def snapshot(self) -> dict[str, Any]:
        """The state after a step (environments.py rule 5): with it a trajectory cut short (an abort at
        a weight update, a drain, a kill after a periodic save) continues from its last complete turn
        in the next attempt, so chaos runs exercise partial rollouts (samples.py checks them)."""
        return {"kind": self.kind, "turns": self.turns, "hang_s": self.hang_s}

    def restore(self, state: dict[str, Any]) -> None:
        """In place of ``reset`` in a later attempt: what ``step`` needs is all in the state (the turn
        index comes with each ModelTurn)."""
        self.kind, self.turns, self.hang_s = state["kind"], int(state["turns"]), float(state["hang_s"])

    def step(self, turn: ModelTurn) -> Any:
        kind, last = self.kind, turn.index + 1 >= self.turns
        if kind == "hang":
            time.sleep(self.hang_s)  # past the step deadline: the worker gives up on this thread
        elif kind == "raise":
            raise RuntimeError("chaos: tool crashed")
        elif kind == "garbage":
            return {"observation": "not a Step"}
        elif kind in ("reward_huge", "reward_nan", "reward_text"):
            bad: dict[str, Any] = {"reward_huge": 10**400, "reward_nan": math.nan, "reward_text": "1.0"}
            return Step(reward=bad[kind], done=True)  # wrong on purpose: the worker must refuse each
        elif kind == "oov":
            return Step(observation=(OBS_OK, OBS_OUTSIDE), reward=0.0)
        elif kind == "hang_async":
            return self._hang_async()
        return Step(reward=1.0, done=True) if last else Step(observation=f"<o{turn.index}>", reward=0.25,
                                                             info={"tool": "probe", "i": turn.index})

    async def _hang_async(self) -> Step:
        await asyncio.sleep(self.hang_s)  # a coroutine the worker must cancel at the step deadline
        return Step(reward=1.0, done=True)


@group_reward
def chaos_reward(group: Any, outputs: Sequence[Any]) -> Any:
    """``--reward``: ``reward_of`` each output, except for the groups designed to break it."""
    kind = group.metadata.get("hostile")
    if kind == "reward_overflow":
        return [10**400 for _ in outputs]
    if kind == "group_scalar":
        return 1.0
    return [reward_of(o.token_ids) for o in outputs]


def reason_matches(pattern: str, reason: str) -> bool:
    return re.search(pattern, reason or "") is not None
