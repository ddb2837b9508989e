"""The worker runtime's rules with no Redis and no engine: the life-cycle table (states.py), the
verdicts' facade calls and the settler's refusals (verdicts.py, attempt.py), and how an event
becomes a log line (events.py)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest

from rollout_queue import (
    MalformedCompletion,
    PayloadTooLarge,
    Receipt,
    Reservation,
    Sample,
    SourceGroup,
    StaleReceipt,
)
from rollout_queue.workers.attempt import Attempt, RuntimeStats, Settler
from rollout_queue.workers.events import (
    CompletionRefused,
    DrainRequested,
    Event,
    FatalError,
    HoldChanged,
    Settled,
    StaleSettlement,
    StateChanged,
    WorkerClosed,
    log_event,
)
from rollout_queue.workers.rewards import Scorer
from rollout_queue.workers.states import TRANSITIONS, IllegalTransition, Lifecycle, RuntimeState
from rollout_queue.workers.verdicts import VERDICTS, Abort, Complete, Fail, Filter, Verdict

S = RuntimeState
R = Receipt("1-0", 2, "w")


# -- states.py ------------------------------------------------------------------------------------

def at(state: RuntimeState) -> Lifecycle:
    """A Lifecycle brought to ``state`` along allowed transitions only."""
    paths = {S.STARTING: [], S.RUNNING: [S.RUNNING], S.DRAINING: [S.DRAINING], S.FAILING: [S.FAILING],
             S.CLOSING: [S.CLOSING], S.STOPPED: [S.CLOSING, S.STOPPED], S.FAILED: [S.FAILED]}
    life = Lifecycle()
    for step in paths[state]:
        life.advance(step)
    assert life.state is state
    return life


@pytest.mark.parametrize(("current", "wanted"), list(itertools.product(S, S)))
def test_every_pair_is_allowed_exactly_when_the_table_says(current: RuntimeState, wanted: RuntimeState) -> None:
    life = at(current)
    if wanted in TRANSITIONS[current]:
        assert life.advance(wanted) is current and life.state is wanted
        return
    with pytest.raises(IllegalTransition) as info:
        life.advance(wanted)
    assert life.state is current, "a refused transition changes nothing"
    assert (info.value.current, info.value.wanted) == (current, wanted)
    assert f"from {current.value} to {wanted.value}" in str(info.value)


def test_the_table_covers_every_state_and_only_stopped_and_failed_are_terminal() -> None:
    assert set(TRANSITIONS) == set(S)
    assert {s for s in S if s.is_terminal} == {S.STOPPED, S.FAILED}
    assert {s for s in S if not s.is_stopping} == {S.STARTING, S.RUNNING}
    reachable, frontier = {S.STARTING}, [S.STARTING]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()] - reachable:
            reachable.add(nxt)
            frontier.append(nxt)
    assert reachable == set(S)


def test_the_two_ordinary_paths() -> None:
    drained, failed = Lifecycle(), Lifecycle()
    for step in (S.RUNNING, S.DRAINING, S.CLOSING, S.STOPPED):
        drained.advance(step)
    for step in (S.RUNNING, S.DRAINING, S.FAILING, S.CLOSING, S.FAILED):  # a fatal error mid-drain
        failed.advance(step)
    with pytest.raises(IllegalTransition, match="terminal"):
        drained.advance(S.RUNNING)


# -- verdicts.py and the settler --------------------------------------------------------------------

class FakeWorker:
    """Records each facade call; ``refuse`` makes the next call raise."""

    def __init__(self, refuse: list[Exception] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse = refuse or []

    async def _call(self, *call: Any) -> str:
        self.calls.append(call)
        if self.refuse:
            raise self.refuse.pop(0)
        return "ok"

    async def complete(self, receipt: Receipt, samples: Any) -> str:
        return await self._call("complete", receipt, samples)

    async def filter(self, receipt: Receipt, reason: str, tokens: int = 0) -> str:
        return await self._call("filter", receipt, reason, tokens)

    async def fail(self, receipt: Receipt, reason: str) -> str:
        return await self._call("fail", receipt, reason)

    async def abort(self, receipt: Receipt, reason: str = "aborted", progress: Any = (), discarded: int = 0) -> str:
        return await self._call("abort", receipt, reason, discarded)


SAMPLES = (Sample(slot=0, token_ids=(1, 2)),)


@pytest.mark.parametrize(("verdict", "call"), [
    (Complete(SAMPLES), ("complete", R, list(SAMPLES))),
    (Filter("all rewards equal", 12), ("filter", R, "all rewards equal", 12)),
    (Fail("request failed: boom"), ("fail", R, "request failed: boom")),
    (Abort("worker drained", discarded=7), ("abort", R, "worker drained", 7)),
])
def test_each_verdict_makes_exactly_its_own_facade_call(verdict: Verdict, call: tuple[Any, ...]) -> None:
    worker = FakeWorker()
    assert asyncio.run(verdict.send(worker, R)) == "ok"  # type: ignore[arg-type]
    assert worker.calls == [call]


def test_verdicts_are_frozen_and_count_under_distinct_keys() -> None:
    assert len({v.counter for v in VERDICTS}) == len(VERDICTS)
    assert set(RuntimeStats().settled) == {v.counter for v in VERDICTS} | {"stale"}
    with pytest.raises(AttributeError):
        Abort("x").reason = "y"  # type: ignore[misc]
    assert Complete(SAMPLES).log_fields() == {} and Fail("x" * 300).log_fields() == {"reason": "x" * 200}


def settle(verdict: Verdict, refuse: list[Exception],
           generated: int = 0) -> tuple[FakeWorker, RuntimeStats, list[Event]]:
    worker, stats, events = FakeWorker(refuse), RuntimeStats(), []
    settler = Settler(worker, Scorer(), lambda ids: "", stats, events.append)  # type: ignore[arg-type]
    attempt = Attempt(Reservation(R, SourceGroup("s", "p", 1), 0))
    attempt.generated_tokens = generated
    asyncio.run(settler.settle(attempt, verdict))
    return worker, stats, events


def test_the_settler_counts_and_reports_each_outcome() -> None:
    _, stats, events = settle(Filter("same"), [])
    assert stats.settled["filtered"] == 1 and events == [Settled(R, Filter("same"), "ok")]
    _, stats, events = settle(Complete(SAMPLES), [StaleReceipt("1-0", 2, "w", "other", 3)])
    assert (stats.settled["stale"], stats.settled["completed"]) == (1, 0)
    assert [type(e) for e in events] == [StaleSettlement]
    _, stats, events = settle(Complete(SAMPLES), [MalformedCompletion("1-0", "bad slot")])
    assert stats.settled["failed"] == 1 and [type(e) for e in events] == [CompletionRefused]


def test_an_abort_that_keeps_no_progress_hands_its_generated_tokens_to_the_queue_as_waste() -> None:
    """Issue 30: what the attempt generated and no record keeps is counted by the queue (tokens_aborted);
    an abort with progress keeps it (the next attempt continues it), so it sends no count."""
    worker, _, _ = settle(Abort("weight update"), [], generated=9)
    assert worker.calls == [("abort", R, "weight update", 9)]
    worker, _, _ = settle(Abort("weight update", SAMPLES), [], generated=9)
    assert worker.calls == [("abort", R, "weight update", 0)]  # the progress is kept: nothing thrown away


def test_a_payload_too_large_is_settled_again_as_a_failure() -> None:
    worker, stats, events = settle(Complete(SAMPLES), [PayloadTooLarge("completion", 10, 5)])
    assert [c[0] for c in worker.calls] == ["complete", "fail"]
    assert stats.settled["failed"] == 1 and stats.settled["completed"] == 0
    assert isinstance(events[0], Settled) and isinstance(events[0].verdict, Fail)


# -- events.py ------------------------------------------------------------------------------------

def logged(caplog: pytest.LogCaptureFixture, event: Event) -> logging.LogRecord:
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="rollout_queue.workers.runtime"):
        log_event(event, {"queue": "q", "worker": "w"})
    (record,) = caplog.records
    return record


def test_every_log_line_names_its_event_type_and_carries_its_fields(caplog: pytest.LogCaptureFixture) -> None:
    record = logged(caplog, WorkerClosed("aborted", 2, 0, 1, (("completed", 5), ("stale", 0))))
    assert record.getMessage() == "worker closed" and record.levelno == logging.INFO
    assert record.fields == {  # type: ignore[attr-defined]
        "queue": "q", "worker": "w", "event": "WorkerClosed", "terminal": "aborted", "requeued": 2, "dead": 0,
        "reconciled": 1, "completed": 5, "stale": 0}
    record = logged(caplog, Settled(R, Abort("worker drained"), "ready"))
    assert (record.getMessage(), record.levelno) == ("aborted", logging.WARNING)
    assert record.fields == {  # type: ignore[attr-defined]
        "queue": "q", "worker": "w", "event": "Settled", "entry": "1-0", "attempt": 2, "outcome": "ready",
        "reason": "worker drained"}
    record = logged(caplog, StateChanged(S.RUNNING, S.DRAINING))
    assert record.fields["previous"] == "running" and record.fields["state"] == "draining"  # type: ignore[attr-defined]
    assert logged(caplog, HoldChanged(True)).getMessage() == "admission hold active"
    assert logged(caplog, DrainRequested(3.0)).fields["timeout_s"] == 3.0  # type: ignore[attr-defined]
    boom = RuntimeError("boom")
    record = logged(caplog, FatalError(boom))
    assert record.levelno == logging.ERROR and record.exc_info is not None and record.exc_info[1] is boom
