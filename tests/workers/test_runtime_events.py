"""The runtime's life cycle as its observers see it: states and typed events, in order, on real runs
(the scripted engine, a private server), for a drain, a fatal engine error and an engine that never
starts."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

import pytest

from rollout_queue.devtools.local_server import LocalServer
from tests.helpers import wait_until
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    pel_owners,
    submit,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)
from rollout_queue.workers.engines.base import SampleOutput, SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.events import (
    DrainRequested,
    Event,
    FatalError,
    Reserved,
    Settled,
    StateChanged,
    WorkerClosed,
    WorkerStarted,
)
from rollout_queue.workers.runtime import WorkerFailed, WorkerOptions, WorkerRuntime
from rollout_queue.workers.states import RuntimeState
from rollout_queue.workers.verdicts import Complete

S = RuntimeState


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"ev-{uuid.uuid4().hex[:10]}"


def runtime(url: str, name: str, engine: ScriptedEngine, events: list[Event]) -> WorkerRuntime:
    opts = WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=8))
    return WorkerRuntime(url, name, engine, opts, worker_id=f"wk-{uuid.uuid4().hex[:6]}", on_event=events.append)


def states(events: list[Event]) -> list[tuple[S, S]]:
    return [(e.previous, e.state) for e in events if isinstance(e, StateChanged)]


def kinds(events: list[Event], *wanted: type[Event]) -> list[type[Event]]:
    return [type(e) for e in events if isinstance(e, wanted)]


def test_a_drained_run_reports_its_states_and_events_in_order(url: str, name: str) -> None:
    q = open_queue(url, name)
    submit(q, 4, n=2)
    events: list[Event] = []
    rt = RuntimeThread(runtime(url, name, ScriptedEngine(latency_s=0.01), events)).start()
    train(q, {f"g-{i}" for i in range(4)})
    assert rt.drain() is None and rt.runtime.state is S.STOPPED
    assert states(events) == [(S.STARTING, S.RUNNING), (S.RUNNING, S.DRAINING), (S.DRAINING, S.CLOSING),
                              (S.CLOSING, S.STOPPED)]
    lifecycle = [e for e in events if isinstance(e, (WorkerStarted, DrainRequested, WorkerClosed, StateChanged))]
    assert [type(e) for e in lifecycle] == [WorkerStarted, StateChanged, DrainRequested, StateChanged, StateChanged,
                                            WorkerClosed, StateChanged]
    # Every attempt is reserved, then settled once (complete), all while running.
    running = events[events.index(lifecycle[1]) + 1:events.index(lifecycle[3])]
    reserved = [e.receipt for e in running if isinstance(e, Reserved)]
    settled = [e for e in running if isinstance(e, Settled)]
    assert len(reserved) == 4 and sorted(e.receipt.entry_id for e in settled) == sorted(r.entry_id for r in reserved)
    for e in settled:
        assert isinstance(e.verdict, Complete) and len(e.verdict.samples) == 2
        assert running.index(e) > next(i for i, x in enumerate(running) if isinstance(x, Reserved)
                                       and x.receipt == e.receipt)
    closed = lifecycle[5]
    assert isinstance(closed, WorkerClosed) and closed.terminal == "aborted" and dict(closed.settled)["completed"] == 4


def test_a_fatal_error_goes_through_failing_and_closing_before_run_raises(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=5)
    submit(q, 3, n=2)
    events: list[Event] = []
    rt = RuntimeThread(runtime(url, name, ScriptedEngine(hang=True, fatal_after=6), events)).start()
    error = rt.join()
    assert isinstance(error, WorkerFailed) and rt.runtime.state is S.FAILED
    assert states(events) == [(S.STARTING, S.RUNNING), (S.RUNNING, S.FAILING), (S.FAILING, S.CLOSING),
                              (S.CLOSING, S.FAILED)]
    assert kinds(events, FatalError, WorkerClosed) == [FatalError, WorkerClosed]
    fatal = next(e for e in events if isinstance(e, FatalError))
    assert fatal.cause is error.__cause__
    assert events.index(fatal) + 1 == events.index(next(e for e in events if isinstance(e, StateChanged)
                                                         and e.state is S.FAILING))
    closed = next(e for e in events if isinstance(e, WorkerClosed))  # the attempt blamed was failed before
    assert closed.terminal == "aborted" and closed.requeued == 2 and dict(closed.settled)["failed"] == 1
    assert rt.runtime.worker_id not in pel_owners(url, name)


class NoStart(ScriptedEngine):
    async def start(self) -> None:
        raise OSError("no device")


def test_an_engine_that_never_starts_fails_from_starting_with_nothing_to_close(url: str, name: str) -> None:
    events: list[Event] = []
    rt = runtime(url, name, NoStart(), events)
    thread = RuntimeThread(rt)
    thread._thread.start()
    error = thread.join()
    assert isinstance(error, WorkerFailed) and "engine failed to start" in str(error)
    assert states(events) == [(S.STARTING, S.FAILED)] and rt.state is S.FAILED


def test_a_drain_requested_during_start_up_is_kept_and_an_observer_error_changes_nothing(
        url: str, name: str) -> None:
    q = open_queue(url, name)
    submit(q, 1, n=1)
    seen: list[Event] = []

    def observer(event: Event) -> Any:
        seen.append(event)
        raise ValueError("observer bug")

    rt = WorkerRuntime(url, name, ScriptedEngine(), WorkerOptions(block_ms=200), on_event=observer)
    rt.request_drain()  # before run(): the worker starts, reserves nothing and stops
    thread = RuntimeThread(rt)
    thread._thread.start()
    assert thread.join() is None and rt.state is S.STOPPED
    assert states(seen) == [(S.STARTING, S.DRAINING), (S.DRAINING, S.CLOSING), (S.CLOSING, S.STOPPED)]
    st = q.stats()
    assert not [e for e in seen if isinstance(e, Reserved)] and (st.ready + st.backlog, st.completed) == (1, 0)


class Producing(ScriptedEngine):
    """Counts the tokens of every output it hands back, by finish reason: what the worker must report."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.produced: Counter[str] = Counter()

    async def generate(self, request_id: str, prompt_token_ids: Any, params: SamplingConfig) -> SampleOutput:
        out = await super().generate(request_id, prompt_token_ids, params)
        self.produced[out.finish_reason] += len(out.token_ids)
        return out


def first_attempts_long(prompt: str, request_id: str) -> float:
    """Request ids are <entry>/<attempt>/<slot>: a first attempt runs 30 s, a retry at once."""
    return 30.0 if request_id.split("/")[1] == "1" else 0.0


def first_attempts_many(prompt: str, request_id: str) -> str:
    """A first attempt would write 30,000 tokens in its 30 s (one a millisecond), a retry two."""
    return "x" * 30_000 if request_id.split("/")[1] == "1" else "ok"


def test_a_closed_worker_reports_the_tokens_its_engine_generated_by_how_each_attempt_ended(
        url: str, name: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 30's waste count: tokens of attempts a weight update aborted are reported as aborted (the
    partial outputs the engine handed back, exactly), those trained as completed, at close and in
    the `worker closed` log line, so a benchmark can add up every token generated."""
    q = open_queue(url, name, max_attempts=1)  # an aborted attempt never counts: no dead letter
    submit(q, 2, n=2)
    engine = Producing(latency_fn=first_attempts_long, text_fn=first_attempts_many)
    events: list[Event] = []
    opts = WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=30_000), weights_mode="abort")
    rt = RuntimeThread(WorkerRuntime(url, name, engine, opts, on_event=events.append)).start()
    wait_until(lambda: engine.running == 4, 10, message="four first-attempt requests running")
    q.publish_version(1, "file:///weights/v1")  # aborts them mid-generation
    committed, trained = train(q, {"g-0", "g-1"})
    with caplog.at_level(logging.INFO, logger="rollout_queue.workers.runtime"):
        assert rt.drain() is None
    closed = next(e for e in events if isinstance(e, WorkerClosed))
    generated = dict(closed.generated)
    assert generated == rt.runtime.stats.generated
    assert generated["aborted"] == engine.produced["abort"] > 0  # the partial outputs, every token of them
    assert generated["completed"] == engine.produced["stop"] == sum(len(s.token_ids) for g in trained for s in g.samples)
    assert sum(generated.values()) == sum(engine.produced.values())
    assert dict(closed.settled)["aborted"] == 2 and {g.attempt for g in trained} == {2}
    (line,) = [r for r in caplog.records if r.getMessage() == "worker closed"]
    fields = line.fields  # type: ignore[attr-defined]
    assert (fields["tokens_aborted"], fields["tokens_completed"]) == (generated["aborted"], generated["completed"])
