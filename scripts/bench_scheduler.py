"""Scenario 8: engine slot utilisation under the `group` and `sample` backfill policies.

Three policies: ``group``; ``sample`` with ``max_waiting=0`` (``sample_nowait``: a group is
reserved only once ``n`` slots are free, the sample policy before 2026-12-05); ``sample`` as shipped
(up to ``2n - 1`` samples wait in the engine, so the next group is reserved while ``n - 1`` still
wait: with no queue latency, as simulated here, ``n - 1`` would do as well; the real engine needs the
head start, docs/PERFORMANCE.md).

The real worker runtime (workers/runtime.py + workers/scheduler.py) drives the test engine
(workers/engines/scripted.py) against the bench's queue, while a trainer leases and commits.

The engine model (the same for both policies):
- S engine slots (`max_concurrency`); groups of n=8 samples; group policy G = S / n groups,
  sample policy S samples.
- Each sample's generation length L is lognormal, L = min(max_tokens, exp(N(ln median, sigma))),
  drawn from a hash of (prompt, parent slot), so both policies see the same lengths; its latency is L * token_s. There is no batching slowdown: a slot's speed does
  not depend on how many slots are busy (a vLLM engine's per-token time does grow with the batch,
  which only stretches time, not the idle-slot fraction measured here).
- Utilisation = busy slot-seconds / (S x window), over the window from the first sample's start
  (plus 10% of the run, to skip the start-up fill that flatters the group policy) to the last
  reserve that got work (after it the backlog is empty and every policy must drain).

Beside the measured figure, ``simulate`` replays the same model as a discrete-event simulation with
zero queue latency: what each policy can reach at best, so the gap is the runtime's and the queue's.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from bench_common import CTX, flush
from bench_lifecycle import open_queue
from rollout_queue import RolloutQueue, SourceGroup


@dataclass(frozen=True)
class EngineModel:
    slots: int = 256
    n: int = 8
    median_tokens: float = 1024.0
    sigma: float = 1.0
    max_tokens: int = 16384
    token_s: float = 0.0002  # 0.2 ms per token: a 1024-token sample takes ~0.2 s

    def latency(self, prompt: str, slot: str) -> float:
        """Seconds for one sample of ``prompt`` in parent slot ``slot`` (a hash, not a clock)."""
        digest = hashlib.sha256(f"{prompt}|{slot}".encode()).digest()
        u1 = (int.from_bytes(digest[:8], "big") + 1) / 2**64
        u2 = int.from_bytes(digest[8:16], "big") / 2**64
        z = math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)  # Box-Muller
        tokens = min(self.max_tokens, max(1.0, math.exp(math.log(self.median_tokens) + self.sigma * z)))
        return tokens * self.token_s


def worker_main(url: str, queue: str, policy: str, model: EngineModel, ready: Any, stop: Any, results: Any) -> None:
    """A worker process: the real runtime with the test engine; reports every sample's start and
    latency and the runtime's reserve times."""
    from rollout_queue.workers.engines.scripted import ScriptedEngine
    from rollout_queue.workers.runtime import WorkerOptions, WorkerRuntime

    starts: list[tuple[float, float]] = []

    def latency_fn(prompt: str, request_id: str) -> float:
        lat = model.latency(prompt, request_id.rsplit("/", 1)[-1])  # request id: entry/attempt/slot
        starts.append((time.monotonic(), lat))  # called by the engine as the sample starts
        return lat

    engine = ScriptedEngine(max_concurrency=model.slots, latency_fn=latency_fn)
    group_cap = model.slots // model.n
    options = (WorkerOptions(policy="group", max_groups=group_cap, max_batch=group_cap, block_ms=200)
               if policy == "group" else
               WorkerOptions(policy="sample", max_samples=model.slots, max_batch=group_cap, block_ms=200,
                             max_waiting=0 if policy == "sample_nowait" else None))
    runtime = WorkerRuntime(url, queue, engine, options, worker_id=f"bench-sched-{policy}")

    async def serve() -> None:
        # Poll the stop flag: a thread blocked in a multiprocessing Event.wait() that dies with its
        # process can leave the parent's next Event.set() waiting for it forever.
        task = asyncio.create_task(runtime.run())
        while not task.done():
            if stop.is_set():
                runtime.request_drain()
                break
            await asyncio.sleep(0.05)
        await task

    ready.set()
    try:
        asyncio.run(serve())
    except Exception as exc:  # handed to the parent, which raises it as the scenario's error
        results.put({"error": f"{type(exc).__name__}: {exc} (cause: {exc.__cause__!r})"})
        return
    results.put({"starts": starts, "reserves": [t for t, k in runtime.stats.reserves if k]})


def utilisation(starts: list[tuple[float, float]], t0: float, t1: float, slots: int) -> float:
    busy = sum(max(0.0, min(s + lat, t1) - max(s, t0)) for s, lat in starts)
    return busy / (slots * (t1 - t0))


def run_policy(url: str, policy: str, model: EngineModel, groups: int) -> dict[str, float]:
    flush(url)
    name = f"bench-sched-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name)
    run = uuid.uuid4().hex[:6]
    ready, stop, results = CTX.Event(), CTX.Event(), CTX.Queue()
    proc = CTX.Process(target=worker_main, args=(url, name, policy, model, ready, stop, results), daemon=True)
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("scheduler bench worker did not start")
        q.submit([SourceGroup(f"{run}-{i}", f"prompt {i}", model.n) for i in range(groups)])
        try:
            _train(q, groups, proc.is_alive)
        except RuntimeError as exc:
            got = results.get(timeout=1) if not results.empty() else {}
            raise RuntimeError(f"{exc}; worker said: {got.get('error', 'nothing')}") from exc
        stop.set()
        got = results.get(timeout=120)
        if "error" in got:
            raise RuntimeError(f"scheduler bench worker failed: {got['error']}")
    finally:
        stop.set()
        proc.join(60)
        if proc.is_alive():
            proc.kill()  # our own child that did not drain in time
            proc.join()
    q.close()
    starts = got["starts"]
    first, last = min(s for s, _ in starts), max(got["reserves"])
    t0 = first + 0.1 * (last - first)
    return {f"{policy}_util": utilisation(starts, t0, last, model.slots),
            f"{policy}_samples_per_s": len(starts) / (max(s + lat for s, lat in starts) - first)}


def _train(q: RolloutQueue, groups: int, worker_alive: Callable[[], bool]) -> None:
    committed, deadline = 0, time.monotonic() + 900
    while committed < groups:
        if time.monotonic() > deadline or not worker_alive():
            raise RuntimeError(f"scheduler bench: {committed} of {groups} groups trained, then the worker "
                               "died or the deadline passed")
        lease = q.lease(min(32, groups - committed), block_ms=500, partial=True)
        if lease is not None:
            lease.commit()
            committed += len(lease)


POLICIES = ("group", "sample_nowait", "sample")


def simulate(policy: str, model: EngineModel, groups: int) -> float:
    """The same model as a discrete-event simulation with zero queue latency (the policy's best).
    Samples beyond the free slots wait in the engine, first come first served, as in the engines."""
    slots_free, time_now, next_group = model.slots, 0.0, 0
    events: list[tuple[float, int]] = []  # (finish time, group index)
    waiting: list[tuple[int, int]] = []  # (group index, slot) reserved, not yet started
    running = {}  # group index -> samples not yet finished
    starts: list[tuple[float, float]] = []
    last_reserve = 0.0
    cap = model.slots // model.n
    may_wait = 2 * model.n - 1 if policy == "sample" else 0  # the shipped default

    def start_waiting() -> None:
        nonlocal slots_free
        while waiting and slots_free > 0:
            g, slot = waiting.pop(0)
            slots_free -= 1
            lat = model.latency(f"prompt {g}", str(slot))
            starts.append((time_now, lat))
            heapq.heappush(events, (time_now + lat, g))

    def fits() -> bool:
        if policy == "group":
            return len(running) < cap
        return slots_free - len(waiting) + may_wait >= model.n

    def admit() -> None:
        nonlocal next_group, last_reserve
        while next_group < groups and fits():
            g = next_group
            next_group += 1
            last_reserve = time_now
            running[g] = model.n
            waiting.extend((g, slot) for slot in range(model.n))
            start_waiting()

    admit()
    while events:
        time_now, g = heapq.heappop(events)
        running[g] -= 1
        if policy != "group":
            slots_free += 1
        if running[g] == 0:
            del running[g]
            if policy == "group":
                slots_free += model.n
        start_waiting()
        admit()
    t0 = 0.1 * last_reserve
    return utilisation(starts, t0, last_reserve, model.slots)


def run_scheduler(url: str, model: EngineModel, groups: int) -> dict[str, float]:
    """One repeat of scenario 8: every policy on the real runtime, and the simulated best, also for
    the engine benchmark's small engine (32 slots, where waiting for n = 8 free slots costs most)."""
    out: dict[str, float] = {}
    small = EngineModel(slots=32, n=model.n, median_tokens=model.median_tokens, sigma=model.sigma,
                        max_tokens=model.max_tokens, token_s=model.token_s)
    for policy in POLICIES:
        out.update(run_policy(url, policy, model, groups))
        out[f"sim_{policy}_util"] = simulate(policy, model, groups)
        out[f"sim32_{policy}_util"] = simulate(policy, small, groups)
    return out
