"""Lifecycle scenarios: throughput in processes, the raw Redis pipeline, calls, latency, bytes.

Each ``run_*`` function performs ONE repeat against the bench's private server and returns a flat
dict of figures; bench.py repeats them, summarises and compares with the targets. Queue work goes
only through the public API (RolloutQueue, Worker, Lease), exactly as a trainer and workers use it.

Scenarios here (numbers as in issue 9):
1. lifecycle  submit -> reserve -> complete -> lease -> commit in W worker processes and one trainer
              process (the trainer is also the producer: it submits as many groups as it commits).
2. raw        one redis-py (hiredis) pipeline: XADD + XREADGROUP + XACK of the same bytes.
4. calls      commandstats deltas of a lifecycle run, and per transition in one process.
5. latency    completion -> a blocked trainer's lease returning it; reserve with work waiting.
6. bytes      MEMORY USAGE of the completion payload keys per token.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from typing import Any

import redis

from bench_common import (
    BIG,
    Payload,
    Team,
    commandstats,
    commandstats_delta,
    flush,
    per_group_calls,
    percentile,
)
from rollout_queue import AsyncRolloutQueue, QueueConfig, RolloutQueue
from rollout_queue.core.codec import encode_completion, encode_group
from rollout_queue.core.keys import QueueKeys

#: Big enough that no bound refuses work during a bench: only the pipeline's own speed counts.
CONFIG = QueueConfig(max_executing_samples=10**7, max_retained_groups=10**7, max_completed_groups=10**6,
                     worker_timeout_s=120.0, lease_timeout_s=120.0)


def open_queue(url: str, name: str) -> RolloutQueue:
    return RolloutQueue.from_url(url, name, CONFIG)


def cpu_seconds(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# -- 1. lifecycle in processes ---------------------------------------------------------------------


def worker_main(url: str, queue: str, index: int, payload: Payload, batch: int,
                ready: Any, start: Any, stop: Any, results: Any) -> None:
    """A worker process: reserve up to ``batch`` groups and complete each reserved batch with one
    complete_many (the asyncio client), until told to stop."""
    asyncio.run(_worker(url, queue, index, payload, batch, ready, start, stop, results))


async def _worker(url: str, queue: str, index: int, payload: Payload, batch: int,
                  ready: Any, start: Any, stop: Any, results: Any) -> None:
    q = await AsyncRolloutQueue.from_url(url, queue)
    w = q.worker(f"bench-w{index}-{os.getpid()}")
    samples = payload.samples(seed=index)
    ready.set()
    start.wait()  # nothing else runs on this loop yet: blocking here is fine
    cpu0, groups, reserves, empty = time.process_time(), 0, 0, 0
    while not stop.is_set():
        got = await w.reserve(max_groups=batch, block_ms=100)
        reserves += 1
        empty += not got
        outcomes = await w.complete_many([(r.receipt, samples) for r in got])
        refused = [o for o in outcomes if isinstance(o, Exception)]
        if refused:  # a refusal is returned in its item's place: surface it as complete would
            raise refused[0]
        groups += len(got)
    await w.close()
    results.put({"role": "worker", "groups": groups, "reserves": reserves, "empty_reserves": empty,
                 "cpu_s": time.process_time() - cpu0})
    await q.close()


def trainer_main(url: str, queue: str, payload: Payload, total: int, batch: int, window: int,
                 ready: Any, start: Any, stop: Any, results: Any) -> None:
    """The trainer (and producer): keep ``window`` groups in flight, lease ``batch`` at a time and
    commit, submitting one new group per committed one, until ``total`` are committed.
    ``window=0``: everything was submitted beforehand; only lease and commit.

    Before each commit it touches the data as a tensor-building trainer does (``_touch``): it reads
    every group's columns (``CompletedGroup.columns()``, what ``torch.frombuffer`` takes), copies
    the token ids and logprobs once, checks they cover the payload's tokens and sums the token
    counts. So a lazily decoded lease costs here what it costs a real trainer, no less; its Samples
    are never built, as a trainer that reads the columns never builds them."""
    q = RolloutQueue.from_url(url, queue)
    run = uuid.uuid4().hex[:8]
    groups = [payload.group(f"{run}-{i}") for i in range(total)]
    ready.set()
    start.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    submitted = committed = leases = tokens = 0
    while submitted < min(total, window):
        chunk = groups[submitted:min(total, window, submitted + batch)]
        q.submit(chunk)
        submitted += len(chunk)
    while committed < total and not stop.is_set():
        lease = q.lease(min(batch, total - committed), block_ms=1000)
        if lease is None:
            continue
        leases += 1
        tokens += _touch(lease.groups, payload)
        lease.commit()
        committed += len(lease)
        if window and submitted < total:
            chunk = groups[submitted:submitted + len(lease)]
            q.submit(chunk)
            submitted += len(chunk)
    results.put({"role": "trainer", "elapsed": time.perf_counter() - t0, "committed": committed,
                 "leases": leases, "cpu_s": time.process_time() - cpu0, "tokens": tokens})
    q.close()


def _touch(groups: Any, payload: Payload) -> int:
    """Read each group as a trainer building tensors does: its columns, with one copy of the token ids
    and the logprobs (what filling a tensor from ``torch.frombuffer`` costs). Returns the tokens read;
    RuntimeError if a group does not carry the payload's tokens (the bench must not time a decode
    that skipped them)."""
    tokens = 0
    for g in groups:
        cols = g.columns()
        ids, lps = cols.token_ids.tobytes(), cols.logprobs.tobytes()
        want = payload.total_tokens
        if sum(cols.counts) != want or len(ids) != 4 * want or len(lps) != (4 * want if payload.logprobs else 0):
            raise RuntimeError(f"group {g.entry_id} holds {len(ids) // 4} token ids, the payload has {want}")
        tokens += sum(cols.counts)
    return tokens


def run_lifecycle(url: str, payload: Payload, total: int, workers: int, reserve_batch: int = 8,
                  lease_batch: int = 32, window: int = 256) -> dict[str, float]:
    """One lifecycle run in processes; groups/s plus the commandstats delta of the run."""
    flush(url)
    name = f"bench-life-{uuid.uuid4().hex[:8]}"
    open_queue(url, name).close()
    r = redis.Redis.from_url(url)
    team = Team()
    team.add(trainer_main, url, name, payload, total, lease_batch, window)
    for i in range(workers):
        team.add(worker_main, url, name, i, payload, reserve_batch)
    try:
        before, cpu_before = commandstats(r), cpu_seconds(r)
        team.go()
        trainer = team.collect(1, timeout_s=600)[0]
        after, cpu_after = commandstats(r), cpu_seconds(r)
        team.stop.set()
        done = team.collect(workers, timeout_s=60)
    finally:
        team.close()
    committed, elapsed = trainer["committed"], trainer["elapsed"]
    if committed < total:
        raise RuntimeError(f"lifecycle committed {committed} of {total} groups")
    delta = commandstats_delta(before, after)
    client_cpu = trainer["cpu_s"] + sum(d["cpu_s"] for d in done)
    out = {
        "groups_per_s": committed / elapsed,
        "tokens_per_s": committed * payload.total_tokens / elapsed,
        "elapsed_s": elapsed,
        "groups": committed,
        # CPU time per group does not depend on what else the machine runs: the server's bounds
        # the rate one Redis core could reach (1e6 / redis_cpu_us_per_group).
        "redis_cpu_us_per_group": (cpu_after - cpu_before) * 1e6 / committed,
        "client_cpu_us_per_group": client_cpu * 1e6 / committed,
        "trainer_cpu_us_per_group": trainer["cpu_s"] * 1e6 / committed,
        "redis_cpu_frac": (cpu_after - cpu_before) / elapsed,
        "trainer_cpu_frac": trainer["cpu_s"] / elapsed,
        "worker_cpu_frac": sum(d["cpu_s"] for d in done) / elapsed / max(1, workers),
        "empty_reserves_per_group": sum(d["empty_reserves"] for d in done) / committed,
    }
    out.update(per_group_calls(delta, committed))
    r.close()
    return out


# -- 2. the raw Redis pipeline ---------------------------------------------------------------------


def run_raw(url: str, payload: Payload, total: int, batch: int = 32) -> dict[str, float]:
    """XADD + XREADGROUP + XACK of the same bytes (reservation fields + completion blob) with one
    redis-py pipeline per batch, no bookkeeping; the XACK of a batch rides in the next pipeline."""
    flush(url)
    r = redis.Redis.from_url(url)
    key = f"raw:{{{uuid.uuid4().hex[:8]}}}"
    r.xgroup_create(key, "g", id="0", mkstream=True)
    group = payload.group("raw-0")
    parents, body = encode_group(group)
    blob = encode_completion(payload.samples())
    fields = {"v": 1, "sid": group.source_id, "n": group.n, "p": parents, "g": body, "c": blob}
    before, cpu_before = commandstats(r), cpu_seconds(r)
    t0, cpu0, done, pending = time.perf_counter(), time.process_time(), 0, []
    while done < total:
        k = min(batch, total - done)
        pipe = r.pipeline(transaction=False)
        if pending:
            pipe.xack(key, "g", *pending)
        for _ in range(k):
            pipe.xadd(key, fields)
        pipe.xreadgroup("g", "c", {key: ">"}, count=k)
        replies = pipe.execute()
        pending = [entry_id for entry_id, _ in replies[-1][0][1]]
        done += len(pending)
    r.xack(key, "g", *pending)
    elapsed, client_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    redis_cpu = cpu_seconds(r) - cpu_before
    calls = sum(c for c, _ in commandstats_delta(before, commandstats(r)).values())
    r.delete(key)
    r.close()
    return {"raw_groups_per_s": total / elapsed, "raw_commands_per_group": calls / total,
            "raw_bytes_per_group": len(blob) + len(parents) + len(body),
            "raw_redis_cpu_us_per_group": redis_cpu * 1e6 / total,
            "raw_client_cpu_us_per_group": client_cpu * 1e6 / total}


# -- 4. calls per transition -----------------------------------------------------------------------


def run_transitions(url: str, payload: Payload, batch: int = 32, rounds: int = 3) -> dict[str, float]:
    """Commands and script server time per group for each transition, one process, ``batch`` groups
    per submit / reserve / lease / commit and one complete per group; ``complete_many``: a second
    cycle per round completes its ``batch`` groups in one complete_many (only that step counted)."""
    flush(url)
    name = f"bench-calls-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name)
    r = redis.Redis.from_url(url)
    w = q.worker("bench-calls")
    samples = payload.samples()
    sums: dict[str, float] = {}

    def step(label: str, fn: Any) -> Any:
        before = commandstats(r)
        value = fn()
        delta = commandstats_delta(before, commandstats(r))
        sums[f"{label}_commands_per_group"] = sums.get(f"{label}_commands_per_group", 0) + \
            sum(c for c, _ in delta.values()) / batch / rounds
        sums[f"{label}_script_usec_per_group"] = sums.get(f"{label}_script_usec_per_group", 0) + \
            delta.get("evalsha", (0, 0))[1] / batch / rounds
        return value

    for k in range(rounds + 1):  # round 0 loads the scripts (NOSCRIPT) and warms up: not counted
        if k == 1:
            sums.clear()
        step("submit", lambda: q.submit([payload.group(f"c{k}-{i}") for i in range(batch)]))
        got = step("reserve", lambda: w.reserve(batch))
        step("complete", lambda: [w.complete(x.receipt, samples) for x in got])
        lease = step("lease", lambda: q.lease(batch))
        step("commit", lambda: lease.commit())
        q.submit([payload.group(f"m{k}-{i}") for i in range(batch)])
        many = w.reserve(batch)
        step("complete_many", lambda: w.complete_many([(x.receipt, samples) for x in many]))
        q.lease(batch).commit()
    q.close()
    r.close()
    return sums


# -- 5. latency ------------------------------------------------------------------------------------


def latency_trainer_main(url: str, queue: str, count: int, ready: Any, start: Any, stop: Any,
                         results: Any) -> None:
    """Block in lease(1); report the time each lease returned, then commit it."""
    q = RolloutQueue.from_url(url, queue)
    ready.set()
    start.wait()
    got = 0
    while got < count and not stop.is_set():
        lease = q.lease(1, block_ms=2000)
        t = time.perf_counter()
        if lease is None:
            continue
        results.put({"t": t})
        lease.commit()
        got += 1
    q.close()


def run_latency(url: str, payload: Payload, count: int) -> dict[str, float]:
    """completion -> lease returned (trainer blocked in another process), and reserve(1) latency
    with work waiting; milliseconds."""
    flush(url)
    name = f"bench-lat-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name)
    w = q.worker("bench-lat")
    samples = payload.samples()
    q.submit([payload.group(f"l{i}") for i in range(2 * count)])
    reserve_ms = []
    held = []
    for _ in range(count):
        t = time.perf_counter()
        held += w.reserve(1)
        reserve_ms.append((time.perf_counter() - t) * 1000)
    team = Team()
    team.add(latency_trainer_main, url, name, count)
    lease_ms, complete_ms = [], []
    try:
        team.go()
        for res in held:
            time.sleep(0.005)  # let the trainer commit and block in lease again
            t0 = time.perf_counter()
            w.complete(res.receipt, samples)
            complete_ms.append((time.perf_counter() - t0) * 1000)
            lease_ms.append((team.collect(1, timeout_s=30)[0]["t"] - t0) * 1000)
    finally:
        team.close()
    q.close()
    return {
        "lease_p50_ms": percentile(lease_ms, 50), "lease_p99_ms": percentile(lease_ms, 99),
        "complete_p50_ms": percentile(complete_ms, 50), "complete_p99_ms": percentile(complete_ms, 99),
        "reserve_p50_ms": percentile(reserve_ms, 50), "reserve_p99_ms": percentile(reserve_ms, 99),
    }


# -- 6. bytes per token ----------------------------------------------------------------------------


def run_bytes(url: str, payload: Payload, groups: int) -> dict[str, float]:
    """MEMORY USAGE of the completions' payload keys (each an attempt's string) per token stored."""
    flush(url)
    name = f"bench-bytes-{uuid.uuid4().hex[:8]}"
    q = open_queue(url, name)
    r = redis.Redis.from_url(url)
    w = q.worker("bench-bytes")
    samples = payload.samples()
    q.submit([payload.group(f"b{i}") for i in range(groups)])
    used0 = int(r.info("memory")["used_memory"])
    held: list[Any] = []
    while len(held) < groups:  # one reserve grants at most 64 groups
        got = w.reserve(groups - len(held))
        if not got:
            raise RuntimeError(f"bytes: reserved {len(held)} of {groups} groups")
        held += got
    for res in held:
        w.complete(res.receipt, samples)
    used1 = int(r.info("memory")["used_memory"])
    keys = QueueKeys(name)
    payloads = [keys.payload(res.receipt.entry_id, res.receipt.attempt) for res in held]
    usage = sum(int(r.memory_usage(key, samples=0) or 0) for key in payloads)
    one = int(r.strlen(payloads[0]))
    tokens = groups * payload.total_tokens
    q.close()
    r.close()
    # The former what-if row (3-byte ids) is the codec now (schema 2, P6): the main row measures it.
    return {"bytes_per_token": usage / tokens, "payload_bytes_per_token": one / payload.total_tokens,
            "used_memory_per_token": (used1 - used0) / tokens}


__all__ = ["BIG", "run_bytes", "run_latency", "run_lifecycle", "run_raw", "run_transitions"]
