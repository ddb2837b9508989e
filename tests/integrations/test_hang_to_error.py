"""Hang-to-error (issue 31, section 5; core/liveness.py): real worker processes SIGKILLed, and the
trainer raises WorkersGone within the documented bound (worker_timeout_s + grace + two waits, after
the last heartbeat), never while a worker is alive but slow, still starting, or restarting within the
grace. The measurements are scripts/bench_hang.py's own functions; the bounds get a generous slack
for a loaded machine (the figures on an idle one: docs/PERFORMANCE.md, "Kill -> trainer error")."""

from __future__ import annotations

import importlib.util
import itertools
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rollout_queue import AsyncRolloutQueue, QueueConfig, RolloutQueue, SourceGroup, WorkersGone
from rollout_queue.integrations.stream import TrainingStream
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
#: Seconds a loaded machine may add to the bound (several block_ms waits, slow stats calls).
SLACK = 20.0


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_hang", REPO / "scripts" / "bench_hang.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


def within_bound(row: dict[str, Any]) -> None:
    # Never before the grace (the count starts once the last heartbeat is worker_timeout_s old, after
    # the kill), and within the bound from the last heartbeat (at or before the kill), plus slack.
    assert row["grace_s"] <= row["kill_to_error_s"] <= row["bound_s"] + SLACK, row


def test_a_stream_whose_workers_are_killed_raises_workers_gone_within_the_bound(
        private_redis_url: str, fresh_name: str, tmp_path: Path) -> None:
    row = bench.measure_stream(private_redis_url, fresh_name, tmp_path, timeout_s=1.0)
    within_bound(row)
    for part in ("no worker has been alive", "group(s) are queued", "w1 (last heartbeat", "w2 (last heartbeat"):
        assert part in row["error"], row["error"]


def test_slimes_rollout_function_raises_workers_gone_within_the_bound(private_redis_url: str, fresh_name: str,
                                                                     tmp_path: Path) -> None:
    row = bench.measure_slime(private_redis_url, fresh_name, tmp_path, timeout_s=1.0)
    within_bound(row)
    assert "no worker has been alive" in row["error"] and "w1 (last heartbeat" in row["error"], row["error"]


def test_miles_buffer_raises_workers_gone_though_its_own_process_heartbeats(private_redis_url: str,
                                                                            fresh_name: str, tmp_path: Path) -> None:
    """miles' rollout process registers a worker of its own (its data source's reservations): left out
    while it holds none, so a get waiting on dead rollout-queue workers raises instead of waiting for ever."""
    from tests.integrations.framework_src import add_source, stub_sglang

    add_source("MILES_SRC")
    stub_sglang()
    pytest.importorskip("miles.rollout.fully_async_data_buffer",
                        reason="miles is not importable: set MILES_SRC (scripts/test_frameworks.sh miles)")
    row = bench.measure_miles(private_redis_url, fresh_name, tmp_path, timeout_s=1.0, give_up_s=60.0)
    assert row["kill_to_error_s"] is not None, row
    within_bound(row)


def test_verls_v1_sampler_raises_workers_gone_within_the_bound(private_redis_url: str, fresh_name: str,
                                                              tmp_path: Path) -> None:
    """verl's V1 trainer leases through TrainingStream (QueueReplayBuffer): its ``sample`` raises once
    the workers are gone, though sampler_kwargs.wait_s is 600 s."""
    pytest.importorskip("rollout_queue.integrations.verl.sampler",
                        reason="verl 0.9.1 is not installed (scripts/test_frameworks.sh verl)")
    row = bench.measure_verl(private_redis_url, fresh_name, tmp_path, timeout_s=1.0)
    within_bound(row)
    assert "no worker has been alive" in row["error"] and "w1 (last heartbeat" in row["error"], row["error"]


@pytest.mark.torch
def test_ranks_whose_workers_are_killed_all_raise_within_the_bound(private_redis_url: str, fresh_name: str,
                                                                   tmp_path: Path) -> None:
    """Rank 0 raises WorkersGone; rank 1 RankFailed carrying its text (measure_ranks checks the exit codes)."""
    pytest.importorskip("torch")
    row = bench.measure_ranks(private_redis_url, fresh_name, tmp_path, timeout_s=1.0)
    within_bound(row)
    assert "rank 0: WorkersGone" in row["error"] and "rank 1: RankFailed" in row["error"], row["error"]
    assert row["error"].count("no worker has been alive") == 2, row["error"]


def test_a_slow_worker_and_one_still_starting_never_trip_it(private_redis_url: str, fresh_name: str,
                                                            tmp_path: Path) -> None:
    """The trainer waits from before the worker process exists (its start-up: no worker yet, nothing
    armed), then through rollouts of 4 s, longer than worker_timeout_s + grace + two waits (2.5 s):
    the worker heartbeats on its own thread all along, so the batches come and nothing is raised."""
    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(worker_timeout_s=1.0))
    q.submit([SourceGroup("s0", "prompt 0", 2)])
    stream = TrainingStream(q, groups_per_step=1, wait_s=300, fleet_grace_s=0.5, block_ms=500)
    worker = bench.spawn_worker(private_redis_url, fresh_name, "slow", tmp_path / "slow.log", "--engine",
                                "scripted", "--engine-arg", "latency_s=4")
    try:
        stream.next()  # through the worker's start-up, then one slow rollout
        stream.ack(1)
        assert stream.fleet.armed  # from here on, a fleet missing would be gone
        q.submit([SourceGroup("s1", "prompt 1", 2)])
        started = time.monotonic()
        stream.next()
        assert time.monotonic() - started >= 3.5  # a wait longer than the bound, and no WorkersGone
        stream.ack(2)
    finally:
        bench.kill_all([worker])
        q.close()


def has_beaten(q: RolloutQueue, worker_id: str) -> bool:
    """The worker's heartbeat thread has beaten (its progress line: past its process's start-up)."""
    return worker_id.encode() in q.client.hkeys(q.keys["progress"])


def test_a_restart_within_the_grace_is_waited_out_and_a_lease_goes_on_after_the_error(
        private_redis_url: str, fresh_name: str, tmp_path: Path) -> None:
    """No step waits on a fixed count or a start-up time: a worker process may take many seconds to
    start on a loaded machine, so the restart is waited out until the new worker has beaten (the
    patient grace, 120 s, is the bound), and after WorkersGone the stream is asked again once the
    next worker has beaten, as the error says (before that, a lease call answers WorkersGone again)."""
    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(worker_timeout_s=1.0))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2) for i in range(2000)])
    patient = TrainingStream(q, groups_per_step=2, wait_s=300, fleet_grace_s=120)
    workers = [bench.spawn_worker(private_redis_url, fresh_name, "w1", tmp_path / "w1.log")]
    try:
        patient.next()
        patient.ack(1)
        bench.kill_all(workers)
        workers.append(bench.spawn_worker(private_redis_url, fresh_name, "w1-again", tmp_path / "w1b.log"))
        deadline = time.monotonic() + 300  # past the grace: only a loop that never ends is caught here
        for step in itertools.count(2):  # the buffer, then the gap while w1-again starts: no error, batches again
            patient.next()
            patient.ack(step)
            if has_beaten(q, "w1-again"):  # the restart is over
                break
            assert time.monotonic() < deadline, "w1-again never heartbeat (its log: w1b.log)"
        bench.kill_all(workers)
        with pytest.raises(WorkersGone, match="w1-again"):
            quick = TrainingStream(q, groups_per_step=2, wait_s=300, fleet_grace_s=0.5)
            quick.fleet.note_batch()  # this trainer had batches before (patient's)
            for _ in range(1000):
                quick.next()
                quick.ack(0)
        workers.append(bench.spawn_worker(private_redis_url, fresh_name, "w2", tmp_path / "w2.log"))
        wait_until(lambda: has_beaten(q, "w2"), timeout=120, interval=0.1,
                   message="w2's first heartbeat (its log: w2.log)")
        assert len(quick.next()) == 2  # WorkersGone is an answer, not a broken stream: it goes on
    finally:
        bench.kill_all(workers)
        q.close()


def test_the_plain_lease_api_raises_it_too_sync_and_asyncio(private_redis_url: str, fresh_name: str) -> None:
    """A bare ``while q.lease(...) is None`` loop: the queue's own watch (grace worker_timeout_s),
    armed by a live worker (here a handle that reserved, then went silent as a killed one would)."""
    q = RolloutQueue.from_url(private_redis_url, fresh_name, QueueConfig(worker_timeout_s=0.5))
    q.submit([SourceGroup(f"s{i}", "p", 2) for i in range(3)])
    q.worker("gpu-7").reserve(1)
    assert q.lease(1, block_ms=50) is None  # alive: seen, armed
    with pytest.raises(WorkersGone, match=r"gpu-7 \(last heartbeat \d+ s ago, (reaped|registered, silent)\)"):
        wait_until(lambda: q.lease(1, block_ms=100), timeout=30, message="WorkersGone")
    assert q.lease(1) is None  # a poll (block_ms 0) never reads stats, never raises it

    import asyncio

    async def main() -> None:
        aq = await AsyncRolloutQueue.from_url(private_redis_url, fresh_name + "-a", QueueConfig(worker_timeout_s=0.5))
        try:
            await aq.submit([SourceGroup("a0", "p", 2), SourceGroup("a1", "p", 2)])
            await aq.worker("gpu-8").reserve(1)
            with pytest.raises(WorkersGone, match="gpu-8"):
                for _ in range(600):
                    assert await aq.lease(1, block_ms=100) is None
        finally:
            await aq.close()

    asyncio.run(main())
    q.close()


@pytest.mark.slow
@pytest.mark.torch
def test_trl_whose_workers_are_killed_raises_within_the_bound(private_redis_url: str, fresh_name: str,
                                                              tmp_path: Path) -> None:
    """examples/trl_grpo.py (GRPOTrainer on CPU) and two torch-engine workers, SIGKILLed after two steps."""
    pytest.importorskip("trl")
    row = bench.measure_trl(private_redis_url, fresh_name, tmp_path, timeout_s=2.0)
    within_bound(row)
    assert "WorkersGone" in row["error"] and "w1 (last heartbeat" in row["error"], row["error"]
