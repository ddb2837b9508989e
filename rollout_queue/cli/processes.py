"""Long-running processes started from the CLI: ``reaper``, ``worker`` (delegated to ``workers``) and
``walkthrough`` (the queue's lifecycle on a private Redis, with a stand-in engine; ``demo`` is in rl.py)."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from rollout_queue.cli.common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, open_queue


def cmd_reaper(args: argparse.Namespace) -> int:
    from rollout_queue.ops.reaper import run_reaper, stop_on_signals

    q = open_queue(args, must_exist=not args.create)  # a mistyped --queue is exit 4, not a new queue
    stop = threading.Event()
    stop_on_signals(stop)
    run_reaper(q, args.interval, stop, args.passes)
    return EXIT_OK


def cmd_walkthrough(args: argparse.Namespace) -> int:
    from rollout_queue.demo.walkthrough import run_walkthrough

    return EXIT_OK if run_walkthrough(url=args.url, groups=args.groups, kill_worker=not args.no_kill) else EXIT_FAIL


def cmd_worker(args: argparse.Namespace) -> int:
    """Delegate to the generation runtime in ``workers`` (it may import torch or vLLM; the core
    package must stay importable without them)."""
    try:
        from rollout_queue.workers.cli import main as worker_main
    except ImportError as exc:
        print(f"rollout-queue worker: the workers package is not installed ({exc}); "
              "pip install 'rollout-queue[workers]'", file=sys.stderr)
        return EXIT_USAGE
    forwarded = list(args.worker_args)
    if args.url and "--url" not in forwarded:
        forwarded += ["--url", args.url]
    if args.queue and "--queue" not in forwarded:
        forwarded += ["--queue", args.queue]
    for flag, value in (("--durable-replicas", args.durable_replicas), ("--durable-timeout-ms", args.durable_timeout_ms),
                        ("--partitions", args.partitions or None)):
        if value is not None and flag not in forwarded:
            forwarded += [flag, str(value)]
    if args.json_logs and "--json-logs" not in forwarded:
        forwarded.append("--json-logs")
    return int(worker_main(forwarded))


def register(sub: Any) -> None:
    p = sub.add_parser("reaper", help="requeue the work of dead workers, expired leases and stale groups")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    p.add_argument("--passes", type=int, default=None, help="stop after this many passes")
    p.add_argument("--create", action="store_true", help="create the queue if it does not exist (default: exit 4)")
    p.set_defaults(func=cmd_reaper)

    p = sub.add_parser("worker", help="run a generation worker (see `rollout-queue worker --help`)",
                       add_help=False)
    p.add_argument("worker_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("walkthrough", help="the queue's lifecycle with a stand-in engine, on a private Redis")
    p.add_argument("--groups", type=int, default=24, help="source groups to run through the queue")
    p.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    p.set_defaults(func=cmd_walkthrough)
