"""Read-only status commands: ``stats`` (one snapshot), ``top`` (live, with rates) and ``metrics``
(the Prometheus exporter). All run under the read-only operator role."""

from __future__ import annotations

import argparse
import math
import shutil
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Mapping

from rollout_queue.ops import partition_views, views
from rollout_queue.ops.view_models import SampleDistribution, Snapshot
from rollout_queue.cli import render, top
from rollout_queue.cli.common import EXIT_OK, UsageError, add_full, open_view, print_json, to_json

#: (label, meta counter) of the rates `top` shows.
RATES = (("in/s (submitted)", "submitted"), ("completed/s", "completed_total"), ("out/s (committed)", "committed"))


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """`stats --json`: the QueueStats fields at top level (as before), then the views' extras; on a
    partitioned queue the top level is the sum, and ``partitions`` lists each partition's own
    (``{"partition": name, "unreachable": true}`` for one that did not answer)."""
    out = {**to_json(snap.stats), "attempts": to_json(snap.pel.attempts), "pel_states": to_json(snap.pel.states),
           "pel_truncated": snap.pel.truncated, "buffer_staleness": [list(x) for x in snap.buffer_staleness],
           "workers": to_json(snap.workers), "leases": to_json(snap.leases), "drain": to_json(snap.drain),
           "holds": to_json(snap.holds), "push": to_json(snap.push),
           "oldest_ms": {s: snap.oldest_ms(s) for s in render.WAITING},
           "samples": {"tokens": distribution_json(snap.sample_tokens),
                       "seconds": distribution_json(snap.sample_seconds)}}
    if snap.partitions:
        out["partitions"] = [{"partition": name, "unreachable": True} if part is None else
                             {"partition": name, "unreachable": False, **snapshot_json(part)}
                             for name, part in snap.partitions]
    return out


def distribution_json(d: SampleDistribution) -> dict[str, Any]:
    """A sample distribution for `stats --json`: its count, the quantiles as bucket upper edges
    (``"+Inf"`` above the last edge, as Prometheus' ``le``; null with no samples), and the buckets
    themselves (``edges``, and ``counts`` with one more entry for above the last edge)."""
    def edge(v: float | None) -> float | str | None:
        return "+Inf" if v is not None and math.isinf(v) else v

    return {"count": d.count, "workers": d.workers, "p50": edge(d.p50), "p90": edge(d.p90), "p99": edge(d.p99),
            "max": edge(d.max), "edges": list(d.edges), "counts": list(d.counts)}


def cmd_stats(args: argparse.Namespace) -> int:
    view = open_view(args)
    snap = view.run(partition_views.snapshot(view.layout))
    if args.json:
        print_json(snapshot_json(snap))
    elif sys.stdout.isatty() and not args.full:  # the concise default: top's frame, once, without rates
        width, height = render.terminal_size()
        sys.stdout.write("\n".join(top.top_lines(snap, None, [], args.queue, width, height, "stats")) + "\n")
    else:
        render.emit([render.section(f"queue {args.queue}", (), [])] + render.snapshot_sections(snap), full=True)
    return EXIT_OK


def rates(prev: tuple[float, Mapping[str, int]] | None, now: tuple[float, Mapping[str, int]]) -> dict[str, float | None]:
    """Groups per second of each RATES counter between two frames (None on the first frame)."""
    if prev is None or now[0] <= prev[0]:
        return {label: None for label, _ in RATES}
    dt = now[0] - prev[0]
    return {label: max(0.0, (now[1].get(key, 0) - prev[1].get(key, 0)) / dt) for label, key in RATES}


def cmd_top(args: argparse.Namespace, clock: Callable[[], float] = time.monotonic) -> int:
    view = open_view(args)
    frames = 1 if args.once else args.iterations
    spark: deque[float | None] = deque(maxlen=args.history)
    prev: tuple[float, Mapping[str, int]] | None = None
    live = _live() if sys.stdout.isatty() and not args.json and frames != 1 else None
    shown = 0
    try:
        while True:
            snap = view.run(partition_views.snapshot(view.layout))
            now = (clock(), dict(snap.stats.counters))
            r = rates(prev, now)
            prev = now
            spark.append(r["out/s (committed)"])
            if args.json:
                print_json({"rates": r, **snapshot_json(snap)})
            else:
                size = live.console.size if live is not None else shutil.get_terminal_size((120, 40))
                # One line short of the height: the cursor's line must not scroll the frame away.
                frame = "\n".join(top.top_lines(snap, r, list(spark), args.queue, size[0], size[1] - 1))
                if live is not None:
                    live.update(_text(frame), refresh=True)
                else:
                    sys.stdout.write(frame + "\n\n")
                    sys.stdout.flush()
            shown += 1
            if frames and shown >= frames:
                return EXIT_OK
            time.sleep(args.interval)  # the refresh interval of a live display
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if live is not None:
            live.stop()


def _text(frame: str) -> Any:
    from rich.text import Text

    return Text(frame, no_wrap=True, overflow="crop")  # plain text: no markup is read from Redis's values


def _live() -> Any:
    try:
        from rich.live import Live
    except ImportError:
        return None  # no rich: frames are printed as plain text
    live = Live(auto_refresh=False)
    live.start()
    return live


def cmd_metrics(args: argparse.Namespace) -> int:
    try:
        from rollout_queue.ops import metrics
    except ImportError as exc:
        raise UsageError(f"the exporter needs prometheus-client ({exc}): pip install 'rollout-queue[metrics]'") from exc
    view = open_view(args)
    for keys in view.layout.keys:  # NotFound (exit 4) before serving: a mistyped --queue, a missing partition
        view.run(views.require_queue(keys))
    if args.once:
        sys.stdout.write(metrics.exposition(view))
        return EXIT_OK
    server, _ = metrics.serve(view, args.port, args.addr)
    print(f"rollout-queue: serving metrics of queue {args.queue} on http://{args.addr}:{server.server_port}/metrics",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("stats", help="one snapshot: states, staleness, evictions, attempts, workers, leases")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_full(p)
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("top", help="live stats with rates (groups/s in and out) and a sparkline")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    p.add_argument("--iterations", type=int, default=0, help="stop after this many frames (default: until Ctrl-C)")
    p.add_argument("--once", action="store_true", help="one frame, then exit (same as --iterations 1)")
    p.add_argument("--history", type=int, default=40, help="frames in the sparkline (default 40)")
    p.add_argument("--json", action="store_true", help="one JSON object per frame")
    p.set_defaults(func=cmd_top)

    p = sub.add_parser("metrics", help="serve Prometheus metrics of the queue (needs the `metrics` extra)")
    p.add_argument("--port", type=int, default=9464, help="port to serve /metrics on (default 9464; 0: any free)")
    p.add_argument("--addr", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1, loopback; 0.0.0.0 for every interface, e.g. in a container)")
    p.add_argument("--once", action="store_true", help="print one scrape on stdout and exit")
    p.set_defaults(func=cmd_metrics)
