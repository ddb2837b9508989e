"""Rewards and filters: loading ``module:function`` specs, calling them, and the built-in ones.

What a worker runs between generation and ``complete``:

- A **reward** scores samples. Per sample (the default): ``fn(group, output) -> float``. Per group
  (mark it with ``@group_reward``): ``fn(group, outputs) -> [float, ...]``, one per output, in slot
  order (for rewards that compare samples, or score them in one batched call). Either may be
  ``async def``. ``group`` is the pristine ``SourceGroup`` (prompt, metadata such as the expected
  answer); ``output`` is a ``Generated``: slot, decoded text, token ids, logprobs, finish reason.
- A **filter** decides whether a scored group is worth training on: ``fn(group, samples) -> None``
  (keep) or a reason such as ``"zero_std"`` or ``"all rewards equal"`` (reject: the group is settled ``filtered``,
  consumed and never trained). ``True`` rejects with the function's name as the reason.

Rules (docs/USAGE.md, "Rewards and filters", says them for users; examples/rewards.py is the
tested example):
1. A reward returns a finite ``int`` or ``float`` per output (``bool`` is refused: ``True`` is almost
   always a bug); a group reward a sequence of exactly one per output. A reward or filter that
   raises, or returns anything else (or a reason that is no text), raises ``ScoringError``; the
   runtime ends the attempt ``failed`` with its message, which counts toward ``max_attempts``, so a
   prompt that always breaks the reward ends in the dead letters. Whatever comes back is read here
   and nowhere else: an int too large for a float (``10**400``), a NaN, a string, a scalar where a
   group reward owes a list, an iterator that raises. Nothing a reward returns can raise anything
   but ``ScoringError`` out of ``Scorer``.
2. Synchronous functions run on one dedicated daemon thread (``Scorer``, a ``tasks.Lane``), never on
   the event loop (a slow reward must not stall generation) and never two at once (user code need
   not be thread-safe). So a reward that never returns holds this worker's scoring (a reward has no
   deadline of its own), but never its drain or its exit: the thread is a daemon.
3. No tokenizer here: the runtime decodes text on its own thread and hands it in.

Specs: ``package.module:function``, imported from the worker's Python path, or the bare name of a
built-in (``nonzero_std``, ``arithmetic_exact_match``, ``length_reward``, ``target_token_fraction``).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

from rollout_queue.core.checks import check_number, describe
from rollout_queue.core.errors import InvalidInput, ScoringError
from rollout_queue import Sample, SourceGroup, Turn
from rollout_queue.core.models import check_reason
from rollout_queue.workers.tasks import Lane, abandonable


@dataclass(frozen=True)
class Generated:
    """What a reward sees of one sample."""

    slot: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    turns: tuple[Turn, ...] = ()  # a trajectory's model turns and observations (text decodes them all)


RewardFn = Callable[..., Any]
FilterFn = Callable[[SourceGroup, Sequence[Sample]], Any]


def group_reward(fn: RewardFn) -> RewardFn:
    """Mark ``fn(group, outputs) -> [reward per output]`` as a per-group reward."""
    fn.reward_scope = "group"  # type: ignore[attr-defined]  # read back by is_group_reward
    return fn


def is_group_reward(fn: RewardFn) -> bool:
    return getattr(fn, "reward_scope", "sample") == "group"


def load_function(spec: str, *, builtins: str = __name__, names: Mapping[str, str] | None = None,
                  kind: str = "function") -> Callable[..., Any]:
    """Import ``module:attr``, or a built-in's bare name: an attribute of the module ``builtins``
    (through ``names`` when given: bare name -> attribute). Rewards, filters and environments load
    this way. Raises ValueError with what to fix."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, attr = builtins, (spec if names is None else names.get(spec, spec))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {spec!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        listed = f" ({', '.join(sorted(names))})" if names else ""
        where = f"a built-in{listed}" if not sep else f"a {kind} in {module_name}"
        raise ValueError(f"{spec!r} is not {where}; use module:{kind}")
    return fn


class Scorer:
    """Runs one reward and one filter (each optional) for the runtime; see the module rules."""

    def __init__(self, reward: RewardFn | None = None, filter: FilterFn | None = None) -> None:
        self.reward, self.filter = reward, filter
        self._lane = Lane("reward")

    @property
    def needs_text(self) -> bool:
        return self.reward is not None

    async def score(self, group: SourceGroup, outputs: Sequence[Generated]) -> list[float | None]:
        """One reward per output (all None without a reward function). Raises ScoringError."""
        fn = self.reward
        if fn is None:
            return [None] * len(outputs)
        if is_group_reward(fn):
            values = await self._guard(fn, self._call(fn, group, list(outputs)))
        elif inspect.iscoroutinefunction(fn):
            values = await self._guard(fn, asyncio.gather(*(fn(group, o) for o in outputs)))
        else:
            values = await self._guard(fn, self._call(lambda: [fn(group, o) for o in outputs]))
        return list(_rewards(values, fn, len(outputs)))  # list[float] as list[float | None] (invariant list)

    async def check(self, group: SourceGroup, samples: Sequence[Sample]) -> str | None:
        """None to keep the group, or the reason (free text) it is filtered for. Raises ScoringError."""
        fn = self.filter
        if fn is None:
            return None
        verdict = await self._guard(fn, self._call(fn, group, list(samples)))
        if verdict is None or verdict is False:
            return None
        reason = getattr(fn, "__name__", "filter") if verdict is True else verdict
        try:
            return check_reason(reason, "filter reason")
        except ValueError as exc:
            raise ScoringError(f"filter {_name(fn)} returned a bad reason: {exc}") from exc

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await ``fn(*args)``: coroutine functions on the loop, the rest on the reward thread."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        result = await self._lane.call(lambda: fn(*args))
        return await result if inspect.isawaitable(result) else result

    @staticmethod
    async def _guard(fn: Callable[..., Any], work: Awaitable[Any]) -> Any:
        """Await user code; cancelling the caller never waits for it (``abandonable``)."""
        try:
            return await abandonable(work)
        except Exception as exc:  # user code: any error ends this attempt failed, with the reason
            raise ScoringError(f"{_name(fn)} raised {explain(exc)}") from exc

    def close(self) -> None:
        """Let the reward thread end once its call returns (a hung one never holds the exit)."""
        self._lane.stop()


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"


def explain(exc: BaseException) -> str:
    """``repr(exc)`` for a reason; user code's exceptions may have a repr that raises."""
    try:
        return repr(exc)
    except Exception:
        return f"{type(exc).__name__}(<unprintable>)"


def finite(value: Any) -> float | None:
    """A reward as a finite float, or None: not a real number (a bool, a string, None), NaN or an
    infinity, an int too large for a float (``10**400``), or a number type whose ``float()`` raises.
    The one check of a reward's value, for reward functions and environment steps alike."""
    try:
        return check_number(value, "reward")
    except Exception:  # InvalidInput, or user code's number type failing its own conversion
        return None


def _rewards(values: Any, fn: RewardFn, count: int) -> list[float]:
    """What a reward function returned, as ``count`` finite floats (rule 1); ScoringError for
    anything else, whatever reading it raises."""
    if isinstance(values, (str, bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise ScoringError(f"reward {_name(fn)} returned {describe(values)}: a group reward returns a list "
                           "with one reward per sample")
    try:
        items = list(values)
    except Exception as exc:  # an iterator of user code that raises
        raise ScoringError(f"reward {_name(fn)} returned rewards that cannot be read: {explain(exc)}") from exc
    if len(items) != count:
        raise ScoringError(f"reward {_name(fn)} returned {len(items)} values for {count} samples")
    rewards = [finite(v) for v in items]
    for value, reward in zip(items, rewards):
        if reward is None:
            raise ScoringError(f"reward {_name(fn)} returned {describe(value)}; rewards must be finite numbers")
    return rewards  # type: ignore[return-value]  # no None left


# -- built-ins -----------------------------------------------------------------------------------


def nonzero_std(group: SourceGroup, samples: Sequence[Sample]) -> str | None:
    """DAPO's dynamic sampling filter: reject a group whose rewards are all equal ("zero_std").

    Such a group has zero advantage everywhere under GRPO-style normalisation, so it would cost a
    trainer compute and teach nothing. A group of one sample is always rejected (use no filter for
    n=1). Samples without a reward make it raise: configure a reward with this filter.
    """
    rewards = [s.reward for s in samples]
    if any(r is None for r in rewards):
        raise ValueError("nonzero_std needs rewards: configure --reward as well")
    return "zero_std" if len(set(rewards)) <= 1 else None


_OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b, "plus": lambda a, b: a + b,
    "-": lambda a, b: a - b, "minus": lambda a, b: a - b,
    "*": lambda a, b: a * b, "x": lambda a, b: a * b, "times": lambda a, b: a * b,
}
_PROBLEM = re.compile(r"(-?\d+)\s*(\+|-|\*|x|plus|minus|times)\s*(-?\d+)")
_INTEGER = re.compile(r"-?\d+")


def expected_answer(group: SourceGroup) -> int:
    """``metadata["answer"]`` if given, else the value of the first ``a op b`` in the prompt."""
    if "answer" in group.metadata:
        return int(group.metadata["answer"])
    match = _PROBLEM.search(group.prompt)
    if match is None:
        raise ValueError(f"no metadata['answer'] and no 'a + b' problem in prompt {group.prompt[:80]!r}")
    a, op, b = match.groups()
    return _OPS[op](int(a), int(b))


def arithmetic_exact_match(group: SourceGroup, output: Generated) -> float:
    """1.0 when the last integer in the completion equals the expected answer, else 0.0.

    The answer is ``metadata["answer"]`` or computed from an ``a + b`` / ``a times b`` problem in
    the prompt (``+ - * x plus minus times``), e.g. ``"What is 12 plus 30? Answer:"`` expects 42.
    """
    expected = expected_answer(group)  # first: a group without an answer is an error, not a 0
    found = _INTEGER.findall(output.text)
    return 1.0 if found and int(found[-1]) == expected else 0.0


def length_reward(group: SourceGroup, output: Generated) -> float:
    """1 - |tokens - target| / target, clipped at 0 (target: ``metadata["target_len"]``, default 16).

    A smooth toy reward any model can climb (even a random tiny one): RL demos see it rise.
    """
    target = int(group.metadata.get("target_len", 16))
    if target < 1:
        raise ValueError(f"target_len must be >= 1, got {target}")
    return max(0.0, 1.0 - abs(len(output.token_ids) - target) / target)


def target_token_fraction(group: SourceGroup, output: Generated) -> float:
    """The fraction of generated tokens equal to ``metadata["target_token_id"]`` (0 if none)."""
    if "target_token_id" not in group.metadata:
        raise ValueError("target_token_fraction needs metadata['target_token_id']")
    target = int(group.metadata["target_token_id"])
    ids = output.token_ids
    return sum(1 for t in ids if t == target) / len(ids) if ids else 0.0
