"""Reconciliation: a live worker hands back what the PEL gives it but it does not hold, and nothing else.

The decision rule (``is_orphan``) and the pass (``Reconciler``) are tested by hand first; then a
WorkerRuntime on the scripted engine, against a real Redis, is handed entries behind its back (a
reserve with its worker id whose reply is dropped) while it is busy with real attempts: each orphan
is aborted back to ready (terminal aborted, not counted) within about one interval, no attempt the
runtime executes is ever touched, and every group is committed exactly once.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from typing import Any

import pytest
import redis

from rollout_queue import OutcomeUnknown, Receipt, SourceGroup, StaleReceipt
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.core.models import OwnedAttempt
from tests.contract.worker_support import history, ledger
from tests.helpers import wait_until
from tests.stateful.redis_truth import check_no_ghosts, derive_state, observe
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    pel_owners,
    submit,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)
from rollout_queue.workers.attempt import RuntimeStats
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.reconcile import REASON, Reconciler, RuntimeView, interval_for, is_orphan
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime

R1, R2 = Receipt("1-0", 1, "w"), Receipt("2-0", 3, "w")


# -- the decision rule, by hand ------------------------------------------------------------------


def test_held_attempts_and_young_grants_are_never_orphans() -> None:
    old = OwnedAttempt(R1, 60_000)
    assert is_orphan(old, set(), grace_s=30, listed_at=1000.0, reserving_since=None)
    assert not is_orphan(old, {R1}, grace_s=30, listed_at=1000.0, reserving_since=None)
    # the same entry at another attempt is another receipt: the runtime holds attempt 2, not 1
    assert is_orphan(old, {Receipt("1-0", 2, "w")}, grace_s=30, listed_at=1000.0, reserving_since=None)
    assert not is_orphan(OwnedAttempt(R1, 29_999), set(), grace_s=30, listed_at=1000.0, reserving_since=None)


def test_a_grant_of_the_reserve_call_in_flight_is_never_an_orphan() -> None:
    # Listed at t=1000 s with idle 2 s: delivered at t <= 998 s.
    a = OwnedAttempt(R1, 2000)
    assert not is_orphan(a, set(), grace_s=0, listed_at=1000.0, reserving_since=997.0)  # may be its grant
    assert not is_orphan(a, set(), grace_s=0, listed_at=1000.0, reserving_since=998.0)
    assert is_orphan(a, set(), grace_s=0, listed_at=1000.0, reserving_since=999.0)  # delivered before it began


def test_the_interval_defaults_to_the_worker_timeout_at_least_five_seconds() -> None:
    assert interval_for(None, 60.0) == 60.0 and interval_for(None, 1.0) == 5.0
    assert interval_for(0.0, 60.0) == 0.0 and interval_for(0.25, 60.0) == 0.25  # 0: off


@pytest.mark.parametrize("bad", [{"reconcile_interval_s": -1.0}, {"reconcile_grace_s": -0.1},
                                 {"reconcile_interval_s": math.nan}, {"reconcile_grace_s": math.nan}])
def test_options_refuse_negative_reconcile_settings(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="reconcile"):
        WorkerOptions(**bad)  # type: ignore[arg-type]


class FakeWorker:
    """owned() / abort() of an AsyncWorker, scripted: what the PEL lists and what each abort answers
    (an exception is raised); ``on_abort`` runs before each answer."""

    def __init__(self, listed: list[OwnedAttempt], answers: dict[Receipt, Any]) -> None:
        self.listed, self.answers = listed, answers
        self.aborted: list[tuple[Receipt, str]] = []
        self.min_idle: list[int] = []
        self.on_abort: Any = None
        self.on_owned: Any = None

    async def owned(self, min_idle_ms: int = 0) -> list[OwnedAttempt]:
        self.min_idle.append(min_idle_ms)
        if self.on_owned is not None:
            self.on_owned()
        return list(self.listed)

    async def abort(self, receipt: Receipt, reason: str = "aborted", discarded: int = 0) -> str:
        self.aborted.append((receipt, reason))
        if self.on_abort is not None:
            self.on_abort()
        answer = self.answers[receipt]
        if isinstance(answer, Exception):
            raise answer
        return str(answer)


def reconciler(worker: FakeWorker, view: RuntimeView, interval_s: float, grace_s: float,
               stats: RuntimeStats | None = None) -> Reconciler:
    return Reconciler(worker, view, interval_s, grace_s, stats or RuntimeStats(),  # type: ignore[arg-type]
                      lambda *a, **kw: {"fields": kw})


def reconcile_once(worker: FakeWorker, held: list[Receipt], stop_at_first_abort: bool = False) -> tuple[int, int]:
    """One pass with grace 2.5 s and no reserve in flight: (handed back, stats.reconciled)."""
    failures: list[BaseException] = []

    async def main() -> tuple[int, int]:
        stopping, stats = asyncio.Event(), RuntimeStats()
        if stop_at_first_abort:
            worker.on_abort = stopping.set
        view = RuntimeView(lambda: held, lambda: None, stopping, failures.append)
        return await reconciler(worker, view, 1.0, 2.5, stats).reconcile(), stats.reconciled

    result = asyncio.run(main())
    assert failures == []
    return result


def test_a_pass_aborts_only_orphans_with_the_reason_and_counts_them() -> None:
    r3 = Receipt("3-0", 1, "w")
    worker = FakeWorker([OwnedAttempt(R1, 9000), OwnedAttempt(R2, 9000), OwnedAttempt(r3, 9000)],
                        {R1: "ready", r3: "ready"})
    assert reconcile_once(worker, held=[R2]) == (2, 2)
    assert worker.aborted == [(R1, REASON), (r3, REASON)] and worker.min_idle == [2500]


def test_a_race_lost_to_a_settlement_or_to_our_own_abort_is_not_counted() -> None:
    stale = StaleReceipt("1-0", 1, "w", owner="@done", delivery_count=1)
    worker = FakeWorker([OwnedAttempt(R1, 9000), OwnedAttempt(R2, 9000)], {R1: stale, R2: "replay"})
    assert reconcile_once(worker, held=[]) == (0, 0)
    assert len(worker.aborted) == 2


def test_an_attempt_settled_while_the_listing_was_on_the_wire_is_not_an_orphan() -> None:
    held = [R1, R2]
    worker = FakeWorker([OwnedAttempt(R1, 9000), OwnedAttempt(R2, 9000)], {})
    worker.on_owned = held.clear  # both settled (and dropped by the runtime) before the reply came
    assert reconcile_once(worker, held=held) == (0, 0) and worker.aborted == []


def test_a_stopping_runtime_leaves_the_rest_to_close() -> None:
    worker = FakeWorker([OwnedAttempt(R1, 9000), OwnedAttempt(R2, 9000)], {R1: "ready", R2: "ready"})
    assert reconcile_once(worker, held=[], stop_at_first_abort=True) == (1, 1)
    assert [r for r, _ in worker.aborted] == [R1]


class FlakyWorker(FakeWorker):
    """owned() fails once as Redis does when down, then lists nothing, then hits a bug."""

    async def owned(self, min_idle_ms: int = 0) -> list[OwnedAttempt]:
        self.min_idle.append(min_idle_ms)
        if len(self.min_idle) == 1:
            raise OutcomeUnknown("XPENDING: connection to Redis failed")
        if len(self.min_idle) == 2:
            return []
        raise KeyError("a bug")


def test_run_retries_a_pass_redis_refused_and_stops_the_runtime_on_a_bug() -> None:
    async def main() -> tuple[int, list[BaseException]]:
        stopping, failures = asyncio.Event(), []
        worker = FlakyWorker([], {})
        view = RuntimeView(lambda: [], lambda: None, stopping, failures.append)
        await asyncio.wait_for(reconciler(worker, view, 0.01, 0.0).run(), 5)
        return len(worker.min_idle), failures

    passes, failures = asyncio.run(main())
    assert passes == 3 and len(failures) == 1 and isinstance(failures[0], KeyError)


def test_run_ends_when_the_runtime_stops() -> None:
    async def main() -> int:
        stopping = asyncio.Event()
        worker = FakeWorker([], {})
        worker.on_owned = stopping.set
        view = RuntimeView(lambda: [], lambda: None, stopping, lambda exc: None)
        await asyncio.wait_for(reconciler(worker, view, 3600.0, 0.0).run(), 5)
        return len(worker.min_idle)

    assert asyncio.run(main()) == 1  # one pass at once, then no wait for the hour-long interval


# -- a live runtime, real Redis ------------------------------------------------------------------


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"rc-{uuid.uuid4().hex[:10]}"


def start(url: str, name: str, engine: ScriptedEngine, worker_id: str | None = None, **options: Any) -> RuntimeThread:
    opts = WorkerOptions(**{"block_ms": 200, "sampling": SamplingConfig(max_tokens=8), **options})
    return RuntimeThread(WorkerRuntime(url, name, engine, opts, worker_id=worker_id or f"wk-{uuid.uuid4().hex[:6]}")
                         ).start()


def read(url: str, fn: Any, *args: Any) -> Any:
    """``fn(client, *args)`` on a short-lived plain client: Redis truth beside the runtime."""
    client = redis.Redis.from_url(url)
    try:
        return fn(client, *args)
    finally:
        client.close()


def owner_of(url: str, name: str, entry_id: str) -> tuple[str, int] | None:
    rows = read(url, lambda c: c.xpending_range(QueueKeys(name)["src"], "rollout", entry_id, entry_id, 1))
    return (rows[0]["consumer"].decode(), int(rows[0]["times_delivered"])) if rows else None


def check_ledger(url: str, name: str, expected: set[str]) -> None:
    """DESIGN's invariant over Redis truth: every entry in exactly one state, here committed."""
    truth = read(url, observe, QueueKeys(name))
    check_no_ghosts(truth)
    states = {entry_id: derive_state(truth, entry_id) for entry_id in truth.ids.values()}
    assert set(truth.ids) == expected and set(states.values()) == {"committed"}, states


def test_an_orphan_is_handed_back_while_the_real_attempt_keeps_running(url: str, name: str) -> None:
    q = open_queue(url, name)
    [real] = q.submit([SourceGroup("real", "hang here", 2)])
    engine = ScriptedEngine(hang_prompt="hang")
    rt = start(url, name, engine, max_samples=2, reconcile_interval_s=0.2, reconcile_grace_s=0.3)
    wid = rt.runtime.worker_id
    wait_until(lambda: engine.running == 2, 10)  # every slot busy: the runtime is not reserving
    [orphan] = q.submit([SourceGroup("orphan", "quick", 2)])
    [r] = q.worker(wid).reserve(1)  # granted to the runtime's id; the reply never reaches the runtime
    granted_at = time.monotonic()
    assert r.entry_id == orphan and owner_of(url, name, orphan) == (wid, 1)

    wait_until(lambda: read(url, ledger, name, orphan) == f"a|1|{wid}|aborted", 10, message="the orphan aborted")
    # grace 0.3 s + interval 0.2 s: about one interval past the grace (slack for a loaded machine)
    assert time.monotonic() - granted_at < 4.0
    assert owner_of(url, name, real) == (wid, 1) and engine.running == 2 and engine.aborted == 0
    assert rt.runtime.stats.reconciled == 1 and rt.runtime.stats.settled["aborted"] == 0
    h = read(url, history, name, orphan)
    assert h is not None and h["f"] == 0 and [(x["t"], x["r"]) for x in h["h"]] == [("aborted", REASON)]
    st = q.stats()
    assert st.terminals["aborted"] == 1 and st.ready == 1 and st.executing_groups == 1

    rt.on_loop(engine.finish_hanging)
    committed, trained = train(q, {"real", "orphan"})
    assert committed == {"real": 1, "orphan": 1}
    assert {g.group.source_id: g.attempt for g in trained} == {"real": 1, "orphan": 2}
    assert rt.drain() is None
    assert rt.runtime.stats.reconciled == 1 and rt.runtime.stats.settled["stale"] == 0
    check_ledger(url, name, {"real", "orphan"})


def test_a_restarted_worker_hands_back_what_its_predecessor_held(url: str, name: str) -> None:
    q = open_queue(url, name)
    submit(q, 2, n=2)
    wid = f"fixed-{uuid.uuid4().hex[:6]}"
    assert len(q.worker(wid).reserve(2)) == 2  # the previous process under this id died holding these
    rt = start(url, name, ScriptedEngine(latency_s=0.01), worker_id=wid, reconcile_interval_s=0.2,
               reconcile_grace_s=0.0)
    committed, trained = train(q, {"g-0", "g-1"})
    assert committed == {"g-0": 1, "g-1": 1} and {g.attempt for g in trained} == {2}
    assert rt.runtime.stats.reconciled == 2 and q.stats().terminals["aborted"] == 2
    assert rt.drain() is None
    check_ledger(url, name, {"g-0", "g-1"})


def test_a_busy_runtime_never_aborts_its_own_work_even_with_no_grace(url: str, name: str) -> None:
    """Interval 5 ms and no grace: only the held / in-flight rules stand between the reconciler and
    the runtime's own attempts. Orphans are injected while it works; each is handed back, and
    nothing else: no completion of the runtime is refused as stale, every group trains once."""
    q = open_queue(url, name, max_attempts=1)  # a counted terminal would dead-letter the group
    sources = {f"g-{i}" for i in range(40)}
    submit(q, len(sources), n=2)
    engine = ScriptedEngine(latency_s=0.005, jitter_s=0.03, max_concurrency=8)
    rt = start(url, name, engine, max_samples=8, reconcile_interval_s=0.005, reconcile_grace_s=0.0)
    thief = q.worker(rt.runtime.worker_id)
    orphans: list[str] = []

    def after_each_lease(_: int) -> None:
        if len(orphans) < 4:
            orphans.extend(r.entry_id for r in thief.reserve(1))  # a reply the runtime never sees

    committed, _ = train(q, sources, timeout=60, step=after_each_lease)
    assert committed == dict.fromkeys(sources, 1) and orphans
    assert rt.drain() is None
    stats = rt.runtime.stats
    assert stats.settled["stale"] == 0 and stats.settled["aborted"] == 0 and engine.aborted == 0
    assert stats.reconciled == len(orphans) == q.stats().terminals["aborted"]
    assert q.stats().dead == 0 and rt.runtime.worker_id not in pel_owners(url, name)
    check_ledger(url, name, sources)


def test_with_reconciliation_off_an_orphan_waits_for_close(url: str, name: str) -> None:
    q = open_queue(url, name)
    [eid] = submit(q, 1, n=1)
    wid = f"wk-{uuid.uuid4().hex[:6]}"
    q.worker(wid).reserve(1)  # a dropped reply; the runtime's own reserves then keep coming up empty
    rt = start(url, name, ScriptedEngine(), wid, reconcile_interval_s=0, reconcile_grace_s=0.0, block_ms=50)
    calls = len(rt.runtime.stats.reserves)
    wait_until(lambda: len(rt.runtime.stats.reserves) >= calls + 10, 10, message="ten more reserve calls")
    assert owner_of(url, name, eid) == (wid, 1) and rt.runtime.stats.reconciled == 0
    assert rt.drain() is None  # close() returns it: the only way out without reconciliation
    assert owner_of(url, name, eid) == ("@ready", 1) and q.stats().terminals["aborted"] == 1
