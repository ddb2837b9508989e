"""The RL-loop commands: ``produce`` (a dataset into the queue, exactly once), ``train`` (the GRPO
trainer process of docker-compose) and ``demo`` (everything on one machine, with a private Redis).

Each parses its flags and hands over to ``rollout_queue.rl.producer``, ``rollout_queue.demo.grpo`` or
``rollout_queue.demo.main``; torch and transformers are imported only by the commands that train.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

from rollout_queue.core.config import QueueConfig
from rollout_queue.cli.common import (EXIT_FAIL, EXIT_OK, UsageError, client, durability, log_action, open_queue,
                                      partitions)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


# -- produce ---------------------------------------------------------------------------------------


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def unescape_template(text: str) -> str:
    r"""``--template 'Q: {question}\nA:'``: a shell passes the two characters backslash and n, and
    what is meant is a newline. ``\n``, ``\t`` and ``\\`` are decoded (as printf does); any other
    backslash is kept as typed."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def cmd_produce(args: argparse.Namespace) -> int:
    from rollout_queue.rl.producer import ProducePlan, load_records, run_producer

    if args.template is not None and args.prompt_field_given:
        raise UsageError("give --prompt-field or --template, not both")
    try:
        records = load_records(args.dataset, split=args.split)
    except (FileNotFoundError, ImportError) as exc:
        raise UsageError(str(exc)) from exc
    template = None if args.template is None else unescape_template(args.template)
    plan = ProducePlan(name=args.name or _default_name(args.dataset), n=args.n,
                       prompt_field=None if args.template is not None else args.prompt_field, template=template,
                       epochs=args.epochs, shuffle=args.shuffle, seed=args.seed, id_field=args.id_field,
                       metadata_fields=tuple(args.metadata_field) if args.metadata_field else None)
    # The trainer creates the queue; the producer only with --create (a mistyped --queue is exit 4).
    q = _wait_for_queue(args) if args.wait_for_queue else open_queue(args, must_exist=not args.create)
    stop = _stop_on_signals()
    with _progress(args) as progress:
        report = run_producer(q, records, plan, max_backlog=args.max_backlog, batch_size=args.batch_size,
                              stop=stop, on_progress=progress)
    log_action(args, "producer stopped" if not report.done else "producer done", "produce", producer=plan.name,
               cursor=report.cursor, total=report.total, new=report.new)
    return EXIT_OK


def _default_name(path: str) -> str:
    base = os.path.basename(os.path.normpath(path))
    return "".join(c if c.isalnum() or c in "_.-" else "-" for c in base)[:128] or "producer"


def _wait_for_queue(args: argparse.Namespace) -> Any:
    """Wait (up to --wait-for-queue seconds) until the trainer has created the queue, then adopt its config."""
    from rollout_queue.core.errors import QueueNotFound

    deadline = time.monotonic() + args.wait_for_queue
    while True:
        try:
            return open_queue(args)  # create=False: QueueNotFound writes nothing
        except QueueNotFound:
            if time.monotonic() > deadline:
                raise UsageError(f"queue {args.queue!r} was not created within {args.wait_for_queue}s") from None
            time.sleep(0.5)  # polling a process-start dependency, not a test


class _progress:
    """A rich progress bar on a terminal (plain lines every 5 s elsewhere); a context manager that is
    also the producer's ``on_progress`` callback."""

    def __init__(self, args: argparse.Namespace) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.quiet, self.last = args.no_progress, 0.0
        # a rich Progress and its task once entered on a terminal (rich is imported only then)
        self.bar: Any = None
        self.task: Any = None
        self.bound = args.max_backlog

    def __enter__(self) -> "_progress":
        if not self.quiet and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]produce[/]"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=self.console)
            self.bar.start()
        return self

    def __call__(self, report: Any) -> None:
        bound = f"/{self.bound}" if self.bound else ""
        status = f"backlog {report.backlog}{bound}" + ("  [yellow]waiting: backlog full[/]" if report.waiting else "")
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task("produce", total=report.total, completed=report.cursor, status=status)
            self.bar.update(self.task, completed=report.cursor, status=status)
        elif not self.quiet and (time.monotonic() - self.last > 5 or report.done):
            self.last = time.monotonic()
            self.console.print(f"produce: {report.cursor}/{report.total} groups enqueued, {status}", highlight=False)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


# -- train -----------------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from rollout_queue.api.queue import RolloutQueue
    from rollout_queue.demo.grpo import GrpoSettings, GrpoTrainer

    if not args.url or not args.queue:
        raise UsageError("train needs --url and --queue (or REDIS_URL and ROLLOUT_QUEUE)")
    # Admission control at one step's batch: the trainer publishes a version per step, so the workers
    # run at most max_staleness + 1 steps ahead (DESIGN: Capacity); --no-admission-control: none.
    config = QueueConfig(max_staleness=None if args.max_staleness < 0 else args.max_staleness,
                         batch_groups=None if args.no_admission_control else args.batch_groups,
                         max_completed_groups=args.max_completed_groups, lease_timeout_s=args.lease_timeout,
                         staleness_mode=args.staleness_mode, max_stale_evictions=args.max_stale_evictions)
    # The trainer is the process that creates the queue (with --partitions P on a Redis Cluster).
    q = RolloutQueue(client(args), args.queue, config, partitions=partitions(args), durability=durability(args))
    settings = GrpoSettings(steps=args.steps, batch_groups=args.batch_groups, lr=args.lr,
                            checkpoint_every=args.checkpoint_every, lease_timeout_s=args.lease_timeout,
                            threads=args.threads, device=args.device, trainer_id=args.trainer_id,
                            weights_transport=args.weights_transport, weights_uri_base=args.weights_uri_base,
                            weights_upload=args.weights_upload, push_backend=args.push_backend,
                            lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, push_join_s=args.push_join, push_deadline_s=args.push_deadline)
    trainer = GrpoTrainer(q, args.model, args.weights_dir, settings, checkpoint_dir=args.checkpoint_dir,
                          stop=_stop_on_signals(),
                          on_step=lambda r: log_action(args, "step", "train", step=r.step, reward=round(r.reward, 4),
                                                       staleness_max=r.staleness_max, groups=r.groups))
    records = trainer.run()
    return EXIT_OK if records or trainer.step >= args.steps else EXIT_FAIL


# -- demo ------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rollout_queue.demo.main import run_demo

    try:
        return _run_demo(args, run_demo, Console)
    except KeyboardInterrupt:
        print("rollout-queue demo: interrupted (workers stopped, private Redis removed)", file=sys.stderr)
        return 130


def _run_demo(args: argparse.Namespace, run_demo: Any, Console: Any) -> int:
    return run_demo(url=args.url or None, engine=args.engine, steps=args.steps, batch_groups=args.batch_groups,
                    n=args.n, max_tokens=args.max_tokens, lr=args.lr,
                    max_staleness=None if args.on_policy else args.max_staleness,
                    kill_worker_after=args.kill_worker_after or None, compare=args.compare, target=args.target,
                    seed=args.seed, keep=args.keep, task=args.task, staleness_mode=args.staleness_mode,
                    console=Console() if sys.stdout.isatty() else Console(width=110))  # logs: no wrapped tables


class _Given(argparse.Action):
    """Records that --prompt-field was given explicitly (it has a default)."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.prompt_field_given = True


def register(sub: Any) -> None:
    _add_produce(sub)
    _add_train(sub)
    _add_demo(sub)


def _add_produce(sub: Any) -> None:
    p = sub.add_parser("produce", help="enqueue a dataset (JSONL, Parquet, datasets folder) exactly once")
    p.add_argument("dataset", help="a .jsonl / .parquet file or a datasets save_to_disk folder")
    p.add_argument("--name", default=None, help="producer name: its cursor in Redis and source_id prefix "
                                                "(default: the dataset's file name)")
    p.add_argument("--prompt-field", default="prompt", action=_Given, help="record field holding the prompt")
    p.add_argument("--template", default=None,
                   help="prompt template over record fields, e.g. 'Q: {question}\\nA:' (\\n, \\t and \\\\ are decoded)")
    p.add_argument("--n", type=int, default=8, help="samples (parent slots) per group (default 8)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--shuffle", action="store_true", help="shuffle each epoch (seeded: restarts resume the same order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train", help="split of a DatasetDict folder (default train)")
    p.add_argument("--id-field", default=None, help="record field to name groups by (default: position in the file)")
    p.add_argument("--metadata-field", action="append", default=[],
                   help="record field to pass to rewards as metadata; repeatable (default: every other field)")
    p.add_argument("--max-backlog", type=int, default=1024,
                   help="keep at most this many never-reserved groups (0: no bound)")
    p.add_argument("--batch-size", type=int, default=64, help="groups per produce call")
    p.add_argument("--wait-for-queue", type=float, default=0.0, metavar="SECONDS",
                   help="wait for the trainer to create the queue (and adopt its config)")
    p.add_argument("--create", action="store_true",
                   help="create the queue if it does not exist (default: exit 4; the trainer creates it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    p.set_defaults(func=cmd_produce, prompt_field_given=False)


def _add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="run the GRPO trainer on the queue (docker-compose's trainer service)")
    p.add_argument("--model", required=True, help="initial policy: a save_pretrained folder")
    p.add_argument("--weights-dir", required=True, help="shared folder the workers load published weights from")
    p.add_argument("--weights-transport", choices=("folder", "delta", "dist"), default="folder",
                   help="folder: each version in full; delta: only the tensors that changed (a full one every 8); "
                        "dist: pushed over torch.distributed to the workers that join, written as deltas too")
    p.add_argument("--lora-rank", type=int, default=0, metavar="R",
                   help="train a LoRA adapter of rank R (peft) and publish adapters, not models; vLLM workers "
                        "need --engine-arg enable_lora=true --engine-arg max_lora_rank=R (default 0: full fine-tune)")
    p.add_argument("--lora-alpha", type=float, default=None, help="the adapter's alpha (default 2 x rank)")
    p.add_argument("--push-backend", choices=("gloo", "nccl"), default="gloo",
                   help="dist: gloo (CPU tensors) or nccl (GPU tensors); workers reach this process at "
                        "$ROLLOUT_PUSH_HOST (default: its host name)")
    p.add_argument("--push-join", type=float, default=2.0, metavar="S",
                   help="dist: seconds workers may join a round (it starts once every live worker joined)")
    p.add_argument("--push-deadline", type=float, default=60.0, metavar="S",
                   help="dist: the longest a round may take; a worker not done by then loads the folder")
    p.add_argument("--weights-uri-base", default=None, metavar="URI",
                   help="where workers fetch --weights-dir from (https://..., s3://...), for workers without shared storage")
    p.add_argument("--weights-upload", action="store_true",
                   help="copy every version to --weights-uri-base (an object store, credentials as fsspec/AWS "
                        "variables) before recording it; without it, serve or sync --weights-dir there yourself")
    p.add_argument("--checkpoint-dir", default=None, help="model+optimizer checkpoints; resumes from the newest")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-groups", type=int, default=8, help="groups per optimizer step (and admission batch)")
    p.add_argument("--no-admission-control", action="store_true",
                   help="create the queue without admission control (batch_groups none): generation may then "
                        "run ahead of training without bound, and groups that go stale are generated again")
    p.add_argument("--max-staleness", type=int, default=2, help="-1: strictly on-policy")
    p.add_argument("--staleness-mode", choices=["drop", "continue", "pace"], default="continue",
                   help="what goes stale (docs/DESIGN.md#staleness-modes): drop regenerates it; continue judges a "
                        "group by its newest tokens and keeps every prefix; pace evicts nothing and paces admission")
    p.add_argument("--max-stale-evictions", type=int, default=2,
                   help="fairness: a group evicted for staleness this many times is judged fresh at its next "
                        "completion (0: off)")
    p.add_argument("--max-completed-groups", type=int, default=256)
    p.add_argument("--lease-timeout", type=float, default=600.0, help="seconds a lease may outlast its step")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--trainer-id", default="grpo-trainer")
    p.set_defaults(func=cmd_train)


def _add_demo(sub: Any) -> None:
    p = sub.add_parser("demo", help="fully async GRPO on one machine: private Redis, producer, 2 workers, "
                                    "reaper, trainer, live dashboard, ledger check")
    p.add_argument("--engine", choices=["auto", "vllm", "torch"], default="auto",
                   help="worker engine (auto: vllm when installed, else torch)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default: the task's, 80 digits, 120 tools and tools-heavy; "
                        "e.g. --steps 5 for CI)")
    p.add_argument("--batch-groups", type=int, default=8, help="groups per step")
    p.add_argument("--n", type=int, default=8, help="samples per group")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per model turn (default: 16 digits, 3 tools)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--max-staleness", type=int, default=2, help="the async bound (default 2)")
    p.add_argument("--on-policy", action="store_true", help="strictly on-policy instead (max_staleness None)")
    p.add_argument("--kill-worker-after", type=float, default=10.0, metavar="SECONDS",
                   help="SIGKILL a worker this long after training starts (0: never; default 10)")
    p.add_argument("--compare", action="store_true", help="run strictly on-policy, then async; compare them")
    p.add_argument("--target", type=float, default=None,
                   help="reward the comparison measures time to (default: the task's, 0.8)")
    p.add_argument("--task", choices=["digits", "tools", "tools-heavy"], default="digits",
                   help="digits: answer in digits (one turn); tools: ask a tool in what to answer and obey it "
                        "(two model turns around the tool's observation, only the model's turns trained); "
                        "tools-heavy: tools with a slow tool (10-30x the median) on about one prompt in ten")
    p.add_argument("--staleness-mode", choices=["drop", "continue", "pace"], default=None,
                   help="the async queue's staleness_mode (default: the queue's, continue; DESIGN.md: Staleness modes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the run folder (worker logs, weights, checkpoints)")
    p.set_defaults(func=cmd_demo)


__all__ = ["register"]
