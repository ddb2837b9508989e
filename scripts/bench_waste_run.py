"""One arm of scripts/bench_waste.py through the shipped processes, and the figures of a row.

``ArmRun`` owns a run's processes and what it records: the step each group was submitted at (the
producer's progress), each trained group's step and sample lengths (the trainer), each worker's
tokens by how its attempts ended (its ``worker closed`` line), what was left over, the queue's
eviction counts. ``row`` turns that into the figures bench_waste.py's docstring defines; the
reference arm's lengths come in from outside. It decides nothing the queue decides: every group
moves through the public API (produce, reserve and complete in the workers, lease, commit, publish).
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import percentile
from bench_waste import WORKLOADS, Arm, Cell, queue_config

from rollout_queue import CompletedGroup, QueueConfig, RolloutQueue
from rollout_queue.demo.fleet import WorkerProcess
from rollout_queue.integrations.stream import derive_admission
from rollout_queue.ops.reaper import run_reaper
from rollout_queue.rl.producer import GroupBuilder, ProducePlan, ProduceReport, load_records, run_producer
from rollout_queue.rl.trainer import staleness_bound

#: An arm that has not trained its steps after twice their own time plus this many seconds is called
#: stalled and ended there (its row says so): generation that never delivers must not hold the run.
STALL_S = 60.0


@dataclass
class Trained:
    source_id: str
    kind: str
    step: int
    lengths: list[int]
    past_bound: int = 0  # model tokens more than max_staleness versions behind the lease's version


@dataclass
class Record:
    """What one arm observed (ArmRun fills it)."""

    first: set[str] = field(default_factory=set)  # the plan's first steps x batch_groups groups
    submitted: dict[str, int] = field(default_factory=dict)  # source_id -> trainer step at submission
    kinds: dict[str, str] = field(default_factory=dict)  # source_id -> long / short
    trained: list[Trained] = field(default_factory=list)
    generated: dict[str, int] = field(default_factory=dict)  # ending -> tokens, over the workers
    leftover_groups: int = 0
    leftover_tokens: int = 0
    evictions: dict[str, int] = field(default_factory=dict)
    admission_waits: int = 0  # reserves admission control sent away with nothing (the queue's counter)
    config: dict[str, Any] = field(default_factory=dict)  # the settings in force (effective_config)
    steps: int = 0
    wall_s: float = 0.0
    stalled: bool = False
    drain_deadline: bool = False
    versions: int = 0
    exit_codes: list[int | None] = field(default_factory=list)  # each worker's, after its drain (0: clean)


class Versions:
    """Publishes policy version ``v`` after step ``v``, through an admission hold as trainers do. The
    torch and vLLM rows publish the same weights every time (the workers reload them): each prompt's
    lengths stay those of the reference, so a shifted length distribution is the queue's doing."""

    def __init__(self, q: RolloutQueue, cell: Cell, model: Any) -> None:
        self.q, self.model = q, model
        self.publisher = None
        if model is not None:
            from rollout_queue.weights.publisher import WeightPublisher

            self.publisher = WeightPublisher(q, cell.tmp / q.name / "weights", keep=4)

    def publish(self, version: int) -> None:
        if self.publisher is not None:
            self.publisher.publish(self.model, version)
            return
        hold = self.q.hold(timeout_s=60)
        try:
            hold.record_weight_update(version, f"scripted-v{version}")  # the scripted engine loads any URI
        finally:
            hold.release()


class ArmRun:
    """Runs one cell (bench_waste.py's docstring) and returns its Record."""

    def __init__(self, cell: Cell, model: Any) -> None:
        self.cell, self.model = cell, model
        self.name = f"waste-{cell.engine}-{cell.workload}-{cell.arm_name}-{uuid.uuid4().hex[:6]}"
        self.record = Record()
        self.step = 0  # read by the producer's thread: the step a group is submitted at
        self.stop = threading.Event()
        self.queues: list[RolloutQueue] = []
        self.fleet: list[WorkerProcess] = []

    def queue(self, config: QueueConfig | None = None) -> RolloutQueue:
        q = RolloutQueue.from_url(self.cell.url, self.name, config)
        self.queues.append(q)
        return q

    def run(self) -> Record:
        q = self.queue(queue_config(self.cell.arm, self.cell.sizes))
        hold = q.hold(timeout_s=600, reason="bench: until every worker is up")
        if self.cell.arm.admission == "derived":  # as TrainingStream does: the groups per published version
            derive_admission(q, self.cell.sizes.batch_groups)
        self.record.config = effective_config(q.config, self.cell.arm)
        records, plan, builder = self.dataset()
        self.fleet = fleet = self.start_fleet()
        threads: list[threading.Thread] = []
        try:
            self.wait_for(fleet, q)
            threads = [self.thread(self.produce, records, plan, builder),
                       self.thread(run_reaper, self.queue(), 0.5, self.stop)]
            hold.release()
            started = time.perf_counter()
            self.train(q, Versions(q, self.cell, self.model))
            self.record.wall_s = time.perf_counter() - started
        finally:
            self.stop.set()  # the producer first: nothing new once training is over
            self.record.exit_codes = [w.stop(timeout_s=90) for w in fleet]
            self.read_logs(fleet)
            self.count_leftover(q)
            for t in threads:
                t.join(30)
            stats = q.stats()
            self.record.evictions = dict(stats.evictions)
            self.record.admission_waits = int(stats.counters.get("admission_waits", 0))
            for each in self.queues:
                each.close()
        return self.record

    def dataset(self) -> tuple[list[dict[str, Any]], ProducePlan, GroupBuilder]:
        """The workload's records (written as the producer's JSONL), its plan, and the plan's first
        steps x batch_groups groups, what a waste-free FIFO run trains."""
        s = self.cell.sizes
        records = WORKLOADS[self.cell.workload].records(40 * s.trained_groups)
        path = self.cell.tmp / self.name / "prompts.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        plan = ProducePlan(name="bench", n=s.n, prompt_field="prompt", id_field="id",
                           metadata_fields=("kind", "turns", "tool_s"))
        builder = GroupBuilder(plan, load_records(path))
        self.record.first = {builder.source_id(k) for k in range(s.trained_groups)}
        return records, plan, builder

    def thread(self, target: Any, *args: Any) -> threading.Thread:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        return t

    def start_fleet(self) -> list[WorkerProcess]:
        from bench_waste import worker_argv

        logs = self.cell.tmp / self.name
        return [WorkerProcess(f"w{i}", worker_argv(self.cell, self.name, i), logs / f"w{i}.log").start()
                for i in range(self.cell.spec.workers)]

    def wait_for(self, fleet: list[WorkerProcess], q: RolloutQueue) -> None:
        deadline = time.monotonic() + 300
        while q.stats().workers_alive < len(fleet):
            dead = [w for w in fleet if w.status() != "running"]
            if dead or time.monotonic() > deadline:
                culprit = (dead or fleet)[0]
                raise RuntimeError(f"{self.name}: worker {culprit.worker_id} {culprit.status()} while starting:\n"
                                   f"{culprit.log_tail()}")
            self.stop.wait(0.2)  # polling the queue's worker count, bounded by the deadline

    def produce(self, records: list[dict[str, Any]], plan: ProducePlan, builder: GroupBuilder) -> None:
        """The shipped producer; each call's new groups are noted at the trainer's step of the moment."""
        s = self.cell.sizes
        done = [0]

        def progress(report: ProduceReport) -> None:
            for k in range(done[0], report.cursor):
                sid = builder.source_id(k)
                self.record.submitted[sid] = self.step
                self.record.kinds[sid] = str(records[k]["kind"])
            done[0] = max(done[0], report.cursor)

        run_producer(self.queue(), builder.records, plan, max_backlog=4 * s.batch_groups,
                     batch_size=s.batch_groups, stop=self.stop, on_progress=progress)

    def train(self, q: RolloutQueue, versions: Versions) -> None:
        """Lease, "train", commit, publish, for ``steps`` steps; the reference goes on until it has
        trained the plan's first groups. Ends early, stalled, past its time budget (STALL_S)."""
        s, spec = self.cell.sizes, self.cell.spec
        bound = staleness_bound(q)  # as grpo_loss judges a token
        deadline = time.monotonic() + 2 * s.steps * spec.train_s + STALL_S
        while self.step < s.steps or (not self.cell.arm.updates and not self.covered()):
            if time.monotonic() > deadline:
                self.record.stalled = True
                break
            lease = q.lease(s.batch_groups, block_ms=500)
            if lease is None:
                if all(w.status() != "running" for w in self.fleet):
                    break  # no worker left to generate: the exit codes say why
                continue
            for g in lease.groups:
                self.record.trained.append(trained(g, self.step, lease.version, bound))
            time.sleep(spec.train_s)  # the optimizer step: the pace generation has to keep
            lease.commit()
            self.step += 1
            if self.cell.arm.updates:
                versions.publish(self.step)
                self.record.versions = self.step
        self.record.steps = self.step

    def covered(self) -> bool:
        return self.record.first <= {t.source_id for t in self.record.trained}

    def read_logs(self, fleet: list[WorkerProcess]) -> None:
        import orjson

        for w in fleet:
            for line in w.log_path.read_bytes().splitlines():
                if not line.startswith(b"{"):
                    continue  # an engine's own output (vLLM prints its own lines)
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if rec.get("event") == "WorkerClosed":
                    for key, value in rec.items():
                        if key.startswith("tokens_"):
                            ending = key[len("tokens_"):]
                            self.record.generated[ending] = self.record.generated.get(ending, 0) + int(value)
                self.record.drain_deadline |= rec.get("event") == "DrainDeadline"

    def count_leftover(self, q: RolloutQueue) -> None:
        """Fresh completions still buffered at the end: neither trained nor thrown away yet."""
        while (lease := q.lease(64, partial=True)) is not None:
            self.record.leftover_groups += len(lease.groups)
            self.record.leftover_tokens += sum(s.model_tokens for g in lease.groups for s in g.samples)
            lease.rollback()


def effective_config(config: QueueConfig, arm: Arm) -> dict[str, Any]:
    """What an arm really runs with, as the queue and the workers see it (an arm that leaves a setting
    to its default gets whatever the default is today): the workers' weights mode, and the queue's
    admission, staleness mode, fairness bound and progress-record limit once the trainer sized it."""
    from rollout_queue.workers.cli import defaults

    return {"weights_mode": arm.weights_mode or str(defaults()["weights_mode"]),
            "batch_groups": config.batch_groups if isinstance(config.batch_groups, int) or config.batch_groups is None
            else str(config.batch_groups),  # DERIVED: not sized (derive_admission was refused or unanswered)
            "staleness_mode": config.staleness_mode, "max_stale_evictions": config.max_stale_evictions,
            "max_staleness": config.max_staleness, "max_partial_bytes": config.max_partial_bytes}


def trained(g: CompletedGroup, step: int, version: int, bound: int) -> Trained:
    """A leased group as trained at ``step``; ``past_bound`` counts its model tokens generated more than
    ``bound`` versions before the lease's ``version`` (per token, by ``Sample.token_versions``): the
    ones a trainer masks or importance-corrects (grpo_loss's ``stale_tokens``, the same rule)."""
    past = sum(1 for s in g.samples for v, m in zip(s.token_versions, s.loss_mask) if m and version - v > bound)
    return Trained(g.group.source_id, str(g.group.metadata.get("kind", "short")), step,
                   [s.model_tokens for s in g.samples], past)


# -- figures ------------------------------------------------------------------------------------------


def ks_distance(a: list[int], b: list[int]) -> float:
    """The two-sample Kolmogorov-Smirnov distance: the largest gap between the empirical CDFs."""
    if not a or not b:
        return float("nan")
    xs, ys = sorted(a), sorted(b)
    return max(abs(bisect.bisect_right(xs, v) / len(xs) - bisect.bisect_right(ys, v) / len(ys)) for v in set(xs + ys))


def decile_share(lengths: list[int], reference: list[int]) -> float:
    """The share of ``lengths`` at or above the reference's 90th percentile, over the reference's share."""
    if not lengths or not reference:
        return float("nan")
    cut = percentile([float(x) for x in reference], 90)
    ref = sum(x >= cut for x in reference) / len(reference)
    return (sum(x >= cut for x in lengths) / len(lengths)) / ref


def reference_lengths(rec: Record) -> list[int]:
    """The reference arm's sample lengths of the plan's first groups (the same prompts, no updates)."""
    return [x for t in rec.trained if t.source_id in rec.first for x in t.lengths]


def row(cell: Cell, rec: Record, reference: list[int] | None) -> dict[str, Any]:
    """The figures of one arm: tokens over its whole run; lengths, waits and groups never trained over
    its first ``steps`` steps (the reference trains on past them only for its lengths)."""
    steps = cell.sizes.steps
    window = [t for t in rec.trained if t.step < steps]
    lengths = [x for t in window for x in t.lengths]
    trained_tokens = sum(x for t in rec.trained for x in t.lengths)
    generated = sum(rec.generated.values())
    completed, aborted = rec.generated.get("completed", 0), rec.generated.get("aborted", 0)
    per = (lambda x: x / trained_tokens) if trained_tokens else (lambda x: float("nan"))
    trained_at = {t.source_id: t.step for t in window}
    waits = [trained_at[sid] - rec.submitted[sid] for sid in trained_at if sid in rec.submitted]
    first_long = [sid for sid in rec.first if rec.kinds.get(sid) == "long"]
    return {
        "engine": cell.engine, "workload": cell.workload, "arm": cell.arm_name,
        "weights_mode": rec.config.get("weights_mode", cell.arm.weights_mode), "admission": cell.arm.admission,
        "updates": cell.arm.updates, "queue": dict(cell.arm.queue), "worker_args": list(cell.arm.worker_args),
        "config": rec.config, "admission_waits": rec.admission_waits,
        "steps": rec.steps, "versions": rec.versions, "wall_s": rec.wall_s,
        "s_per_step": rec.wall_s / rec.steps if rec.steps else float("nan"),
        "trained_groups": len(rec.trained), "trained_tokens": trained_tokens,
        "generated": rec.generated, "generated_tokens": generated,
        "leftover_groups": rec.leftover_groups, "leftover_tokens": rec.leftover_tokens,
        "gen_per_trained": per(generated - rec.leftover_tokens), "gen_per_trained_all": per(generated),
        "aborted_per_trained": per(aborted),
        # completed tokens neither trained nor left over: evicted (stale, overflow, a lease's eviction)
        "evicted_per_trained": per(completed - trained_tokens - rec.leftover_tokens),
        "other_per_trained": per(generated - completed - aborted), "evictions": rec.evictions,
        "past_bound_per_trained": per(sum(t.past_bound for t in rec.trained)),
        "ks": ks_distance(lengths, reference) if reference else float("nan"),
        "long_decile": decile_share(lengths, reference) if reference else float("nan"),
        "wait_max": max(waits, default=0), "wait_p99": percentile([float(w) for w in waits], 99),
        "never_trained": len(rec.first - set(trained_at)),
        "long_first": len(first_long), "long_trained": sum(1 for sid in first_long if sid in trained_at),
        "stalled": rec.stalled, "drain_deadline": rec.drain_deadline, "exit_codes": rec.exit_codes,
    }


def run_cells(a: Any) -> list[dict[str, Any]]:
    """Every engine x workload x arm chosen, the reference first in each; one row each."""
    import tempfile

    from bench_tables import waste_cells

    from rollout_queue.devtools.local_server import LocalServer

    # The workers import this directory's bench_waste for their --env, and this checkout's package
    # (as this process does: bench_waste.REPO), wherever they run.
    here = Path(__file__).resolve().parent
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), str(here.parent), os.environ.get("PYTHONPATH")]))
    rows: list[dict[str, Any]] = []
    with LocalServer(a.kind, appendfsync="everysec") as server, tempfile.TemporaryDirectory(prefix="bench-waste-") as d:
        if a.keep:
            d = a.keep  # worker logs, datasets and weights stay there
        for engine in a.engine_list:
            model_dir, model = load_model(engine, a.model, Path(d))
            for workload in a.workload_list or a.sizes.engines[engine].workloads:
                reference: list[int] | None = None
                for arm_name, arm in a.arm_list:
                    if engine not in arm.engines:
                        continue
                    cell = Cell(server.url, engine, model_dir, workload, arm_name, arm, a.sizes, Path(d))
                    started = time.perf_counter()
                    try:
                        rec = ArmRun(cell, model).run()
                    except Exception as exc:  # reported in its row and the exit code; the other arms still run
                        rows.append({"engine": engine, "workload": workload, "arm": arm_name,
                                     "error": f"{type(exc).__name__}: {exc}"})
                    else:
                        if arm_name == "reference":
                            reference = reference_lengths(rec)
                        rows.append({**row(cell, rec, reference), "arm_wall_s": time.perf_counter() - started})
                    print(" | ".join(waste_cells(rows[-1])), flush=True)
    return rows


def load_model(engine: str, model: str | None, tmp: Path) -> tuple[Path | None, Any]:
    """(model folder, the policy the trainer publishes) for torch and vllm; (None, None) for scripted."""
    if engine == "scripted":
        return None, None
    import torch
    from transformers import AutoModelForCausalLM

    from rollout_queue.workers.tiny_model import build_tiny_model

    folder = Path(model) if model else build_tiny_model(tmp / "tiny")
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
