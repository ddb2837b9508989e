"""Flat cost at any depth (issue 17 item 2): the server time of every transition as the queue grows.

Four dimensions, each on a fresh queue grown in place from its smallest size to its largest:

- ``backlog``: groups waiting in the stream (1k -> 1M),
- ``buffer``: completed groups waiting for a trainer (100 -> 100k),
- ``workers``: registered workers, each holding one executing group, so each a consumer of the
  group with a pending entry (10 -> 1,000),
- ``leases``: active leases of one group each, each a ``@lease:<id>`` consumer (1 -> 1,000).

At each size a probe runs ``rounds`` full cycles on top of that state (submit 1, reserve 1,
complete 1, lease 1, commit, stats, one reaper pass), so the state keeps its size while it is
measured, and ``rollout-queue stats``'s snapshot (the views) runs a few times. Every call's
server-side duration comes from SLOWLOG (threshold 0): the time Redis spent inside that one call,
on its one thread. Per script: the median (its cost per call) and the longest call. For the
snapshot, made of plain read commands in bounded pages, the longest single command.

The figures to judge are ratios measured in the same run: largest size / smallest size, per
transition and dimension (the target: within 2x, i.e. flat). SLOWLOG durations are wall time inside
the call, so the longest call also catches a descheduled server thread on a busy machine; the
medians are the structural figure.

    python scripts/bench_depth.py                  # the full sizes (~1 min on 2 cores)
    python scripts/bench_depth.py --quick          # small sizes (~10 s)
    python scripts/bench_depth.py --dimensions workers,leases --json out.json

scripts/bench.py runs ``run_depth`` as its scenario 9. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import orjson
import redis

from rollout_queue import QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.core.scripts import SCRIPTS
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.ops import partition_views

DIMENSIONS = ("backlog", "buffer", "workers", "leases")
#: The transitions a probe cycle runs, in the order the table lists them.
TRANSITIONS = ("submit", "reserve", "complete", "lease", "commit", "stats", "reap_scan")
#: The reaper's bounded sweeps over the PEL (a batch from a cursor per pass).
SWEEPS = ("sweep_owners", "reindex")
OPS = TRANSITIONS + SWEEPS
SAMPLE = (Sample(0, (1, 2, 3), (-0.1, -0.2, -0.3), 1.0, 0),)
LONG_S = 3600.0
#: Unmeasured probe cycles first: the first calls on a new queue or after a big delete (the
#: allocator returning the freed memory) are not what a queue at that size costs.
WARMUP = 5  # nothing goes silent or expires while it is measured


@dataclass(frozen=True)
class DepthSizes:
    backlog: tuple[int, ...] = (1_000, 31_623, 1_000_000)
    buffer: tuple[int, ...] = (100, 3_162, 100_000)
    workers: tuple[int, ...] = (10, 100, 1_000)
    leases: tuple[int, ...] = (1, 32, 1_000)
    rounds: int = 100
    snapshots: int = 5


QUICK_DEPTH = DepthSizes(backlog=(1_000, 30_000), buffer=(100, 5_000), workers=(10, 200), leases=(1, 200),
                         rounds=40, snapshots=3)


def _config() -> QueueConfig:
    return QueueConfig(max_executing_samples=10**9, max_retained_groups=10**7, max_completed_groups=10**6,
                       worker_timeout_s=LONG_S, lease_timeout_s=LONG_S)


class Grower:
    """Brings one dimension of a queue to a size; every group goes through the public API."""

    def __init__(self, q: RolloutQueue, run: str) -> None:
        self.q, self.run, self.submitted = q, run, 0
        self.filler = q.worker(f"filler-{run}")
        self.workers: list[object] = []
        self.leases: list[object] = []

    def submit(self, count: int) -> None:
        for start in range(0, count, 5000):
            todo = min(5000, count - start)
            self.q.submit([SourceGroup(f"{self.run}-{self.submitted + i}", "p", 1) for i in range(todo)])
            self.submitted += todo

    def complete(self, count: int) -> None:
        """``count`` more groups through reserve and complete_many, into the buffer."""
        self.submit(count)
        done = 0
        while done < count:
            got = self.filler.reserve(max_groups=min(64, count - done))
            self.filler.complete_many([(r.receipt, SAMPLE) for r in got])
            done += len(got)
        self.filler.heartbeat()

    def grow(self, dimension: str, size: int) -> None:
        if dimension == "backlog":
            self.submit(size - self.submitted)
        elif dimension == "buffer":
            self.complete(size - self.submitted)
        elif dimension == "workers":
            self.submit(size - len(self.workers))
            while len(self.workers) < size:
                w = self.q.worker(f"w{len(self.workers):05d}-{self.run}")
                assert len(w.reserve(1)) == 1
                self.workers.append(w)
        elif dimension == "leases":
            self.complete(size - len(self.leases))
            while len(self.leases) < size:
                lease = self.q.lease(1, timeout_s=LONG_S)
                assert lease is not None
                self.leases.append(lease)
        else:
            raise ValueError(f"unknown dimension {dimension!r}: one of {', '.join(DIMENSIONS)}")


def _calls(r: redis.Redis, names: dict[str, str]) -> list[tuple[str, float]]:
    """(script or command, µs) of every call in the slowlog since the last reset, bench reads left out."""
    out = []
    for e in r.slowlog_get(10**6):
        cmd = e["command"]
        cmd = cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)
        words = cmd.split()
        if not words:
            continue
        verb = words[0].lower()
        if verb in ("evalsha", "evalsha_ro") and len(words) > 1:
            out.append((names.get(words[1][:12], words[1][:12]), float(e["duration"])))
        elif verb not in ("slowlog", "info", "config", "ping", "client", "hello", "script"):
            out.append((verb, float(e["duration"])))
    return out


def probe(q: RolloutQueue, r: redis.Redis, rounds: int, snapshots: int, run: str) -> dict[str, tuple[float, float]]:
    """op -> (median µs, longest µs) over ``rounds`` probe cycles; 'snapshot' -> its longest command."""
    names = {s.sha[:12]: s.name for s in SCRIPTS.values()}
    worker = q.worker(f"probe-{run}")
    for i in range(-WARMUP, rounds):
        if i == 0:
            r.slowlog_reset()
        q.submit([SourceGroup(f"{run}-probe-{i}", "p", 1)])
        [res] = worker.reserve(1)
        worker.complete(res.receipt, SAMPLE)
        lease = q.lease(1, timeout_s=LONG_S)
        assert lease is not None
        lease.commit()
        q.stats()
        q.reap()
    by_op: dict[str, list[float]] = {}
    for name, us in _calls(r, names):
        by_op.setdefault(name, []).append(us)
    out = {op: (statistics.median(v), max(v)) for op, v in by_op.items() if op in OPS}
    r.slowlog_reset()
    t = time.perf_counter()
    for _ in range(snapshots):
        q.run(partition_views.snapshot(q.layout))
    wall = (time.perf_counter() - t) / snapshots
    # SLOWLOG lists the commands a script calls too: the longest plain command is a view's own read.
    plain = [(name, us) for name, us in _calls(r, names) if name not in names.values()]
    longest = max(plain, key=lambda x: x[1]) if plain else ("", 0.0)
    out["snapshot"] = (wall * 1e6, longest[1])  # (client wall µs of one snapshot, longest command µs)
    return out


def settle_lazy_free(r: redis.Redis, timeout_s: float = 120.0) -> None:
    """Wait until Redis's background thread has freed what UNLINK handed it. Freeing the largest
    sizes of a dimension (a million-entry stream and its sets) takes that thread seconds; on two cores
    it competes with the main thread, and every script of the next dimension's smallest size showed
    10-18 ms spikes that were that thread's work, not the script's."""
    deadline = time.monotonic() + timeout_s
    while r.info("memory").get("lazyfree_pending_objects", 0) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a background free, bounded by the deadline
    time.sleep(0.5)  # and the pages it returned


def run_depth(url: str, sizes: DepthSizes = DepthSizes(), dimensions: tuple[str, ...] = DIMENSIONS,
              log: Callable[[str], None] = lambda line: None) -> dict[str, float]:
    """Figures ``depth_<dimension>_<op>_{us,longest_us}_<size>`` and, per op, the ratio largest /
    smallest (``depth_<dimension>_<op>_ratio``, medians; ``..._longest_ratio``), on the server at ``url``."""
    r = redis.Redis.from_url(url)
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 1_000_000)
    figures: dict[str, float] = {}
    try:
        for dim in dimensions:
            run = uuid.uuid4().hex[:6]
            name = f"bench-depth-{dim}-{run}"
            q = RolloutQueue.from_url(url, name, _config())
            grower = Grower(q, run)
            results: dict[int, dict[str, tuple[float, float]]] = {}
            for size in getattr(sizes, dim):
                t = time.perf_counter()
                grower.grow(dim, size)
                grew = time.perf_counter() - t
                results[size] = got = probe(q, r, sizes.rounds, sizes.snapshots, f"{run}-{size}")
                log(f"{dim:8} {size:>9,}  (grown in {grew:5.1f}s)  " + "  ".join(
                    f"{op}={got[op][0]:.0f}/{got[op][1]:.0f}" for op in OPS + ("snapshot",) if op in got) + " µs")
                for op, (med, longest) in got.items():
                    figures[f"depth_{dim}_{op}_us_{size}"] = med
                    figures[f"depth_{dim}_{op}_longest_us_{size}"] = longest
            small, large = min(results), max(results)
            for op in OPS + ("snapshot",):
                if op in results[small] and op in results[large]:
                    a, b = results[small][op], results[large][op]
                    figures[f"depth_{dim}_{op}_ratio"] = b[0] / max(a[0], 1.0)
                    figures[f"depth_{dim}_{op}_longest_ratio"] = b[1] / max(a[1], 1.0)
            figures[f"depth_{dim}_small"], figures[f"depth_{dim}_large"] = small, large
            q.close()
            keys = list(r.scan_iter(match=f"rollout:{{{name}}}:*", count=1000))
            for i in range(0, len(keys), 500):
                r.unlink(*keys[i:i + 500])
            settle_lazy_free(r)
        figures.update(summary(figures, dimensions))
    finally:
        r.config_set("slowlog-log-slower-than", 10_000)
        r.slowlog_reset()
        r.close()
    return figures


def summary(figures: dict[str, float], dimensions: tuple[str, ...]) -> dict[str, float]:
    """The figures bench.py judges: per dimension and overall, the worst largest/smallest ratio of a
    transition's median; the sweeps' largest median (bounded, not flat: they read up to a batch, so
    they cost more until the PEL fills one); the longest script call and snapshot command seen."""
    out: dict[str, float] = {}
    nan = float("nan")
    worst = []
    for dim in dimensions:
        ratios = [figures[f"depth_{dim}_{op}_ratio"] for op in TRANSITIONS if f"depth_{dim}_{op}_ratio" in figures]
        if ratios:
            out[f"depth_{dim}_worst_ratio"] = max(ratios)
            worst.append(max(ratios))
    out["depth_worst_ratio"] = max(worst) if worst else nan
    sweeps = [v for k, v in figures.items() if any(k.startswith(f"depth_{d}_{op}_us_") for d in dimensions
                                                   for op in SWEEPS)]
    out["depth_sweep_max_us"] = max(sweeps) if sweeps else nan
    longest = [v for k, v in figures.items() if "_longest_us_" in k and "_snapshot_" not in k]
    out["depth_longest_script_ms"] = max(longest) / 1000 if longest else nan
    snap = [v for k, v in figures.items() if "_snapshot_longest_us_" in k]
    out["depth_snapshot_longest_command_ms"] = max(snap) / 1000 if snap else nan
    return out


def table(figures: dict[str, float], dimensions: tuple[str, ...] = DIMENSIONS) -> str:
    """Median µs per call at the smallest and largest size of each dimension, and their ratio."""
    lines = ["| dimension | sizes | " + " | ".join(OPS) + " | snapshot longest cmd |",
             "| --- | --- | " + " | ".join("---:" for _ in OPS) + " | ---: |"]
    for dim in dimensions:
        if f"depth_{dim}_small" not in figures:
            continue
        small, large = int(figures[f"depth_{dim}_small"]), int(figures[f"depth_{dim}_large"])
        cells = []
        for op in OPS:
            a, b = figures.get(f"depth_{dim}_{op}_us_{small}"), figures.get(f"depth_{dim}_{op}_us_{large}")
            cells.append("n/a" if a is None or b is None else f"{a:.0f} -> {b:.0f} ({b / max(a, 1.0):.2f}x)")
        a = figures.get(f"depth_{dim}_snapshot_longest_us_{small}", 0.0)
        b = figures.get(f"depth_{dim}_snapshot_longest_us_{large}", 0.0)
        lines.append(f"| {dim} | {small:,} -> {large:,} | " + " | ".join(cells) + f" | {a:.0f} -> {b:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--dimensions", default=",".join(DIMENSIONS))
    ap.add_argument("--kind", default="redis", help="redis (the default, as scripts/bench.py) or valkey")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    args = ap.parse_args(argv)
    dims = tuple(d for d in args.dimensions.split(",") if d)
    for d in dims:
        if d not in DIMENSIONS:
            print(f"unknown dimension {d!r}: one of {', '.join(DIMENSIONS)}", file=sys.stderr)
            return 2
    sizes = QUICK_DEPTH if args.quick else DepthSizes()
    with LocalServer(args.kind, appendfsync="everysec") as server:
        print(f"server: {server.kind}; median/longest µs of one call, server side")
        figures = run_depth(server.url, sizes, dims, log=print)
    print()
    print(table(figures, dims))
    print(f"\nworst ratio largest/smallest (medians, transitions): {figures['depth_worst_ratio']:.2f}x (target <= 2); "
          f"sweeps' largest median: {figures['depth_sweep_max_us']:.0f} µs (<= 1000); "
          f"longest script call: {figures['depth_longest_script_ms']:.2f} ms (<= 5); "
          f"longest snapshot command: {figures['depth_snapshot_longest_command_ms']:.2f} ms (<= 2)")
    if args.json:
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
