"""Scaling figure for issue 7: the lifecycle on one Redis node vs a 3-master Redis Cluster, and the
memory one group costs in each state.

    .venv/bin/python scripts/cluster_bench.py                 # docs/SCALING.md's figure (~2-3 minutes)
    .venv/bin/python scripts/cluster_bench.py --groups 2000   # quicker

Lifecycle: submit -> reserve -> complete -> lease -> commit with small payloads (n=4 samples of 16
tokens, a 200-byte prompt; one extra run with n=8 x 1024 tokens and logprobs) in W worker processes and one trainer process that is also the producer
(it keeps ``window`` groups in flight and submits one group per committed one), as the benchmarks
issue's lifecycle scenario does, run on:

  1. one node, a plain queue (P = 1: today's RolloutQueue);
  2. one node, a partitioned queue with P = 3 (what partitioning itself costs);
  3. a 3-master cluster, P = 1 (one queue: one slot, so one node does all the work);
  4. a 3-master cluster, P = 3, one partition per master (the queue name is chosen so).

Per run: committed groups/s (wall clock), the servers' CPU per group (INFO cpu, all nodes), and
each node's share. The CPU per group is what capacity planning needs: it does not depend on what
else runs on the machine, and ``1e6 / us_per_group`` is what one Redis core can sustain. The wall
clock rate on this 2-core machine is bounded by the clients, not Redis, so the cluster cannot show
linear scaling here; the per-node CPU shares show the load spreading instead.

Memory: MEMORY USAGE (SAMPLES 0, exact) of every key of a queue after N groups are submitted,
reserved, completed, leased and committed, per group; what stays after commit (the ``ids`` and
``ledger`` hashes and the ``commits`` stream) is listed key by key.

Servers are private (loopback, free ports, AOF ``appendfsync everysec`` as in production) and
thrown away afterwards. Prints a Markdown table and stores the figures as the ``cluster`` section
of ``benchmarks/results.json`` (``--results``; the rest of that file is left as it is), from which
``scripts/bench_tables.py`` renders docs/SCALING.md's tables; ``--out`` also writes them alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import RESULTS, store_section  # noqa: E402

from rollout_queue import PartitionedQueue, QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.devtools.local_cluster import LocalCluster
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.scale.layout import partition_names

CTX = mp.get_context("spawn")
#: No bound refuses work during a bench: only the pipeline's own speed counts.
CONFIG = QueueConfig(max_executing_samples=10**7, max_retained_groups=10**7, max_completed_groups=10**6,
                     worker_timeout_s=120.0, lease_timeout_s=120.0)
PROMPT = 200
SMALL = (4, 16, False)  # n samples, tokens per sample, logprobs
LARGE = (8, 1024, True)
REPEATS_MAX = 5
Spec = tuple[str, str, int]  # (url, queue name, partitions; 0: a plain RolloutQueue)
Shape = tuple[int, int, bool]


def open_queue(spec: Spec, config: QueueConfig | None = None) -> Any:
    url, name, partitions = spec
    if partitions == 0:
        return RolloutQueue.from_url(url, name, config)
    return PartitionedQueue.from_url(url, name, partitions, config)


def samples(shape: Shape) -> list[Sample]:
    n, tokens, logprobs = shape
    return [Sample(slot=i, token_ids=list(range(tokens)), logprobs=[-0.5] * tokens if logprobs else [],
                   reward=float(i % 2)) for i in range(n)]


# -- processes -------------------------------------------------------------------------------------


def worker_main(spec: Spec, shape: Shape, index: int, ready: Any, start: Any, stop: Any, results: Any) -> None:
    q = open_queue(spec)
    w = q.worker(f"bench-w{index}-{os.getpid()}")
    out = samples(shape)
    ready.set()
    start.wait()
    cpu0, groups = time.process_time(), 0
    while not stop.is_set():
        for r in w.reserve(max_groups=8, block_ms=100):
            w.complete(r.receipt, out)
            groups += 1
    w.close()
    results.put({"role": "worker", "groups": groups, "cpu_s": time.process_time() - cpu0})
    q.close()


def trainer_main(spec: Spec, shape: Shape, total: int, batch: int, window: int, ready: Any, start: Any, stop: Any,
                 results: Any) -> None:
    q = open_queue(spec)
    run = uuid.uuid4().hex[:8]
    groups = [SourceGroup(f"{run}-{i}", "p" * PROMPT, shape[0]) for i in range(total)]
    ready.set()
    start.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    q.submit(groups[:window])
    submitted, committed = window, 0
    while committed < total and not stop.is_set():
        lease = q.lease(min(batch, total - committed), block_ms=1000, partial=True)
        if lease is None:
            continue
        lease.commit()
        committed += len(lease.groups)
        if submitted < total:
            q.submit(groups[submitted:submitted + len(lease.groups)])
            submitted += len(lease.groups)
    results.put({"role": "trainer", "elapsed": time.perf_counter() - t0, "committed": committed,
                 "cpu_s": time.process_time() - cpu0})
    q.close()


def run_team(spec: Spec, shape: Shape, total: int, workers: int, batch: int = 32,
             window: int = 512) -> list[dict[str, Any]]:
    ready = [CTX.Event() for _ in range(workers + 1)]
    start, stop, results = CTX.Event(), CTX.Event(), CTX.Queue()
    procs = [CTX.Process(target=trainer_main,
                         args=(spec, shape, total, batch, window, ready[0], start, stop, results))]
    procs += [CTX.Process(target=worker_main, args=(spec, shape, i, ready[i + 1], start, stop, results))
              for i in range(workers)]
    for p in procs:
        p.start()
    try:
        for e in ready:
            if not e.wait(60):
                raise RuntimeError("a bench process did not start")
        start.set()
        out = [results.get(timeout=900)]  # the trainer finishes first: it counts the commits
        stop.set()
        out += [results.get(timeout=60) for _ in range(workers)]
        return out
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def server_cpu(ports: list[int]) -> list[float]:
    out = []
    for port in ports:
        r = redis.Redis(host="127.0.0.1", port=port)
        info = r.info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
        r.close()
    return out


def measure(label: str, make_spec: Callable[[], Spec], ports: list[int], total: int, workers: int,
            repeats: int, shape: Shape = SMALL) -> dict[str, Any]:
    """The median run (by groups/s) of ``repeats``, each on a fresh queue."""
    runs = sorted((measure_once(label, make_spec(), shape, ports, total, workers) for _ in range(repeats)),
                  key=lambda run: run["groups_per_s"])
    median = runs[len(runs) // 2]
    return {**median, "groups_per_s_runs": [run["groups_per_s"] for run in runs]}


def script_calls(ports: list[int]) -> int:
    """EVALSHA calls so far on all nodes (each is one transition or one sweep read)."""
    total = 0
    for port in ports:
        r = redis.Redis(host="127.0.0.1", port=port)
        total += int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
        r.close()
    return total


def measure_once(label: str, spec: Spec, shape: Shape, ports: list[int], total: int, workers: int
                 ) -> dict[str, Any]:
    open_queue(spec, CONFIG).close()
    before, calls_before = server_cpu(ports), script_calls(ports)
    done = run_team(spec, shape, total, workers)
    after, calls = server_cpu(ports), script_calls(ports) - calls_before
    trainer = done[0]
    committed, elapsed = trainer["committed"], trainer["elapsed"]
    cpu = [a - b for a, b in zip(after, before)]
    client_cpu = sum(d["cpu_s"] for d in done)
    return {"config": label, "groups": committed, "elapsed_s": round(elapsed, 2),
            "groups_per_s": round(committed / elapsed),
            "redis_cpu_us_per_group": round(sum(cpu) * 1e6 / committed, 1),
            "scripts_per_group": round(calls / committed, 2),
            "node_cpu_share": [round(c / sum(cpu), 2) for c in cpu],
            "client_cpu_us_per_group": round(client_cpu * 1e6 / committed),
            "one_core_groups_per_s": round(committed / max(cpu)) if max(cpu) else None}


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def spread_name(cluster: LocalCluster, partitions: int) -> str:
    """A queue name whose partitions sit on distinct masters (placement is by CRC16 of the tag)."""
    while True:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        nodes = {cluster.node_of(f"{{{n}}}") for n in partition_names(name, partitions)}
        if len(nodes) == min(partitions, len(cluster.nodes)):
            return name


# -- memory per group ------------------------------------------------------------------------------


def queue_memory(r: redis.Redis, names: tuple[str, ...]) -> dict[str, int]:
    """key suffix -> bytes (MEMORY USAGE ... SAMPLES 0), summed over the queue's partitions."""
    out: dict[str, int] = {}
    for name in names:
        prefix = f"rollout:{{{name}}}:"
        for key in r.scan_iter(match=prefix + "*", count=1000):
            suffix = key.decode()[len(prefix):]
            suffix = "lease:*" if suffix.startswith("lease:") else suffix
            out[suffix] = out.get(suffix, 0) + int(r.memory_usage(key, samples=0) or 0)
    return out


def memory_per_state(url: str, count: int) -> dict[str, Any]:
    name = f"mem-{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(url)
    q = RolloutQueue.from_url(url, name, CONFIG)
    base = sum(queue_memory(r, (name,)).values())
    steps: dict[str, Any] = {}

    def record(state: str) -> None:
        steps[state] = round((sum(queue_memory(r, (name,)).values()) - base) / count)

    q.submit([SourceGroup(f"source-{i:08d}", "p" * PROMPT, SMALL[0]) for i in range(count)])
    record("backlog")
    w = q.worker("mem-worker")
    got = []
    while len(got) < count:
        got += w.reserve(max_groups=256)
    record("executing")
    out = samples(SMALL)
    for res in got:
        w.complete(res.receipt, out)
    record("completed")
    leases = []
    while (lease := q.lease(256, partial=True)) is not None:
        leases.append(lease)
    record("leased")
    for lease in leases:
        lease.commit()
    record("committed")
    after = queue_memory(r, (name,))
    steps["after_commit_by_key"] = {k: round(v / count) for k, v in sorted(after.items()) if v / count >= 1}
    big = samples(LARGE)
    q.submit([SourceGroup("big", "p" * PROMPT, LARGE[0])])
    res = w.reserve(max_groups=1)[0]
    w.complete(res.receipt, big)
    payload = q.keys.payload(res.receipt.entry_id, res.receipt.attempt)
    steps["completion_8x1024_tokens_with_logprobs"] = int(r.memory_usage(payload, samples=0) or 0)
    q.close()
    r.close()
    return {"groups": count, "bytes_per_group": steps}


# -- main ------------------------------------------------------------------------------------------


def with_servers(kind: str, fn: Callable[[LocalServer, LocalCluster], Any]) -> Any:
    single = LocalServer(kind, appendfsync="everysec").start()
    try:
        with LocalCluster(kind, masters=3, appendfsync="everysec") as cluster:
            return fn(single, cluster)
    finally:
        single.cleanup(graceful=False)


def store(path: Path, result: dict[str, Any]) -> None:
    """Replace the ``cluster`` section of the results file, keeping every other section."""
    store_section(path, "cluster", result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=8000, help="groups committed per run")
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--repeats", type=int, default=3, choices=range(1, REPEATS_MAX + 1))
    parser.add_argument("--memory-groups", type=int, default=20000)
    parser.add_argument("--kind", default="redis", choices=("redis", "valkey"))
    parser.add_argument("--out", default=None, help="also write the figures alone to this JSON file")
    parser.add_argument("--results", default=str(RESULTS),
                        help="the results file whose `cluster` section this run replaces (default "
                             "benchmarks/results.json; '' to leave it alone)")
    args = parser.parse_args(argv)

    def bench(single: LocalServer, cluster: LocalCluster) -> dict[str, Any]:
        ports = [n.port for n in cluster.nodes]
        rest = (args.groups, args.workers, args.repeats)
        info = redis.Redis.from_url(single.url)
        version = info.info("server").get("redis_version")
        info.close()
        loadavg_start = os.getloadavg()
        runs = [
            measure("1 node, P=1 (plain queue)", lambda: (single.url, fresh("b1"), 0), [single.port], *rest),
            measure("1 node, P=3", lambda: (single.url, fresh("b3"), 3), [single.port], *rest),
            measure("3-node cluster, P=1", lambda: (cluster.url, fresh("c1"), 0), ports, *rest),
            measure("3-node cluster, P=3", lambda: (cluster.url, spread_name(cluster, 3), 3), ports, *rest),
            measure("1 node, P=1, large payload", lambda: (single.url, fresh("b1l"), 0), [single.port],
                    max(200, args.groups // 8), args.workers, args.repeats, LARGE),
        ]
        memory = memory_per_state(single.url, args.memory_groups)
        return {"machine": {"cpus": os.cpu_count(), "kind": args.kind, "version": version,
                            "appendfsync": "everysec", "loadavg_start": loadavg_start,
                            "loadavg_end": os.getloadavg(), "workers": args.workers,
                            "groups_per_run": args.groups, "repeats": args.repeats,
                            "payload": f"n={SMALL[0]} x {SMALL[1]} tokens, prompt {PROMPT} B; large: "
                                       f"n={LARGE[0]} x {LARGE[1]} tokens with logprobs"},
                "runs": runs, "memory": memory}

    result = with_servers(args.kind, bench)
    result["command"] = "python scripts/cluster_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result["command"] = result["command"].strip()
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    if args.results:
        store(Path(args.results), result)
    print("| config | groups/s (runs) | Redis CPU µs/group | scripts/group | node CPU share | "
          "groups/s at one busy core |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for run in result["runs"]:
        print(f"| {run['config']} | {run['groups_per_s']} {run['groups_per_s_runs']} | "
              f"{run['redis_cpu_us_per_group']} | {run['scripts_per_group']} | {run['node_cpu_share']} | "
              f"{run['one_core_groups_per_s']} |")
    print(json.dumps(result["memory"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
