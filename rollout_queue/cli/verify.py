"""``rollout-queue verify``: the demo's closing check on any queue, read-only (ops/verify.py).

Exit 0 when the promise holds (PASS), 1 when it does not (FAIL, each problem on stdout with some
entry IDs); the usual 3, 4 and 6 when Redis cannot be reached, the queue does not exist, or the
credentials may not read it. Runs under the read-only operator role. On a terminal it draws its
progress on stderr (a large queue takes a while: every command reads one page).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from rollout_queue.cli import render
from rollout_queue.cli.common import EXIT_FAIL, EXIT_OK, add_full, open_view, print_json
from rollout_queue.ops import verify
from rollout_queue.ops.escape import clean


def cmd_verify(args: argparse.Namespace) -> int:
    view = open_view(args)
    with progress_bar() as tick:
        report = view.run(verify.verify_layout(view.layout, args.final, tick))
    if args.json:
        print_json(report.to_json())
    else:
        verdict = render.verify_verdict(report, min(100, shutil.get_terminal_size((80, 24)).columns))
        render.emit(render.verify_sections(report), full=args.full, reserve=verdict.count("\n"))
        sys.stdout.write(verdict)
    return EXIT_OK if report.ok else EXIT_FAIL


@contextmanager
def progress_bar() -> Iterator[verify.Progress | None]:
    """A rich progress display on stderr while the check reads (a terminal only, with rich installed):
    one line per phase, gone when it ends. None elsewhere (pipes, CI logs)."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        from rich.console import Console
        from rich.progress import Progress
    except ImportError:
        yield None
        return
    tasks: dict[str, Any] = {}
    with Progress(console=Console(stderr=True), transient=True) as bar:
        def tick(phase: str, done: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(clean(phase), total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield tick


def register(sub: Any) -> None:
    p = sub.add_parser("verify", help="check the queue's promise: every group in one state, none committed twice, "
                                      "none lost (exit 0 PASS, 1 FAIL); read-only")
    p.add_argument("--final", action="store_true",
                   help="the run is over: also fail for any group still owned or waiting (backlog, ready, "
                        "executing, completed, leased)")
    p.add_argument("--json", action="store_true", help="machine-readable verdict and problems")
    add_full(p)
    p.set_defaults(func=cmd_verify)
