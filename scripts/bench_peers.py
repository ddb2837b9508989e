"""Scenario 3: peers on the same server, no-op jobs of ~200 bytes: RQ, arq, bullmq and ours.

Each peer runs in its own spawned process: enqueue N jobs with its bulk API (where it has one),
then time one worker draining them. Ours: submit N groups (n=1, a 200-byte prompt), then one
worker process (reserve 64 / complete each, an 8-token sample back) and one trainer process
(lease 64 / commit) drain them. The primary figure is the drain rate (items/s from the worker's
start to the last item done); enqueue rates are reported beside it.

Peer settings (defaults unless said): RQ SimpleWorker (no fork per job) with RQ's JSONSerializer
(we never run pickle), logging at WARNING; arq with max_jobs=10 (its default), an orjson
serializer, and poll_delay=0 (the default 0.5 s sleeps between polls of 10 jobs, which would cap
it at 20 jobs/s); bullmq Worker with concurrency 10 and default job options (jobs kept on
completion). A peer that is not installed is reported as missing, not as zero.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import time
import uuid
from typing import Any

import redis

from bench_common import CTX, TINY, Team, flush
from bench_lifecycle import cpu_seconds, open_queue, trainer_main, worker_main

PAYLOAD = "x" * 200
PEERS = ("rq", "arq", "bullmq")


def noop(payload: str) -> None:
    """The RQ job: does nothing."""


async def arq_noop(ctx: dict[str, Any], payload: str) -> None:
    """The arq job: does nothing."""


def installed(peer: str) -> bool:
    return importlib.util.find_spec(peer) is not None


def peer_version(peer: str) -> str | None:
    """The installed distribution's version (None: not installed): a peer's speed moves with it, so
    a stored run names the versions it compared against."""
    if not installed(peer):
        return None
    try:
        return importlib.metadata.version(peer)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- the peers, one process each -------------------------------------------------------------------


def rq_main(url: str, n: int, results: Any) -> None:
    from redis import Redis
    from rq import Queue, SimpleWorker
    from rq.serializers import JSONSerializer

    conn = Redis.from_url(url)
    q = Queue(f"bench-{uuid.uuid4().hex[:6]}", connection=conn, serializer=JSONSerializer)
    t0 = time.perf_counter()
    for start in range(0, n, 500):
        q.enqueue_many([Queue.prepare_data("bench_peers.noop", args=(PAYLOAD,)) for _ in range(start, min(n, start + 500))])
    t1 = time.perf_counter()
    worker = SimpleWorker([q], connection=conn, serializer=JSONSerializer)
    probe = Probe(url)
    worker.work(burst=True, logging_level="WARNING")
    results.put({"enqueue_s": t1 - t0, **probe.done(), "done": q.finished_job_registry.count})


def arq_main(url: str, n: int, results: Any) -> None:
    asyncio.run(_arq(url, n, results))


async def _arq(url: str, n: int, results: Any) -> None:
    import orjson
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    name = f"bench-{uuid.uuid4().hex[:6]}"
    pool = await create_pool(RedisSettings.from_dsn(url), job_serializer=orjson.dumps,
                             job_deserializer=orjson.loads, default_queue_name=name)
    t0 = time.perf_counter()
    for start in range(0, n, 100):  # no bulk enqueue in arq: 100 concurrent enqueue_job calls
        await asyncio.gather(*(pool.enqueue_job("noop", PAYLOAD) for _ in range(start, min(n, start + 100))))
    t1 = time.perf_counter()
    worker = Worker(functions=[func(arq_noop, name="noop")], redis_pool=pool, queue_name=name, burst=True,
                    handle_signals=False, poll_delay=0, max_jobs=10, job_serializer=orjson.dumps,
                    job_deserializer=orjson.loads)
    probe = Probe(url)
    await worker.main()
    figures = probe.done()
    done = worker.jobs_complete
    await worker.close()
    results.put({"enqueue_s": t1 - t0, **figures, "done": done})


def bullmq_main(url: str, n: int, results: Any) -> None:
    asyncio.run(_bullmq(url, n, results))


async def _bullmq(url: str, n: int, results: Any) -> None:
    from bullmq import Queue, Worker

    name = f"bench-{uuid.uuid4().hex[:6]}"
    queue = Queue(name, {"connection": url})
    t0 = time.perf_counter()
    for start in range(0, n, 500):
        await queue.addBulk([{"name": "noop", "data": {"p": PAYLOAD}} for _ in range(start, min(n, start + 500))])
    t1 = time.perf_counter()
    finished = asyncio.Event()
    count = 0

    def on_completed(job: Any, result: Any) -> None:
        nonlocal count
        count += 1
        if count >= n:
            finished.set()

    async def process(job: Any, token: str) -> None:
        return None

    probe = Probe(url)
    worker = Worker(name, process, {"connection": url, "concurrency": 10})
    worker.on("completed", on_completed)
    await asyncio.wait_for(finished.wait(), timeout=600)
    figures = probe.done()
    await worker.close()
    await queue.close()
    results.put({"enqueue_s": t1 - t0, **figures, "done": count})


class Probe:
    """Wall time, this process's CPU and the server's CPU over a drain (read in the peer's process)."""

    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.t, self.cpu, self.server = time.perf_counter(), time.process_time(), cpu_seconds(self.r)

    def done(self) -> dict[str, float]:
        out = {"drain_s": time.perf_counter() - self.t, "cpu_s": time.process_time() - self.cpu,
               "redis_cpu_s": cpu_seconds(self.r) - self.server}
        self.r.close()
        return out


MAINS = {"rq": rq_main, "arq": arq_main, "bullmq": bullmq_main}


def run_peer(url: str, peer: str, n: int) -> dict[str, float]:
    """One peer run in a fresh process; jobs/s for the drain and for the enqueue."""
    flush(url)
    results = CTX.Queue()
    proc = CTX.Process(target=MAINS[peer], args=(url, n, results), daemon=True)
    proc.start()
    try:
        got = results.get(timeout=900)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()  # our own child, stuck after reporting
            proc.join()
    if got["done"] < n:
        raise RuntimeError(f"{peer} finished {got['done']} of {n} jobs")
    return {f"{peer}_per_s": n / got["drain_s"], f"{peer}_enqueue_per_s": n / got["enqueue_s"],
            f"{peer}_worker_cpu_us": got["cpu_s"] * 1e6 / n, f"{peer}_redis_cpu_us": got["redis_cpu_s"] * 1e6 / n}


def run_ours_tiny(url: str, n: int, batch: int = 64) -> dict[str, float]:
    """Ours with the peers' payload: submit N, then one worker and one trainer process drain them."""
    flush(url)
    name = f"bench-tiny-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name)
    run = uuid.uuid4().hex[:6]
    t0 = time.perf_counter()
    for start in range(0, n, 500):
        q.submit([TINY.group(f"{run}-{i}") for i in range(start, min(n, start + 500))])
    enqueue_s = time.perf_counter() - t0
    q.close()
    r = redis.Redis.from_url(url)
    team = Team()
    # window=0: everything is already submitted, the trainer only leases and commits.
    team.add(trainer_main, url, name, TINY, n, batch, 0)
    team.add(worker_main, url, name, 0, TINY, batch)
    try:
        team.go()
        cpu0 = cpu_seconds(r)
        trainer = team.collect(1, timeout_s=600)[0]
        redis_cpu = cpu_seconds(r) - cpu0
        team.stop.set()
        worker = team.collect(1, timeout_s=60)[0]
    finally:
        team.close()
    r.close()
    if trainer["committed"] < n:
        raise RuntimeError(f"ours committed {trainer['committed']} of {n}")
    return {"ours_tiny_per_s": n / trainer["elapsed"], "ours_tiny_enqueue_per_s": n / enqueue_s,
            "ours_tiny_redis_cpu_us": redis_cpu * 1e6 / n, "ours_tiny_worker_cpu_us": worker["cpu_s"] * 1e6 / n,
            "ours_tiny_trainer_cpu_us": trainer["cpu_s"] * 1e6 / n}


def run_peers(url: str, n: int) -> dict[str, float]:
    """One repeat of scenario 3: ours and every installed peer, back to back, and the ratios."""
    out = run_ours_tiny(url, n)
    for peer in PEERS:
        if installed(peer):
            out.update(run_peer(url, peer, n))
            out[f"ours_vs_{peer}"] = out["ours_tiny_per_s"] / out[f"{peer}_per_s"]
            out[f"ours_vs_{peer}_redis_cpu"] = out[f"{peer}_redis_cpu_us"] / out["ours_tiny_redis_cpu_us"]
    return out
