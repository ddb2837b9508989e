"""A settlement acknowledged and then lost in a server crash must not pin its group on a live worker.

The crash is made deterministic: the AOF's live file is cut back to its size before the worker's
``complete`` (what ``appendfsync everysec`` loses when the host dies right after the reply), and the
server restarts from it. Redis then gives the entry back to the worker at the same delivery count,
though the worker already dropped the attempt. The worker keeps heartbeating, so the reaper never
frees it: only the worker's reconciliation (workers/reconcile.py) hands it back. At the end every
group is committed exactly once and Redis truth passes the ledger checks.
"""

from __future__ import annotations

import os
import uuid

import redis

from rollout_queue.devtools.chaos.aof import live_incr_file
from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer
from tests.contract.worker_support import history
from tests.helpers import wait_until
from tests.stateful.redis_truth import check_no_ghosts, derive_state, observe
from tests.workers.runtime_helpers import RuntimeThread, train
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.engines.scripted import ScriptedEngine
from rollout_queue.workers.reconcile import REASON
from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime


def owner_of(client: redis.Redis, name: str, entry_id: str) -> tuple[str, int] | None:
    rows = client.xpending_range(QueueKeys(name)["src"], "rollout", entry_id, entry_id, 1)
    return (rows[0]["consumer"].decode(), int(rows[0]["times_delivered"])) if rows else None


def test_a_complete_lost_in_a_crash_is_handed_back_by_the_live_worker(fresh_server: LocalServer) -> None:
    name, wid = f"lost-{uuid.uuid4().hex[:8]}", "crash-w1"
    q = RolloutQueue.from_url(fresh_server.url, name, QueueConfig(worker_timeout_s=30.0, max_attempts=1))
    client = redis.Redis.from_url(fresh_server.url)
    [eid] = q.submit([SourceGroup("lost", "a prompt", 2)])
    engine = ScriptedEngine(hang=True)
    options = WorkerOptions(block_ms=200, max_samples=2, sampling=SamplingConfig(max_tokens=8),
                            reconcile_interval_s=0.3, reconcile_grace_s=3.0)
    rt = RuntimeThread(WorkerRuntime(fresh_server.url, name, engine, options, worker_id=wid)).start()
    try:
        wait_until(lambda: engine.running == 2, 10)  # attempt 1 executing; every slot busy, no reserve
        aof = live_incr_file(fresh_server.dir)
        assert aof is not None
        cut = aof.stat().st_size  # appendfsync always: everything up to here is on disk

        engine.hang = False
        rt.on_loop(engine.finish_hanging)
        wait_until(lambda: rt.runtime.stats.settled["completed"] == 1, 10)  # acknowledged to the worker
        assert q.stats().completed == 1 and owner_of(client, name, eid) == ("@done", 1)

        fresh_server.kill()
        assert live_incr_file(fresh_server.dir) == aof, "an AOF rewrite ran: the cut would be meaningless"
        with open(aof, "r+b") as fh:  # the host died before the complete reached the disk
            fh.truncate(cut)
            os.fsync(fh.fileno())
        fresh_server.start()
        # The lost write is gone: the PEL gives the entry to the worker again, at the same attempt.
        # (The grace, 3 s since the grant, keeps the reconciler off it while this is checked.)
        assert owner_of(client, name, eid) == (wid, 1)
        assert q.stats().completed == 0 and rt.runtime.stats.reconciled == 0

        wait_until(lambda: rt.runtime.stats.reconciled == 1, 15, message="the orphan handed back")
        h = history(client, name, eid)  # kept until the group settles
        assert h is not None and h["f"] == 0 and [(x["a"], x["t"], x["r"]) for x in h["h"]] == [
            (1, "aborted", REASON)]
        committed, trained = train(q, {"lost"}, timeout=30)
        assert committed == {"lost": 1} and trained[0].attempt == 2
        assert rt.runtime.stats.reconciled == 1 and rt.runtime.stats.settled["completed"] == 2
    finally:
        error = rt.drain()
    assert error is None
    truth = observe(client, QueueKeys(name))
    check_no_ghosts(truth)
    assert {derive_state(truth, e) for e in truth.ids.values()} == {"committed"}
    assert q.stats().dead == 0 and q.stats().terminals["aborted"] == 1
    client.close()
    q.close()
