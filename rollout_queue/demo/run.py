"""One demo run, end to end: private Redis, tiny model, producer, worker processes, reaper, GRPO
trainer, dashboard, an optional worker kill, then the ledger check.

Roles and where they run: the producer, the reaper and the dashboard are threads of this process,
each with its own connection; the trainer runs on the main thread; the workers are separate
processes (``python -m rollout_queue.workers``), as they would be on GPU hosts. Admission is held closed until
every worker is up, so both ``--compare`` modes start their clocks from the same point.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import redis

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.config import QueueConfig, StalenessMode
from rollout_queue.rl.producer import GroupBuilder, ProducePlan, load_records, run_producer
from rollout_queue.ops.reaper import run_reaper
from rollout_queue.demo.dashboard import Dashboard, Events
from rollout_queue.demo.fleet import WorkerProcess, split_cpus, start_workers
from rollout_queue.demo.grpo import GrpoSettings, GrpoTrainer, StepRecord, TrainerState
from rollout_queue.demo.ledger import LedgerCheck, check_ledger
from rollout_queue.demo.task import demo_task


@dataclass(frozen=True)
class DemoOptions:
    """Everything a run needs; ``max_staleness=None`` is the strictly on-policy mode."""

    url: str
    engine: str
    model_dir: Path
    run_dir: Path
    steps: int = 80
    batch_groups: int = 8
    n: int = 8
    max_tokens: int = 16
    lr: float = 5e-4
    max_staleness: int | None = 2
    workers: int = 2
    kill_worker_after: float | None = None
    target: float = 0.8
    seed: int = 0
    worker_start_timeout_s: float = 300.0
    label: str = "async"
    task: str = "digits"  # demo/task.py: digits, tools (multi-turn trajectories against an environment), tools-heavy
    staleness_mode: StalenessMode | None = None  # QueueConfig.staleness_mode; None: the queue's default (continue)
    pin_cpus: bool = False  # --compare: trainer and workers on disjoint CPUs, like separate GPU pools


@dataclass
class RunResult:
    """What the summary prints about one run."""

    options: DemoOptions
    queue: str
    records: list[StepRecord]
    ledger: LedgerCheck | None = None
    startup_s: float = 0.0
    training_s: float = 0.0
    lost_attempts: int = 0
    killed: list[str] = field(default_factory=list)
    error: str | None = None
    #: source_ids of the task's long groups (a heavy-tailed task's slow tools) among those enqueued
    long_sources: frozenset[str] = frozenset()
    stale_evictions: int = 0  # completed groups the queue sent back to be generated again as too stale
    tokens_per_trained: float | None = None  # tokens generated per token trained (1.0: nothing thrown away)

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.records]

    def reward_at(self, end: bool) -> float:
        window = self.rewards[-3:] if end else self.rewards[:3]
        return sum(window) / len(window) if window else 0.0

    def metric_at(self, end: bool) -> float | None:
        """The task's own metric (tools: the secret rate), mean of the first or last 3 steps."""
        values = [r.metric for r in self.records if r.metric is not None]
        window = values[-3:] if end else values[:3]
        return sum(window) / len(window) if window else None

    @property
    def max_staleness_seen(self) -> int:
        """The oldest token's staleness, largest over every lease."""
        return max((r.staleness_max for r in self.records), default=0)

    @property
    def newest_staleness_seen(self) -> int:
        """The newest tokens' staleness (a trajectory's last model turn), largest over every lease."""
        return max((r.newest_staleness_max for r in self.records), default=0)

    @property
    def staleness_mode(self) -> str:
        return self.options.staleness_mode or QueueConfig.staleness_mode

    def long_trained(self, until_step: int | None = None) -> int:
        """Long groups trained (committed), all steps or up to ``until_step``."""
        return sum(1 for r in self.records if until_step is None or r.step <= until_step
                   for source in r.sources if source in self.long_sources)

    def long_span_max(self) -> int:
        """The most policy versions a trained long group's sample spanned."""
        return max((span for r in self.records for source, span in zip(r.sources, r.spans)
                    if source in self.long_sources), default=0)

    def within_bound(self) -> bool:
        """No lease held a group staler than the queue's mode allows. On-policy: nothing stale at all.
        ``drop``: every token within the bound, except in groups the fairness rule widened (only once a
        group was evicted for staleness), whose newest tokens must be; ``continue``: the newest tokens
        within the bound (older ones past it are importance-corrected in the loss, or masked); ``pace`` bounds nothing."""
        bound = self.options.max_staleness
        if bound is None:
            return self.max_staleness_seen == 0
        if self.staleness_mode == "pace" or self.max_staleness_seen <= bound:
            return True
        widened = self.staleness_mode == "drop" and self.stale_evictions > 0
        return (self.staleness_mode == "continue" or widened) and self.newest_staleness_seen <= bound

    def reached(self) -> StepRecord | None:
        """The first step at which the mean reward of the last 3 steps reached the target."""
        for i in range(len(self.records)):
            window = self.records[max(0, i - 2):i + 1]
            if len(window) == 3 and sum(r.reward for r in window) / 3 >= self.options.target:
                return self.records[i]
        return None

    @property
    def ok(self) -> bool:
        return self.error is None and self.ledger is not None and self.ledger.ok and self.within_bound()


def queue_config(options: DemoOptions) -> QueueConfig:
    """Admission control at ``batch_groups``: generation runs at most max_staleness + 1 batches ahead.
    ``staleness_mode`` only when given: otherwise the queue's default, as a user's queue would have.
    ``worker_timeout_s`` 3 s when a worker is to be killed (the recovery shows within seconds), else
    10 s: with no kill planned (``--compare``), a worker starved of its CPU by other work on a shared
    machine is not dead (a --compare run here lost both workers at load average 10 with 3 s)."""
    mode = QueueConfig.staleness_mode if options.staleness_mode is None else options.staleness_mode
    silence = 3.0 if options.kill_worker_after else 10.0
    return QueueConfig(max_staleness=options.max_staleness, batch_groups=options.batch_groups,
                       max_completed_groups=4 * options.batch_groups, worker_timeout_s=silence, lease_timeout_s=120.0,
                       hold_timeout_s=options.worker_start_timeout_s + 60, staleness_mode=mode)


def _thread(target: Callable[..., Any], *args: Any, name: str) -> threading.Thread:
    t = threading.Thread(target=target, args=args, name=name, daemon=True)
    t.start()
    return t


class DemoRun:
    """One run (see the module docstring); ``execute()`` returns its RunResult."""

    def __init__(self, options: DemoOptions, console: Any) -> None:
        self.o, self.console = options, console
        self.name = f"demo-{options.label}-{int(time.time() * 1000) % 10**9}"
        self.events = Events(echo=None if console.is_terminal else lambda line: console.print(line, highlight=False))
        self.stop = threading.Event()
        self.state = TrainerState()
        self.fleet: list[WorkerProcess] = []
        self.result = RunResult(options, self.name, [])
        self._queues: list[RolloutQueue] = []
        self._affinity: set[int] | None = None
        # (trainer CPUs, worker CPUs), computed before this thread is pinned to the first half
        self.split = split_cpus() if options.pin_cpus else None

    def queue(self, config: QueueConfig | None = None) -> RolloutQueue:
        q = RolloutQueue.from_url(self.o.url, self.name, config)
        self._queues.append(q)
        return q

    def execute(self) -> RunResult:
        o = self.o
        q = self.queue(queue_config(o))
        self._pin_trainer()
        hold = q.hold(timeout_s=o.worker_start_timeout_s + 30, reason="demo: until every worker has started")  # nothing is generated before all workers are up
        self.records, self.plan, tokenizer = self._dataset()
        stats_q = self.queue()
        bound = o.max_staleness
        facts = {"queue": self.name, "redis": o.url, "engine": f"{o.engine} x{o.workers}",
                 "mode": "strictly on-policy" if bound is None else
                 f"async, max_staleness {bound}, staleness_mode {self.result.staleness_mode}"}
        dashboard = Dashboard(self.console, f"rollout-queue demo: GRPO on a tiny model ({o.label})", facts,
                              self.state, self.events, self.fleet, stats_q.stats, o.steps, bound).start()
        threads: list[threading.Thread] = []
        try:
            threads += [_thread(self._produce, self.records, self.plan, tokenizer, name="producer"),
                        _thread(run_reaper, self.queue(), 0.5, self.stop, name="reaper")]
            started = time.monotonic()
            self._start_fleet()
            settings = GrpoSettings(steps=o.steps, batch_groups=o.batch_groups, lr=o.lr, seed=o.seed,
                                    threads=max(1, (os.cpu_count() or 2) // 2))
            trainer = GrpoTrainer(self.queue(), o.model_dir, o.run_dir / self.name / "weights", settings,
                                  checkpoint_dir=o.run_dir / self.name / "checkpoints", stop=self.stop,
                                  state=self.state)
            self._wait_for_workers(stats_q)
            self.result.startup_s = time.monotonic() - started
            hold.release()
            self.events.add(f"all workers up after {self.result.startup_s:.1f}s: admission open, training starts")
            threads.append(_thread(self._watch_fleet, name="fleet-watch"))
            if o.kill_worker_after:
                threads.append(_thread(self._kill_later, stats_q, name="killer"))
            trainer.run()
        except Exception as exc:  # reported in the summary with the worker logs; cleanup still runs
            self.result.error = f"{type(exc).__name__}: {exc}"
            self.events.add(f"run failed: {self.result.error}")
        finally:
            self._finish(dashboard, threads, stats_q)
        return self.result

    def _start_fleet(self) -> None:
        o = self.o
        # Strictly on-policy, a sample that spans an update is stale whatever the mode: abort frees the
        # engine at once. With a staleness bound, continue (the workers' default) throws nothing away.
        weights_mode = "abort" if o.max_staleness is None else "continue"
        split = self.split
        task = demo_task(o.task)
        self.fleet.extend(start_workers(o.workers, url=o.url, queue=self.name, engine=o.engine, model_dir=o.model_dir,
                                        log_dir=o.run_dir / self.name, reward=task.reward, max_tokens=o.max_tokens,
                                        weights_mode=weights_mode, cpus=split[1] if split else None,
                                        extra=task.worker_args(o.max_tokens)))
        pinned = f", workers on CPUs {sorted(split[1])}, trainer on {sorted(split[0])}" if split else ""
        self.events.add(f"started {o.workers} {o.engine} workers (weights mode {weights_mode}{pinned})")

    def _pin_trainer(self) -> None:
        """Keep the trainer (this thread, and the threads and torch workers it starts) off the workers'
        CPUs, as separate GPU pools would; restored in _finish."""
        if self.split:
            self._affinity = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.split[0])

    def _dataset(self) -> tuple[Any, ProducePlan, Any]:
        from transformers import AutoTokenizer

        o = self.o
        task = demo_task(o.task)
        path = task.write_dataset(o.run_dir / self.name / "prompts.jsonl", o.steps * o.batch_groups, o.seed)
        plan = ProducePlan(name="demo", n=o.n, prompt_field="prompt", shuffle=True, seed=o.seed,
                           metadata_fields=task.metadata_fields)
        records = load_records(path)
        if task.is_long is not None:
            builder = GroupBuilder(plan, records)
            groups = (builder.group(k) for k in range(builder.total))
            self.result.long_sources = frozenset(g.source_id for g in groups if task.is_long(g.metadata))
        return records, plan, AutoTokenizer.from_pretrained(o.model_dir)

    def _produce(self, records: Any, plan: ProducePlan, tokenizer: Any) -> None:
        report = run_producer(self.queue(), records, plan, max_backlog=4 * self.o.batch_groups,
                              batch_size=self.o.batch_groups, stop=self.stop, tokenize=tokenizer.encode)
        if report.done:
            self.events.add(f"producer: all {report.total} source groups enqueued (n={plan.n} each)")

    def _wait_for_workers(self, q: RolloutQueue) -> None:
        deadline = time.monotonic() + self.o.worker_start_timeout_s
        while q.stats().workers_alive < len(self.fleet):
            dead = [w for w in self.fleet if w.status() != "running"]
            if dead:
                hint = " (if vLLM is broken here, pass --engine torch)" if self.o.engine == "vllm" else ""
                raise RuntimeError(f"{dead[0].worker_id} {dead[0].status()} while starting{hint}:\n"
                                   f"{dead[0].log_tail()}")
            if time.monotonic() > deadline or self.stop.wait(0.2):
                raise TimeoutError(f"workers not up after {self.o.worker_start_timeout_s}s")

    def _watch_fleet(self) -> None:
        """Stop the run when no worker is left: the trainer would otherwise wait for data forever."""
        while not self.stop.wait(0.5):
            if all(w.status() != "running" for w in self.fleet):
                self.result.error = "every worker process exited; see their logs below"
                self.events.add(self.result.error)
                self.stop.set()

    def _kill_later(self, q: RolloutQueue) -> None:
        """SIGKILL the first worker ``kill_worker_after`` s into training, at an instant it owns executing
        work (so the recovery has something to recover), then report what the reaper did."""
        while self.state.started_at is None:
            if self.stop.wait(0.1):
                return
        if self.stop.wait(max(0.0, self.state.started_at + float(self.o.kill_worker_after or 0) - time.monotonic())):
            return
        victim = self.fleet[0]
        client = redis.Redis.from_url(self.o.url)
        try:
            owned = _owned(client, q, victim.worker_id)
            deadline = time.monotonic() + 10
            while not owned and time.monotonic() < deadline and not self.stop.wait(0.01):
                owned = _owned(client, q, victim.worker_id)
        finally:
            client.close()
        before = q.stats().terminals["lost"]
        victim.kill()
        self.result.killed.append(victim.worker_id)
        self.events.add(f"killed {victim.worker_id} (SIGKILL, pid {victim.pid}) while it owned {owned} "
                        "executing groups")
        deadline = time.monotonic() + 30
        while not self.stop.wait(0.2) and time.monotonic() < deadline:
            st = q.stats()
            if st.terminals["lost"] > before or (not owned and st.workers_alive < len(self.fleet)):
                self.events.add(f"reaper: {victim.worker_id} silent past worker_timeout_s; "
                                f"{st.terminals['lost'] - before} attempts requeued (terminal lost); the other "
                                "worker generates them again")
                return

    def _finish(self, dashboard: Dashboard, threads: list[threading.Thread], q: RolloutQueue) -> None:
        self.result.training_s = self.state.records[-1].elapsed_s if self.state.records else 0.0
        self.result.records = list(self.state.records)
        self.stop.set()  # first: the fleet watch must not read the workers' drain below as a failure
        for w in self.fleet:
            w.stop(timeout_s=15)
        for t in threads:
            t.join(timeout=10)
        dashboard.stop()
        if self._affinity:
            os.sched_setaffinity(0, self._affinity)
        stats = q.stats()
        self.result.lost_attempts = stats.terminals["lost"]
        self.result.stale_evictions = stats.evictions.get("stale", 0)
        self.result.tokens_per_trained = stats.waste.per_trained
        client = redis.Redis.from_url(self.o.url)
        try:
            trained = [e for r in self.result.records for e in r.entry_ids]
            builder = GroupBuilder(self.plan, self.records)
            expected = [builder.source_id(k) for k in range(builder.total)]
            self.result.ledger = check_ledger(q, client, expected, trained)
        finally:
            client.close()
            for queue in self._queues:
                queue.close()


def _owned(client: redis.Redis, q: RolloutQueue, worker_id: str) -> int:
    """How many entries ``worker_id`` owns in the PEL (its executing attempts)."""
    return len(client.xpending_range(q.keys["src"], "rollout", "-", "+", 1000, consumername=worker_id))
