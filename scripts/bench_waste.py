"""Waste (issue 30, section 4): tokens generated per token trained, the lengths trained and how long
groups wait, through the shipped processes, one arm per configuration.

Each arm is one run on a private Redis (``LocalServer``): ``rollout-queue worker`` processes
(``python -m rollout_queue.workers`` with the row's engine, ``--json-logs``), the producer
(``run_producer`` on a thread, a JSONL dataset under a backlog bound), the reaper (``run_reaper``
on a thread) and a trainer (this process) that leases ``batch_groups`` groups, spends ``train_s``
on its "optimizer step", commits, and publishes a new policy version, every step. Admission is held
closed until every worker is up. After the last step the producer stops, the workers drain
(SIGTERM: what is in flight finishes into the buffer) and whatever fresh completion is still
buffered is *left over*: leased once more (a lease evicts what went stale) and rolled back.

Arms differ by configuration only (``ARMS``; ``--arm NAME=JSON`` adds one, its fields as JSON): the
workers' ``--weights-mode`` (null: the worker's default) and any other worker options, the queue's
config (``queue``: any QueueConfig field, ``staleness_mode`` and ``max_stale_evictions`` included;
``admission``: ``batch_groups`` = the lease size under the staleness bound, or ``"derived"``: left to
the trainer, which sizes it as TrainingStream does) and whether versions are published. Every arm
but ``new-default`` names each setting it depends on, so a later change of a default leaves what it
measures alone: ``old-default`` is what shipped before issue 30 (abort, no admission control, no
fairness rule); ``fair-drop``, ``modes-continue`` and ``modes-pace`` run continue mode with admission
control under each staleness mode; ``new-default`` sets nothing, so it runs whatever a trainer-created
queue gets today. Each row records the settings in force (``config``).
``reference`` publishes none: nothing is aborted, goes stale or is evicted, and it trains on until
every one of the plan's first ``steps x batch_groups`` groups is trained; their lengths are what the
other arms' trained lengths are compared with (the same prompts, no updates). keep-kv runs on vLLM
only (when named): the torch engine keeps its KV in every mode and the scripted engine has none.

Workloads, multi-turn so that every engine runs them (``--env``, the classes below):
``heavy``: one group in ten is 10-30 model turns, the others one (10-30x the median length);
``tool``: two model turns around a tool call of 1.5 s on 4 early prompts and 20 ms on the rest
(issue 30's long/short environment); ``single``: one model turn of ``SINGLE_TURNS`` turns' tokens, no
environment (single-turn samples are what partial rollouts continue: the ``abort-partial`` arm
against ``abort``, the same abort mode with progress records off, ``max_partial_bytes=0``).

Figures per arm (bench_tables.py renders them into docs/PERFORMANCE.md):

- ``gen/trained``: the tokens the engines generated (the ``tokens_<ending>`` of each worker's
  ``worker closed`` log line: workers/events.py) less those left over, over the tokens trained
  (the committed samples' model tokens). Per trained token, what was not trained: ``aborted``
  (partial outputs of aborted attempts), ``evicted`` (completed, then evicted as stale by the reaper
  or a lease, or on overflow: completed tokens neither trained nor left over), ``other`` (failed,
  filtered, stale receipts). With progress records (``abort-partial``) an aborted attempt's tokens are
  continued, not thrown away: they count under ``aborted`` when generated and are trained later, so
  ``evicted`` (completed tokens less those trained) goes negative by as much; ``gen/trained`` is exact.
- ``past bound``: the trained model tokens generated more than ``max_staleness`` versions before the
  version their lease was taken at (per token, by ``Sample.token_versions``), per trained token: what
  the trainer has to mask or importance-correct (``grpo_loss``'s ``stale_tokens``, the same rule). 0
  in ``drop`` mode without the fairness rule; ``continue`` and ``pace`` trade eviction for these.
- ``KS``: the two-sample Kolmogorov-Smirnov distance between the trained samples' lengths (model
  tokens) and the reference's lengths of the plan's first ``steps x batch_groups`` groups;
  ``long decile``: the share of trained samples at or above the reference's 90th percentile length,
  over the reference's own share (1.0: the longest decile trained as often as it occurs).
- ``wait``: steps from the step a group was submitted at (the producer's call) to the step that
  trained it, max and p99 over the groups trained; ``never``: of the plan's first ``steps x
  batch_groups`` groups (what a waste-free FIFO run trains), those not trained by the end; ``long``:
  of the long ones among them, those trained.
- ``admission waits``: the queue's ``admission_waits`` counter at the end, reserves admission control
  sent away with nothing (how often generation waited for training; 0 without admission control).

Tokens count over an arm's whole run; lengths, waits and groups never trained over its first
``steps`` steps (the reference trains on past them only for its lengths). An arm whose trainer has
not done its steps after twice their own time plus a minute is ended there, ``stalled``; one whose
workers all exited ends at once, and a worker that did not drain cleanly shows its exit code.

    python scripts/bench_waste.py --results benchmarks/results.json   # full run (~18 min on 2 shared cores)
    python scripts/bench_waste.py --quick                             # scripted arms only, ~1 min
    python scripts/bench_waste.py --engines scripted --arms reference,old-default,new-default --steps 20
    python scripts/bench_waste.py --arm 'pace-k0={"weights_mode": "continue", "admission": true,
                                           "queue": {"staleness_mode": "pace", "max_stale_evictions": 0}}'
    python scripts/bench_waste.py --quick --workloads single --arms reference,abort,abort-partial

vLLM's throughput through the queue with a version every 2 s is scripts/bench_engine.py's
``queue+weights`` row (its table shows it; the waste table quotes it). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

#: This checkout's package, here and in the workers (run_cells puts it on their PYTHONPATH): an
#: installed rollout_queue of another version would disagree with the queue's stored library.
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from rollout_queue.workers.environments import ModelTurn, Step  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # a bar per published version otherwise
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

ENGINES = ("scripted", "torch", "vllm")
#: vLLM's context: the longest trajectory (30 turns of 16 tokens after a prompt of ~15) with room.
MAX_MODEL_LEN = 1024


# -- the workloads' environments (imported by the worker processes: --env bench_waste:Turns) ----------


class Turns:
    """``heavy``: ``metadata["turns"]`` model turns, no observation between them (the model goes on)."""

    def __init__(self) -> None:
        self.turns = 1

    def reset(self, group: Any, slot: int) -> None:
        self.turns = int(group.metadata.get("turns", 1))

    def step(self, turn: ModelTurn) -> Step:
        return Step(done=turn.index + 1 >= self.turns)


class SlowTool:
    """``tool``: after the first model turn a tool call of ``metadata["tool_s"]`` seconds (blocking, on
    the environment's own thread as every synchronous call), then the answer turn."""

    def __init__(self) -> None:
        self.tool_s = 0.02

    def reset(self, group: Any, slot: int) -> None:
        self.tool_s = float(group.metadata.get("tool_s", 0.02))

    def step(self, turn: ModelTurn) -> Step:
        if turn.index == 0:
            time.sleep(self.tool_s)  # the tool's own latency: what this workload is about
            return Step(observation=" tool: ok.")
        return Step(done=True)


def heavy_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """One long group (10-30 turns) at a random place in every ten, the others one turn."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(count):
        if i % 10 == 0:
            long_at = i + rng.randrange(10)
        long = i == long_at
        out.append({"id": f"h{i:06d}", "prompt": f"Story {i}: once upon a time", "kind": "long" if long else "short",
                    "turns": rng.randint(10, 30) if long else 1})
    return out


def tool_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Four long groups among the first 32 (a 1.5 s tool call), every other one 20 ms."""
    long = {3, 11, 19, 27}
    return [{"id": f"t{i:06d}", "prompt": f"Task {i}: call the tool, then answer.",
             "kind": "long" if i in long else "short", "tool_s": 1.5 if i in long else 0.02} for i in range(count)]


def single_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Single-turn prompts (the scripted engine's long tail makes one request in ten 10-20x longer)."""
    return [{"id": f"s{i:06d}", "prompt": f"Essay {i}: write on.", "kind": "short"} for i in range(count)]


#: The single workload's samples are this many turns' tokens long (one request each).
SINGLE_TURNS = 8


@dataclass(frozen=True)
class Workload:
    """The worker's ``--env`` ('' : single-turn, no environment), the dataset's records (the first
    ``count``), the most model turns."""

    env: str
    records: Callable[[int], list[dict[str, Any]]]
    max_turns: int


WORKLOADS = {"heavy": Workload("bench_waste:Turns", heavy_records, 30),
             "tool": Workload("bench_waste:SlowTool", tool_records, 2),
             "single": Workload("", single_records, 1)}


# -- arms and sizes ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One configuration. ``weights_mode``: the workers' ``--weights-mode`` (None: not passed, the
    worker's own default). ``queue``: QueueConfig fields over the bench's own (``staleness_mode``,
    ``max_stale_evictions``, ...: any field, as JSON). ``admission``: admission control off (False),
    ``batch_groups`` = the lease size under the staleness bound (True), or ``"derived"``: left DERIVED,
    the QueueConfig default, and sized by the trainer as the trainer-side helpers do
    (``integrations.stream.derive_admission``, the groups it commits per published version)."""

    weights_mode: str | None = "abort"
    admission: bool | Literal["derived"] = False
    updates: bool = True
    queue: Mapping[str, Any] = field(default_factory=dict)
    worker_args: tuple[str, ...] = ()
    engines: tuple[str, ...] = ENGINES
    #: run when ``--arms`` names none (the partial-rollout arms only when named, on --workloads single)
    listed: bool = True


#: Every arm but ``new-default`` names what it depends on, so a later change of a default does not
#: change what an arm measures; ``new-default`` is the shipped defaults of a trainer-created queue,
#: whatever they are when it runs (each row records the settings in force: ``config``).
ARMS: dict[str, Arm] = {
    "reference": Arm(updates=False),
    # What shipped before issue 30: abort mode, no admission control, no fairness rule.
    "old-default": Arm(queue={"staleness_mode": "drop", "max_stale_evictions": 0}),
    # Issue 30's staleness modes (DESIGN: Staleness modes), each with continue mode and admission control.
    "fair-drop": Arm(weights_mode="continue", admission=True,
                     queue={"staleness_mode": "drop", "max_stale_evictions": 2}),
    "modes-continue": Arm(weights_mode="continue", admission=True, queue={"staleness_mode": "continue"}),
    "modes-pace": Arm(weights_mode="continue", admission=True, queue={"staleness_mode": "pace"}),
    # The shipped defaults: the worker's --weights-mode, batch_groups DERIVED and derived by the
    # trainer, QueueConfig's staleness_mode and max_stale_evictions.
    "new-default": Arm(weights_mode=None, admission="derived"),
    # Earlier arms (issue 30's baseline table), run when named; without the fairness rule, as then.
    "continue": Arm(weights_mode="continue", queue={"staleness_mode": "drop", "max_stale_evictions": 0}, listed=False),
    "keep-kv": Arm(weights_mode="keep-kv", queue={"staleness_mode": "drop", "max_stale_evictions": 0},
                   engines=("vllm",), listed=False),
    "admission": Arm(admission=True, queue={"staleness_mode": "drop", "max_stale_evictions": 0}, listed=False),
    # fair-drop without the fairness rule: what the rule itself changes.
    "drop-k0": Arm(weights_mode="continue", admission=True, queue={"staleness_mode": "drop", "max_stale_evictions": 0},
                   listed=False),
    # Partial rollouts (issue 30 section 1): abort mode, progress records off, then on.
    "abort": Arm(weights_mode="abort", queue={"staleness_mode": "drop", "max_partial_bytes": 0}, listed=False),
    "abort-partial": Arm(weights_mode="abort", queue={"staleness_mode": "drop"}, listed=False),
}


@dataclass(frozen=True)
class EngineSpec:
    """Per engine: worker processes, engine slots each, seconds of a trainer step (generation can make
    about twice what it consumes), (scripted) seconds of a model turn, and the workloads run when
    ``--workloads`` names none (the tool workload's time is its tool's: the scripted engine runs it)."""

    workers: int
    slots: int
    train_s: float
    turn_s: float = 0.0
    workloads: tuple[str, ...] = ("heavy", "tool")


@dataclass(frozen=True)
class Sizes:
    steps: int = 30
    batch_groups: int = 4
    n: int = 4
    max_staleness: int = 2
    turn_tokens: int = 16
    engines: Mapping[str, EngineSpec] = field(default_factory=lambda: {
        "scripted": EngineSpec(workers=2, slots=8, train_s=0.25, turn_s=0.04),
        "torch": EngineSpec(workers=1, slots=16, train_s=0.8, workloads=("heavy",)),
        "vllm": EngineSpec(workers=1, slots=16, train_s=1.2, workloads=("heavy",))})

    @property
    def trained_groups(self) -> int:
        return self.steps * self.batch_groups


QUICK = Sizes(steps=10, engines={"scripted": EngineSpec(workers=2, slots=8, train_s=0.1, turn_s=0.02)})


@dataclass(frozen=True)
class Cell:
    """What one arm runs: the server, the engine and its model, the workload, the arm, the sizes."""

    url: str
    engine: str
    model: Path | None
    workload: str
    arm_name: str
    arm: Arm
    sizes: Sizes
    tmp: Path

    @property
    def spec(self) -> EngineSpec:
        return self.sizes.engines[self.engine]


def engine_args(cell: Cell) -> list[str]:
    """The worker's engine options: the scripted engine's turn, or bench_engine.py's settings."""
    spec = cell.spec
    if cell.engine == "scripted":
        options: dict[str, Any] = {"tokens": cell.sizes.turn_tokens, "latency_s": spec.turn_s,
                                   "jitter_s": spec.turn_s / 2, "max_concurrency": spec.slots}
        if not WORKLOADS[cell.workload].env:  # one request as long as SINGLE_TURNS turns, a tail of 10-20x
            turns_s = spec.turn_s * SINGLE_TURNS
            options.update(tokens=cell.sizes.turn_tokens * SINGLE_TURNS, latency_s=turns_s, jitter_s=turns_s / 2,
                           tail_p=0.1, tail_s=15 * turns_s)
        model: list[str] = []
    else:
        from bench_engine import engine_settings

        options = engine_settings(cell.engine, spec.slots, 0)
        if cell.engine == "vllm":
            # bench_engine's budget covers its 64-token samples; a trajectory here grows to ~500 tokens.
            # Every running request at the longest context fits in one step (the figures in
            # PERFORMANCE.md were measured so); its per-step log stays off.
            options["max_model_len"] = MAX_MODEL_LEN
            options["engine_args"] = {"max_num_batched_tokens": spec.slots * MAX_MODEL_LEN}
        model = ["--model", str(cell.model)]
    return model + [word for key, value in options.items() for word in ("--engine-arg", f"{key}={json.dumps(value)}")]


def worker_argv(cell: Cell, queue: str, index: int) -> list[str]:
    workload = WORKLOADS[cell.workload]
    turns = ["--env", workload.env, "--max-turns", str(workload.max_turns)] if workload.env else []
    tokens = cell.sizes.turn_tokens * (1 if workload.env else SINGLE_TURNS)
    weights_mode = [] if cell.arm.weights_mode is None else ["--weights-mode", cell.arm.weights_mode]
    return [sys.executable, "-m", "rollout_queue.workers", "--url", cell.url, "--queue", queue,
            "--worker-id", f"{queue}-w{index}", "--engine", cell.engine, "--json-logs", "--seed", "0",
            "--temperature", "1.0", "--max-tokens", str(tokens), *turns, *weights_mode,
            "--drain-timeout", "60", "--block-ms", "250", *engine_args(cell), *cell.arm.worker_args]


def queue_config(arm: Arm, sizes: Sizes) -> Any:
    """The arm's QueueConfig: the bench's bounds (``max_staleness``, short worker and long lease
    timeouts), its admission setting, then the arm's ``queue`` fields over them. Raises InvalidInput
    (a ValueError) for a combination QueueConfig refuses (``pace`` with admission off)."""
    from rollout_queue import QueueConfig
    from rollout_queue.core.config import DERIVED

    if arm.admission not in (True, False, "derived"):
        raise ValueError(f"admission must be true, false or \"derived\", got {arm.admission!r}")
    admission = {True: sizes.batch_groups, False: None, "derived": DERIVED}[arm.admission]
    base: dict[str, Any] = {"max_staleness": sizes.max_staleness, "worker_timeout_s": 10.0,
                            "lease_timeout_s": 300.0, "batch_groups": admission}
    return QueueConfig(**{**base, **arm.queue})


def parse_arm(spec: str) -> tuple[str, Arm]:
    """``NAME=JSON`` (the Arm's fields) -> (name, Arm); ValueError says what is wrong."""
    name, sep, body = spec.partition("=")
    if not sep or not name:
        raise ValueError(f"--arm {spec!r}: expected NAME=JSON, e.g. pace={{\"weights_mode\": \"continue\"}}")
    try:
        fields = json.loads(body)
        arm = Arm(**{k: tuple(v) if k in ("worker_args", "engines") else v for k, v in fields.items()})
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:  # not JSON, not an object, no such field
        raise ValueError(f"--arm {name}: {exc}") from exc
    return name, arm


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the scripted engine's arms at small sizes (< 1 min)")
    ap.add_argument("--engines", default=None, help=f"comma-separated, of {','.join(ENGINES)} (default: all; "
                                                    "--quick: scripted)")
    ap.add_argument("--workloads", default=None,
                    help="comma-separated, of heavy,tool (default: scripted both, torch and vllm heavy)")
    ap.add_argument("--arms", default=None, help="only these arms (reference first: the lengths need it)")
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=JSON", help="an arm of its own; repeatable")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per arm")
    ap.add_argument("--kind", default="redis", choices=("redis", "valkey"), help="server binary (default redis)")
    ap.add_argument("--model", default=None, help="a model folder for torch and vllm (default: a tiny Llama)")
    ap.add_argument("--keep", default=None, metavar="DIR",
                    help="run in DIR and keep it: each arm's worker logs, dataset and weights (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the rows to this file")
    ap.add_argument("--results", default=None,
                    help="replace the `waste` section of this results file (benchmarks/results.json: the table of "
                         "docs/PERFORMANCE.md is generated from it)")
    a = ap.parse_args(argv)
    a.sizes = QUICK if a.quick else Sizes()
    if a.steps:
        a.sizes = replace(a.sizes, steps=a.steps)
    a.engine_list = (a.engines or ("scripted" if a.quick else ",".join(ENGINES))).split(",")
    a.workload_list = a.workloads.split(",") if a.workloads else []
    arms = dict(ARMS)
    try:
        arms.update(parse_arm(spec) for spec in a.arm)
    except ValueError as exc:
        ap.error(str(exc))
    chosen = a.arms.split(",") if a.arms else [name for name, arm in arms.items() if arm.listed]
    unknown = (set(chosen) - set(arms)) | (set(a.engine_list) - set(a.sizes.engines)) | (set(a.workload_list) - set(WORKLOADS))
    if unknown:
        ap.error(f"unknown {', '.join(sorted(unknown))} (arms: {', '.join(arms)}; engines at these sizes: "
                 f"{', '.join(a.sizes.engines)}; workloads: {', '.join(WORKLOADS)})")
    for name in chosen:  # a config the queue refuses fails here, not after the arms before it ran
        try:
            queue_config(arms[name], a.sizes)
        except (ValueError, TypeError) as exc:  # InvalidInput is a ValueError; TypeError: no such field
            ap.error(f"arm {name}: {exc}")
    a.arm_list = [(name, arms[name]) for name in sorted(chosen, key=lambda x: x != "reference")]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from bench_common import run_environment, write_rows
    from bench_tables import WASTE_HEAD, waste_cells
    from bench_waste_run import run_cells

    load = os.getloadavg()[0]
    started = time.perf_counter()
    print(" | ".join(WASTE_HEAD), flush=True)
    rows = run_cells(a)
    env = run_environment(load, **{k: v for k, v in asdict(a.sizes).items() if k != "engines"},
                          engines={e: asdict(a.sizes.engines[e]) for e in a.engine_list}, quick=a.quick,
                          wall_s=time.perf_counter() - started)
    print(f"load average {env['loadavg_start']:.2f} -> {env['loadavg_end']:.2f}, {env['cpus']} CPUs, "
          f"{env['wall_s']:.0f} s")
    write_rows("waste", env, rows, a.json, a.results)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    # The run module imports this file as bench_waste (as the workers do for --env): one module, not two.
    sys.modules.setdefault("bench_waste", sys.modules[__name__])
    sys.exit(main())
