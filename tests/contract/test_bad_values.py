"""Odd values at every public entry point: InvalidInput, checked before anything is sent, or success.

Issue 12 items 11 and 12. Bools where ints are meant, floats, negatives, NaN and infinities, ints past
2^53 (or past what ``str()`` can print), wrong types, text with control characters: each call either
succeeds (keeping the value exactly) or raises the library's own InvalidInput before a single op
reaches Redis, so every key stays byte-identical. Never OverflowError, TypeError, redis-py's
DataError, or a script error reported as a bug. Run over the sync and the asyncio client (the checks
live in the shared flows and the value types, so both must agree), one fresh queue per example.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rollout_queue import (
    LeaseUnsatisfiable,
    InvalidInput,
    MalformedCompletion,
    NotFound,
    QueueConfig,
    Receipt,
    RolloutQueue,
    RolloutQueueError,
    Sample,
    SourceGroup,
)
from rollout_queue.core.keys import QueueKeys
from tests.contract.conftest import snapshot
from tests.contract.worker_support import group, samples
from tests.fuzz.support import EXAMPLES

ODD = st.one_of(
    st.booleans(), st.none(),
    st.sampled_from([0, -1, 1, 2, 2**21, 2**31, 2**53 - 1, 2**53, 2**63, 10**400, 10**5000]),
    st.integers(-(2**70), 2**70),
    st.sampled_from([1.5, -0.0, 0.5, 1e-300, 1e308, math.nan, math.inf, -math.inf, 2.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1", "", "-", "1-0", "0-1", "lost", "aborted", "x\n\x1b[31m", "\udcff"]),
    st.text(max_size=6), st.binary(max_size=4),
    st.lists(st.integers(-3, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.builds(object),
)


@dataclass
class Ctx:
    """What a case's setup made ready: the queue, a worker, and the objects a call needs."""

    q: Any
    w: Any
    receipt: Receipt | None = None
    lease: Any = None
    hold: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


def backlog(q: Any) -> Ctx:
    q.submit([group("g0"), group("g1")])
    return Ctx(q, q.worker("w1"))


def executing(q: Any) -> Ctx:
    ctx = backlog(q)
    [res] = ctx.w.reserve(1)
    ctx.receipt = res.receipt
    return ctx


def buffered(q: Any) -> Ctx:
    ctx = executing(q)
    ctx.w.complete(ctx.receipt, samples(2))
    return ctx


def leased(q: Any) -> Ctx:
    ctx = buffered(q)
    ctx.lease = q.lease(1)
    assert ctx.lease is not None
    return ctx


def held(q: Any) -> Ctx:
    ctx = Ctx(q, q.worker("w1"))
    ctx.hold = q.hold()
    return ctx


Call = Callable[[Ctx, Any], Any]
#: case -> (setup, call, typed refusals a *valid* odd value may still meet besides InvalidInput)
CASES: dict[str, tuple[Callable[[Any], Ctx], Call, tuple[type[Exception], ...]]] = {
    "queue name": (backlog, lambda c, x: QueueKeys(x), ()),  # pure: a valid odd name must not create a queue
    "queue config": (backlog, lambda c, x: isinstance(c.q, RolloutQueue) and RolloutQueue(c.q.client, c.q.name, x), ()),
    "submit(groups)": (backlog, lambda c, x: c.q.submit(x), ()),
    "submit([group])": (backlog, lambda c, x: c.q.submit([x]), ()),
    "publish_version(version)": (backlog, lambda c, x: c.q.publish_version(x), ()),
    "publish_version(weights_uri)": (backlog, lambda c, x: c.q.publish_version(1, x), ()),
    "lease(groups)": (buffered, lambda c, x: c.q.lease(x), (LeaseUnsatisfiable,)),  # more than the bounds allow
    "lease(timeout_s)": (buffered, lambda c, x: c.q.lease(1, timeout_s=x), ()),
    "lease(block_ms)": (buffered, lambda c, x: c.q.lease(1, block_ms=x), ()),
    "lease(partial)": (buffered, lambda c, x: c.q.lease(1, partial=x), ()),
    "lease(trainer_id)": (buffered, lambda c, x: c.q.lease(1, trainer_id=x), ()),
    "hold(timeout_s)": (backlog, lambda c, x: c.q.hold(timeout_s=x), ()),
    "checkpoint(step)": (backlog, lambda c, x: c.q.checkpoint(x), ()),
    "restore(step)": (backlog, lambda c, x: c.q.restore(x), ()),
    "reap(budget)": (backlog, lambda c, x: c.q.reap(x), ()),
    "dead_letters(count)": (backlog, lambda c, x: c.q.dead_letters(x), ()),
    "dead_letters(start)": (backlog, lambda c, x: c.q.dead_letters(1, x), ()),
    "requeue_dead_letter(dlq_id)": (backlog, lambda c, x: c.q.requeue_dead_letter(x), (NotFound,)),
    "worker(worker_id).reserve": (backlog, lambda c, x: c.q.worker(x).reserve(1), ()),
    "reserve(max_groups)": (backlog, lambda c, x: c.w.reserve(x), ()),
    "reserve(block_ms)": (backlog, lambda c, x: c.w.reserve(1, block_ms=x), ()),
    "reserve(max_samples)": (backlog, lambda c, x: c.w.reserve(1, max_samples=x), ()),
    "complete(receipt)": (executing, lambda c, x: c.w.complete(x, samples(2)), ()),
    "complete(samples)": (executing, lambda c, x: c.w.complete(c.receipt, x), (MalformedCompletion,)),
    "complete([sample])": (executing, lambda c, x: c.w.complete(c.receipt, [x]), ()),
    "complete_many(items)": (executing, lambda c, x: c.w.complete_many(x), ()),
    "complete_many([item])": (executing, lambda c, x: c.w.complete_many([x]), ()),
    "complete_many([(receipt, x)])": (executing, lambda c, x: c.w.complete_many([(c.receipt, x)]), ()),
    "fail(receipt)": (executing, lambda c, x: c.w.fail(x, "r"), ()),
    "fail(reason)": (executing, lambda c, x: c.w.fail(c.receipt, x), ()),
    "abort(receipt)": (executing, lambda c, x: c.w.abort(x), ()),
    "abort(discarded)": (executing, lambda c, x: c.w.abort(c.receipt, "r", discarded=x), ()),
    "filter(receipt)": (executing, lambda c, x: c.w.filter(x, "r"), ()),
    "filter(reason)": (executing, lambda c, x: c.w.filter(c.receipt, x), ()),
    "filter(tokens)": (executing, lambda c, x: c.w.filter(c.receipt, "r", x), ()),
    "owned(min_idle_ms)": (executing, lambda c, x: c.w.owned(x), ()),
    "close(terminal)": (executing, lambda c, x: c.w.close(x), ()),
    "lease.commit(step)": (leased, lambda c, x: c.lease.commit(x), ()),
    "lease.extend(seconds)": (leased, lambda c, x: c.lease.extend(x), ()),
    "lease.rollback(reason)": (leased, lambda c, x: c.lease.rollback(x), ()),
    "hold.wait_terminal(timeout_s)": (held, lambda c, x: c.hold.wait_terminal(x), ()),
    "hold.record_weight_update(version)": (held, lambda c, x: c.hold.record_weight_update(x), ()),
    "hold.record_weight_update(weights_uri)": (held, lambda c, x: c.hold.record_weight_update(1, x), ()),
}


def record_ops(q: Any) -> list[Any]:
    """Every op the queue's transport sends from now on (sync or asyncio transport)."""
    transport, sent = q.driver, []
    original = transport.execute
    if inspect.iscoroutinefunction(original):
        async def execute(op: Any) -> Any:
            sent.append(op)
            return await original(op)
    else:
        def execute(op: Any) -> Any:
            sent.append(op)
            return original(op)
    transport.execute = execute
    return sent


SETTINGS = settings(max_examples=EXAMPLES * 2, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(case=st.sampled_from(sorted(CASES)), value=ODD, n=st.integers(0, 10**9))
def test_every_entry_point_refuses_odd_values_before_sending(open_queue, raw: redis.Redis, queue_name: str,
                                                            case: str, value: Any, n: int) -> None:
    setup, call, refusals = CASES[case]
    name = f"{queue_name}-{n}"
    q = open_queue(QueueConfig(worker_timeout_s=30.0), name=name)
    try:
        ctx = setup(q)
        before = snapshot(raw, name)
        sent = record_ops(q)
        try:
            call(ctx, value)
            event("accepted")
        except InvalidInput as exc:
            if isinstance(exc, refusals):
                return  # a documented outcome of a well-formed call (e.g. an empty completion)
            event("refused")
            assert sent == [], f"{case}({value!r}) raised {exc!r} after sending {sent}"
            assert snapshot(raw, name) == before, f"{case}({value!r}) changed Redis before refusing"
        except refusals:
            pass
        except RolloutQueueError as exc:
            pytest.fail(f"{case}({value!r}) raised {exc!r}, not InvalidInput")
        # Anything else (OverflowError, TypeError, DataError, ValueError) fails the test by itself.
    finally:
        keys = list(raw.scan_iter(match=f"rollout:{{{name}}}:*", count=1000))
        if keys:
            raw.unlink(*keys)


# -- the values the issue names, one by one --------------------------------------------------------


@pytest.mark.parametrize("call, match", [
    (lambda c: c.w.reserve(True), "max_groups"),
    (lambda c: c.w.reserve(1.5), "max_groups"),
    (lambda c: c.w.reserve("1"), "max_groups"),
    (lambda c: c.q.hold(timeout_s=-1), "timeout_s"),
    (lambda c: c.q.lease(1, timeout_s=-1), "timeout_s"),
    (lambda c: c.q.lease(1, timeout_s=math.nan), "timeout_s"),
    (lambda c: c.q.checkpoint(True), "step"),
    (lambda c: c.q.restore(1.5), "step"),
    (lambda c: c.q.publish_version(1.5), "version"),
    (lambda c: c.q.publish_version(2**21), "version"),
    (lambda c: c.q.dead_letters(1.5), "count"),
    (lambda c: c.q.reap(0), "budget"),
    (lambda c: c.w.owned(1.5), "min_idle_ms"),
    (lambda c: c.q.submit([SourceGroup("m", "p", 1)] * 0 + ["not a group"]), "groups"),
])
def test_the_reported_values_raise_invalid_input_and_change_nothing(open_queue, raw: redis.Redis, queue_name: str,
                                                                     call: Callable[[Ctx], Any], match: str) -> None:
    q = open_queue(QueueConfig())
    ctx = backlog(q)
    before = snapshot(raw, queue_name)
    with pytest.raises(InvalidInput, match=match):
        call(ctx)
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("metadata", [{"x": math.nan}, {"x": [1, {"y": math.inf}]}, {"x": -math.inf}])
def test_nan_or_infinity_in_metadata_is_refused_not_stored_as_null(metadata: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput, match="NaN or infinity"):
        SourceGroup("m", "p", 1, metadata)
    assert SourceGroup("m", "p", 1, {"x": 1.5, "y": [None, "z"]}).metadata == {"x": 1.5, "y": [None, "z"]}


@pytest.mark.parametrize("kwargs", [{"reward": 10**400}, {"reward": True}, {"reward": math.inf}, {"slot": 2**70},
                                    {"slot": True}, {"logprobs": (10**400,)}, {"version": 2**21}])
def test_a_sample_with_an_odd_value_cannot_exist(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        Sample(**{"slot": 0, "token_ids": (1,), **kwargs})
    assert Sample(0, (1,), reward=10**300).reward == 1e300  # large but finite: kept as a float


def test_a_receipt_attempt_must_be_a_lua_exact_integer() -> None:
    for attempt in (True, 2**53, 1.0, "1", 0):
        with pytest.raises(InvalidInput, match="attempt"):
            Receipt("1-0", attempt, "w1")
    assert Receipt("1-0", 2**53 - 1, "w1").attempt == 2**53 - 1
