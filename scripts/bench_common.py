"""Shared pieces of the benchmark modules: payloads, process handling, Redis counters, statistics.

Owns what every scenario needs the same way: the 8 x 512-token completion and the tiny ~200-byte
payload, spawning child processes that wait on a common start signal, reading `INFO commandstats`
deltas, and summarising repeats (median, min, max). It must not know any scenario's logic or
targets; those live in the scenario modules and in bench.py.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import redis

from rollout_queue import Sample, SourceGroup

#: The results file the docs' tables are generated from (scripts/bench_tables.py).
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results.json"


def run_environment(loadavg_start: float, **settings: Any) -> dict[str, Any]:
    """What a stored run says about the machine (CPUs, load average at its start and now, Python)
    and about its own settings; the tables print it under each one."""
    return {"cpus": os.cpu_count(), "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg()[0],
            "python": sys.version.split()[0], **settings}


def store_run(path: Path, name: str, environment: Mapping[str, Any], **body: Any) -> None:
    """Store a benchmark run as section ``name`` of the results file: the command that made it (this
    script and its arguments), the date, ``environment`` (run_environment) and ``body``."""
    command = " ".join(["python", f"scripts/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    store_section(path, name, {"command": command, "date": time.strftime("%Y-%m-%d"),
                               "environment": dict(environment), **body})
    print(f"wrote the {name} section of {path}; now run python scripts/bench_tables.py")


def write_rows(name: str, environment: Mapping[str, Any], rows: Any, json_path: str | None,
               results: str | os.PathLike[str] | None) -> None:
    """A benchmark's rows with its environment: to ``json_path``, and as section ``name`` of the
    ``results`` file (store_run), each when given."""
    if json_path:
        Path(json_path).write_text(json.dumps({"environment": dict(environment), "rows": rows}, indent=2))
    if results:
        store_run(Path(results), name, environment, rows=rows)


def store_section(path: Path, name: str, result: Mapping[str, Any]) -> None:
    """Replace one section of the results file, keeping every other (store_sections)."""
    store_sections(path, {name: result})


def store_sections(path: Path, sections: Mapping[str, Any]) -> None:
    """Replace these top-level sections of the results file, keeping every other: scripts/bench.py
    writes the scenarios, each other benchmark (cluster, engine, overlap, weights, trl) its own."""
    import orjson

    report = orjson.loads(path.read_bytes()) if path.exists() else {}
    report.update(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")


#: Commands the bench itself sends to read the server (never part of a queue's cost).
INSTRUMENTATION = ("info", "config", "slowlog", "memory", "flushall", "ping", "client", "hello", "select",
                   "dbsize", "latency", "script", "debug", "command")

#: Spawned children start from a clean interpreter: no inherited sockets, threads or event loops.
CTX = mp.get_context("spawn")


@dataclass(frozen=True)
class Payload:
    """The shape of one group: ``n`` samples of ``tokens`` tokens (with logprobs or not) and a prompt."""

    n: int
    tokens: int
    logprobs: bool
    prompt_bytes: int

    def group(self, source_id: str) -> SourceGroup:
        return SourceGroup(source_id, "p" * self.prompt_bytes, self.n)

    def samples(self, seed: int = 0) -> list[Sample]:
        """One completion; built once per process and re-sent (encoding still runs per call)."""
        rnd = random.Random(seed)
        out = []
        for slot in range(self.n):
            ids = tuple(rnd.randrange(152_000) for _ in range(self.tokens))
            lps = tuple(-rnd.random() * 5 for _ in range(self.tokens)) if self.logprobs else ()
            out.append(Sample(slot, ids, lps, reward=float(slot % 2), version=0))
        return out

    @property
    def total_tokens(self) -> int:
        return self.n * self.tokens


#: The issue's lifecycle payload: groups of 8 samples x 512 tokens with logprobs.
BIG = Payload(n=8, tokens=512, logprobs=True, prompt_bytes=200)
#: The peers' payload: one ~200-byte item (a prompt of 200 bytes, one sample of 8 tokens back).
TINY = Payload(n=1, tokens=8, logprobs=False, prompt_bytes=200)


# -- Redis counters --------------------------------------------------------------------------------


def commandstats(r: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) from INFO commandstats (subcommands as 'config|set')."""
    info = r.info("commandstats")
    return {k[len("cmdstat_"):]: (int(v["calls"]), int(v["usec"])) for k, v in info.items()}


def commandstats_delta(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]
                       ) -> dict[str, tuple[int, int]]:
    """Per-command (calls, usec) between two snapshots, without the bench's own instrumentation."""
    out = {}
    for name, (calls, usec) in after.items():
        if name.split("|")[0] in INSTRUMENTATION:
            continue
        c0, u0 = before.get(name, (0, 0))
        if calls - c0:
            out[name] = (calls - c0, usec - u0)
    return out


def per_group_calls(delta: Mapping[str, tuple[int, int]], groups: int) -> dict[str, float]:
    """Round trips, script calls and Redis commands per group from a commandstats delta.

    Clients send only EVALSHA and XREAD (the blocking wait on a wake stream); scripts never XREAD,
    so those two are the client round trips. Commands run inside scripts are counted by
    commandstats under their own names; EVALSHA itself is counted once more, as Redis executes it.
    """
    calls = {k: v[0] for k, v in delta.items()}
    evalsha, xread = calls.get("evalsha", 0), calls.get("xread", 0)
    total = sum(calls.values())
    return {
        "evalsha_per_group": evalsha / groups,
        "round_trips_per_group": (evalsha + xread) / groups,
        "commands_per_group": total / groups,
        "commands_in_scripts_per_group": (total - evalsha - xread) / groups,
        "script_usec_per_group": delta.get("evalsha", (0, 0))[1] / groups,
    }


def flush(url: str) -> None:
    """Empty the bench's private server between runs (it is ours alone; never a shared one) and
    compact its AOF, outside any timing: bench.py turns automatic AOF rewrites off, so a rewrite
    fork never lands inside a measurement, and the file would otherwise only grow."""
    r = redis.Redis.from_url(url)
    r.flushall()
    try:
        r.bgrewriteaof()
    except redis.ResponseError:
        pass  # a rewrite is already running or scheduled: waiting for it below is the same
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = r.info("persistence")
        if not info.get("aof_rewrite_in_progress") and not info.get("aof_rewrite_scheduled"):
            break
        time.sleep(0.02)  # polling a background rewrite, bounded by the deadline
    r.close()


# -- child processes -------------------------------------------------------------------------------


class Team:
    """Child processes that get ready, wait for one start signal, and report a dict each.

    Each target is called as ``fn(*args, ready, start, stop, results)``: it signals ``ready`` once
    connected, waits for ``start``, works until its own end or ``stop``, then puts one dict on
    ``results``. Start-up (imports, connecting, building payloads) is outside every timing.
    """

    def __init__(self) -> None:
        self.start, self.stop = CTX.Event(), CTX.Event()
        self.results: Any = CTX.Queue()
        self.procs: list[Any] = []
        self.readies: list[Any] = []

    def add(self, fn: Callable[..., None], *args: Any) -> None:
        ready = CTX.Event()
        proc = CTX.Process(target=fn, args=(*args, ready, self.start, self.stop, self.results), daemon=True)
        proc.start()
        self.procs.append(proc)
        self.readies.append(ready)

    def go(self, timeout_s: float = 60.0) -> float:
        """Wait until every child is ready, then release them all; returns the start time."""
        deadline = time.monotonic() + timeout_s
        for proc, ready in zip(self.procs, self.readies):
            while not ready.wait(0.1):
                if not proc.is_alive() or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"bench child {proc.name} died or hung while starting (exit {proc.exitcode})")
        t0 = time.perf_counter()
        self.start.set()
        return t0

    def collect(self, count: int, timeout_s: float) -> list[dict[str, Any]]:
        """``count`` result dicts, in arrival order; raises if children die or time runs out."""
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < count:
            try:
                out.append(self.results.get(timeout=0.2))
            except Exception:  # queue.Empty: check the children are still alive, then wait on
                if time.monotonic() > deadline or not any(p.is_alive() for p in self.procs):
                    self.close()
                    raise RuntimeError(f"bench children returned {len(out)} of {count} results in time")
        return out

    def close(self, timeout_s: float = 15.0) -> None:
        self.stop.set()
        for proc in self.procs:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()  # a child we started that ignored the stop signal
                proc.join()


# -- statistics ------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarise(runs: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """metric -> {median, min, max, runs} over the repeats that reported it."""
    keys = sorted({k for r in runs for k in r})
    out = {}
    for k in keys:
        xs = [float(r[k]) for r in runs if k in r]
        out[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}
    return out
