#!/usr/bin/env python3
"""Chaos run: a private Redis, a producer, test-engine workers, a trainer and reapers as processes,
random faults from a seed, then a history check of every log against the Redis truth.

    .venv/bin/python scripts/chaos.py --groups 600 --seed 1                  # ~1 min, AOF always
    .venv/bin/python scripts/chaos.py --groups 10000 --seed 7 --deadline 3000 --settle 120 \
        --fault-interval 0.5 --lease-batch 16 --train-ms 100 --log-dir /tmp/chaos-long   # the long run
    .venv/bin/python scripts/chaos.py --groups 3000 --weight redis_outage=3 --worker-slots 2+,4,6+ \
        --sizes 1,2,2,3,4,6,8 --deadline 900 --settle 90                  # long outages, mixed slots
    .venv/bin/python scripts/chaos.py --mode everysec --weight redis_kill=5 --groups 800 --seed 31
    .venv/bin/python scripts/chaos.py --groups 600 --seed 3 --traj-workers 2 --pushes   # shipped workers, pushes
    .venv/bin/python scripts/chaos.py --groups 600 --seed 4 --traj-workers 2 --weight credential=3  # + the adversary
    .venv/bin/python scripts/chaos.py --recheck /tmp/chaos-long              # check kept logs again

Prints the report as JSON (``--json``) or a short table, and exits 0 only when the checker proves:
lost = 0, trained twice = 0, stuck = 0 (nothing owned at the end, and no group without an observable
change for longer than the run's bound, measured while it ran), dead letters only for poison prompts,
no late settlement accepted, no downtime counted against a live worker, lease or hold (and, with
everysec, that every lost acknowledgement lies in the last second before a kill), every counted
failure charged to a group that caused it, no shipped worker dead of its groups, every push round
ended by its deadline and every live worker on the last version, and what a worker credential did.
The harness lives in ``rollout_queue/devtools/chaos/`` (docs/CHAOS.md).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import orjson

# Run from anywhere: the harness package sits at the repository root, and this file's own name would
# shadow it, so the script's directory is replaced by the root before the harness is imported.
sys.path[0] = str(Path(__file__).resolve().parents[1])
harness = importlib.import_module("rollout_queue.devtools.chaos.harness")
nemesis = importlib.import_module("rollout_queue.devtools.chaos.nemesis")
roles = importlib.import_module("rollout_queue.devtools.chaos.roles")


#: Options that are RunConfig fields of the same name (their defaults are RunConfig's): the shipped
#: workers, the pusher and push-fault member, the adversary's commands, the code the children run.
FLEET_OPTIONS: tuple[tuple[str, str], ...] = (
    ("--traj-workers", "shipped workers (python -m rollout_queue.workers, scripted engine, chaos environment)"),
    ("--traj-slots", "each shipped worker's --max-samples"),
    ("--hostile-every", "every k-th group breaks the shipped workers' environment or reward (0: none)"),
    ("--env-step-timeout-s", "the shipped workers' --env-step-timeout"),
    ("--save-progress-every-s", "the shipped workers' --save-progress-every-s (partial rollouts)"),
    ("--traj-latency-s", "the scripted engine's latency per model turn in the shipped workers"),
    ("--traj-jitter-s", "plus up to this much (seeded)"),
    ("--pushes", "a pusher publishes the versions, over torch.distributed pushes to the shipped workers"),
    ("--publish-interval-s", "pusher: seconds between versions"),
    ("--push-every", "pusher: every k-th version goes by push"),
    ("--push-join-s", "a push round's join window"),
    ("--push-deadline-s", "a push round's deadline"),
    ("--unreachable-rate", "share of rounds a live member that cannot reach the trainer joins"),
    ("--invented-rate", "share of rounds an id that never heartbeat tries to join"),
    ("--adversary-commands", "the adversary (--weight credential=W) sends only these, e.g. 'xack src,del meta'"),
    ("--code-root", "run the children from this tree's rollout_queue (git archive <commit>), this chaos/ overlaid"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=600)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--worker-slots", default="2+,4,6+", metavar="S[+],...",
                   help="max_samples of each worker in turn; '+' = it overcommits (default 2+,4,6+; '0' = no cap)")
    p.add_argument("--worker-groups", type=int, default=4, help="max_groups per reserve")
    p.add_argument("--sizes", default=",".join(map(str, roles.DEFAULT_SIZES)),
                   help="each group's n is drawn from these (default %(default)s; '' = the old 2-4)")
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--reapers", type=int, default=2)
    p.add_argument("--mode", choices=["always", "everysec"], default="always", help="AOF appendfsync")
    p.add_argument("--kind", choices=["redis", "valkey"], default=None, help="server (default: what is installed)")
    p.add_argument("--fault-interval", type=float, default=1.0, help="mean seconds between faults")
    p.add_argument("--no-fault", action="append", default=[], choices=nemesis.FAULT_KINDS, help="leave out a kind")
    p.add_argument("--weight", action="append", default=[], metavar="KIND=W",
                   help="relative weight of a fault kind (defaults: %s)" % dict(nemesis.DEFAULT_WEIGHTS))
    p.add_argument("--deadline", type=float, default=150.0, help="seconds for the whole run")
    p.add_argument("--settle", type=float, default=30.0, help="fault-free seconds at the end of the deadline")
    p.add_argument("--worker-timeout", type=float, default=2.0)
    p.add_argument("--outage", default="1.5,3.0", metavar="LO,HI",
                   help="redis_outage keeps Redis down LO..HI x worker_timeout (default %(default)s)")
    p.add_argument("--progress-slack", type=float, default=15.0,
                   help="slack of the no-progress bound (bound = max(lease_timeout, 3 x worker_timeout) "
                        "+ longest outage + slack)")
    p.add_argument("--lease-timeout", type=float, default=4.0)
    p.add_argument("--lease-batch", type=int, default=8, help="groups per lease")
    p.add_argument("--train-ms", type=float, default=200.0, help="the trainer's step time (uniform up to)")
    p.add_argument("--gen-ms", type=float, default=30.0, help="the test engine's time per group (uniform up to)")
    p.add_argument("--submit-rate", type=float, default=0.0,
                   help="groups submitted per second at most, so the run lasts on a fast machine (0: no pace)")
    p.add_argument("--cli-reaper", action="store_true", help="reapers as `python -m rollout_queue reaper`")
    for flag, help_ in FLEET_OPTIONS:
        name = flag[2:].replace("-", "_")
        default = getattr(harness.RunConfig, name)
        if isinstance(default, bool):
            p.add_argument(flag, action="store_true", help=help_)
        else:
            p.add_argument(flag, type=type(default) if default is not None else str, default=default,
                           help=f"{help_} (default %(default)s)")
    p.add_argument("--log-dir", default=None, help="keep the logs here (default: temp dir, removed on success)")
    p.add_argument("--keep-logs", action="store_true")
    p.add_argument("--json", action="store_true", help="print the whole summary as JSON")
    p.add_argument("--recheck", metavar="LOG_DIR", help="only run the checker again on a kept run's logs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.recheck:
        report = harness.recheck(Path(a.recheck))
        print("\n".join(report.violations) or "no violations")
        return 0 if report.ok else 1
    weights = dict(nemesis.DEFAULT_WEIGHTS)
    for item in a.weight:
        kind, _, w = item.partition("=")
        if kind not in nemesis.FAULT_KINDS:
            raise SystemExit(f"unknown fault kind {kind!r}; one of {nemesis.FAULT_KINDS}")
        weights[kind] = float(w)
    weights = {k: v for k, v in weights.items() if k not in a.no_fault and v > 0}
    specs = [x.strip() for x in a.worker_slots.split(",") if x.strip()] or ["0"]
    lo, hi = (float(x) for x in a.outage.split(","))
    cfg = harness.RunConfig(
        groups=a.groups, seed=a.seed, workers=a.workers, reapers=a.reapers, mode=a.mode, kind=a.kind,
        worker_slots=tuple(int(x.rstrip("+")) for x in specs), worker_overcommit=tuple(x.endswith("+") for x in specs),
        worker_groups=a.worker_groups, group_sizes=roles.parse_sizes(a.sizes), trainers=a.trainers,
        outage_factor=(lo, hi), progress_slack_s=a.progress_slack,
        fault_interval_s=a.fault_interval, weights=weights, deadline_s=a.deadline, settle_s=a.settle,
        worker_timeout_s=a.worker_timeout, lease_timeout_s=a.lease_timeout, lease_batch=a.lease_batch,
        train_ms=a.train_ms, gen_ms=a.gen_ms, submit_rate=a.submit_rate, cli_reaper=a.cli_reaper, log_dir=a.log_dir,
        **{name: getattr(a, name) for name in (flag[2:].replace("-", "_") for flag, _ in FLEET_OPTIONS)})
    result = harness.run(cfg, keep_logs=a.keep_logs)
    summary = result.summary()
    if a.json:
        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for key, value in summary.items():
            print(f"{key:32} {value}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
