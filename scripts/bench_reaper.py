"""Reaper latency at scale: the longest single script call while reaping 100k pending entries.

Starts its own private Redis, parks N executing entries on W workers that then go silent, and
reaps them all, reading each script call's server-side duration from SLOWLOG (threshold 0 µs). Also
times the other transitions that scan state (stats, a reserve and a lease opportunistically reaping,
hold_open snapshotting every executing attempt), so a regression shows as a number, not a stall.

    python scripts/bench_reaper.py [--entries 100000] [--workers 100] [--kind redis|valkey]
Prints a table; --json writes the figures too. A benchmark, not a test: the machine is noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson
import redis

from rollout_queue import QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.local_server import LocalServer


def slow_calls(r: redis.Redis) -> list[tuple[int, str]]:
    """(duration µs, script name) of every EVALSHA in the slowlog since the last reset."""
    out = []
    for e in r.slowlog_get(1_000_000):
        cmd = e["command"].decode(errors="replace") if isinstance(e["command"], bytes) else str(e["command"])
        if cmd.lower().startswith("evalsha"):
            out.append((int(e["duration"]), cmd.split()[1][:12]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=100)
    ap.add_argument("--kind", default=None)
    ap.add_argument("--json", default=None, help="write figures to this file")
    args = ap.parse_args()

    with LocalServer(args.kind, appendfsync="everysec") as server:
        r = redis.Redis.from_url(server.url)
        cfg = QueueConfig(max_executing_samples=10**9, max_retained_groups=10**7, worker_timeout_s=5.0, lease_timeout_s=5.0,
                          max_completed_groups=10**6)
        q = RolloutQueue.from_url(server.url, "bench-reaper", cfg)
        names = {s.sha[:12]: s.name for s in __import__("rollout_queue.scripts", fromlist=["SCRIPTS"]).SCRIPTS.values()}
        t0 = time.perf_counter()
        for start in range(0, args.entries + 4096, 2000):
            q.submit([SourceGroup(f"g{i}", "p", 1) for i in range(start, min(args.entries + 4096, start + 2000))])
        per = args.entries // args.workers
        for w in range(args.workers):
            worker = q.worker(f"w{w}")
            got = 0
            while got < per:
                got += len(worker.reserve(max_groups=min(500, per - got)))
        # One big lease (4096 groups) that will expire with the workers: expiry must be bounded too.
        big = q.worker("w-lease")
        for res in big.reserve(max_groups=4096):
            big.complete(res.receipt, [Sample(0, (1, 2, 3), (-0.1, -0.2, -0.3), 1.0, 0)])
        lease = q.lease(4096, timeout_s=5.0)
        assert lease is not None and len(lease) == 4096
        setup_s = time.perf_counter() - t0
        st = q.stats()
        print(f"setup: {st.executing_groups} executing on {args.workers} workers and one lease of {st.leased} "
              f"groups in {setup_s:.1f}s (server {server.kind})")

        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 1_000_000)
        figures: dict[str, float] = {}

        def measure(label: str, fn) -> None:  # type: ignore[no-untyped-def]
            r.slowlog_reset()
            t = time.perf_counter()
            fn()
            wall = time.perf_counter() - t
            calls = slow_calls(r)
            longest = max(calls) if calls else (0, "")
            figures[f"{label}_longest_ms"] = longest[0] / 1000
            figures[f"{label}_calls"] = len(calls)
            figures[f"{label}_wall_s"] = wall
            p99 = statistics.quantiles([c[0] for c in calls], n=100)[98] / 1000 if len(calls) > 2 else longest[0] / 1000
            print(f"{label:28} calls={len(calls):6d} longest={longest[0] / 1000:8.2f} ms "
                  f"({names.get(longest[1], longest[1])}) p99={p99:6.2f} ms wall={wall:6.2f}s")

        measure("stats (100k pending)", q.stats)
        hold = None

        def open_hold() -> None:
            nonlocal hold
            hold = q.hold(timeout_s=5)

        measure("hold_open snapshot", open_hold)
        hold.release()  # type: ignore[union-attr]
        time.sleep(cfg.worker_timeout_s + 0.2)  # let every worker go silent and the lease expire
        measure("reserve (opportunistic)", lambda: q.worker("probe").reserve(1))
        total = {"lost": 0}

        def reap_all() -> None:
            while True:
                rep = q.reap()
                total["lost"] += rep.lost
                if rep.total == 0:
                    return

        measure("reap 100k lost + 1 lease", reap_all)
        st = q.stats()
        print(f"after reaping: ready={st.ready} executing={st.executing_groups} leased={st.leased} "
              f"lost attempts={st.terminals['lost']} expired={st.terminals['expired']}")
        figures["entries"] = args.entries
        if args.json:
            with open(args.json, "wb") as f:
                f.write(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
