"""The processes of a chaos run: producer, test-engine worker and trainer (``python -m rollout_queue.devtools.chaos.roles``).

Each role drives the queue only through the public API and appends every operation to its own
JSONL log (``oplog``): what it called (``*_invoke``), what it was told (``*_ok`` / ``*_refused`` /
``*_unknown``), with entry ids, receipts and lease ids. The checker trusts a line only for what the
process was told; Redis is the other witness.

Rules every role keeps, because the checker relies on them:
1. An ``OutcomeUnknown`` is logged and the process exits (code 3): it cannot know what it owns, so it
   lets the reaper take its work back instead of guessing (DESIGN rule 5). The harness restarts it.
2. A refusal (StaleReceipt, LeaseLost) is logged and the work is dropped: never retried, never counted.
3. Any other exception is logged as ``crash`` with its type and the process exits 1; the checker
   fails the run on a crash whose type is not a RolloutQueueError the role expects.
4. A refusal the caller is told to act on is logged and acted on, never a crash: a checkpoint the
   queue refuses (LeasesOpen while another trainer holds a lease, CheckpointRegression after another
   trainer checkpointed further, RestoreInProgress) is skipped (``checkpoint_refused``); a lease the
   bounds can never satisfy (LeaseUnsatisfiable) is logged (``lease_unsatisfiable``): the checker
   decides whether the run's config could have caused it; a blocking lease that found every worker
   gone (WorkersGone: the harness killed them all and restarts them) is logged (``workers_gone``)
   and the trainer waits on, as a trainer that restarts its workers would.
The reaper role runs the library's own loop (``rollout_queue.ops.reaper.run_reaper``, what ``rollout-queue
reaper`` runs) and copies its log records into the operation log.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import random
import secrets
import signal
import sys
import threading
import time
import traceback
from types import FrameType
from typing import Any, Callable, Sequence

import orjson

import rollout_queue
from rollout_queue import (
    CheckpointRegression,
    HoldLost,
    LeaseLost,
    LeasesOpen,
    LeaseUnsatisfiable,
    OutcomeUnknown,
    QueueConfig,
    Receipt,
    Reservation,
    RestoreInProgress,
    RetryPolicy,
    RolloutQueue,
    RolloutQueueError,
    SourceGroup,
    StaleReceipt,
    WorkersGone,
)
from rollout_queue.ops.reaper import run_reaper
from rollout_queue.demo.walkthrough import test_engine_generate

from rollout_queue.devtools.chaos.envs import POISON_MARK, hostile_kind, trajectory_mismatch
from rollout_queue.devtools.chaos.oplog import OpLog
from rollout_queue.devtools.chaos.samples import sample_record

#: Longer than any Redis restart or outage of a run (kill, clean stop, down for up to 3 x
#: worker_timeout_s, AOF replay, LOADING), so an outage is a pause to every role, never an exit.
RETRY = RetryPolicy(window_s=30.0)
EXIT_UNKNOWN, EXIT_CRASH = 3, 1
#: The trainer's admission hold lasts this long in queue time (downtime does not count); its update
#: takes about wait_terminal's 2 s at most.
HOLD_TIMEOUT_S = 5.0

#: The sizes (``n``) groups are drawn from when a run names none: mostly small, some larger than a
#: 2- or 4-slot worker, so the oversized-group path (skip for a strict caller, grant to a caller
#: with the slots or to one that overcommits) runs all the time.
DEFAULT_SIZES: tuple[int, ...] = (1, 2, 2, 3, 3, 4, 4, 6, 8)

#: The refusals of checkpoint(step) after which nothing was written: the trainer skips that
#: checkpoint and tries again at the next one.
CHECKPOINT_REFUSALS = (LeasesOpen, CheckpointRegression, RestoreInProgress)


def source_id(seed: int, i: int) -> str:
    return f"chaos-{seed}-{i:06d}"


def group_n(seed: int, i: int, sizes: Sequence[int] | None = None) -> int:
    """The ``n`` of group ``i``: drawn from ``sizes`` by (seed, i) alone, so a restarted producer
    submits exactly the same group again. Without sizes: the harness's original 2-4."""
    if not sizes:
        return 2 + i % 3
    return sizes[random.Random(f"{seed}:n:{i}").randrange(len(sizes))]


def is_poison(i: int, poison_every: int) -> bool:
    return poison_every > 0 and i % poison_every == poison_every - 1


def source_group(seed: int, i: int, poison_every: int, sizes: Sequence[int] | None = None, hostile_every: int = 0,
                 hang_s: float = 0.0) -> SourceGroup:
    """Group ``i`` of a run: ``group_n`` parent slots; every ``poison_every``-th prompt makes the test
    engine and the scripted engine fail (so it must end as a dead letter with its reasons); every
    ``hostile_every``-th breaks the shipped worker's environment or reward in its own way
    (envs.py; a test-engine worker completes it like any other). ``turns``: the model turns of its
    trajectory when a shipped worker runs it; ``hang_s``: how long a hanging tool call of it hangs."""
    poison = is_poison(i, poison_every)
    prompt = prompt_of(seed, i, poison)
    hostile = None if poison else hostile_kind(i, hostile_every)
    return SourceGroup(source_id(seed, i), prompt, n=group_n(seed, i, sizes),
                       metadata={"i": i, "poison": poison, "hostile": hostile, "turns": 1 + i % 3, "hang_s": hang_s})


def prompt_of(seed: int, i: int, poison: bool = False) -> str:
    """Group ``i``'s prompt: a function of (seed, i), so the checker can replay what an engine
    generated for it from the source id alone (samples.py)."""
    return f"chaos prompt {seed}/{i}" + (f" {POISON_MARK}" if poison else "")


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,8"`` -> (1, 2, 8); empty: the original 2-4 (see group_n)."""
    return tuple(int(x) for x in text.split(",") if x.strip())


def connect(args: argparse.Namespace, name: str) -> RolloutQueue:
    # client_name lets the nemesis find this process's connection in CLIENT LIST (CLIENT KILL).
    return RolloutQueue.from_url(args.url, args.queue, retry=RETRY, client_name=name)


def stop_event() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def guarded(log: OpLog, body: Callable[[], None]) -> int:
    """Run a role's loop; map its ending to an exit code and a last log line (rule 1 and 3)."""
    try:
        body()
    except OutcomeUnknown as exc:
        log.write("exit_unknown", error=str(exc)[:500])
        return EXIT_UNKNOWN
    except Exception as exc:  # every unexpected error is logged for the checker, then ends the process
        log.write("crash", error_type=type(exc).__name__, error=str(exc)[:500],
                  is_queue_error=isinstance(exc, RolloutQueueError), tb=traceback.format_exc()[-2000:])
        return EXIT_CRASH
    log.write("exit", code=0)
    return 0


# -- producer ------------------------------------------------------------------------------------


def run_producer(args: argparse.Namespace) -> int:
    """Submit groups 0..N-1 in batches, keeping the backlog short so submission spans the run.
    A restarted producer submits from 0 again: submit is idempotent by source_id. With ``--rate``,
    group j is submitted no earlier than ``--start-t`` + j / rate (wall clock, so a restarted
    producer catches up to where the pace stands instead of pacing from 0 again)."""
    log = OpLog(args.log, "producer")
    stop = stop_event()

    def body() -> None:
        q = connect(args, f"chaos-producer:{os.getpid()}|work")
        log.write("start", groups=args.groups)
        sizes = parse_sizes(args.sizes)
        i = 0
        while i < args.groups and not stop.is_set():
            due = args.start_t + i / args.rate - time.time() if args.rate > 0 else 0.0
            if due > 0:
                stop.wait(min(due, 0.5))
                continue
            if q.stats().backlog >= args.backlog:
                stop.wait(0.05)
                continue
            batch = [source_group(args.seed, j, args.poison_every, sizes, args.hostile_every, args.hang_s)
                     for j in range(i, min(i + args.batch, args.groups))]
            sids = [g.source_id for g in batch]
            log.write("submit_invoke", sids=sids)
            ids = q.submit(batch)
            log.write("submit_ok", sids=sids, ids=ids)
            i += len(batch)
        if i >= args.groups:
            log.write("done", groups=args.groups)

    return guarded(log, body)


# -- worker --------------------------------------------------------------------------------------


class HeartbeatThread(threading.Thread):
    """Heartbeats on its own connection, so a worker busy generating is never taken for dead."""

    def __init__(self, args: argparse.Namespace, worker_id: str, log: OpLog) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.args, self.worker_id, self.log = args, worker_id, log
        self.halt = threading.Event()

    def run(self) -> None:
        q = None
        while not self.halt.wait(self.args.heartbeat_s):
            try:
                if q is None:  # connect inside the loop: Redis may be restarting when the worker starts
                    q = RolloutQueue.from_url(self.args.url, self.args.queue, retry=RetryPolicy(window_s=1.0),
                                              client_name=f"{self.worker_id}|hb")
                q.worker(self.worker_id).heartbeat()
            except RolloutQueueError as exc:  # Redis restarting: logged, the next beat retries
                self.log.write("heartbeat_failed", error=type(exc).__name__)


def _settle(w: Any, r: Reservation, reserved_at: float, args: argparse.Namespace, rng: random.Random,
            log: OpLog) -> None:
    """Generate with the test engine, then complete (or fail a poison prompt) exactly once."""
    time.sleep(rng.uniform(0, args.gen_ms) / 1000)  # "generation": a window in which faults land
    rc = r.receipt
    late = time.monotonic() - reserved_at > args.worker_timeout_s  # we were paused past the timeout
    receipt = {"eid": rc.entry_id, "attempt": rc.attempt, "worker": rc.worker_id, "sid": r.group.source_id,
               "late": late}
    if r.group.metadata.get("poison"):
        op, call = "fail", lambda: w.fail(rc, "test engine: poison prompt")
    else:
        samples = [test_engine_generate(r, slot) for slot in range(r.group.n)]
        op, call = "complete", lambda: w.complete(rc, samples)
    log.write(f"{op}_invoke", **receipt)
    try:
        result = call()
    except StaleReceipt as exc:
        log.write(f"{op}_refused", **receipt, error="StaleReceipt", owner=exc.owner,
                  delivery_count=exc.delivery_count)
        return
    log.write(f"{op}_ok", **receipt, result=result)


def run_worker(args: argparse.Namespace) -> int:
    """Reserve -> generate (test engine) -> complete, until SIGTERM; then close (requeue owned work).

    ``--max-samples`` is this worker's slot count: each reserve asks for at most that many samples,
    as a sample-policy engine passes its free slots. With ``--overcommit`` the worker declares that it
    queues samples internally (what workers/runtime.py's sample policy does), so the queue may grant it
    one group larger than its slots as the first grant of a call; without it such groups are left for
    another caller. Both are in every log line, so the checker can hold each grant to them."""
    worker_id = f"chaos-w{args.index}:{os.getpid()}:{secrets.token_hex(2)}"
    log = OpLog(args.log, "worker", worker=worker_id, max_samples=args.max_samples,
                overcommit=bool(args.overcommit))
    stop = stop_event()
    rng = random.Random(f"{args.seed}:{worker_id}")
    beat = HeartbeatThread(args, worker_id, log)

    def body() -> None:
        q = connect(args, f"{worker_id}|work")
        w = q.worker(worker_id)
        log.write("start")
        beat.start()
        while not stop.is_set():
            sent = time.time()  # the grant may be made in Redis any time from here to the reply
            got = w.reserve(max_groups=args.max_groups, block_ms=500, max_samples=args.max_samples,
                            overcommit=bool(args.overcommit))
            reserved_at = time.monotonic()
            if got:
                log.write("reserve_ok", grants=[[r.entry_id, r.receipt.attempt, r.group.source_id, r.group.n]
                                                for r in got], version=got[0].version, sent=sent)
            for r in got:
                if stop.is_set():
                    break  # close() below requeues what we did not settle
                _settle(w, r, reserved_at, args, rng, log)
        beat.halt.set()
        beat.join(timeout=5)  # no beat after close: a closed worker must not re-register
        requeued, dead = w.close()
        log.write("close_ok", requeued=requeued, dead=dead)

    return guarded(log, body)


# -- trainer -------------------------------------------------------------------------------------


def _next_step(q: RolloutQueue) -> int:
    """One past the last committed step (the commits stream's newest line), so steps only grow."""
    last = q.client.xrevrange(q.keys["commits"], count=1)
    if not last:
        return 1
    step = last[0][1].get(b"step", b"")
    return int(step) + 1 if step else 1


def _payload_mismatches(lease: Any) -> dict[str, str]:
    """Entry ids whose samples are not what the test engine generates for that exact attempt, or,
    for a trajectory (a shipped worker's sample), not what a healthy chaos environment gives
    (envs.trajectory_mismatch): the trainer must train the completion of the receipt the ledger
    recorded, nothing else, and never a hostile group's."""
    bad = {}
    for g in lease.groups:
        whys = [] if sorted(s.slot for s in g.samples) == list(range(g.group.n)) else ["slots do not cover n"]
        for s in g.samples:
            if s.turns:
                whys.append(trajectory_mismatch(dict(g.group.metadata), s.token_ids, s.logprobs, s.reward, s.turns)
                            or "")
                continue
            probe = Reservation(Receipt(g.entry_id, g.attempt, "chaos-check"), g.group, s.version)
            want = test_engine_generate(probe, s.slot)
            if want.token_ids != s.token_ids or want.reward != s.reward:
                whys.append(f"slot {s.slot} is not the test engine's sample for attempt {g.attempt}")
        if any(whys):
            bad[g.entry_id] = "; ".join(sorted({w for w in whys if w}))
    return bad


def _probe_lease_bound(q: RolloutQueue, trainer_id: str, groups: int, log: OpLog) -> None:
    """Ask once for a lease no bound can ever satisfy (more groups than max_completed_groups): the
    queue must refuse it at once with LeaseUnsatisfiable (issue 12 item 3), never answer None (which
    a trainer would take for "not yet" and wait on forever). The checker fails the run on anything
    but a refusal."""
    log.write("lease_probe_invoke", groups=groups)
    try:
        lease = q.lease(groups, block_ms=0, trainer_id=trainer_id)
    except LeaseUnsatisfiable as exc:
        log.write("lease_probe_refused", groups=groups, bound=exc.bound, limit=exc.limit)
        return
    if lease is not None:
        lease.rollback()  # impossible with the run's bounds; hand the groups back before reporting it
    log.write("lease_probe_answered", groups=groups, got=None if lease is None else len(lease.groups))


def _train_one(q: RolloutQueue, trainer_id: str, step: int, args: argparse.Namespace, rng: random.Random,
               log: OpLog) -> bool:
    """Lease -> "train" -> commit(step) or rollback. True when a step was committed."""
    try:
        lease = q.lease(args.batch, block_ms=1000, partial=True, trainer_id=trainer_id)
    except LeaseUnsatisfiable as exc:  # a partial lease of the run's size: the checker judges it
        log.write("lease_unsatisfiable", groups=args.batch, bound=exc.bound, limit=exc.limit, error=str(exc)[:300])
        time.sleep(0.5)
        return False
    except WorkersGone as exc:  # rule 4: nothing was leased; the next lease goes on once a worker is back
        log.write("workers_gone", groups=args.batch, down_s=round(exc.down_s, 3), error=str(exc)[:300])
        return False
    if lease is None:
        return False
    members = [[g.entry_id, g.attempt, g.group.source_id, g.min_version] for g in lease.groups]
    log.write("lease_ok", lease=lease.lease_id, members=members, version=lease.version)
    # What is trained, token by token with its versions: the checker replays it (samples.py).
    log.write("trained", lease=lease.lease_id, groups=[[g.entry_id, g.attempt, g.group.source_id,
                                                        [sample_record(s) for s in g.samples]]
                                                       for g in lease.groups])
    bad = _payload_mismatches(lease)
    if bad:
        log.write("payload_mismatch", lease=lease.lease_id, ids=list(bad), why=bad)
    log.write("train_begin", lease=lease.lease_id, step=step)
    time.sleep(rng.uniform(args.train_ms / 4, args.train_ms) / 1000)  # "training": the kill window
    ids = [m[0] for m in members]
    if rng.random() < args.rollback_rate:
        log.write("rollback_invoke", lease=lease.lease_id, ids=ids)
        try:
            n = lease.rollback()
        except LeaseLost as exc:
            log.write("rollback_refused", lease=lease.lease_id, state=exc.state)
            return False
        log.write("rollback_ok", lease=lease.lease_id, requeued=n)
        return False
    log.write("commit_invoke", lease=lease.lease_id, ids=ids, step=step)
    try:
        commit_id = lease.commit(step)
    except LeaseLost as exc:
        log.write("commit_refused", lease=lease.lease_id, ids=ids, state=exc.state)
        return False
    log.write("commit_ok", lease=lease.lease_id, ids=ids, step=step, commit_id=commit_id)
    return True


def _checkpoint(q: RolloutQueue, step: int, log: OpLog) -> bool:
    """checkpoint(step), or a logged skip when the queue refuses it: another trainer (or a killed
    one whose lease has not expired yet) still holds a lease (LeasesOpen), another trainer already
    checkpointed a later step (CheckpointRegression), or a restore is unfinished. A refused checkpoint
    wrote nothing, so the trainer tries again after its next step; it is not a failure of the run.
    True when the checkpoint was taken."""
    log.write("checkpoint_invoke", step=step)
    try:
        dropped = q.checkpoint(step)
    except CHECKPOINT_REFUSALS as exc:
        log.write("checkpoint_refused", step=step, error=type(exc).__name__, error_text=str(exc)[:300],
                  **{k: getattr(exc, k) for k in ("leased", "checkpoint") if isinstance(getattr(exc, k, None), int)})
        return False
    log.write("checkpoint_ok", step=step, dropped=dropped)
    return True


def weights_uri(version: int) -> str:
    """Where a version's weights are: the same for a version whoever publishes it (the scripted
    engine loads any URI; a pushed version is applied from what was staged for this URI)."""
    return f"file:///chaos/weights/v{version}"


def weight_update(q: RolloutQueue, log: OpLog, version: int | None = None) -> None:
    """The weight-update boundary through an admission hold: record ``version`` (default: the next
    one). A hold that expired first (the update took longer than its timeout while Redis was up, or
    a crash lost it) is logged and the update waits for the next step; the checker fails the run
    when it was lost with less than its timeout of Redis's up-time behind it (downtime must not
    expire a hold). ``publish_record`` is written before the version is recorded: no worker may
    apply a version no publisher ever asked to record."""
    log.write("publish_invoke", hold_timeout_s=HOLD_TIMEOUT_S)
    try:
        with q.hold(timeout_s=HOLD_TIMEOUT_S) as hold:
            log.write("hold_open", hold=hold.hold_id, waiting=hold.waiting)
            drained = hold.wait_terminal(timeout_s=2.0)
            version = q.version + 1 if version is None else version
            log.write("publish_record", version=version, uri=weights_uri(version))
            hold.record_weight_update(version, weights_uri(version))
    except HoldLost as exc:
        log.write("publish_refused", hold=exc.hold_id)
        return
    log.write("publish_ok", version=version, uri=weights_uri(version), drained=drained)


def run_trainer(args: argparse.Namespace) -> int:
    trainer_id = f"chaos-trainer:{os.getpid()}:{secrets.token_hex(2)}"
    log = OpLog(args.log, "trainer", trainer=trainer_id)
    stop = stop_event()
    rng = random.Random(f"{args.seed}:{trainer_id}")

    def body() -> None:
        q = connect(args, f"{trainer_id}|work")
        step = _next_step(q)
        log.write("start", step=step)
        if args.lease_probe > 0:
            _probe_lease_bound(q, trainer_id, args.lease_probe, log)
        owed = False  # a checkpoint was refused and is owed
        while not stop.is_set():
            if not _train_one(q, trainer_id, step, args, rng, log):
                continue
            if owed or step % args.checkpoint_every == 0:
                owed = not _checkpoint(q, step, log)  # refused: try again after the next step
            if args.publish_every > 0 and step % args.publish_every == 0:
                weight_update(q, log)
            step += 1

    return guarded(log, body)


# -- reaper --------------------------------------------------------------------------------------


class _ToOpLog(logging.Handler):
    """Copies the reaper loop's structured log records (``reaped``, failed passes) into the op log."""

    def __init__(self, log: OpLog) -> None:
        super().__init__(logging.INFO)
        self.oplog = log

    def emit(self, record: logging.LogRecord) -> None:
        self.oplog.write("reaper_" + record.getMessage().replace(" ", "_").split(";")[0],
                         **getattr(record, "fields", {}))


def run_reaper_role(args: argparse.Namespace) -> int:
    log = OpLog(args.log, "reaper")
    stop = stop_event()
    logging.getLogger("rollout_queue.ops.reaper").addHandler(_ToOpLog(log))
    logging.getLogger("rollout_queue.ops.reaper").setLevel(logging.INFO)

    def body() -> None:
        q = connect(args, f"chaos-reaper{args.index}:{os.getpid()}|reap")
        log.write("start")
        run_reaper(q, args.reap_interval_s, stop)

    return guarded(log, body)


def run_init(args: argparse.Namespace) -> int:
    """Create the run's queue with this build's scripts and the given stored config."""
    log = OpLog(args.log, "init")
    config = QueueConfig.from_meta(orjson.loads(args.config))

    def body() -> None:
        RolloutQueue.from_url(args.url, args.queue, config, retry=RETRY).close()
        log.write("start", rollout_queue=rollout_queue.__file__)

    return guarded(log, body)


#: role -> "module:function" of its entry point; the modules apart from this one import only when
#: their role runs (pushes.py imports torch, which a test-engine worker must never pay for).
ROLES = {"producer": "roles:run_producer", "worker": "roles:run_worker", "trainer": "roles:run_trainer",
         "reaper": "roles:run_reaper_role", "init": "roles:run_init", "traj": "shipped:run_shipped",
         "pusher": "pushes:run_pusher", "pushfault": "pushes:run_pushfault", "adversary": "adversary:run_adversary"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rollout_queue.devtools.chaos.roles", description=__doc__.split("\n")[0],
                                     epilog="traj: the shipped worker's own options follow a `--`")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--config", default="{}", help="init: the queue config in its stored form (JSON)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--log", required=True, help="this process's JSONL operation log")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="producer: groups per submit; trainer: per lease")
    parser.add_argument("--backlog", type=int, default=128, help="producer: submit while the backlog is shorter")
    parser.add_argument("--poison-every", type=int, default=0, help="every k-th prompt fails in the test engine")
    parser.add_argument("--rate", type=float, default=0.0, help="producer: groups per second at most (0: no pace)")
    parser.add_argument("--start-t", type=float, default=0.0, help="producer: the wall-clock time the pace counts from")
    parser.add_argument("--sizes", default="", help="producer: the n of each group is drawn from these (1,2,8)")
    parser.add_argument("--max-samples", type=int, default=0, help="worker: slots per reserve (0: no cap)")
    parser.add_argument("--overcommit", type=int, choices=[0, 1], default=0,
                        help="worker: 1 = queues samples internally (may be granted one group beyond its slots)")
    parser.add_argument("--max-groups", type=int, default=2, help="worker: groups per reserve")
    parser.add_argument("--lease-probe", type=int, default=0,
                        help="trainer: at start, ask for this many groups (more than any bound allows)")
    parser.add_argument("--gen-ms", type=float, default=30.0)
    parser.add_argument("--heartbeat-s", type=float, default=0.4)
    parser.add_argument("--worker-timeout-s", type=float, default=2.0)
    parser.add_argument("--train-ms", type=float, default=200.0)
    parser.add_argument("--rollback-rate", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--publish-every", type=int, default=5, help="trainer: 0 = never publish weights")
    parser.add_argument("--reap-interval-s", type=float, default=0.5)
    parser.add_argument("--hostile-every", type=int, default=0,
                        help="producer: every k-th group breaks the shipped worker's environment or reward (envs.py)")
    parser.add_argument("--hang-s", type=float, default=0.0, help="producer: how long a hostile tool call hangs")
    parser.add_argument("--publish-interval-s", type=float, default=3.0, help="pusher: seconds between versions")
    parser.add_argument("--push-every", type=int, default=1, help="pusher: every k-th version also goes by push")
    parser.add_argument("--push-join-s", type=float, default=1.5)
    parser.add_argument("--push-deadline-s", type=float, default=5.0)
    parser.add_argument("--push-expect", type=int, default=0, help="pusher: seal once this many joined (0: all live)")
    parser.add_argument("--push-floats", type=int, default=4096, help="pusher: float32s pushed per version")
    parser.add_argument("--unreachable-rate", type=float, default=0.0,
                        help="pushfault: share of rounds joined by a live member that cannot reach the trainer")
    parser.add_argument("--invented-rate", type=float, default=0.0,
                        help="pushfault: share of rounds an id that never heartbeat tries to join")
    parser.add_argument("--user", default="", help="adversary: the ACL user (the worker role's)")
    parser.add_argument("--password", default="", help="adversary: its password")
    parser.add_argument("--interval-s", type=float, default=1.0, help="adversary: mean seconds between commands")
    parser.add_argument("--until", type=float, default=float("inf"), help="adversary: wall-clock time to stop at")
    parser.add_argument("--commands", default="", help="adversary: only these, e.g. 'xack src,evalsha script'")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    module, _, name = ROLES[args.role].partition(":")
    home = sys.modules[__name__] if module == "roles" else importlib.import_module(f"rollout_queue.devtools.chaos.{module}")
    role = getattr(home, name)
    return role(args, argv[cut + 1:]) if args.role == "traj" else role(args)


if __name__ == "__main__":
    sys.exit(main())
