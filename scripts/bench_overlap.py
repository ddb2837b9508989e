"""Trainer idle and step overlap (issue 17, item 3): the demo's GRPO loop, async against strictly
on-policy, with 1, 2 and 4 workers, in one run.

Each cell is one ``rollout-queue demo`` run (``DemoRun``: private Redis, tiny model, producer,
``rollout-queue worker`` processes with the torch engine, reaper, the GRPO trainer), with the
trainer and the workers on disjoint CPUs as separate GPU pools would be (``pin_cpus``). Printed
per cell, over the steps after the first (start-up excluded):

- ``s/step``: training wall time per optimizer step;
- ``idle``: the share of that time the trainer waited for a lease (generation behind training);
- ``lag s``: the median time from publishing a version to the first lease bringing samples
  generated on it (what the trainer feels of the weight-update latency);
- ``x on-policy``: the cell's s/step over the strictly on-policy cell's with the same workers.

    python scripts/bench_overlap.py                      # 24 steps per cell, 1,2,4 workers (~10 min on 2 cores)
    python scripts/bench_overlap.py --workers 2 --steps 12
    python scripts/bench_overlap.py --results benchmarks/results.json   # the table of docs/PERFORMANCE.md

On a 2-core machine the workers share one core whatever their number, so more workers add
concurrency, not compute: read the async/on-policy ratio, not the absolute times.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--batch-groups", type=int, default=4)
    p.add_argument("--staleness", type=int, default=2, help="the async cells' max_staleness")
    p.add_argument("--results", type=Path, default=None,
                   help="replace the `overlap` section of this results file (benchmarks/results.json: the "
                        "table of docs/PERFORMANCE.md is generated from it by scripts/bench_tables.py)")
    a = p.parse_args()
    from rich.console import Console

    from rollout_queue.demo.run import DemoOptions, DemoRun
    from rollout_queue.devtools.local_server import LocalServer
    from rollout_queue.workers.tiny_model import build_tiny_model

    rows: list[dict[str, Any]] = []
    load = os.getloadavg()[0]
    server = LocalServer("redis").start()
    quiet = Console(file=io.StringIO(), force_terminal=False)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
            model = build_tiny_model(Path(tmp) / "tiny")
            print(f"{'workers':>7} {'mode':<12} {'steps':>5} {'s/step':>7} {'idle':>5} {'lag s':>6} "
                  f"{'reward end':>10} {'x on-policy':>11}", flush=True)
            for workers in (int(w) for w in a.workers.split(",")):
                base = None
                for label, bound in (("on-policy", None), ("async", a.staleness)):
                    options = DemoOptions(url=server.url, engine="torch", model_dir=model, run_dir=Path(tmp),
                                          steps=a.steps, batch_groups=a.batch_groups, max_staleness=bound,
                                          workers=workers, label=f"{label}-{workers}", pin_cpus=True)
                    result = DemoRun(options, quiet).execute()
                    if result.error or not result.ledger or not result.ledger.ok:
                        error = result.error or "ledger check failed"
                        print(f"{workers:>7} {label:<12} failed: {error}", flush=True)
                        rows.append({"workers": workers, "mode": label, "error": str(error)})
                        continue
                    steady = result.records[1:]
                    span = steady[-1].elapsed_s - result.records[0].elapsed_s
                    per_step = span / max(1, len(steady))
                    idle = sum(r.wait_s for r in steady) / max(1e-9, span)
                    lags = [r.version_lag_s for r in steady if r.version_lag_s is not None]
                    lag = statistics.median(lags) if lags else float("nan")
                    base = base or per_step
                    print(f"{workers:>7} {label:<12} {len(result.records):>5} {per_step:>7.3f} {idle:>5.0%} "
                          f"{lag:>6.2f} {result.reward_at(True):>10.3f} {per_step / base:>11.2f}", flush=True)
                    rows.append({"workers": workers, "mode": label, "steps": len(result.records),
                                 "s_per_step": per_step, "idle": idle, "lag_s": lag,
                                 "reward_end": result.reward_at(True), "x_on_policy": per_step / base})
    finally:
        server.stop()
    from bench_common import run_environment, store_run

    env = run_environment(load, steps=a.steps, batch_groups=a.batch_groups, staleness=a.staleness)
    print(f"load average {env['loadavg_end']:.2f}, {env['cpus']} CPUs, python {env['python']}")
    if a.results:
        store_run(a.results, "overlap", env, rows=rows)


if __name__ == "__main__":
    main()
