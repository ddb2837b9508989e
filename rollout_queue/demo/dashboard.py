"""The demo's live view: queue states, groups/s, tokens/s, staleness against its bound, the reward
curve, the worker processes and what happened to them. A rich ``Live`` panel on a terminal; plain
progress lines otherwise (CI logs, pipes).

It only reads: the trainer's records, the fleet's process states and ``q.stats()`` on its own
connection. It never changes queue state.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from rollout_queue.core.models import QueueStats
from rollout_queue.demo.grpo import StepRecord, TrainerState

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60, low: float = 0.0, high: float = 1.0) -> str:
    """Values in [low, high] as one line of block characters (the last ``width`` of them)."""
    span = (high - low) or 1.0
    return "".join(BARS[min(len(BARS) - 1, max(0, int((v - low) / span * len(BARS))))] for v in values[-width:])


@dataclass
class Events:
    """Timestamped lines shown under the dashboard (and printed in plain mode)."""

    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    echo: Callable[[str], None] | None = None

    def add(self, text: str) -> None:
        line = f"[{time.monotonic() - self.started:6.1f}s] {text}"
        with self.lock:
            self.lines.append(line)
        if self.echo:
            self.echo(line)


def rates(records: Sequence[StepRecord], window_s: float = 10.0) -> tuple[float, float]:
    """(groups/s, trained response tokens/s) over the last ``window_s`` of training."""
    if len(records) < 2:
        return 0.0, 0.0
    end = records[-1].elapsed_s
    recent = [r for r in records if r.elapsed_s >= end - window_s]
    first = records[len(records) - len(recent) - 1] if len(recent) < len(records) else None
    start = first.elapsed_s if first else 0.0
    span = max(1e-6, end - start)
    return sum(r.groups for r in recent) / span, sum(r.tokens for r in recent) / span


class Dashboard:
    """Renders the run until ``stop()``; ``title`` and ``facts`` head the panel."""

    def __init__(self, console: Any, title: str, facts: dict[str, str], state: TrainerState, events: Events,
                 fleet: Sequence[Any], stats: Callable[[], QueueStats], total_steps: int, bound: int | None) -> None:
        self.console, self.title, self.facts = console, title, facts
        self.state, self.events, self.fleet, self.stats = state, events, fleet, stats
        self.total_steps, self.bound = total_steps, bound
        self.live_mode = bool(console.is_terminal)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: QueueStats | None = None
        self._printed_step = 0

    def start(self) -> "Dashboard":
        self._thread = threading.Thread(target=self._run, name="dashboard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _poll(self) -> None:
        try:
            self._last = self.stats()
        except Exception as exc:  # a view must never kill the run; show the last good snapshot
            self.events.add(f"dashboard: stats failed ({exc!r})")

    def _run(self) -> None:
        if not self.live_mode:
            while not self._stop.wait(0.5):
                self._print_progress()
            self._print_progress()
            return
        from rich.live import Live

        with Live(self.render(), console=self.console, refresh_per_second=4, transient=False) as live:
            while not self._stop.wait(0.25):
                self._poll()
                live.update(self.render())
            self._poll()
            live.update(self.render())

    def _print_progress(self) -> None:
        with self.state.lock:
            records = list(self.state.records)
        if not records or records[-1].step == self._printed_step:
            return
        if records[-1].step - self._printed_step < 5 and records[-1].step < self.total_steps:
            return
        self._poll()
        self._printed_step = records[-1].step
        r = records[-1]
        gps, tps = rates(records)
        st = self._last
        queue = (f"backlog {st.backlog} ready {st.ready} executing {st.executing_groups} completed {st.completed} "
                 f"committed {st.committed}") if st else ""
        self.console.print(f"step {r.step:3d}/{self.total_steps}  reward {r.reward:.3f}  staleness max "
                           f"{max(x.staleness_max for x in records)}  {gps:.1f} groups/s  {tps:.0f} tokens/s  {queue}",
                           highlight=False)

    def render(self) -> Any:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table

        with self.state.lock:
            records = list(self.state.records)
        head = Table.grid(padding=(0, 2))
        head.add_row(*[f"[bold]{k}[/] {v}" for k, v in self.facts.items()])
        queue = Table(title="queue (redis)", title_justify="left", expand=False)
        names = ("backlog", "ready", "executing", "completed", "leased", "committed", "filtered", "dead", "workers")
        for name in names:
            queue.add_column(name, justify="right")
        st = self._last
        if st is not None:
            queue.add_row(str(st.backlog), str(st.ready), str(st.executing_groups), str(st.completed), str(st.leased),
                          str(st.committed), str(st.filtered), str(st.dead),
                          f"{st.workers_alive} alive, {st.workers_silent} silent")
        return Panel(Group(head, queue, self._training(records), self._fleet(), self._events()),
                     title=self.title, border_style="cyan")

    def _training(self, records: list[StepRecord]) -> Any:
        from rich.table import Table

        t = Table.grid(padding=(0, 2))
        if not records:
            t.add_row("[bold]training[/]", "waiting for the workers to start (admission is held until they are up)")
            return t
        gps, tps = rates(records)
        seen = max(r.staleness_max for r in records)
        bound = "none: strictly on-policy" if self.bound is None else str(self.bound)
        ok = "green" if self.bound is None or seen <= self.bound else "red"
        rewards = [r.reward for r in records]
        t.add_row("[bold]step[/]", f"{records[-1].step}/{self.total_steps}  (policy version {records[-1].step})")
        idle = sum(r.wait_s for r in records[1:]) / max(1e-9, records[-1].elapsed_s)
        t.add_row("[bold]throughput[/]", f"{gps:.1f} groups/s   {tps:.0f} tokens/s (trained)   "
                                         f"trainer idle {idle:.0%} (waiting for data)")
        last = records[-1]
        t.add_row("[bold]staleness[/]", f"last lease max {last.staleness_max} mean {last.staleness_mean:.2f}   "
                                        f"largest seen [{ok}]{seen}[/] (bound {bound})")
        t.add_row("[bold]reward[/]", f"start {sum(rewards[:3]) / len(rewards[:3]):.3f}  now {rewards[-1]:.3f}")
        t.add_row("", f"[green]{sparkline(rewards)}[/]")
        return t

    def _fleet(self) -> Any:
        from rich.table import Table

        t = Table.grid(padding=(0, 2))
        for w in self.fleet:
            colour = "green" if w.status() == "running" else "red"
            t.add_row(f"[bold]{w.worker_id}[/]", f"pid {w.pid}", f"[{colour}]{w.status()}[/]")
        return t

    def _events(self) -> Any:
        from rich.text import Text

        with self.events.lock:
            lines = self.events.lines[-6:]
        return Text("\n".join(lines), style="dim")
