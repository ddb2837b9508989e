"""The worker PROCESS and its queues: a missing queue is waited for (bounded, logged once), then an
error (exit 4, nothing written), and ``--queue a:3,b:1`` serves two queues by weight, each settled
through its own queue."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import uuid

import pytest
import redis

from rollout_queue import AsyncRolloutQueue, QueueNotFound, RolloutQueue, SourceGroup
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.workers.served import ServedReceipt, parse_queue_spec, receipt_scope
from rollout_queue.core.models import Receipt
from tests.helpers import wait_until
from tests.workers.runtime_helpers import open_queue, registered_workers, spawn_worker, worker_server  # noqa: F401
from tests.workers.test_runtime_process import finish


@pytest.fixture
def url(worker_server: LocalServer) -> str:  # noqa: F811
    return worker_server.url


def keys_of(url: str, name: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"rollout:{{{name}*"))
    finally:
        client.close()


def test_queue_specs_parse_names_and_weights() -> None:
    assert parse_queue_spec("run-a:3,run-b:1") == {"run-a": 3.0, "run-b": 1.0}
    assert parse_queue_spec("grpo") == {"grpo": 1.0}
    assert parse_queue_spec("x:y") == {"x:y": 1.0}  # a name with a colon and no weight
    assert parse_queue_spec("x:3:2") == {"x:3": 2.0}
    for bad in ("a,,b", "a:1,a:2", "a{b}", ""):
        with pytest.raises(ValueError):
            parse_queue_spec(bad)
    inner = Receipt("1-0", 1, "w")
    assert receipt_scope(ServedReceipt("1-0", 1, "w", served="a", inner=inner)) == "a"
    assert ServedReceipt("1-0", 1, "w", served="a", inner=inner) != ServedReceipt("1-0", 1, "w", served="b",
                                                                                     inner=inner)


def test_a_mistyped_queue_exits_4_with_the_reason_and_creates_nothing(url: str) -> None:
    name = f"typo-{uuid.uuid4().hex[:8]}"
    code, err = finish(spawn_worker(url, name, "w-typo", "--wait-for-queue", "0"))
    assert code == 4, err
    assert "does not exist" in err and name in err and "--create" in err and "waiting" not in err
    assert keys_of(url, name) == []
    # One missing queue of several is refused the same way, after the bounded wait (logged once, and
    # named in the last line); the existing one is left as it was.
    present = f"here-{uuid.uuid4().hex[:8]}"
    open_queue(url, present).close()
    before = sorted(keys_of(url, present))
    code, err = finish(spawn_worker(url, f"{present}:3,{name}:1", "w-typo2", "--json-logs",
                                    env={"ROLLOUT_WAIT_FOR_QUEUE": "1.5"}), timeout=60)
    assert code == 4 and name in err, err
    waits = [json.loads(line) for line in err.splitlines() if line.startswith("{") and "WaitingForQueue" in line]
    assert len(waits) == 1 and waits[0]["missing"] == name and waits[0]["wait_s"] == 1.5, err
    assert err.strip().splitlines()[-1].endswith("(waited 1.5 s for it: --wait-for-queue)"), err
    assert keys_of(url, name) == [] and sorted(keys_of(url, present)) == before
    assert "w-typo2" not in registered_workers(url, present)


def test_a_worker_started_before_its_queue_waits_for_it_then_serves(url: str) -> None:
    """Pods and Slurm arrays start in any order: a worker up before its trainer logs once that it
    waits, creates nothing meanwhile, and serves as soon as the trainer has created the queue."""
    name = f"later-{uuid.uuid4().hex[:8]}"
    proc = spawn_worker(url, name, "w-early", "--wait-for-queue", "120", "--json-logs")
    logged: list[str] = []
    reader = threading.Thread(target=lambda: logged.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()  # the worker's stderr, line by line, while it runs
    try:
        def waiting() -> bool:
            assert proc.poll() is None, "".join(logged)
            return any("WaitingForQueue" in line for line in logged)

        wait_until(waiting, 60, message="the worker to log that it waits for its queue")
        assert keys_of(url, name) == []  # waiting writes nothing: no queue of that name appears
        q = open_queue(url, name)  # the trainer comes up and creates the queue
        q.submit([SourceGroup("g-0", "What is 1 plus 1?", 2)])
        wait_until(lambda: q.stats().completed == 1, 60, message="the early worker to serve the group")
        assert "w-early" in registered_workers(url, name)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    finally:
        proc.kill()
    reader.join(10)
    assert code == 0, "".join(logged)
    assert sum("WaitingForQueue" in line for line in logged) == 1  # said once, before the queue came
    q.close()


def test_an_open_that_finds_no_queue_leaves_no_connection_behind(url: str) -> None:
    """A waiting worker asks every second: each try's connection is closed with its QueueNotFound."""
    name = f"none-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    before = len(client.client_list())
    for _ in range(5):
        with pytest.raises(QueueNotFound):
            asyncio.run(AsyncRolloutQueue.from_url(url, name, create=False))
        with pytest.raises(QueueNotFound):
            RolloutQueue.from_url(url, name, create=False)
    assert len(client.client_list()) <= before
    client.close()


def test_create_lets_the_worker_create_its_queue(url: str) -> None:
    name = f"made-{uuid.uuid4().hex[:8]}"
    proc = spawn_worker(url, name, "w-create", "--create")
    try:
        wait_until(lambda: "w-create" in registered_workers(url, name), 20, message="the worker to register")
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err


def test_two_queues_by_weight_are_served_about_3_to_1_each_through_its_own_queue(url: str) -> None:
    a, b = f"wa-{uuid.uuid4().hex[:8]}", f"wb-{uuid.uuid4().hex[:8]}"
    qa, qb = open_queue(url, a), open_queue(url, b)
    for q, prefix in ((qa, "a"), (qb, "b")):
        q.submit([SourceGroup(f"{prefix}-{i}", f"{prefix} {i}", 1) for i in range(300)])
    proc = spawn_worker(url, f"{a}:3,{b}:1", "w-fleet", "--engine-arg", "latency_s=0.005", "--max-samples", "4",
                        "--json-logs")
    try:
        wait_until(lambda: qa.stats().completed + qb.stats().completed >= 120, 40, message="120 groups completed")
        assert "w-fleet" in registered_workers(url, a) and "w-fleet" in registered_workers(url, b)  # beats both
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 0, err
    sa, sb = qa.stats(), qb.stats()
    assert sa.executing_groups == sb.executing_groups == 0 and sa.dead == sb.dead == 0
    ratio = sa.completed / max(1, sb.completed)
    assert 2.0 <= ratio <= 4.5, (sa.completed, sb.completed)
    # Each group settled in the queue that issued it: as many completed as left its backlog.
    assert sa.completed + sa.ready + sa.backlog == 300 and sb.completed + sb.ready + sb.backlog == 300
    assert "w-fleet" not in registered_workers(url, a) + registered_workers(url, b)  # closed on both
    qa.close()
    qb.close()


def test_a_follower_queue_that_publishes_versions_is_refused_with_exit_2(url: str) -> None:
    a, b = f"la-{uuid.uuid4().hex[:8]}", f"fb-{uuid.uuid4().hex[:8]}"
    open_queue(url, a).close()
    qb = open_queue(url, b)
    qb.publish_version(1, "/weights/b/1")
    code, err = finish(spawn_worker(url, f"{a}:1,{b}:1", "w-refused"))
    assert code == 2, err
    assert "share one model and weights source" in err and b in err
    assert "w-refused" not in registered_workers(url, a) + registered_workers(url, b)
    qb.close()


def test_a_follower_queue_that_published_version_0_with_its_own_weights_is_refused(url: str) -> None:
    """Version 0 is a published version too (issue 29 item 21): recorded with a weights URI it names
    another model than the lead's, which the worker would otherwise serve that queue with."""
    a, b = f"la-{uuid.uuid4().hex[:8]}", f"fb-{uuid.uuid4().hex[:8]}"
    qa, qb = open_queue(url, a), open_queue(url, b)
    qb.publish_version(0, "/weights/b/base")
    code, err = finish(spawn_worker(url, f"{a}:1,{b}:1", "w-refused0"))
    assert code == 2, err
    assert "share one model and weights source" in err and b in err and "version 0" in err
    assert "w-refused0" not in registered_workers(url, a) + registered_workers(url, b)
    # And one that publishes version 0 while the worker serves it stops the worker (the same rule).
    c = f"fc-{uuid.uuid4().hex[:8]}"
    qc = open_queue(url, c)
    proc = spawn_worker(url, f"{a}:1,{c}:1", "w-later0", "--heartbeat-interval", "0.2")
    try:
        wait_until(lambda: "w-later0" in registered_workers(url, c), 20, message="the worker to register")
        qc.publish_version(0, "/weights/c/base")
        code, err = finish(proc)
    finally:
        proc.kill()
    assert code == 2, err
    assert "share one model and weights source" in err and c in err
    for q in (qa, qb, qc):
        q.close()
