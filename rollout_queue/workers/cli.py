"""``rollout-queue worker`` / ``python -m rollout_queue.workers``: one command that runs a generation worker.

Owns argument parsing, building the engine and the scorer, signal handling (SIGTERM and SIGINT
drain; a second signal skips the rest of the drain timeout), ending the process in bounded time once
its work is returned (``ExitDeadline``: user code that never returns must not keep a drained worker
alive) and exit codes. Everything else is ``WorkerRuntime``. ``main`` is a process's entry point:
once a runtime ran, the process ends within ``--exit-grace`` seconds.
Exit codes: 0 drained cleanly, 1 fatal error (owned work was returned first),
2 usage error (or queues that one worker cannot serve together), 3 cannot reach Redis, 4 a queue
does not exist (the worker never creates one unless ``--create``: a mistyped ``--queue`` must not
become a new empty queue that waits forever). A queue that does not exist yet is waited for first,
``--wait-for-queue`` seconds (default 300), because on a cluster the workers often start before the
trainer that creates it; the wait is logged once, and exit 4 follows if it ends first.

``--url`` may name a Redis Cluster (``redis+cluster://host:port``) and ``--partitions P`` (env
ROLLOUT_PARTITIONS) the queues' partition count. ``--queue run-a:3,run-b:1`` serves several queues
by weight (FleetReserver); the policy versions and weights follow the first queue only, and the
others must never publish a version (served.py; docs/DESIGN.md, "One worker, several queues").

Examples::

    python -m rollout_queue.workers --url redis://redis:6379/0 --queue grpo --engine vllm --model /ckpt/policy \\
        --max-tokens 1024 --temperature 1.0 --reward my_rewards:math_verify --filter nonzero_std
    python -m rollout_queue.workers --url ... --queue ... --engine torch --model /ckpt/policy \\
        --engine-arg device=cuda --engine-arg dtype=bfloat16 --engine-arg max_batch_size=64
    python -m rollout_queue.workers --url ... --queue ... --engine scripted --engine-arg latency_s=0.05 \\
        --engine-arg tail_p=0.1 --engine-arg tail_s=2.0      # the test engine, for drills and benchmarks
    rollout-queue --url ... --queue ... worker -- --engine vllm --model /ckpt/policy
    python -m rollout_queue.workers --url redis+cluster://node-1:6379 --partitions 6 \
        --queue eval-a:3,eval-b:1 --engine vllm --model /ckpt/frozen      # two fixed-model queues, 3:1
    python -m rollout_queue.workers --url ... --queue agents --engine vllm --model /ckpt/policy \
        --env my_envs:CodeSandbox --max-turns 6 --trajectory-tokens 8192  # multi-turn trajectories
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any, Collection, Sequence

from redis.exceptions import RedisClusterException

from rollout_queue import Durability, OutcomeUnknown, RolloutQueueError
from rollout_queue.cli.common import CommandParser
from rollout_queue.core.errors import QueueNotFound
from rollout_queue.ops import logs
from rollout_queue.workers.engines.base import Engine, SamplingConfig, make_engine
from rollout_queue.workers.reconcile import DEFAULT_GRACE_S
from rollout_queue.workers.environments import MAX_HUNG, EnvironmentHost, load_environment
from rollout_queue.workers.rewards import Scorer, load_function
from rollout_queue.workers.trajectory import TrajectoryLimits
from rollout_queue.workers.options import DEFAULT_QUEUE_WAIT_S, DEFAULT_SAVE_PROGRESS_EVERY_S
from rollout_queue.workers.runtime import WorkerFailed, WorkerOptions, WorkerRuntime
from rollout_queue.workers.served import ServedQueuesRefused
from rollout_queue.workers.states import RuntimeState

log = logging.getLogger("rollout_queue.workers")

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
DESCRIPTION = __doc__.split("\n")[0]
#: Default seconds the process may take to end once the worker returned its work (--exit-grace).
EXIT_GRACE_S = 10.0


def build_parser() -> argparse.ArgumentParser:
    """The worker's own parser (``python -m rollout_queue.workers``); ``rollout-queue worker`` is the same
    options on a subcommand of the core CLI's tree (cli/processes.py)."""
    p = CommandParser(prog="rollout-queue worker", description=DESCRIPTION, separator_optional=True)
    add_arguments(p)
    return p


def defaults() -> dict[str, Any]:
    """Each option's value when it is not given (its env variable, or the default)."""
    return vars(build_parser().parse_args([]))


def add_arguments(p: argparse.ArgumentParser, inherited: Collection[str] = ()) -> None:
    """Every option of the worker, on ``p``. The options named (by dest) in ``inherited`` get no
    default: an enclosing parser gives it (cli/processes.py)."""

    def default(name: str, value: Any) -> Any:
        return argparse.SUPPRESS if name in inherited else value

    env = os.environ.get
    p.add_argument("--url", default=default("url", env("REDIS_URL")), help="Redis URL (env REDIS_URL)")
    p.add_argument("--queue", default=default("queue", env("ROLLOUT_QUEUE")),
                   help="queue name, or several by weight: run-a:3,run-b:1 (env ROLLOUT_QUEUE)")
    p.add_argument("--partitions", type=int, default=default("partitions", env("ROLLOUT_PARTITIONS") or "1"),
                   metavar="P",
                   help="the queues' partition count (env ROLLOUT_PARTITIONS; default 1)")
    p.add_argument("--create", action="store_true",
                   help="create a queue that does not exist (default: wait --wait-for-queue, then exit 4, nothing "
                        "written)")
    p.add_argument("--wait-for-queue", type=float, metavar="SECONDS",
                   default=default("wait_for_queue", env("ROLLOUT_WAIT_FOR_QUEUE") or DEFAULT_QUEUE_WAIT_S),
                   help="a queue that does not exist yet is waited for this long (its trainer creates it), with "
                        "one log line saying so, then exit 4 (env ROLLOUT_WAIT_FOR_QUEUE; default "
                        f"{DEFAULT_QUEUE_WAIT_S:g}; 0: exit 4 at once)")
    p.add_argument("--engine", choices=["vllm", "torch", "scripted"], default="vllm",
                   help="generation backend; 'scripted' is the model-free test engine")
    p.add_argument("--model", default="", help="model folder (save_pretrained) or hub name")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="engine constructor option, VALUE parsed as JSON when it parses "
                        "(e.g. device=cuda, dtype=bfloat16, max_batch_size=64); repeatable")
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--stop", action="append", default=[], help="stop string; repeatable")
    g.add_argument("--seed", type=int, default=None, help="base seed (each sample derives its own)")
    s = p.add_argument_group("scheduling")
    s.add_argument("--policy", choices=["group", "sample"], default="sample",
                   help="sample: backfill freed sample slots (default); group: at most --max-groups groups")
    s.add_argument("--max-samples", type=int, default=None,
                   help="samples executing at once (default: the engine's max concurrency)")
    s.add_argument("--max-waiting", type=int, default=None, metavar="N",
                   help="sample policy: samples beyond --max-samples the engine may hold waiting for a slot "
                        "(default: two groups less one, so the next group is reserved while n - 1 still wait, "
                        "when --max-samples is the engine's concurrency and the engine is not the torch one, "
                        "else 0; 0: only when n slots are free)")
    s.add_argument("--max-groups", type=int, default=None, help="groups held at once (group policy default 4)")
    s.add_argument("--block-ms", type=int, default=1000, help="longest wait of one reserve call")
    r = p.add_argument_group("rewards")
    r.add_argument("--reward", default=None, help="module:function (or a built-in name, e.g. length_reward)")
    r.add_argument("--filter", default=None, help="module:function (or a built-in name, e.g. nonzero_std)")
    e = p.add_argument_group("environments (multi-turn trajectories)")
    e.add_argument("--env", default=None, metavar="MODULE:CLASS",
                   help="run every sample as a trajectory against this environment (or a built-in: echo); "
                        "its steps' rewards are the reward unless --reward is given")
    e.add_argument("--max-turns", type=int, default=8, help="model turns per trajectory (default 8)")
    e.add_argument("--trajectory-tokens", type=int, default=4096,
                   help="token budget after the prompt, model and observation tokens together (default 4096; "
                        "keep prompt + budget within the model's context)")
    e.add_argument("--trajectory-timeout", type=float, default=600.0,
                   help="seconds one trajectory may take; past it, it ends with the turns finished (default 600)")
    e.add_argument("--env-step-timeout", type=float, default=30.0,
                   help="seconds one environment call may take; past it, the attempt fails (default 30)")
    e.add_argument("--env-max-hung", type=int, default=MAX_HUNG, metavar="N",
                   help="synchronous environment calls still running past their timeout (each holds a thread "
                        "nothing can kill) at which the worker stops and returns its work uncounted "
                        f"(default {MAX_HUNG})")
    w = p.add_argument_group("lifecycle")
    w.add_argument("--weights-mode", choices=["abort", "continue", "keep-kv"], default="continue",
                   help="at a new policy version: continue in-flight requests (default: nothing generated is "
                        "thrown away; vLLM recomputes their KV on the new weights), continue over the KV already "
                        "computed (keep-kv), or abort them (their groups start over on the new weights)")
    w.add_argument("--no-weights-push", dest="weights_push", action="store_false",
                   help="never join torch.distributed weight pushes: load every version from its folder")
    w.add_argument("--worker-id", default=None, help="default host:pid:nonce")
    w.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to finish work after SIGTERM")
    w.add_argument("--save-progress-every-s", type=float, default=DEFAULT_SAVE_PROGRESS_EVERY_S, metavar="S",
                   help="an attempt still generating after S seconds saves its samples so far, and again every "
                        "S seconds: a worker killed mid-attempt loses at most S seconds of tokens, the next "
                        "attempt continues the rest (torch and scripted engines give tokens mid-request; vLLM "
                        "only finished samples; a trajectory its complete turns, when its environment has "
                        f"snapshot/restore). Default {DEFAULT_SAVE_PROGRESS_EVERY_S:g}; 0: off")
    w.add_argument("--exit-grace", type=float, default=EXIT_GRACE_S, metavar="SECONDS",
                   help="once its work is returned, the process ends within this many seconds even if user code "
                        f"(a hung tool call or reward) still runs (default {EXIT_GRACE_S:g})")
    w.add_argument("--heartbeat-interval", type=float, default=None, help="default worker_timeout_s / 4")
    w.add_argument("--reconcile-interval", type=float, default=None,
                   help="seconds between checks that the queue gives this worker nothing it does not hold "
                        "(orphans are aborted back to ready); default max(worker_timeout_s, 5), 0: off")
    w.add_argument("--reconcile-grace", type=float, default=DEFAULT_GRACE_S,
                   help="hand back an orphaned attempt only once delivered this many seconds ago "
                        f"(default {DEFAULT_GRACE_S:g}: the client's retry window plus a socket timeout)")
    w.add_argument("--durable-replicas", type=int,
                   default=default("durable_replicas", env("ROLLOUT_DURABLE_REPLICAS", "0")),
                   metavar="N", help="durable mode: each state-changing call answers only once N replicas have it "
                                     "(env ROLLOUT_DURABLE_REPLICAS; default 0: off; docs/OPERATIONS.md, Replicas)")
    w.add_argument("--durable-timeout-ms", type=int,
                   default=default("durable_timeout_ms", env("ROLLOUT_DURABLE_TIMEOUT_MS", "1000")),
                   metavar="MS", help="durable mode: ms of one WAIT (env ROLLOUT_DURABLE_TIMEOUT_MS; default 1000)")
    w.add_argument("--json-logs", action="store_true", default=default("json_logs", False),
                   help="one JSON object per log line")


def parse_engine_args(items: Sequence[str]) -> dict[str, Any]:
    """``["a=1", "device=cuda"]`` -> ``{"a": 1, "device": "cuda"}``. Raises ValueError."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.isidentifier():
            raise ValueError(f"--engine-arg {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw  # a bare string such as device=cuda
    return out


def build_engine(kind: str, model: str, options: dict[str, Any]) -> Engine:
    """The engine of ``kind``; ``scripted`` is built here because make_engine does not list it."""
    if kind == "scripted":
        from rollout_queue.workers.engines.scripted import ScriptedEngine

        return ScriptedEngine(model, **options)
    if not model:
        raise ValueError(f"--engine {kind} needs --model PATH")
    return make_engine(kind, model, **options)


def build_runtime(args: argparse.Namespace) -> WorkerRuntime:
    sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                              stop=tuple(args.stop), seed=args.seed)
    options = WorkerOptions(policy=args.policy, max_samples=args.max_samples, max_groups=args.max_groups,
                            max_waiting=args.max_waiting,
                            sampling=sampling, weights_mode=args.weights_mode, drain_timeout_s=args.drain_timeout,
                            block_ms=args.block_ms, heartbeat_interval_s=args.heartbeat_interval,
                            reconcile_interval_s=args.reconcile_interval, reconcile_grace_s=args.reconcile_grace,
                            weights_push=args.weights_push, queue_wait_s=args.wait_for_queue,
                            save_progress_every_s=args.save_progress_every_s)
    scorer = Scorer(load_function(args.reward) if args.reward else None,
                    load_function(args.filter) if args.filter else None)
    engine_options = parse_engine_args(args.engine_arg)
    if args.weights_mode == "keep-kv" and args.engine == "vllm":
        engine_options.setdefault("kv_on_update", "keep")  # the torch engine always keeps the KV
    # vLLM's import and a model load take from seconds to minutes: shown as under way, then timed.
    with logs.progress(log, f"loading the {args.engine} engine", model=args.model):
        engine = build_engine(args.engine, args.model, engine_options)
    durable = Durability(args.durable_replicas, args.durable_timeout_ms) if args.durable_replicas else None
    environment = (None if args.env is None
                   else EnvironmentHost(load_environment(args.env), step_timeout_s=args.env_step_timeout,
                                        max_hung=args.env_max_hung))
    limits = TrajectoryLimits(args.max_turns, args.trajectory_tokens, args.trajectory_timeout)
    return WorkerRuntime(args.url, args.queue, engine, options, worker_id=args.worker_id, scorer=scorer,
                         durability=durable, partitions=args.partitions, create=args.create,
                         environment=environment, trajectory=limits)


class ExitDeadline:
    """Ends the process ``grace_s`` seconds after the worker returned its work, if it is still alive.

    Why: a tool call or a reward may never return, and a thread cannot be killed. The runtime stops
    waiting for such code (its attempt is settled, its thread a daemon), but the process's exit may
    still wait on it: a thread a library started, an executor the interpreter joins, a coroutine
    that swallows its cancellation while ``asyncio.run`` cleans up. Armed only once ``run()``
    returned, so the queue's own settlement is never cut short; then ``os._exit`` with ``code``
    (main sets the exact one as soon as it knows it)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.code = EXIT_FAIL
        self._thread: threading.Thread | None = None

    def arm(self, code: int) -> None:
        self.code = code
        if self._thread is None:
            self._thread = threading.Thread(target=self._expire, name="exit-deadline", daemon=True)
            self._thread.start()

    def _expire(self) -> None:
        try:
            time.sleep(self.grace_s)
        except OverflowError:  # --exit-grace inf: no deadline
            return
        print(f"rollout-queue worker: still running {self.grace_s:g} s after returning its work (user code that "
              f"never returned: a tool call, a reward); exiting {self.code}", file=sys.stderr)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(self.code)


async def serve(runtime: WorkerRuntime, deadline: ExitDeadline | None = None) -> None:
    """Run with SIGTERM/SIGINT wired to a drain; once ``run()`` returned (the work is back in the
    queue), ``deadline`` bounds what is left of the process's life."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.request_drain)
    try:
        await runtime.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if deadline is not None:
            deadline.arm(EXIT_OK if runtime.state is RuntimeState.STOPPED else EXIT_FAIL)


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the worker the parsed options describe, until it drains; the exit code."""
    logs.configure(args.json_logs)
    if not args.url or not args.queue:
        print("rollout-queue worker: pass --url and --queue (or set REDIS_URL and ROLLOUT_QUEUE)", file=sys.stderr)
        return EXIT_USAGE
    if args.partitions < 1:
        print(f"rollout-queue worker: --partitions must be >= 1, not {args.partitions}", file=sys.stderr)
        return EXIT_USAGE
    if not args.exit_grace >= 0:
        print(f"rollout-queue worker: --exit-grace must be >= 0 seconds, not {args.exit_grace}", file=sys.stderr)
        return EXIT_USAGE
    log.info("worker starting", extra=logs.fields(queue=args.queue, engine=args.engine, model=args.model,
                                                  worker_id=args.worker_id or "host:pid:nonce"))
    try:
        runtime = build_runtime(args)
    except (ValueError, TypeError, ImportError) as exc:
        print(f"rollout-queue worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    deadline = ExitDeadline(args.exit_grace)
    deadline.code = _run_to_exit_code(runtime, args, deadline)
    return deadline.code


def _run_to_exit_code(runtime: WorkerRuntime, args: argparse.Namespace, deadline: ExitDeadline) -> int:
    """Serve until drained or failed; the exit code."""
    try:
        asyncio.run(serve(runtime, deadline))
    except QueueNotFound as exc:
        waited = f" (waited {args.wait_for_queue:g} s for it: --wait-for-queue)" if args.wait_for_queue else ""
        print(f"rollout-queue worker: {exc}{waited}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except WorkerFailed as exc:
        if isinstance(exc.__cause__, ServedQueuesRefused):
            print(f"rollout-queue worker: {exc.__cause__}", file=sys.stderr)
            return EXIT_USAGE
        print(f"rollout-queue worker: {exc}", file=sys.stderr)
        return EXIT_FAIL
    except (OutcomeUnknown, ConnectionError, OSError, RedisClusterException) as exc:
        print(f"rollout-queue worker: cannot reach Redis at {args.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except RolloutQueueError as exc:
        print(f"rollout-queue worker: {exc}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK
