"""rollout-queue benchmarks: the queue against its peers and against Redis itself, in one run.

One command. It starts its own private Redis (LocalServer, loopback, a free port) with
``appendfsync everysec`` for every scenario (throughput runs measure the queue, not the disk's
fsync; automatic AOF rewrites are off and the AOF is compacted between runs, outside timings), runs
each chosen scenario ``--repeats`` times (the repeats are interleaved: repeat 1 of every scenario,
then repeat 2, ...), prints one table (median and min-max of the repeats, each figure beside the
team's target with met/missed) and writes the JSON.

    python scripts/bench.py                       # the full run (~5-10 minutes on 2 cores)
    python scripts/bench.py --quick               # small sizes, ~1 minute
    python scripts/bench.py --scenarios calls,bytes --json out.json

Scenarios (issue 9): lifecycle, raw, peers, calls, latency, bytes, reaper, scheduler; and depth
(issue 17: every transition's server time as the backlog, buffer, fleet and leases grow). Absolute
numbers depend on the machine and on whatever else runs on it; ratios measured in the same run
(lifecycle / raw, ours / peers) are what to compare across machines. Targets are goals, not
assertions: the exit code is non-zero only when a scenario fails to run.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

import redis

# `python scripts/bench.py` puts scripts/ first on sys.path, so the bench_* modules beside this
# file import as top-level modules (and spawned children inherit that path).
from bench_common import BIG, store_sections, summarise
from bench_depth import QUICK_DEPTH, DepthSizes, run_depth
from bench_lifecycle import run_bytes, run_latency, run_lifecycle, run_raw, run_transitions
from bench_peers import PEERS, peer_version, run_peers
from bench_reaper import run_reaper
from bench_scheduler import EngineModel, run_scheduler
from rollout_queue.devtools.local_server import LocalServer

SCENARIOS = ("lifecycle", "raw", "peers", "calls", "latency", "bytes", "reaper", "scheduler", "depth")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    repeats: int = 3
    lifecycle_groups: int = 3000
    workers: int = 2
    raw_groups: int = 10000
    peer_jobs: int = 4000
    calls_groups: int = 1000  # the lifecycle run behind `calls` when `lifecycle` is not chosen
    latency_samples: int = 300
    bytes_groups: int = 256
    reaper_entries: int = 100_000
    reaper_workers: int = 100
    scheduler_groups: int = 256
    engine: EngineModel = EngineModel(slots=256, token_s=0.0005)
    depth: DepthSizes = DepthSizes()


QUICK = Sizes(repeats=2, lifecycle_groups=300, raw_groups=1000, peer_jobs=400, calls_groups=200,
              latency_samples=40, bytes_groups=32, reaper_entries=5000, reaper_workers=10, scheduler_groups=32,
              engine=EngineModel(slots=64, token_s=0.0002), depth=QUICK_DEPTH)

# (metric, label, unit, op, target); op None: context only. Judged on the median of the repeats.
TARGETS: list[tuple[str, str, str, str | None, float | None]] = [
    ("groups_per_s", "1 lifecycle, 8x512 tokens + logprobs", "groups/s", None, None),
    ("raw_groups_per_s", "2 raw pipeline XADD+XREADGROUP+XACK, same bytes", "groups/s", None, None),
    ("lifecycle_vs_raw", "2 lifecycle / raw pipeline", "ratio", ">=", 0.30),
    ("redis_cpu_us_per_group", "2 Redis CPU per group, lifecycle", "us", None, None),
    ("raw_redis_cpu_us_per_group", "2 Redis CPU per group, raw pipeline", "us", None, None),
    ("lifecycle_vs_raw_redis_cpu", "2 lifecycle / raw in Redis CPU (load-free)", "ratio", None, None),
    ("client_cpu_us_per_group", "2 client CPU per group, lifecycle (all procs)", "us", None, None),
    ("raw_client_cpu_us_per_group", "2 client CPU per group, raw pipeline", "us", None, None),
    ("ours_tiny_per_s", "3 ours, ~200 B (1 worker + 1 trainer proc)", "items/s", None, None),
    ("bullmq_per_s", "3 bullmq Worker, concurrency 10", "jobs/s", None, None),
    ("rq_per_s", "3 RQ SimpleWorker", "jobs/s", None, None),
    ("arq_per_s", "3 arq worker, max_jobs 10", "jobs/s", None, None),
    ("ours_tiny_worker_cpu_us", "3 ours: worker process CPU per item", "us", None, None),
    ("ours_tiny_redis_cpu_us", "3 ours: Redis CPU per item", "us", None, None),
    ("ours_vs_bullmq", "3 ours / bullmq", "ratio", ">=", 5.0),
    ("ours_vs_rq", "3 ours / RQ", "ratio", ">=", 20.0),
    ("ours_vs_arq", "3 ours / arq", "ratio", None, None),
    ("bullmq_redis_cpu_us", "3 bullmq: Redis CPU per job", "us", None, None),
    ("rq_redis_cpu_us", "3 RQ: Redis CPU per job", "us", None, None),
    ("arq_redis_cpu_us", "3 arq: Redis CPU per job", "us", None, None),
    ("ours_vs_bullmq_redis_cpu", "3 ours / bullmq in Redis CPU (load-free)", "ratio", None, None),
    ("ours_vs_rq_redis_cpu", "3 ours / RQ in Redis CPU (load-free)", "ratio", None, None),
    ("bullmq_worker_cpu_us", "3 bullmq: worker process CPU per job", "us", None, None),
    ("rq_worker_cpu_us", "3 RQ: worker process CPU per job", "us", None, None),
    ("round_trips_per_group", "4 client round trips per group", "calls", "<=", 1.5),
    ("commands_per_group", "4 Redis commands per group (in scripts too)", "cmds", "<=", 12.0),
    ("evalsha_per_group", "4 EVALSHA per group", "calls", None, None),
    ("submit_commands_per_group", "4   submit (batch 32)", "cmds", None, None),
    ("reserve_commands_per_group", "4   reserve (batch 32)", "cmds", None, None),
    ("complete_commands_per_group", "4   complete", "cmds", None, None),
    ("complete_many_commands_per_group", "4   complete_many (batch 32)", "cmds", None, None),
    ("lease_commands_per_group", "4   lease (batch 32)", "cmds", None, None),
    ("commit_commands_per_group", "4   commit (batch 32)", "cmds", None, None),
    ("lease_p50_ms", "5 completion -> blocked lease, p50", "ms", None, None),
    ("lease_p99_ms", "5 completion -> blocked lease, p99", "ms", "<=", 5.0),
    ("complete_p50_ms", "5 complete call (8x512), p50", "ms", None, None),
    ("reserve_p50_ms", "5 reserve(1) with work waiting, p50", "ms", None, None),
    ("reserve_p99_ms", "5 reserve(1) with work waiting, p99", "ms", None, None),
    ("bytes_per_token", "6 stored payloads' MEMORY USAGE per token", "B/token", "<=", 9.0),
    ("payload_bytes_per_token", "6 completion blob per token (encoded)", "B/token", None, None),
    ("reap_longest_ms", "7 reaper: longest script call", "ms", "<=", 5.0),
    ("reap_p99_ms", "7 reaper: p99 script call", "ms", None, None),
    ("reap_median_ms", "7 reaper: median script call", "ms", None, None),
    ("reap_cpu_ms_per_call", "7 reaper: server CPU per script call (mean)", "ms", None, None),
    ("reap_cpu_us_per_entry", "7 reaper: server CPU per entry reaped", "us", None, None),
    ("reaper_reserve_longest_ms", "7 reserve reaping opportunistically", "ms", None, None),
    ("group_util", "8 engine slot utilisation, group policy", "busy/ideal", None, None),
    ("sample_nowait_util", "8 engine slot utilisation, sample, max_waiting 0", "busy/ideal", None, None),
    ("sample_util", "8 engine slot utilisation, sample policy", "busy/ideal", ">=", 0.97),
    ("sim_group_util", "8 simulated best, group policy", "busy/ideal", None, None),
    ("sim_sample_nowait_util", "8 simulated best, sample, max_waiting 0", "busy/ideal", None, None),
    ("sim_sample_util", "8 simulated best, sample policy", "busy/ideal", None, None),
    ("sim32_sample_nowait_util", "8 simulated, 32 slots, sample, max_waiting 0", "busy/ideal", None, None),
    ("sim32_sample_util", "8 simulated, 32 slots, sample policy", "busy/ideal", None, None),
    ("depth_worst_ratio", "9 depth: worst largest/smallest, any transition", "ratio", "<=", 2.0),
    ("depth_backlog_worst_ratio", "9   backlog (groups waiting)", "ratio", None, None),
    ("depth_buffer_worst_ratio", "9   buffer (completed groups)", "ratio", None, None),
    ("depth_workers_worst_ratio", "9   workers (consumers with work)", "ratio", None, None),
    ("depth_leases_worst_ratio", "9   active leases", "ratio", None, None),
    ("depth_sweep_max_us", "9 depth: reaper PEL sweeps, largest median call", "us", "<=", 1000.0),
    ("depth_longest_script_ms", "9 depth: longest script call, any size", "ms", "<=", 5.0),
    ("depth_snapshot_longest_command_ms", "9 depth: stats snapshot, longest command", "ms", "<=", 2.0),
]


def scenario_runners(url: str, sizes: Sizes) -> dict[str, Callable[[dict[str, float]], dict[str, float]]]:
    """Each runner gets the figures of this repeat so far (for ratios) and returns its own."""

    def lifecycle(_: dict[str, float]) -> dict[str, float]:
        return run_lifecycle(url, BIG, sizes.lifecycle_groups, sizes.workers)

    def raw(so_far: dict[str, float]) -> dict[str, float]:
        out = run_raw(url, BIG, sizes.raw_groups)
        if "groups_per_s" in so_far:
            out["lifecycle_vs_raw"] = so_far["groups_per_s"] / out["raw_groups_per_s"]
            # The same comparison in server CPU per group: what one Redis core could carry.
            out["lifecycle_vs_raw_redis_cpu"] = out["raw_redis_cpu_us_per_group"] / so_far["redis_cpu_us_per_group"]
        return out

    def calls(so_far: dict[str, float]) -> dict[str, float]:
        keys = ("evalsha_per_group", "round_trips_per_group", "commands_per_group",
                "commands_in_scripts_per_group", "script_usec_per_group")
        base = so_far if "round_trips_per_group" in so_far else run_lifecycle(url, BIG, sizes.calls_groups, sizes.workers)
        return {**{k: base[k] for k in keys}, **run_transitions(url, BIG)}

    return {
        "lifecycle": lifecycle,
        "raw": raw,
        "peers": lambda _: run_peers(url, sizes.peer_jobs),
        "calls": calls,
        "latency": lambda _: run_latency(url, BIG, sizes.latency_samples),
        "bytes": lambda _: run_bytes(url, BIG, sizes.bytes_groups),
        "reaper": lambda _: run_reaper(url, sizes.reaper_entries, sizes.reaper_workers),
        "scheduler": lambda _: run_scheduler(url, sizes.engine, sizes.scheduler_groups),
        "depth": lambda _: run_depth(url, sizes.depth),
    }


def run_all(url: str, chosen: list[str], sizes: Sizes, log: Callable[[str], None]) -> tuple[dict[str, Any], dict[str, str]]:
    runners = scenario_runners(url, sizes)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
    errors: dict[str, str] = {}
    for rep in range(sizes.repeats):
        so_far: dict[str, float] = {}
        for name in chosen:
            if name in errors:
                continue
            t = time.perf_counter()
            figures = None
            for attempt in (1, 2):  # one retry: a child that lost a race (e.g. scripts edited mid-run)
                try:
                    figures = runners[name](so_far)
                    break
                except Exception as exc:  # reported in the table and the JSON; the exit code says so
                    message = f"{type(exc).__name__}: {exc}"
                    log(f"[repeat {rep + 1}] {name}: attempt {attempt} failed: {message}")
                    traceback.print_exc(file=sys.stderr)
                    if attempt == 2:
                        errors[name] = message
            if figures is None:
                continue
            so_far.update(figures)
            runs[name].append(figures)
            log(f"[repeat {rep + 1}/{sizes.repeats}] {name} done in {time.perf_counter() - t:.1f}s")
    return {name: {"runs": r, "summary": summarise(r)} for name, r in runs.items()}, errors


def judge(scenarios: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target metric that some scenario reported."""
    merged = {k: v for s in scenarios.values() for k, v in s["summary"].items()}
    rows = []
    for key, label, unit, op, target in TARGETS:
        if key not in merged:
            continue
        m = merged[key]
        met = None if op is None else (m["median"] >= target if op == ">=" else m["median"] <= target)
        rows.append({"metric": key, "label": label, "unit": unit, "op": op, "target": target,
                     "median": m["median"], "min": m["min"], "max": m["max"], "met": met})
    return rows


def fmt(x: float) -> str:
    if x != x:  # NaN
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = f"| {'figure':48} | {'median':>9} | {'min - max':>19} | {'unit':10} | {'target':>8} | {'':6} |"
    lines = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        target = "" if r["op"] is None else f"{r['op']} {fmt(r['target'])}"
        verdict = "" if r["met"] is None else ("met" if r["met"] else "MISSED")
        span = f"{fmt(r['min'])} - {fmt(r['max'])}"
        lines.append(f"| {r['label']:48} | {fmt(r['median']):>9} | {span:>19} | {r['unit']:10} | {target:>8} | {verdict:6} |")
    return "\n".join(lines)


def environment(server: LocalServer) -> dict[str, Any]:
    r = redis.Redis.from_url(server.url)
    info = r.info("server")
    r.close()
    try:
        import hiredis
        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = None
    return {
        "server": {"kind": server.kind, "version": info.get("redis_version"), "appendfsync": "everysec",
                   "auto_aof_rewrite": "off (compacted between runs)"},
        "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "python": platform.python_version(),
        "redis_py": redis.__version__, "hiredis": hiredis_version,
        "peers": {p: peer_version(p) or False for p in PEERS},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 repeats (~1 minute)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all)")
    ap.add_argument("--repeats", type=int, default=None, help="override the number of repeats")
    ap.add_argument("--kind", default="redis", choices=("redis", "valkey"), help="server binary (default redis)")
    ap.add_argument("--json", default=None,
                    help="where to write the figures (default benchmarks/results[-quick].json)")
    args = ap.parse_args(argv)
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown or not chosen:
        ap.error(f"unknown scenarios {sorted(unknown)}; choose from {','.join(SCENARIOS)}")
    args.chosen = [s for s in SCENARIOS if s in chosen]  # lifecycle before raw and calls: ratios
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    if args.repeats:
        sizes = replace(sizes, repeats=args.repeats)
    out_path = Path(args.json) if args.json else ROOT / "benchmarks" / ("results-quick.json" if args.quick else "results.json")
    command = "python scripts/bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with LocalServer(args.kind, appendfsync="everysec", extra_config=[("auto-aof-rewrite-percentage", "0")]) as server:
        env = environment(server)
        print(f"bench: {server.kind} {env['server']['version']} on {server.url} (appendfsync everysec), "
              f"{env['cpus']} cpus, load {env['loadavg_start'][0]:.1f}; scenarios {','.join(args.chosen)}; "
              f"{sizes.repeats} repeats", flush=True)
        t0 = time.perf_counter()
        scenarios, errors = run_all(server.url, args.chosen, sizes, lambda line: print(line, flush=True))
        env["loadavg_end"] = os.getloadavg()
        env["wall_s"] = time.perf_counter() - t0
    rows = judge(scenarios)
    print()
    print(table(rows))
    for name, message in errors.items():
        print(f"scenario {name} failed: {message}")
    report = {"command": command.strip(), "quick": args.quick, "sizes": asdict(sizes), "environment": env,
              "scenarios": scenarios, "targets": rows, "errors": errors}
    store_sections(out_path, report)  # the other benchmarks own their sections (cluster, engine, ...)
    print(f"\nwrote {out_path} ({env['wall_s']:.0f}s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
