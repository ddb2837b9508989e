"""The worker runtime in-process, on the scripted test engine, against a real Redis.

Each test runs a WorkerRuntime on its own loop thread (as a worker process runs it), a test trainer
that leases and commits, and reads the ledger back from Redis.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from rollout_queue import RolloutQueue, Sample, SourceGroup
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.ops import views
from tests.helpers import after_settling, wait_until
from tests.workers.runtime_helpers import (
    RuntimeThread,
    open_queue,
    pel_owners,
    registered_workers,
    spawn_worker,
    submit,
    train,
    worker_server,  # noqa: F401  # a fixture, used by name
)
from rollout_queue.workers import rewards
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.rewards import Generated, Scorer
from rollout_queue.workers.runtime import WorkerFailed, WorkerOptions, WorkerRuntime


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"w-{uuid.uuid4().hex[:10]}"


def start(url: str, name: str, engine: ScriptedEngine, scorer: Scorer | None = None, **options: Any) -> RuntimeThread:
    opts = WorkerOptions(**{"block_ms": 200, "sampling": SamplingConfig(max_tokens=32), **options})
    return RuntimeThread(WorkerRuntime(url, name, engine, opts, worker_id=f"wk-{uuid.uuid4().hex[:6]}",
                                       scorer=scorer)).start()


def answer_half(prompt: str, request_id: str) -> str:
    """Even slots answer correctly, odd slots do not (so every group has mixed rewards)."""
    slot = int(request_id.rsplit("/", 1)[1])
    if "What is " not in prompt:
        return "I cannot say."
    a = int(prompt.split("What is ")[1].split(" ")[0])
    return f"The answer is {2 * a if slot % 2 == 0 else 2 * a + 1}."


def assert_nothing_owned(url: str, name: str, worker_id: str) -> None:
    assert worker_id not in pel_owners(url, name)
    assert worker_id not in registered_workers(url, name)


def test_full_lifecycle_generates_scores_completes_and_trains_each_group_once(url: str, name: str) -> None:
    q = open_queue(url, name)
    submit(q, 6, n=3)
    engine = ScriptedEngine(text_fn=answer_half, latency_s=0.01)
    rt = start(url, name, engine, Scorer(rewards.arithmetic_exact_match))
    committed, trained = train(q, {f"g-{i}" for i in range(6)})
    assert set(committed.values()) == {1}
    for g in trained:
        assert [s.slot for s in g.samples] == [0, 1, 2]
        assert [s.reward for s in g.samples] == [1.0, 0.0, 1.0]
        for s in g.samples:
            assert engine.decode(s.token_ids).startswith("The answer is")
            assert len(s.logprobs) == len(s.token_ids) and all(lp < 0 for lp in s.logprobs)
            assert (s.version, s.versions, s.finish_reason) == (0, (0,), "stop")
    assert rt.drain() is None
    st = q.stats()
    assert (st.committed, st.retained, st.executing_groups, st.workers_alive) == (6, 0, 0, 0)
    assert rt.runtime.stats.settled["completed"] == 6
    assert_nothing_owned(url, name, rt.runtime.worker_id)


def long_tail(prompt: str, request_id: str) -> float:
    """Slot 0 of every group is slow, the other slots are quick."""
    return 0.6 if request_id.endswith("/0") else 0.02


@pytest.mark.parametrize("policy", ["group", "sample"])
def test_group_and_sample_policies_on_long_tailed_latencies(url: str, name: str, policy: str) -> None:
    q = open_queue(url, name)
    submit(q, 6, n=4)
    engine = ScriptedEngine(latency_fn=long_tail, max_concurrency=64)
    rt = start(url, name, engine, policy=policy, max_samples=8, max_groups=2 if policy == "group" else None)
    train(q, {f"g-{i}" for i in range(6)})
    assert rt.drain() is None
    sched = rt.runtime.scheduler
    assert sched is not None and engine.peak_running <= 8
    first_batch = next(k for _, k in rt.runtime.stats.reserves if k)
    assert first_batch == 2  # reserve batching: the idle worker took two groups in one call
    if policy == "group":
        # Never more than G groups: while a long sample held its group, its 3 slots stayed idle.
        assert sched.peak_groups == 2
    else:
        # Freed slots were backfilled while the long-tailed samples still held their groups open.
        assert sched.peak_groups >= 3
        assert engine.peak_running > 4


def test_at_the_engines_concurrency_the_next_group_is_reserved_while_samples_still_wait(url: str, name: str) -> None:
    """The sample policy's default: up to 2n - 1 samples wait inside the engine, so the next group
    is reserved while n - 1 still wait and a freed slot is refilled at once instead of idling for a
    reservation; the engine's own cap still holds (the rest wait in its queue), and never more than
    2n - 1 wait."""
    q = open_queue(url, name)
    submit(q, 6, n=4)
    engine = ScriptedEngine(latency_fn=long_tail, max_concurrency=4)  # one group fills every slot
    rt = start(url, name, engine)
    train(q, {f"g-{i}" for i in range(6)})
    assert rt.drain() is None
    sched = rt.runtime.scheduler
    assert sched is not None and sched.max_samples == 4
    assert engine.peak_running <= 4
    # Groups were taken while every slot was busy: more than a group less one waited (4 running,
    # over 3 waiting), and never more than 4 + 7.
    assert 4 + 3 < sched.peak_samples <= 4 + 7 and sched.peak_groups >= 3


def test_abort_on_weight_update_requeues_uncounted_and_loads_the_weights(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)  # a counted terminal would dead-letter the group
    submit(q, 2, n=2)
    engine = ScriptedEngine(hang=True)
    rt = start(url, name, engine, weights_mode="abort")
    wait_until(lambda: engine.running == 4, 10)
    engine.hang = False  # requests reserved from now on finish normally
    q.publish_version(1, "file:///weights/v1")
    committed, trained = train(q, {"g-0", "g-1"})
    assert engine.loads == ["file:///weights/v1"]
    assert rt.runtime.stats.settled["aborted"] == 2
    st = q.stats()
    assert st.terminals["aborted"] == 2 and st.dead == 0
    for g in trained:
        assert g.attempt == 2 and {s.version for s in g.samples} == {1}
        assert {s.versions for s in g.samples} == {(1,)}
    assert rt.drain() is None


def test_continue_mode_records_every_version_a_sample_saw(url: str, name: str) -> None:
    q = open_queue(url, name, max_staleness=4)
    submit(q, 2, n=2)
    engine = ScriptedEngine(hang=True)
    rt = start(url, name, engine, weights_mode="continue")
    wait_until(lambda: engine.running == 4, 10)
    engine.hang = False
    q.publish_version(3, "file:///weights/v3")
    wait_until(lambda: engine.loads == ["file:///weights/v3"] and rt.runtime.loaded_version == 3, 10)
    rt.on_loop(engine.finish_hanging)  # the old requests end after the update
    submit(q, 1, n=2, prefix="late")
    committed, trained = train(q, {"g-0", "g-1", "late-0"})
    by_source = {g.group.source_id: g for g in trained}
    for sid in ("g-0", "g-1"):
        assert by_source[sid].attempt == 1  # not aborted
        assert {(s.version, s.versions) for s in by_source[sid].samples} == {(0, (0, 3))}
        assert by_source[sid].min_version == 0
    assert {(s.version, s.versions) for s in by_source["late-0"].samples} == {(3, (3,))}
    assert rt.runtime.stats.settled["aborted"] == 0
    assert rt.drain() is None


def test_the_default_worker_process_aborts_nothing_at_a_weight_update(url: str, name: str) -> None:
    """Issue 30 section 3: ``rollout-queue worker`` with no --weights-mode keeps the requests in flight
    at an update (continue): no attempt aborted, no generated token thrown away, and each sample
    records both versions it ran under (its version the oldest, which the staleness bound judges)."""
    q = open_queue(url, name, max_staleness=2)
    submit(q, 1, n=2)
    # Each request takes 6 s: the update (noticed and loaded in well under a second) lands inside it.
    proc = spawn_worker(url, name, "w-default", "--engine-arg", "latency_s=6")
    try:
        wait_until(lambda: q.stats().executing_samples == 2, 60, message="the group generating")
        q.publish_version(1, "file:///weights/v1")
        committed, trained = train(q, {"g-0"}, timeout=60)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    st = q.stats()
    assert st.terminals["aborted"] == 0 and st.terminals["failed"] == 0
    (group,) = trained
    assert group.attempt == 1  # generated once, never started over
    assert {(s.version, s.versions) for s in group.samples} == {(0, (0, 1))}
    assert "weights updated" in err and "continue" in err


def test_refused_weights_keep_the_worker_on_its_version_until_a_version_loads(url: str, name: str) -> None:
    """A version whose folder the engine refuses (missing, pruned, truncated: nothing applied) does
    not stop the worker: it generates on the version it holds, its samples say so, it retries the
    refused version, and it moves to the next version that loads."""
    q = open_queue(url, name, max_staleness=8)
    engine = ScriptedEngine(refuse_load="broken")
    runtime = WorkerRuntime(url, name, engine, WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=8)),
                            worker_id=f"wk-{uuid.uuid4().hex[:6]}")
    runtime.versions.retry_s = 0.2
    rt = RuntimeThread(runtime).start()
    q.publish_version(1, "file:///weights/v1-broken")
    wait_until(lambda: rt.runtime.stats.weight_refusals >= 2, 10)  # refused, then retried
    assert rt.alive and rt.runtime.loaded_version == 0 and engine.loads == []
    submit(q, 1, n=2, prefix="during")
    _, trained = train(q, {"during-0"})
    assert {s.version for g in trained for s in g.samples} == {0}  # generated on what it holds
    engine.refuse_load = None  # the folder appeared (a late network filesystem): the retry loads it
    wait_until(lambda: rt.runtime.loaded_version == 1, 10)
    q.publish_version(2, "file:///weights/v2")
    wait_until(lambda: rt.runtime.loaded_version == 2, 10)
    assert engine.loads == ["file:///weights/v1-broken", "file:///weights/v2"]
    submit(q, 1, n=2, prefix="after")
    _, trained = train(q, {"after-0"})
    assert {s.version for g in trained for s in g.samples} == {2}
    assert rt.drain() is None


def test_a_worker_whose_recorded_version_is_refused_at_start_serves_what_it_holds_and_catches_up(
        url: str, name: str) -> None:
    """Issue 29 item 4: the queue's version names weights the engine refuses at start (its folder
    not written yet: with ``dist`` the version is recorded first). The worker starts anyway, on the
    weights it started with (version 0: no older folder beside that one), says what it waits for,
    generates (its samples say version 0) and loads the version once it can."""
    from rollout_queue.workers.events import Event, StartedBehind

    q = open_queue(url, name, max_staleness=8)
    q.publish_version(3, "file:///weights/v3-pending")
    engine = ScriptedEngine(refuse_load="pending")
    events: list[Event] = []
    runtime = WorkerRuntime(url, name, engine, WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=8)),
                            worker_id=f"wk-{uuid.uuid4().hex[:6]}", on_event=events.append)
    runtime.versions.retry_s = 0.2
    rt = RuntimeThread(runtime).start()
    assert rt.alive and rt.runtime.loaded_version == 0 and engine.loads == []
    (behind,) = [e for e in events if isinstance(e, StartedBehind)]
    assert (behind.version, behind.weights_uri, behind.loaded, behind.loaded_uri) == (3, "file:///weights/v3-pending",
                                                                                     0, None)
    assert "scripted refusal" in behind.reason
    submit(q, 1, n=2, prefix="behind")
    _, trained = train(q, {"behind-0"})
    assert {s.version for g in trained for s in g.samples} == {0}
    engine.refuse_load = None  # the folder was written: the next retry loads it
    wait_until(lambda: rt.runtime.loaded_version == 3, 10)
    assert engine.loads == ["file:///weights/v3-pending"]
    submit(q, 1, n=2, prefix="caught-up")
    _, trained = train(q, {"caught-up-0"})
    assert {s.version for g in trained for s in g.samples} == {3}
    assert rt.drain() is None


def test_while_a_refused_version_is_retried_abort_mode_aborts_nothing(url: str, name: str) -> None:
    """A worker in ``abort`` mode waiting for a refused version's folder (it retries every
    ``retry_s``) aborts no request until the version passes the check: attempts longer than the
    retry interval still finish, once each, on the version it holds."""
    q = open_queue(url, name, max_staleness=8)
    q.publish_version(2, "file:///weights/v2-pending")
    engine = ScriptedEngine(refuse_load="pending", latency_s=1.0)
    runtime = WorkerRuntime(url, name, engine, WorkerOptions(block_ms=200, sampling=SamplingConfig(max_tokens=8)),
                            worker_id=f"wk-{uuid.uuid4().hex[:6]}")
    runtime.versions.retry_s = 0.1
    rt = RuntimeThread(runtime).start()
    submit(q, 2, n=2, prefix="long")
    _, trained = train(q, {"long-0", "long-1"})
    assert rt.runtime.stats.weight_refusals >= 5  # retried several times while they generated
    assert [g.attempt for g in trained] == [1, 1] and rt.runtime.stats.settled["aborted"] == 0
    assert {s.version for g in trained for s in g.samples} == {0}
    assert rt.drain() is None


def test_a_reward_that_raises_fails_the_attempt_with_the_reason(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=2)
    q.submit([SourceGroup("bad", "no arithmetic here", 2), SourceGroup("ok", "What is 1 plus 1?", 2)])
    engine = ScriptedEngine(text_fn=answer_half)
    rt = start(url, name, engine, Scorer(rewards.arithmetic_exact_match))
    train(q, {"ok"})
    wait_until(lambda: q.stats().dead == 1, 10)
    (letter,) = after_settling(q).dead_letters()
    assert letter.source_id == "bad" and letter.attempt == 2
    assert [h["t"] for h in letter.history] == ["failed", "failed"]
    assert all("arithmetic_exact_match raised ValueError" in h["r"] for h in letter.history)
    assert rt.runtime.stats.settled["failed"] == 2
    assert rt.drain() is None


def test_a_reward_that_is_no_list_of_finite_numbers_fails_only_its_attempt(url: str, name: str) -> None:
    """Issue 29 item 10: a group reward returning a scalar (a TypeError) or 10**400 (an OverflowError
    inside the finiteness check) used to kill the worker, every group it held counted lost."""

    @rewards.group_reward
    def reward(group: SourceGroup, outputs: list[Generated]) -> Any:
        kind = group.prompt.split()[0]
        return {"scalar": 1.0, "huge": [10**400] * len(outputs)}.get(kind, [1.0] * len(outputs))

    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("scalar", "scalar please", 2), SourceGroup("huge", "huge please", 2),
              SourceGroup("ok", "fine please", 2)])
    rt = start(url, name, ScriptedEngine(), Scorer(reward))
    committed, _ = train(q, {"ok"})
    wait_until(lambda: q.stats().dead == 2, 10, message="two dead letters")
    assert rt.drain() is None  # the worker lived through both
    reasons = {d.source_id: d.history[-1]["r"] for d in after_settling(q).dead_letters()}
    assert "returned float 1.0: a group reward returns a list" in reasons["scalar"]
    assert "returned int 1000000" in reasons["huge"] and "rewards must be finite numbers" in reasons["huge"]
    assert committed == {"ok": 1} and q.stats().terminals["lost"] == 0


def test_nonzero_std_filter_settles_constant_groups_filtered(url: str, name: str) -> None:
    q = open_queue(url, name)
    q.submit([SourceGroup(f"same-{i}", f"same {i}", 3) for i in range(3)]
             + [SourceGroup(f"mixed-{i}", f"mixed {i}", 3) for i in range(2)])

    def reward(group: SourceGroup, out: Generated) -> float:
        return 1.0 if group.prompt.startswith("same") else float(out.slot)

    rt = start(url, name, ScriptedEngine(), Scorer(reward, rewards.nonzero_std))
    committed, _ = train(q, {"mixed-0", "mixed-1"})
    wait_until(lambda: q.stats().filtered == 3, 10)
    st = q.stats()
    assert st.filtered_by_reason == {"zero_std": 3} and st.retained == 0
    assert set(committed) == {"mixed-0", "mixed-1"}
    # The filtered groups' tokens are waste the queue counts (the worker sends them with the filter);
    # nothing is held any more, so every generated token was trained or thrown away.
    w = st.waste
    assert w.discarded["filtered"] > 0 and w.generated == w.trained + w.discarded_total, w
    assert rt.drain() is None


def test_request_failed_fails_only_that_attempt(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup("poison", "poison pill", 2), SourceGroup("fine", "fine prompt", 2)])
    rt = start(url, name, ScriptedEngine(fail_prompt="poison"))
    train(q, {"fine"})
    wait_until(lambda: q.stats().dead == 1, 10)
    assert "request failed" in after_settling(q).dead_letters()[0].reason or after_settling(q).dead_letters()[0].history
    assert rt.alive and rt.runtime.stats.settled["failed"] == 1
    assert rt.drain() is None


def test_heartbeat_thread_keeps_a_worker_alive_while_its_loop_is_blocked(url: str, name: str) -> None:
    q = open_queue(url, name, worker_timeout_s=0.3)
    submit(q, 1, n=2)
    # The first generate call blocks the event loop for 5x the worker timeout.
    engine = ScriptedEngine(block_loop_s=1.5, block_loop_calls=1)
    rt = start(url, name, engine, heartbeat_interval_s=0.05)
    wait_until(lambda: engine.calls >= 1, 10)
    beats = rt.runtime.heartbeat.beats  # type: ignore[union-attr]
    blocked_until = time.monotonic() + 1.2
    while time.monotonic() < blocked_until:  # reap throughout the stall
        assert q.reap().lost == 0
        assert q.stats().workers_silent == 0
    assert rt.runtime.heartbeat.beats > beats + 5  # type: ignore[union-attr]
    committed, trained = train(q, {"g-0"})
    assert trained[0].attempt == 1 and q.stats().terminals["lost"] == 0
    # The beats carry the worker's progress, which operators read as its speed (views.workers).
    worker = rt.runtime.worker_id
    tokens = sum(len(s.token_ids) for s in trained[0].samples)

    def reported() -> Any:
        (w,) = [w for w in views.QueueView(q.client, name).run(views.workers(QueueKeys(name))) if w.worker_id == worker]
        return w.progress if w.progress and w.progress.groups == 1 else None

    progress = wait_until(reported, 10, message="the worker's progress in its heartbeat")
    assert progress.tokens == tokens and progress.uptime_ms > 0
    assert rt.drain() is None
    assert not q.client.hexists(QueueKeys(name)["progress"], worker)  # gone with its registration


def test_a_stale_receipt_on_complete_is_dropped(url: str, name: str) -> None:
    q = open_queue(url, name, worker_timeout_s=0.5)
    submit(q, 1, n=1)
    engine = ScriptedEngine(hang=True)
    # A heartbeat far rarer than the timeout, and one slot (no reserve calls, which also refresh
    # liveness, while it generates): the worker looks dead while it generates.
    rt = start(url, name, engine, heartbeat_interval_s=3600, max_samples=1)
    wait_until(lambda: engine.running == 1, 10)
    wait_until(lambda: q.reap().lost == 1, 10)
    rescuer = q.worker("rescuer")
    (r,) = wait_until(lambda: rescuer.reserve(1), 10)
    rt.on_loop(engine.finish_hanging)
    wait_until(lambda: rt.runtime.stats.settled["stale"] == 1, 10)
    assert rt.alive and rt.runtime.stats.settled["completed"] == 0
    rescuer.complete(r.receipt, [Sample(0, (5,), (-0.1,))])
    committed, trained = train(q, {"g-0"})
    assert committed["g-0"] == 1 and trained[0].attempt == 2
    assert rt.drain() is None


def test_a_fatal_engine_error_counts_against_the_attempt_whose_request_raised_it_alone(url: str, name: str) -> None:
    """Issue 29 item 14: the engine dies under g-2's request; the groups it held beside g-2 (their
    requests in flight too) go back uncounted, so with max_attempts=1 only g-2 is dead-lettered."""
    q = open_queue(url, name, max_attempts=1)
    submit(q, 3, n=2)
    engine = ScriptedEngine(hang=True, fatal_after=6)  # the 6th generate call, g-2's second sample, kills the engine
    rt = start(url, name, engine)
    error = rt.join()
    assert isinstance(error, WorkerFailed) and "scripted fatal error" in str(error)
    st = q.stats()
    assert (st.ready, st.executing_groups, st.dead) == (2, 0, 1)
    assert (st.terminals["failed"], st.terminals["aborted"], st.terminals["lost"]) == (1, 2, 0)
    (letter,) = after_settling(q).dead_letters()
    assert letter.source_id == "g-2" and "the engine failed under this group's request" in letter.history[-1]["r"]
    assert "scripted fatal error at call 6" in letter.history[-1]["r"]
    assert_nothing_owned(url, name, rt.runtime.worker_id)


def test_drain_deadline_aborts_what_is_still_generating(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)
    submit(q, 2, n=2)
    engine = ScriptedEngine(hang=True)
    rt = start(url, name, engine, drain_timeout_s=0.2)
    wait_until(lambda: engine.running == 4, 10)
    assert rt.drain() is None
    st = q.stats()
    assert (st.ready, st.executing_groups, st.terminals["aborted"], st.dead) == (2, 0, 2, 0)
    assert engine.aborted == 4
    assert_nothing_owned(url, name, rt.runtime.worker_id)


def test_admission_hold_stops_reservations_without_spinning(url: str, name: str) -> None:
    q: RolloutQueue = open_queue(url, name)
    hold = q.hold(timeout_s=30)
    submit(q, 2, n=1)
    rt = start(url, name, ScriptedEngine(), block_ms=300)
    wait_until(lambda: rt.runtime.held is True, 10)
    calls_before = len(rt.runtime.stats.reserves)
    held_for = time.monotonic() + 0.6
    while time.monotonic() < held_for:
        assert q.stats().executing_groups == 0
    # Blocking reserves (300 ms each) while held: a handful of calls, not a spin.
    assert len(rt.runtime.stats.reserves) - calls_before <= 4
    hold.release()
    train(q, {"g-0", "g-1"})
    assert rt.drain() is None

