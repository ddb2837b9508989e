"""The ``rollout-queue`` command line: a thin shell over the public API.

Owns argument parsing, output formatting (rich tables, or ``--json`` for scripts) and exit codes; it
only calls the public API (RolloutQueue and friends), never a script or a key directly.
Exit codes: 0 ok, 1 runtime failure (including a failed ledger check), 2 usage error,
3 cannot reach Redis, 4 not found.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import asdict
from typing import Any, Sequence

import orjson

from . import logs
from .client import RolloutQueue
from .errors import NotFound, OutcomeUnknown, RolloutQueueError
from .transport import RetryPolicy

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4


def _connect(args: argparse.Namespace) -> RolloutQueue:
    if not args.url:
        raise SystemExit(_usage("no Redis URL: pass --url or set REDIS_URL"))
    if not args.queue:
        raise SystemExit(_usage("no queue: pass --queue or set ROLLOUT_QUEUE"))
    # A CLI should fail fast when Redis is down, not retry for the library default of 30 s.
    return RolloutQueue.from_url(args.url, args.queue, retry=RetryPolicy(window_s=3.0))


def _usage(message: str) -> int:
    print(f"rollout-queue: {message}", file=sys.stderr)
    return EXIT_USAGE


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


def cmd_stats(args: argparse.Namespace) -> int:
    q = _connect(args)
    st = q.stats()
    if args.json:
        _print_json(asdict(st))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"queue {q.name}", show_header=True)
    table.add_column("state")
    table.add_column("groups", justify="right")
    for name in ("backlog", "ready", "executing_groups", "executing_samples", "completed", "leased", "retained",
                 "committed", "filtered", "dead", "kept"):
        table.add_row(name, str(getattr(st, name)))
    table.add_row("policy version", f"{st.version}" + ("" if st.version_published else " (none published)"))
    if st.staleness_max is not None:
        table.add_row("buffer staleness max/mean", f"{st.staleness_max} / {st.staleness_mean:.2f}")
    table.add_row("workers alive/silent", f"{st.workers_alive} / {st.workers_silent}")
    table.add_row("active leases / holds", f"{st.active_leases} / {st.active_holds}")
    for reason, n in st.evictions.items():
        table.add_row(f"evicted ({reason})", str(n))
    for terminal, n in st.terminals.items():
        table.add_row(f"attempts {terminal}", str(n))
    Console().print(table)
    return EXIT_OK


def cmd_reaper(args: argparse.Namespace) -> int:
    from .reaper import run_reaper, stop_on_signals

    logs.configure(args.json_logs)
    q = _connect(args)
    stop = threading.Event()
    stop_on_signals(stop)
    run_reaper(q, args.interval, stop, args.passes)
    return EXIT_OK


def cmd_dlq(args: argparse.Namespace) -> int:
    q = _connect(args)
    if args.action == "list":
        letters = q.dead_letters(args.count)
        if args.json:
            _print_json([{**asdict(d), "group": asdict(d.group) if d.group else None, "fields": None} for d in letters])
        else:
            for d in letters:
                print(f"{d.dlq_id}\t{d.entry_id}\t{d.source_id}\tattempt={d.attempt}\t{d.reason}")
        return EXIT_OK
    if not args.ids:
        return _usage(f"dlq {args.action} needs dead-letter IDs (see `rollout-queue dlq list`)")
    if args.action == "requeue":
        if not args.yes:
            return _usage("dlq requeue submits the groups again: confirm with --yes")
        for dlq_id in args.ids:
            print(f"{dlq_id}\t{q.requeue_dead_letter(dlq_id)}")
        return EXIT_OK
    found = {d.dlq_id: d for d in q.dead_letters(100_000)}
    for dlq_id in args.ids:
        if dlq_id not in found:
            raise NotFound(f"dead letter {dlq_id} not found")
        d = found[dlq_id]
        _print_json({**asdict(d), "group": asdict(d.group) if d.group else None, "fields": None})
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from .walkthrough import run_walkthrough

    return EXIT_OK if run_walkthrough(url=args.url, groups=args.groups, kill_worker=not args.no_kill) else EXIT_FAIL


def cmd_worker(args: argparse.Namespace) -> int:
    """Delegate to the generation runtime in ``workers`` (it may import torch or vLLM; the core
    package must stay importable without them)."""
    try:
        from workers.cli import main as worker_main
    except ImportError as exc:
        print(f"rollout-queue worker: the workers package is not installed ({exc}); "
              "pip install 'rollout-queue[workers]'", file=sys.stderr)
        return EXIT_USAGE
    forwarded = list(args.worker_args)
    if args.url and "--url" not in forwarded:
        forwarded += ["--url", args.url]
    if args.queue and "--queue" not in forwarded:
        forwarded += ["--queue", args.queue]
    return int(worker_main(forwarded))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollout-queue", description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"), help="Redis URL (env REDIS_URL)")
    parser.add_argument("--queue", default=os.environ.get("ROLLOUT_QUEUE"), help="queue name (env ROLLOUT_QUEUE)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stats", help="one snapshot of the queue's states and counters")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("reaper", help="requeue the work of dead workers, expired leases and stale groups")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default 1)")
    p.add_argument("--passes", type=int, default=None, help="stop after this many passes")
    p.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    p.set_defaults(func=cmd_reaper)

    p = sub.add_parser("dlq", help="dead letters: list, show, requeue")
    p.add_argument("action", choices=["list", "show", "requeue"])
    p.add_argument("ids", nargs="*", help="dead-letter IDs (show, requeue)")
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--json", action="store_true")
    p.add_argument("--yes", action="store_true", help="confirm a state change")
    p.set_defaults(func=cmd_dlq)

    p = sub.add_parser("worker", help="run a generation worker (see `rollout-queue worker --help`)",
                       add_help=False)
    p.add_argument("worker_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("demo", help="the whole lifecycle on one machine, with a private Redis")
    p.add_argument("--groups", type=int, default=24, help="source groups to run through the queue")
    p.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-run")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except OutcomeUnknown as exc:
        print(f"rollout-queue: cannot reach Redis: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except NotFound as exc:
        print(f"rollout-queue: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except RolloutQueueError as exc:
        print(f"rollout-queue: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except ConnectionError as exc:
        print(f"rollout-queue: cannot reach Redis at {args.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


if __name__ == "__main__":
    sys.exit(main())
