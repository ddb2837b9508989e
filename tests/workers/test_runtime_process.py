"""Worker PROCESSES (``python -m rollout_queue.workers --engine scripted``): SIGTERM drain, kill -9, fatal errors.

These are the failure modes DESIGN's "Failure handling" promises to survive, exercised on real
processes and a real Redis, with the ledger read back at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from rollout_queue import SourceGroup
from rollout_queue.devtools.local_server import LocalServer
from tests.helpers import wait_until
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
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811  # the fixture above, by name
    return worker_server.url


@pytest.fixture
def name() -> str:
    return f"p-{uuid.uuid4().hex[:10]}"


def drain_once(proc: subprocess.Popen[str], ready: Callable[[], Any], message: str,
               timeout: float = 20.0) -> tuple[int, str]:
    """Wait until ``ready()``, then SIGTERM ``proc`` and finish it: (exit code, stderr). Killed on the way out."""
    try:
        wait_until(ready, timeout, message=message)
        proc.send_signal(signal.SIGTERM)
        return finish(proc)
    finally:
        proc.kill()


def finish(proc: subprocess.Popen[str], timeout: float = 20.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"worker did not exit; stderr:\n{err}") from None
    return proc.returncode, err


def test_sigterm_drains_finishes_in_flight_work_requeues_the_rest_and_exits_0(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=1)
    q.submit([SourceGroup(f"quick-{i}", f"quick {i}", 2) for i in range(2)]
             + [SourceGroup("stuck", "stuck forever", 2)])
    proc = spawn_worker(url, name, "drainer", "--engine-arg", "latency_s=0.4", "--engine-arg", 'hang_prompt="stuck"',
                        "--drain-timeout", "6", "--json-logs")  # 0.4 s groups: room on a loaded CI machine
    code, err = drain_once(proc, lambda: q.stats().executing_groups == 3, "three groups executing")
    assert code == 0, err
    st = q.stats()
    # The quick attempts finished inside the deadline; the stuck one went back to ready, uncounted.
    assert (st.completed, st.ready, st.executing_groups, st.dead) == (2, 1, 0, 0), err
    assert st.terminals["aborted"] == 1
    assert "drainer" not in pel_owners(url, name) and "drainer" not in registered_workers(url, name)
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]
    closed = [x for x in lines if x["msg"] == "worker closed"]
    assert closed and closed[0]["worker"] == "drainer" and closed[0]["queue"] == name
    assert closed[0]["event"] == "WorkerClosed"  # every runtime line names its typed event (workers/events.py)
    assert (closed[0]["completed"], closed[0]["aborted"], closed[0]["requeued"]) == (2, 1, 0)
    aborted = [x for x in lines if x["msg"] == "aborted"]
    assert aborted and {"entry", "attempt", "worker", "queue"} <= set(aborted[0]) and aborted[0]["event"] == "Settled"


def test_kill_9_mid_generation_the_reaper_requeues_and_another_worker_finishes_once(url: str, name: str) -> None:
    q = open_queue(url, name, worker_timeout_s=0.5)
    ids = submit(q, 6, n=2)
    proc = spawn_worker(url, name, "doomed", "--engine-arg", "latency_s=30", "--max-samples", "6")
    try:
        wait_until(lambda: q.stats().executing_groups == 3, 20, message="three groups executing")
    finally:
        proc.kill()  # SIGKILL: no drain, no close, the heartbeat thread dies with it
    proc.communicate()
    assert pel_owners(url, name).get("doomed") == 3
    lost = wait_until(lambda: q.reap().lost, 10, message="the reaper to requeue the dead worker's work")
    assert lost == 3 and "doomed" not in pel_owners(url, name)
    rescuer = RuntimeThread(WorkerRuntime(url, name, ScriptedEngine(latency_s=0.01),
                                          WorkerOptions(block_ms=200), worker_id="rescuer")).start()
    committed, trained = train(q, {f"g-{i}" for i in range(6)})
    assert rescuer.drain() is None
    assert len(ids) == 6 and set(committed.values()) == {1}  # every group trained exactly once
    assert sorted(g.attempt for g in trained) == [1, 1, 1, 2, 2, 2]
    st = q.stats()
    assert (st.committed, st.retained, st.dead, st.terminals["lost"]) == (6, 0, 0, 3)


def test_a_fatal_engine_error_requeues_everything_before_a_non_zero_exit(url: str, name: str) -> None:
    q = open_queue(url, name, max_attempts=3)
    submit(q, 4, n=2)
    # Requests hang (so the worker owns work when it dies); the 5th generate call (the first of the
    # third group: all four groups were reserved in one call) is fatal.
    proc = spawn_worker(url, name, "fragile", "--engine-arg", "hang=true", "--engine-arg", "fatal_after=5")
    code, err = finish(proc)
    assert code == 1, err
    assert "scripted fatal error" in err
    st = q.stats()
    assert (st.ready, st.executing_groups, st.dead) == (4, 0, 0), err
    # Counted against the group whose request killed the engine (g-2's first sample: a prompt that
    # kills engines must not loop for ever), and it alone: the other three go back uncounted (and g-2
    # too, if the reserve call in flight got it back as the worker stopped).
    assert (st.terminals["failed"], st.terminals["lost"]) == (1, 0) and st.terminals["aborted"] >= 3
    assert "fragile" not in pel_owners(url, name) and "fragile" not in registered_workers(url, name)
    # The requeue happened before the exit: the log says so, in that order.
    assert err.index("worker closed") < err.index("rollout-queue worker:")


def test_a_recorded_version_that_fails_while_applying_at_start_stops_the_worker_with_exit_1(url: str,
                                                                                          name: str) -> None:
    """What still stops a worker at start (issue 29 item 4): a load that failed while applying (the
    engine's weights then unknown, ``EngineError``), not a refusal. Nothing was reserved; exit 1."""
    q = open_queue(url, name)
    q.publish_version(1, "file:///weights/v1")
    submit(q, 2, n=2)
    code, err = finish(spawn_worker(url, name, "w-apply", "--engine-arg", "fatal_on_load=true"))
    assert code == 1, err
    assert "scripted fatal error loading weights" in err
    st = q.stats()
    assert (st.backlog + st.ready, st.executing_groups, st.dead) == (2, 0, 0), err
    assert "w-apply" not in pel_owners(url, name) and "w-apply" not in registered_workers(url, name)


def test_a_reward_and_filter_named_on_the_command_line_score_every_group(url: str, name: str) -> None:
    """docs/USAGE.md's example module, loaded by a worker process from its Python path: every
    sample scored by examples.rewards:exact_answer (the scripted engine answers with random digits,
    never the answer), so examples.rewards:some_right filters every group."""
    q = open_queue(url, name)
    submit(q, 3, n=2)
    proc = spawn_worker(url, name, "scorer", "--reward", "examples.rewards:exact_answer",
                        "--filter", "examples.rewards:some_right")
    code, err = drain_once(proc, lambda: q.stats().filtered == 3, "three groups scored and filtered", 30)
    assert code == 0, err
    st = q.stats()
    assert st.filtered_by_reason == {"no_sample_right": 3} and st.dead == 0 and st.terminals["failed"] == 0, st
    q.close()


def test_the_worker_command_reports_usage_errors(url: str, name: str) -> None:
    proc = spawn_worker(url, name, "w", "--engine-arg", "not-a-pair")
    code, err = finish(proc)
    assert code == 2 and "KEY=VALUE" in err


def test_rollout_queue_worker_delegates_to_the_worker_command(url: str, name: str) -> None:
    from rollout_queue.cli import main as rollout_queue_main

    # The worker's own usage error (exit 2), with the documented (now optional) `--` and without it.
    for separator in (["--"], []):
        argv = ["--url", url, "--queue", name, "worker", *separator, "--engine", "scripted", "--engine-arg", "oops"]
        assert rollout_queue_main(argv) == 2
