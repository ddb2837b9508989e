"""Long-running processes started from the CLI: ``reaper``, ``worker`` (delegated to ``workers``) and
``walkthrough`` (the queue's lifecycle on a private Redis, with a stand-in engine; ``demo`` is in rl.py)."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from rollout_queue.cli.common import EXIT_FAIL, EXIT_OK, UsageError, connection_options, open_queue


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
    """Run the generation worker (workers/cli.py; it imports torch or vLLM only when it builds its
    engine, so the core package stays importable without them). The options the worker shares with
    the core CLI may come before ``worker`` or after it (register); the worker's default fills in
    where neither gave one. A connection option that only the core CLI takes (``--tls-*``) is refused,
    not dropped."""
    from rollout_queue.workers import cli as worker_cli  # imports this package's common.py: not at the top

    own = worker_cli.defaults()
    for name, value in own.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    refused = [a.option_strings[0] for a in connection_options()
               if a.dest not in own and getattr(args, a.dest) != a.default]  # given, not the env's value
    if refused:
        raise UsageError(f"the worker does not take {', '.join(refused)} (nothing was started)")
    return int(worker_cli.run(args))


def register(sub: Any) -> None:
    from rollout_queue.workers import cli as worker_cli

    p = sub.add_parser("reaper", help="requeue the work of dead workers, expired leases and stale groups")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    p.add_argument("--passes", type=int, default=None, help="stop after this many passes")
    p.add_argument("--create", action="store_true", help="create the queue if it does not exist (default: exit 4)")
    p.set_defaults(func=cmd_reaper)

    p = sub.add_parser("worker", help="run a generation worker (see `rollout-queue worker --help`)",
                       description=worker_cli.DESCRIPTION, separator_optional=True)
    # A connection option may come before the subcommand too (`rollout-queue --url U worker`), and
    # argparse copies a subcommand's defaults over the values given before it: the options both take
    # have no default here, and cmd_worker fills the worker's in where neither position gave one.
    worker_cli.add_arguments(p, inherited={a.dest for a in connection_options()})
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("walkthrough", help="the queue's lifecycle with a stand-in engine, on a private Redis")
    p.add_argument("--groups", type=int, default=24, help="source groups to run through the queue")
    p.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    p.set_defaults(func=cmd_walkthrough)
