"""Reaper latency at scale: the longest single script call while reaping 100k pending entries.

Parks N executing entries on W workers that then go silent, plus one lease of 4096 groups that
expires, and reaps them all, reading each script call's server-side duration from SLOWLOG
(threshold 0 µs). Also times the other transitions that scan state (stats, a reserve
opportunistically reaping, hold_open), so a regression shows as a number, not a stall.

SLOWLOG durations are wall-clock time inside the call: on a loaded machine a descheduled server
thread shows up as a long call, so read the longest call together with its p99 and repeat the run.

    python scripts/bench_reaper.py [--entries 100000] [--workers 100] [--kind redis|valkey] [--history 32] [--json F]
scripts/bench.py runs ``run_reaper`` as its scenario 7. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Callable

import orjson
import redis

from rollout_queue import QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.core.scripts import SCRIPTS

WORKER_TIMEOUT_S = 3.0
LEASE_GROUPS = 4096


def slow_calls(r: redis.Redis) -> list[tuple[int, str]]:
    """(duration µs, script sha prefix) of every EVALSHA in the slowlog since the last reset."""
    out = []
    for e in r.slowlog_get(1_000_000):
        cmd = e["command"].decode(errors="replace") if isinstance(e["command"], bytes) else str(e["command"])
        if cmd.lower().startswith("evalsha"):
            out.append((int(e["duration"]), cmd.split()[1][:12]))
    return out


def _setup(q: RolloutQueue, entries: int, workers: int) -> None:
    """N executing entries on W workers and one lease of LEASE_GROUPS groups. Every worker is
    heartbeaten about once a second while the others reserve, so none goes silent (and is reaped
    opportunistically by a later reserve) before the measurement starts."""
    run = uuid.uuid4().hex[:6]
    total = entries + LEASE_GROUPS
    for start in range(0, total, 2000):
        q.submit([SourceGroup(f"{run}-{i}", "p", 1) for i in range(start, min(total, start + 2000))])
    handles, last_beat = [], time.monotonic()
    per = entries // workers
    for w in range(workers):
        worker = q.worker(f"w{w}")
        handles.append(worker)
        got = 0
        while got < per:
            got += len(worker.reserve(max_groups=min(500, per - got)))
        if time.monotonic() - last_beat > WORKER_TIMEOUT_S / 3:
            for h in handles:
                h.heartbeat()
            last_beat = time.monotonic()
    big = q.worker("w-lease")
    done = 0
    while done < LEASE_GROUPS:  # reserve grants at most 64 groups a call
        got = big.reserve(max_groups=min(64, LEASE_GROUPS - done))
        big.complete_many([(res.receipt, [Sample(0, (1, 2, 3), (-0.1, -0.2, -0.3), 1.0, 0)]) for res in got])
        done += len(got)
    lease = q.lease(LEASE_GROUPS, timeout_s=WORKER_TIMEOUT_S)
    assert lease is not None and len(lease) == LEASE_GROUPS


def _give_histories(r: redis.Redis, q: RolloutQueue, attempts: int) -> None:
    """Give every pending entry a history of ``attempts`` earlier (aborted) attempts: the reaper's
    structural worst case, since each requeue decodes and re-encodes the history it extends."""
    blob = orjson.dumps({"f": 0, "h": [{"a": 1, "w": "host-a:gpu0", "t": "aborted", "r": "weight update",
                                        "ms": 1_700_000_000_000 + i} for i in range(attempts)]})
    last = "-"
    while True:
        batch = r.xrange(q.keys["src"], min=last, count=5000)
        ids = [e[0] for e in batch if e[0] != last]
        if not ids:
            return
        r.hset(q.keys["history"], mapping={i: blob for i in ids})
        last = ids[-1]


def run_reaper(url: str, entries: int = 100_000, workers: int = 100,
               log: Callable[[str], None] = lambda line: None, history: int = 0) -> dict[str, float]:
    """One run on the server at ``url`` (its queue keys are deleted afterwards); figures in ms.
    ``history``: earlier attempts recorded for every entry before reaping (0: first attempts)."""
    r = redis.Redis.from_url(url)
    cfg = QueueConfig(max_executing_samples=10**9, max_retained_groups=10**7, worker_timeout_s=WORKER_TIMEOUT_S,
                      lease_timeout_s=WORKER_TIMEOUT_S, max_completed_groups=10**6)
    name = f"bench-reaper-{uuid.uuid4().hex[:6]}"
    q = RolloutQueue.from_url(url, name, cfg)
    names = {s.sha[:12]: s.name for s in SCRIPTS.values()}
    t0 = time.perf_counter()
    _setup(q, entries, workers)
    if history:
        _give_histories(r, q, history)
    st = q.stats()
    log(f"setup: {st.executing_groups} executing on {workers} workers and one lease of {st.leased} groups "
        f"in {time.perf_counter() - t0:.1f}s")
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 1_000_000)
    figures: dict[str, float] = {"entries": entries}

    def measure(label: str, fn: Callable[[], object]) -> None:
        r.slowlog_reset()
        info = r.info("cpu")
        cpu0 = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        t = time.perf_counter()
        fn()
        wall = time.perf_counter() - t
        info = r.info("cpu")
        cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"]) - cpu0
        calls = slow_calls(r)
        longest = max(calls) if calls else (0, "")
        durations = [c[0] / 1000 for c in calls]
        p99 = statistics.quantiles(durations, n=100)[98] if len(durations) > 2 else longest[0] / 1000
        key = "reap" if label == "reap" else f"reaper_{label}"  # bench.py merges every scenario's keys
        figures.update({f"{key}_longest_ms": longest[0] / 1000, f"{key}_p99_ms": p99,
                        f"{key}_median_ms": statistics.median(durations) if durations else 0.0,
                        # Server CPU per call: unlike SLOWLOG's wall time, not lengthened by the
                        # server thread being descheduled on a busy machine.
                        f"{key}_cpu_ms_per_call": cpu * 1000 / max(1, len(calls)),
                        f"{key}_calls": len(calls), f"{key}_wall_s": wall, f"{key}_cpu_s": cpu})
        by_script: dict[str, list[float]] = {}
        for usec, sha in calls:
            by_script.setdefault(names.get(sha, sha), []).append(usec / 1000)
        log(f"{label:10} calls={len(calls):6d} longest={longest[0] / 1000:8.2f} ms "
            f"({names.get(longest[1], longest[1])}) p99={p99:6.2f} ms wall={wall:6.2f}s")
        for script, ms in sorted(by_script.items()):
            top = sorted(ms)[-5:]
            log(f"{'':10}   {script:14} calls={len(ms):5d} median={statistics.median(ms):6.2f} ms "
                f"top5={' '.join(f'{x:.1f}' for x in top)}")

    measure("stats", q.stats)
    holds = []
    measure("hold_open", lambda: holds.append(q.hold(timeout_s=5)))
    holds[0].release()
    time.sleep(WORKER_TIMEOUT_S + 0.2)  # let every worker go silent and the lease expire
    measure("reserve", lambda: q.worker("probe").reserve(1))

    def reap_all() -> None:
        while q.reap().total:
            pass

    measure("reap", reap_all)
    st = q.stats()
    log(f"after reaping: ready={st.ready} executing={st.executing_groups} leased={st.leased} "
        f"lost attempts={st.terminals['lost']} expired={st.terminals['expired']}")
    figures["reaped"] = st.terminals["lost"] + st.terminals["expired"]
    # Server CPU per entry reaped: the load-free cost of the reaper's work (scan, scripts, replies).
    figures["reap_cpu_us_per_entry"] = figures["reap_cpu_s"] * 1e6 / max(1, figures["reaped"])
    r.config_set("slowlog-log-slower-than", 10_000)
    r.slowlog_reset()
    keys = list(r.scan_iter(match=f"rollout:{{{name}}}:*", count=1000))
    if keys:
        r.delete(*keys)
    q.close()
    r.close()
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--kind", default=None)
    ap.add_argument("--history", type=int, default=0,
                    help="earlier attempts in every entry's history (32: the cap, the worst case)")
    ap.add_argument("--json", default=None, help="write figures to this file")
    args = ap.parse_args()
    with LocalServer(args.kind, appendfsync="everysec") as server:
        print(f"server: {server.kind}, appendfsync everysec")
        figures = run_reaper(server.url, args.entries, args.workers, log=print, history=args.history)
    if args.json:
        with open(args.json, "wb") as f:
            f.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
