"""Rewards and filters with no Redis: loading specs, sync/async, per sample/per group, errors."""

from __future__ import annotations

import asyncio
import re
import threading

import pytest

from rollout_queue import Sample, SourceGroup
from rollout_queue.workers import rewards
from rollout_queue.workers.rewards import Generated, Scorer, ScoringError, group_reward, load_function

GROUP = SourceGroup("s-1", "What is 12 plus 30? Answer:", 3, {"target_len": 4})


def out(slot: int, text: str = "", tokens: tuple[int, ...] = (5, 6)) -> Generated:
    return Generated(slot, text, tokens, tuple(-0.5 for _ in tokens), "stop")


def sample(slot: int, reward: float | None) -> Sample:
    return Sample(slot, (1,), (-0.1,), reward=reward)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_load_function_resolves_specs_and_builtins() -> None:
    assert load_function("nonzero_std") is rewards.nonzero_std
    assert load_function("rollout_queue.workers.rewards:length_reward") is rewards.length_reward
    for bad in ("no_such_builtin", "rollout_queue.workers.rewards:nope", "no.such.module:f"):
        with pytest.raises(ValueError):
            load_function(bad)


def test_per_sample_sync_reward_runs_off_the_event_loop() -> None:
    threads: set[str] = set()

    def reward(group: SourceGroup, o: Generated) -> float:
        threads.add(threading.current_thread().name)
        return float(o.slot)

    scorer = Scorer(reward)
    assert run(scorer.score(GROUP, [out(0), out(1), out(2)])) == [0.0, 1.0, 2.0]
    assert threads and all(name.startswith("reward") for name in threads)
    scorer.close()


def test_async_and_group_rewards() -> None:
    async def per_sample(group: SourceGroup, o: Generated) -> float:
        await asyncio.sleep(0)
        return 1.0 if o.slot == 1 else 0.0

    @group_reward
    def ranked(group: SourceGroup, outputs: list[Generated]) -> list[float]:
        return [float(len(outputs) - o.slot) for o in outputs]

    @group_reward
    async def ranked_async(group: SourceGroup, outputs: list[Generated]) -> list[int]:
        return [o.slot for o in outputs]

    outputs = [out(0), out(1), out(2)]
    assert run(Scorer(per_sample).score(GROUP, outputs)) == [0.0, 1.0, 0.0]
    assert run(Scorer(ranked).score(GROUP, outputs)) == [3.0, 2.0, 1.0]
    assert run(Scorer(ranked_async).score(GROUP, outputs)) == [0.0, 1.0, 2.0]
    assert run(Scorer().score(GROUP, outputs)) == [None, None, None]


@pytest.mark.parametrize("result", [float("nan"), "high", None, True])
def test_a_reward_that_returns_garbage_is_a_scoring_error(result: object) -> None:
    with pytest.raises(ScoringError, match="finite"):
        run(Scorer(lambda g, o: result).score(GROUP, [out(0)]))


def test_a_reward_that_raises_is_a_scoring_error_with_the_reason() -> None:
    def broken(group: SourceGroup, o: Generated) -> float:
        raise KeyError("answer")

    async def broken_async(group: SourceGroup, o: Generated) -> float:
        raise RuntimeError("judge unreachable")

    with pytest.raises(ScoringError, match="KeyError"):
        run(Scorer(broken).score(GROUP, [out(0)]))
    with pytest.raises(ScoringError, match="judge unreachable"):
        run(Scorer(broken_async).score(GROUP, [out(0)]))
    with pytest.raises(ScoringError, match="2 values for 3"):
        run(Scorer(group_reward(lambda g, os: [1.0, 2.0])).score(GROUP, [out(0), out(1), out(2)]))


@pytest.mark.parametrize(("result", "shown"), [
    (10**400, "int 1000000"),  # no float holds it: math.isfinite raised OverflowError
    (10**5000, "<16610-bit integer>"),  # not even a repr
    (float("inf"), "float inf"),
    ([1.0], "list [1.0]"),
], ids=["10**400", "10**5000", "inf", "list"])
def test_a_per_sample_reward_that_is_no_finite_number_is_a_scoring_error(result: object, shown: str) -> None:
    """Issue 29 item 10: nothing a reward returns raises anything but ScoringError."""
    with pytest.raises(ScoringError, match="rewards must be finite numbers") as caught:
        run(Scorer(lambda g, o: result).score(GROUP, [out(0)]))
    assert shown in str(caught.value)


def raising_rewards() -> object:
    yield 1.0
    raise RuntimeError("judge went away mid-list")


class NoFloat(float):
    def __float__(self) -> float:
        raise RuntimeError("a number type of user code that cannot convert itself")


@pytest.mark.parametrize(("result", "message"), [
    (1.0, "returned float 1.0: a group reward returns a list with one reward per sample"),  # used to be a TypeError
    (None, "returned NoneType None: a group reward returns a list"),
    ("abc", "returned str 'abc': a group reward returns a list"),
    ({0: 1.0, 1: 1.0}, "returned dict"),
    ([1.0, 10**400], "returned int 1000000"),
    ([1.0, NoFloat(2.0)], "rewards must be finite numbers"),
    (raising_rewards(), "rewards that cannot be read: RuntimeError('judge went away mid-list')"),
], ids=["scalar", "none", "text", "dict", "10**400", "no-float", "raising-iterator"])
def test_a_group_reward_that_returns_no_list_of_finite_numbers_is_a_scoring_error(result: object,
                                                                                 message: str) -> None:
    with pytest.raises(ScoringError, match=re.escape(message)):
        run(Scorer(group_reward(lambda g, os: result)).score(GROUP, [out(0), out(1)]))


def test_nonzero_std_filter() -> None:
    scorer = Scorer(filter=rewards.nonzero_std)
    assert run(scorer.check(GROUP, [sample(0, 1.0), sample(1, 1.0)])) == "zero_std"
    assert run(scorer.check(GROUP, [sample(0, 1.0), sample(1, 0.0)])) is None
    with pytest.raises(ScoringError, match="needs rewards"):
        run(scorer.check(GROUP, [sample(0, None), sample(1, 0.0)]))


def test_filter_verdicts() -> None:
    def always(group: SourceGroup, samples: list[Sample]) -> bool:
        return True

    assert run(Scorer(filter=always).check(GROUP, [])) == "always"
    assert run(Scorer(filter=lambda g, s: False).check(GROUP, [])) is None
    assert run(Scorer(filter=lambda g, s: "all rewards equal!").check(GROUP, [])) == "all rewards equal!"
    with pytest.raises(ScoringError, match="bad reason"):
        run(Scorer(filter=lambda g, s: 3).check(GROUP, []))


def test_arithmetic_exact_match() -> None:
    assert rewards.expected_answer(GROUP) == 42
    assert rewards.expected_answer(SourceGroup("m", "compute 7 times 6", 1)) == 42
    assert rewards.expected_answer(SourceGroup("m", "no numbers", 1, {"answer": "5"})) == 5
    assert rewards.arithmetic_exact_match(GROUP, out(0, "it is 40... no, 42")) == 1.0
    assert rewards.arithmetic_exact_match(GROUP, out(0, "42 or 41")) == 0.0
    assert rewards.arithmetic_exact_match(GROUP, out(0, "no idea")) == 0.0
    with pytest.raises(ValueError):
        rewards.arithmetic_exact_match(SourceGroup("m", "hello", 1), out(0, "1"))


def test_length_and_target_token_rewards() -> None:
    assert rewards.length_reward(GROUP, out(0, tokens=(1, 2, 3, 4))) == 1.0
    assert rewards.length_reward(GROUP, out(0, tokens=(1, 2))) == 0.5
    assert rewards.length_reward(GROUP, out(0, tokens=tuple(range(20)))) == 0.0
    target = SourceGroup("t", "p", 1, {"target_token_id": 7})
    assert rewards.target_token_fraction(target, out(0, tokens=(7, 1, 7, 2))) == 0.5
    assert rewards.target_token_fraction(target, out(0, tokens=())) == 0.0
    with pytest.raises(ValueError):
        rewards.target_token_fraction(GROUP, out(0))


# -- the documented examples (examples/rewards.py, shown in docs/USAGE.md) -------------------------


def test_the_documented_reward_functions_do_what_usage_md_says() -> None:
    """Loaded by their --reward specs, as a worker loads them, and run through the Scorer."""
    answer = SourceGroup("a-1", "What is 40 plus 2?", 3, {"answer": 42})
    outputs = [out(0, "it is 42", (1, 2, 3)), out(1, "41", (1,)), out(2, "42", (1,))]
    exact = Scorer(load_function("examples.rewards:exact_answer"))
    assert run(exact.score(answer, outputs)) == [1.0, 0.0, 1.0]
    shortest = load_function("examples.rewards:shortest_right")
    assert rewards.is_group_reward(shortest)  # @group_reward: one call for the whole group
    assert run(Scorer(shortest).score(answer, outputs)) == [0.5, 0.0, 1.0]
    judged = load_function("examples.rewards:judged")
    assert asyncio.iscoroutinefunction(judged) and run(Scorer(judged).score(answer, outputs)) == [1.0, 0.0, 1.0]
    keep = Scorer(filter=load_function("examples.rewards:some_right"))
    assert run(keep.check(answer, [sample(0, 0.0), sample(1, 1.0)])) is None
    assert run(keep.check(answer, [sample(0, 0.0), sample(1, 0.0)])) == "no sample right"
    # What USAGE.md says fails an attempt: a group without the metadata the reward reads.
    with pytest.raises(ScoringError, match="KeyError"):
        run(exact.score(SourceGroup("a-2", "no answer stored", 1), [out(0, "7")]))
    for scorer in (exact, keep):
        scorer.close()


@pytest.mark.parametrize("result", [7, -1, 0.25])
def test_a_reward_may_return_an_int_or_a_float(result: float) -> None:
    assert run(Scorer(lambda g, o: result).score(GROUP, [out(0)])) == [float(result)]
