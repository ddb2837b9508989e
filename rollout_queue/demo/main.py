"""``rollout-queue demo``: set up (private Redis, tiny model, engine choice), run once or ``--compare``
the strictly on-policy and async modes, print the summary, and say whether the ledger check passed.

Exit status: 0 when every run's ledger check passed and no lease exceeded the staleness bound.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from rollout_queue.core.config import StalenessMode
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.demo.fleet import vllm_available
from rollout_queue.demo.run import DemoOptions, DemoRun, RunResult
from rollout_queue.demo.task import demo_task

ENGINE_NOTE = {
    "vllm": "vLLM (CPU build here): ~10-40 s and ~1 GiB per worker to start, then fast generation",
    "torch": "torch (transformers): starts in seconds; vLLM not installed or not chosen",
}


def choose_engine(engine: str) -> str:
    """'auto': vLLM when it imports here, else torch."""
    if engine != "auto":
        return engine
    return "vllm" if vllm_available() else "torch"


def quiet_libraries() -> None:
    """The dashboard owns the terminal: no per-save progress bars, and only warnings from the
    library's own loggers (the reaper's per-pass lines would scroll the panel away)."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    logging.getLogger("rollout_queue").setLevel(logging.WARNING)


def build_model(run_dir: Path) -> Path:
    from rollout_queue.workers.tiny_model import build_tiny_model

    return build_tiny_model(run_dir / "tiny-model")


def run_demo(*, url: str | None, engine: str, steps: int | None, batch_groups: int, n: int, max_tokens: int | None,
             lr: float, max_staleness: int | None, kill_worker_after: float | None, compare: bool,
             target: float | None, seed: int, keep: bool, console: Any, task: str = "digits",
             staleness_mode: StalenessMode | None = None) -> int:
    """Run the demo; returns the exit status. ``steps``, ``max_tokens`` and ``target`` None: the task's;
    ``staleness_mode`` None: the queue's default."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        os.environ.setdefault(name, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    quiet_libraries()
    run_dir = Path(tempfile.mkdtemp(prefix="rollout-demo-"))
    server = None if url else LocalServer().start()
    results: list[RunResult] = []
    try:
        url = url or server.url  # type: ignore[union-attr]
        chosen = choose_engine(engine)
        spec = demo_task(task)
        target = spec.target if target is None else target
        steps = spec.steps if steps is None else steps
        max_tokens = spec.max_tokens if max_tokens is None else max_tokens
        console.print(f"[bold]task[/]: {spec.description}")
        console.print(f"[bold]engine[/]: {ENGINE_NOTE.get(chosen, chosen)}")
        console.print(f"[bold]redis[/]: {url} ({'private server, AOF on, stopped at exit' if server else 'given'})")
        model_dir = build_model(run_dir)
        base = DemoOptions(url=url, engine=chosen, model_dir=model_dir, run_dir=run_dir, steps=steps,
                           batch_groups=batch_groups, n=n, max_tokens=max_tokens, lr=lr, max_staleness=max_staleness,
                           kill_worker_after=kill_worker_after, target=target, seed=seed, task=task,
                           staleness_mode=staleness_mode)
        for options in plan_runs(base, compare):
            results.append(DemoRun(options, console).execute())
        for result in results:
            print_summary(console, result)
        if compare:
            print_comparison(console, results)
        ok = all(r.ok for r in results)
        if not ok:
            print_failure(console, results, run_dir)
            keep = True
        return 0 if ok else 1
    finally:
        if server is not None:
            server.cleanup()
        if keep:
            console.print(f"run folder kept: {run_dir} (worker logs, weights, checkpoints)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)  # scratch space; nothing in it is needed after the summary


def plan_runs(base: DemoOptions, compare: bool) -> list[DemoOptions]:
    """One run, or --compare's two: strictly on-policy, then async. In both, no worker kill (it would
    skew the timing being compared) and the trainer and the workers on disjoint CPUs, the stand-in
    for separate GPU pools (it slows vLLM's start-up, which the timing excludes). A staleness mode
    is the async run's: strictly on-policy nothing may be stale, whatever the mode would allow."""
    if not compare:
        return [base if base.max_staleness is not None else replace(base, label="on-policy", staleness_mode=None)]
    bound = base.max_staleness if base.max_staleness is not None else 2
    return [replace(base, max_staleness=None, kill_worker_after=None, pin_cpus=True, label="on-policy",
                    staleness_mode=None),
            replace(base, max_staleness=bound, kill_worker_after=None, pin_cpus=True, label="async")]


def print_summary(console: Any, r: RunResult) -> None:
    from rich.table import Table

    o = r.options
    table = Table(title=f"demo summary ({o.label}, {o.engine} workers)", title_justify="left")
    table.add_column("")
    table.add_column("", justify="right")
    bound = "none (on-policy)" if o.max_staleness is None else f"{o.max_staleness}, {r.staleness_mode}"
    reached = r.reached()
    rows = [
        ("reward at start (mean of first 3 steps)", f"{r.reward_at(False):.3f}"),
        ("reward at end (mean of last 3 steps)", f"{r.reward_at(True):.3f}"),
        *_metric_rows(r),
        (f"steps / seconds to reward >= {o.target}",
         f"{reached.step} / {reached.elapsed_s:.1f}s" if reached else "not reached"),
        ("optimizer steps", f"{len(r.records)} of {o.steps}"),
        ("groups trained (committed)", str(sum(x.groups for x in r.records))),
        ("samples trained", str(sum(x.groups for x in r.records) * o.n)),
        ("largest staleness in any lease: oldest / newest tokens (bound, mode)",
         f"{r.max_staleness_seen} / {r.newest_staleness_seen} ({bound})"),
        *_long_rows(r),
        ("worker start-up / training time", f"{r.startup_s:.1f}s / {r.training_s:.1f}s"),
        ("workers killed / attempts requeued as lost", f"{', '.join(r.killed) or 'none'} / {r.lost_attempts}"),
    ]
    ledger = r.ledger
    if ledger is not None:
        rows += [
            ("source groups enqueued (expected)", f"{ledger.enqueued} ({ledger.expected})"),
            ("committed exactly once / twice",
             f"{ledger.state('committed') - ledger.report.committed_twice} / {ledger.report.committed_twice}"),
            ("lost / still owned / dead / filtered", " / ".join(
                str(n) for n in (ledger.state("lost"), ledger.report.unsettled, ledger.state("dead"),
                                 ledger.state("filtered")))),
        ]
    verdict = "[green]PASS[/]" if r.ok else "[red]FAIL[/]"
    rows.append(("ledger check (rollout-queue verify --final, and the trainer's record)", verdict))
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)


def _long_rows(r: RunResult) -> list[tuple[str, str]]:
    """A heavy-tailed task's long groups: how many were trained (by the target too), how many versions
    their samples spanned, and what the queue regenerated to keep the bound."""
    if not r.long_sources:
        return []
    reached = r.reached()
    by_target = f", {r.long_trained(reached.step)} by the target" if reached else ""
    waste = "-" if r.tokens_per_trained is None else f"{r.tokens_per_trained:.2f}"
    return [("long trajectories trained / enqueued", f"{r.long_trained()} / {len(r.long_sources)}{by_target}"),
            ("most policy versions a trained long sample spanned", str(r.long_span_max())),
            ("stale evictions / tokens generated per token trained", f"{r.stale_evictions} / {waste}")]


def _metric_rows(r: RunResult) -> list[tuple[str, str]]:
    """The task's own metric at start and end (tools: the secret rate, which needs the observation)."""
    name = demo_task(r.options.task).metric
    start, end = r.metric_at(False), r.metric_at(True)
    if name is None or start is None or end is None:
        return []
    return [(f"{name} at start / end (mean of 3 steps)", f"{start:.3f} / {end:.3f}")]


def print_comparison(console: Any, results: list[RunResult]) -> None:
    from rich.table import Table

    table = Table(title="strictly on-policy vs. async (same task, steps and workers; trainer idle = waiting for data)",
                  title_justify="left")
    for col in ("mode", "steps to target", "s to target", "train time", "s/step", "trainer idle", "reward end",
                "max staleness (bound)"):
        table.add_column(col, justify="right")
    for r in results:
        reached = r.reached()
        bound = "none" if r.options.max_staleness is None else str(r.options.max_staleness)
        per_step = r.training_s / max(1, len(r.records))
        idle = sum(x.wait_s for x in r.records[1:]) / max(1e-9, r.training_s)
        table.add_row(r.options.label, str(reached.step) if reached else "-",
                      f"{reached.elapsed_s:.1f}" if reached else "-", f"{r.training_s:.1f}s", f"{per_step:.2f}",
                      f"{idle:.0%}", f"{r.reward_at(True):.3f}", f"{r.max_staleness_seen} ({bound})")
    console.print(table)
    if any(r.long_sources for r in results):
        print_long_comparison(console, results)


def print_long_comparison(console: Any, results: list[RunResult]) -> None:
    """A heavy-tailed task's long trajectories in each mode: how soon they were trained, what keeping
    the bound cost (groups regenerated), and how far apart their turns were."""
    from rich.table import Table

    table = Table(title="long trajectories (the slow tool's) in each mode", title_justify="left")
    for col in ("mode", "staleness mode", "trained", "by the target", "stale evictions", "versions spanned (max)",
                "tokens generated / trained"):
        table.add_column(col, justify="right")
    for r in results:
        reached = r.reached()
        table.add_row(r.options.label, "-" if r.options.max_staleness is None else r.staleness_mode,
                      f"{r.long_trained()} / {len(r.long_sources)}",
                      str(r.long_trained(reached.step)) if reached else "-", str(r.stale_evictions),
                      str(r.long_span_max()), "-" if r.tokens_per_trained is None else f"{r.tokens_per_trained:.2f}")
    console.print(table)


def print_failure(console: Any, results: list[RunResult], run_dir: Path) -> None:
    for r in results:
        if r.error:
            console.print(f"[red]{r.options.label}: {r.error}[/]")
        if r.ledger is not None:
            for problem in r.ledger.problems:
                console.print(f"[red]ledger: {problem}[/]")
        log_dir = run_dir / r.queue
        for log in sorted(log_dir.glob("*.log")) if log_dir.exists() else []:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            console.print(f"[dim]--- {log.name} (tail) ---\n{tail}[/]", highlight=False)
