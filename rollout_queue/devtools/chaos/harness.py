"""One chaos run: a private Redis, the processes, the faults, the end condition, then the check.

Owns the run's timeline: start Redis (LocalServer, AOF ``always`` or ``everysec``), open the queue,
spawn the producer, P test-engine workers (each with its own slot count, some overcommitting), T
trainers and R reapers (``python -m rollout_queue reaper``), and what fleet.py adds (shipped
workers, a pusher and a push-fault member, the adversary), inject faults until every group is
settled or the fault phase ends, let the queue settle without faults, let the shipped workers catch
up with the last version (fleet.converge), stop everything with SIGTERM, then run the checker on
the logs and the Redis truth. While the run goes, the progress watchdog
(progress.py) tails the logs and the commits/dlq streams and logs a ``stall`` line the moment any
group has gone longer than the run's bound without an observable change; the checker fails the run
on every such gap. It must not fix anything it finds: the checker's verdict is the run's result.
"""

from __future__ import annotations

import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import orjson
import redis

from rollout_queue import QueueConfig
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.local_server import LocalServer

from rollout_queue.devtools.chaos import checker, fleet
from rollout_queue.devtools.chaos.aof import AofTail
from rollout_queue.devtools.chaos.nemesis import (
    DEFAULT_WEIGHTS,
    FAULT_KINDS,
    PARTIAL_KINDS,
    PUSH_KINDS,
    Nemesis,
    NemesisConfig,
)
from rollout_queue.devtools.chaos.oplog import LogTail, OpLog, read_logs
from rollout_queue.devtools.chaos.progress import Progress, bound_for, replay
from rollout_queue.devtools.chaos.roles import DEFAULT_SIZES
from rollout_queue.devtools.chaos.supervisor import Slot, Supervisor
from rollout_queue.devtools.chaos.truth import Truth
from rollout_queue.devtools.chaos.truth import load as load_truth
from rollout_queue.devtools.chaos.truth import observe, stream_lines
from rollout_queue.devtools.chaos.truth import save as save_truth

#: the folder that holds the rollout_queue package (chaos lives inside it, at devtools/chaos)
ROOT = Path(__file__).resolve().parents[3]



def _count(raw: object) -> int:
    """A counter as read raw: 0 where it is absent or no integer (a worker credential may forge it)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "0")
    return int(text) if text.lstrip("-").isdigit() else 0

@dataclass
class RunConfig:
    groups: int = 600
    seed: int = 1
    workers: int = 3
    # Slots of worker i (its max_samples) and whether it overcommits: worker_slots[i % len]. No
    # worker has slots for the largest groups (8), so they run only because some workers overcommit
    # (two, so that one killed or paused worker does not hold them all up), and the strict one must
    # skip groups larger than its slots, not stall behind them (issue 12 item 2).
    worker_slots: tuple[int, ...] = (2, 4, 6)
    worker_overcommit: tuple[bool, ...] = (True, False, True)
    worker_groups: int = 4                    # max_groups per reserve
    group_sizes: tuple[int, ...] = DEFAULT_SIZES  # each group's n is drawn from these (empty: the old 2-4)
    trainers: int = 2                         # trainer 0 publishes weights (no pusher); all lease and checkpoint
    reapers: int = 2
    mode: str = "always"                      # appendfsync: 'always' or 'everysec'
    kind: str | None = None                   # 'redis' or 'valkey' (None: what is installed)
    fault_interval_s: float = 1.0
    weights: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    deadline_s: float = 150.0                 # the whole run, faults and settling
    settle_s: float = 30.0                    # the last part of the deadline is fault-free
    worker_timeout_s: float = 2.0
    lease_timeout_s: float = 4.0
    max_attempts: int = 6
    poison_every: int = 97
    lease_batch: int = 8
    train_ms: float = 200.0                   # the trainer's "training" time per step (uniform up to)
    gen_ms: float = 30.0                      # the test engine's "generation" time per group (uniform up to)
    loss_window_s: float = 1.0                # everysec: the simulated host crash drops this much
    outage_factor: tuple[float, float] = (1.5, 3.0)  # redis_outage: down this many x worker_timeout_s
    progress_slack_s: float = 15.0            # the progress bound's slack: restarts, reaper passes, queueing
    abort_after_bounds: float = 3.0           # end the run early once a group has gone this many bounds unchanged
    cli_reaper: bool = False                  # reapers as `python -m rollout_queue reaper` (else run_reaper)
    # Groups submitted per second at most (0: as fast as the backlog allows). A run's fault count is
    # its length x the fault rate, and without a pace its length is the machine's speed: a fast
    # machine settled the short run in ~24 s and met 19 faults. Paced, submission alone spans
    # groups / submit_rate seconds on any machine, so faults land on work that is still in flight.
    submit_rate: float = 0.0
    log_dir: str | None = None                # kept when given; a temp dir removed on success otherwise
    # Issue 29: shipped workers (``rollout_queue.workers``, the scripted engine, envs.ChaosEnv and
    # chaos_reward) beside the test-engine ones, groups hostile to them, weight pushes, an adversary.
    traj_workers: int = 0                     # shipped worker processes
    traj_slots: int = 8                       # their --max-samples (and the scripted engine's concurrency)
    hostile_every: int = 11                   # every k-th group is hostile to them (envs.hostile_kind; 0: none)
    env_step_timeout_s: float = 1.0           # their --env-step-timeout; a hostile hang lasts 3 x it
    # Partial rollouts: the shipped workers save progress this often, and a model turn takes latency
    # plus up to jitter seconds, so an attempt of 2-3 turns outlives a save and a kill finds records.
    save_progress_every_s: float = 0.05
    traj_latency_s: float = 0.03
    traj_jitter_s: float = 0.06
    pushes: bool = False                      # a pusher publishes the versions (trainer 0 then does not)
    publish_interval_s: float = 3.0           # pusher: seconds between versions
    push_every: int = 1                       # pusher: every k-th version also goes by torch.distributed push
    push_join_s: float = 1.5
    push_deadline_s: float = 5.0
    unreachable_rate: float = 0.3             # pushfault: share of rounds a member that cannot connect joins
    invented_rate: float = 1.0                # pushfault: share of rounds an id that never heartbeat tries
    code_root: str | None = None              # run the children from this tree's package (chaos/ overlaid)
    adversary_commands: str = ""              # only these attacks ("xack src,del meta"; '': every one)

    def nemesis_weights(self) -> dict[str, float]:
        """The kinds the nemesis draws: ``credential`` paces the adversary instead, the push
        faults need a pusher and the partial faults shipped workers."""
        return {k: v for k, v in self.weights.items()
                if v > 0 and k != "credential" and (self.pushes or k not in PUSH_KINDS)
                and (self.traj_workers > 0 or k not in PARTIAL_KINDS)}

    def max_outage_s(self) -> float:
        """The longest Redis is down in this run (a long outage if that fault is drawn, else a kill)."""
        if self.weights.get("redis_outage", 0) > 0:
            return self.worker_timeout_s * self.outage_factor[1]
        return NemesisConfig().redis_down_s[1] if self.weights.get("redis_kill", 0) > 0 else 0.0

    def progress_bound_s(self) -> float:
        """No group may go longer than this without an observable change (progress.bound_for)."""
        return bound_for(self.worker_timeout_s, self.lease_timeout_s, self.max_outage_s(), self.progress_slack_s)

    def queue_config(self) -> QueueConfig:
        return QueueConfig(max_completed_groups=64, max_staleness=4, lease_timeout_s=self.lease_timeout_s,
                           worker_timeout_s=self.worker_timeout_s, max_attempts=self.max_attempts,
                           hold_timeout_s=5.0, commits_maxlen=10_000_000, lease_record_ttl_s=3600.0)


@dataclass
class RunResult:
    config: dict[str, Any]
    report: checker.Report
    faults: dict[str, int]
    duration_s: float
    finished: bool
    log_dir: str
    reaped: dict[str, int]
    stall_restarts: int
    stalls_live: int = 0                      # stall lines the watchdog wrote while the run went

    @property
    def ok(self) -> bool:
        return self.finished and self.report.ok

    def summary(self) -> dict[str, Any]:
        r = self.report
        lost_acks = r.lost_acks
        return {
            "ok": self.ok, "finished": self.finished, "mode": self.config["mode"], "seed": self.config["seed"],
            "groups": r.groups, "committed": r.committed, "dead_lettered": r.dead, "dead_poison": r.dead_poison,
            "dead_valid": r.dead_valid, "lost": r.lost, "trained_twice": r.trained_twice, "stuck": r.stuck,
            "liveness": _liveness(r.progress),
            "no_progress_max_s": r.progress.get("worst_s"), "no_progress_bound_s": r.progress.get("bound_s"),
            "no_progress_worst": r.progress.get("worst"), "stalls": r.progress.get("stalls"),
            "stalls_live": self.stalls_live,
            "faults": dict(self.faults), "faults_total": sum(self.faults.get(k, 0) for k in FAULT_KINDS),
            "outages": r.outages, "outages_longer_than_worker_timeout":
                sum(o["longer_than_worker_timeout"] for o in r.outages),
            "worker_slots": [f"{s}{'+' if o else ''}" for s, o in self._slots()],
            "oversize_grants": r.oversize_grants, "oversize_queue_counters": r.oversize_queue,
            "refused_paused": r.refused_paused,
            "refused_across_outage": r.refused_across_outage, "refused_lost_write": r.refused_lost_write,
            "refused_unexplained": r.refused_unexplained, "holds_lost": r.holds_lost,
            "checkpoints": r.checkpoints, "checkpoints_refused": r.checkpoints_refused,
            "settlements_accepted": r.settlements_accepted, "settlements_refused": r.settlements_refused,
            "late_settlements_refused": r.late_refused, "late_flag_accepted": r.late_accepted,
            "commits": r.commits, "commits_refused_lease_lost": r.commits_refused, "rollbacks": r.rollbacks,
            "outcome_unknown_exits": r.unknown_exits, "reaped": self.reaped, "stall_restarts": self.stall_restarts,
            "dead_hostile": r.dead_hostile, "charges": r.charges, "shipped": r.shipped, "pushes": r.pushes,
            "adversary": r.adversary,
            "counters_forged": r.counters_forged,
            "partials": r.partials, "trained_samples": r.samples,
            "acks_lost": len(lost_acks),
            "acks_lost_by_kind": dict(Counter(a["kind"] for a in lost_acks)),
            "acks_lost_unexplained": sum(not a["explained"] for a in lost_acks),
            "acks_lost_max_age_before_kill_s": max((a["age_before_kill_s"] or 0 for a in lost_acks), default=0),
            "loss_bound_s": self.config["loss_window_s"] if self.config["mode"] == "everysec" else 0,
            "duration_s": round(self.duration_s, 1), "violations": r.violations[:20],
            "violations_total": len(r.violations), "log_dir": self.log_dir,
        }

    def _slots(self) -> list[tuple[int, bool]]:
        c = self.config
        slots, over = c["worker_slots"] or [0], c["worker_overcommit"] or [False]
        return [(slots[i % len(slots)], bool(over[i % len(over)])) for i in range(c["workers"])]


def _liveness(progress: Mapping[str, Any]) -> str:
    """stuck = 0 in words: the watchdog's verdict over the whole run, not only at its end."""
    if not progress:
        return "not measured"
    stalls, bound, worst = progress.get("stalls", 0), progress.get("bound_s"), progress.get("worst_s")
    if stalls:
        return f"{stalls} gap(s) without progress longer than {bound} s (worst {worst} s)"
    return f"no group without progress for longer than {bound} s (worst {worst} s)"


def snapshot_code(dest: Path, root: Path = ROOT) -> Path:
    """Copy the package the children import (rollout_queue, chaos inside it) into ``dest``: a run exercises
    one build from start to end, even while the working tree changes under it (a restarted worker
    with other Lua would meet a queue that stores another library version). With another ``root``
    (an older tree: ``git archive <commit>``), its package runs under this harness's chaos/."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(root / "rollout_queue", dest / "rollout_queue", ignore=ignore)
    if root != ROOT:
        chaos = dest / "rollout_queue" / "devtools" / "chaos"
        shutil.rmtree(chaos, ignore_errors=True)
        shutil.copytree(Path(__file__).resolve().parent, chaos, ignore=ignore)
    return dest


def _argv_cli_reaper(url: str, queue: str) -> Any:
    """The ``rollout-queue reaper`` command itself; its JSON log lines go to the slot's .out file."""
    return lambda log: ["-m", "rollout_queue", "--url", url, "--queue", queue, "reaper", "--interval", "0.5",
                        "--json-logs"]


class Run:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="rollout-chaos-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log = OpLog(self.log_dir / "harness.jsonl", "harness")
        self.queue = f"chaos-{cfg.seed}-{int(time.time())}"
        self.credential = fleet.Credential(self.queue, self.log_dir) if cfg.weights.get("credential", 0) > 0 else None
        extra = [("auto-aof-rewrite-percentage", "0")] if cfg.mode == "everysec" else []
        if self.credential is not None:
            extra.append(("aclfile", str(self.credential.path)))
        self.server = LocalServer(cfg.kind, appendfsync=cfg.mode, extra_config=extra)
        self.stall_restarts = 0
        self.end_t: float | None = None  # when the loop ended (wall clock): the watchdog judges up to here

    def start(self) -> None:
        cfg, url = self.cfg, self.server.start().url
        code = snapshot_code(self.log_dir / "code", Path(cfg.code_root) if cfg.code_root else ROOT)
        self.sup = Supervisor(code, self.log_dir, self.log, self.rng)
        # The queue is created by the snapshot's code, so its stored library version is the one every
        # child brings (this process may have imported an older or newer rollout_queue).
        init = self.sup.run_once(["-m", "rollout_queue.devtools.chaos.roles", "init", "--url", url, "--queue", self.queue,
                                  "--log", str(self.log_dir / "init.jsonl"), "--config", orjson.dumps(
                                      cfg.queue_config().to_meta()).decode()])
        if init != 0:
            raise RuntimeError(f"creating queue {self.queue} failed (exit {init}); see {self.log_dir}/init.out")
        self.log.write("run_start", config=asdict(cfg), queue=self.queue, url=url, kind=self.server.kind,
                       code=str(code))
        self.sup.add(Slot("producer", 0, fleet.role_argv("producer", url, self.queue, cfg, 0, groups=cfg.groups,
                                                    poison_every=cfg.poison_every, batch=32, backlog=96,
                                                    sizes=",".join(map(str, cfg.group_sizes)),
                                                    rate=cfg.submit_rate, start_t=time.time(),
                                                    hostile_every=cfg.hostile_every if cfg.traj_workers else 0,
                                                    hang_s=fleet.hang_s(cfg))))
        for i in range(cfg.workers):
            slots = cfg.worker_slots[i % len(cfg.worker_slots)] if cfg.worker_slots else 0
            over = cfg.worker_overcommit[i % len(cfg.worker_overcommit)] if cfg.worker_overcommit else False
            self.sup.add(Slot("worker", i, fleet.role_argv("worker", url, self.queue, cfg, i, gen_ms=cfg.gen_ms,
                                                      max_samples=slots, overcommit=int(over),
                                                      max_groups=cfg.worker_groups)))
        probe = cfg.queue_config().max_completed_groups + 1  # no bound can ever allow it
        for i in range(cfg.trainers):
            # One trainer publishes weights (two would race for the same next version); all lease,
            # commit and checkpoint, so a checkpoint meets another trainer's open lease.
            self.sup.add(Slot("trainer", i, fleet.role_argv("trainer", url, self.queue, cfg, i, batch=cfg.lease_batch,
                                                       train_ms=cfg.train_ms, lease_probe=probe,
                                                       publish_every=5 if i == 0 and not cfg.pushes else 0)))
        for i in range(cfg.reapers):
            if cfg.cli_reaper:
                self.sup.add(Slot("reaper", i, _argv_cli_reaper(url, self.queue), log_suffix=".reaper.log"))
            else:
                self.sup.add(Slot("reaper", i, fleet.role_argv("reaper", url, self.queue, cfg, i)))
        fleet.add_roles(self, url)
        self.aof = AofTail(self.server.dir).start() if cfg.mode == "everysec" else None
        keys = QueueKeys(self.queue)
        self.nemesis = Nemesis(self.sup, self.server, self.log, self.rng, NemesisConfig(
            interval_s=cfg.fault_interval_s, weights=cfg.nemesis_weights(), worker_timeout_s=cfg.worker_timeout_s,
            loss_window_s=cfg.loss_window_s if cfg.mode == "everysec" else None,
            outage_factor=cfg.outage_factor), self.aof, push_keys=(keys["push"], keys["push_members"]),
            partial_keys=(keys["partial_head"], keys["src"]))
        self.watch = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=1.0)
        self.progress = Progress(cfg.progress_bound_s())
        self.tail = LogTail(self.log_dir)
        self.stream_at = {"commits": "0-0", "dlq": "0-0"}
        self.stalls_live = 0
        self.log.write("progress_bound", bound_s=round(self.progress.bound_s, 3))

    def watch_progress(self) -> None:
        """One watchdog step: the new log records and settlement lines, then the open gaps; a stall
        line for every group that just crossed the bound (the checker fails the run on each)."""
        for rec in self.tail.read():
            self.progress.feed(rec)
        keys = QueueKeys(self.queue)
        for stream in ("commits", "dlq"):
            try:
                while True:
                    lines = stream_lines(self.watch.xrange(keys[stream], min=f"({self.stream_at[stream]}", count=1000))
                    for sid, fields in lines:
                        self.progress.settle_line(stream, sid, fields)
                        self.stream_at[stream] = sid
                    if len(lines) < 1000:
                        break
            except redis.RedisError:
                break  # Redis is down or restarting: the next step reads on from here
        for gap in self.progress.tick(time.time()):
            self.stalls_live += 1
            self.log.write("stall", sid=gap.sid, state=gap.state, since=gap.start, age_s=round(gap.length, 3),
                           bound_s=self.progress.bound_s)

    def settled(self) -> tuple[bool, int]:
        """(every group in Redis is settled and the producer is done, groups settled so far).
        Read raw: this process runs no queue script. Settled is judged from the stream, the PEL and
        the kept index, never from the counters, which a worker credential (the adversary) may forge;
        the counters only report progress."""
        keys = QueueKeys(self.queue)
        try:
            meta = self.watch.hmget(keys["counters"], "committed", "dead", "filtered")
            length = self.watch.xlen(keys["src"])
            pending = self.watch.xpending(keys["src"], "rollout")["pending"]
            kept = self.watch.zcard(keys["kept"])
        except redis.RedisError:
            return False, -1  # Redis is restarting (or the group is being recreated)
        committed, dead, filtered = (_count(x) for x in meta)
        producer_done = all(s.done for s in self.sup.slots if s.role == "producer")
        done = producer_done and pending == 0 and length - kept == 0
        return done, committed + dead + filtered

    def loop(self) -> bool:
        """Faults until settled or the fault phase ends, then settle without faults. True if settled."""
        cfg = self.cfg
        start = time.monotonic()
        fault_until, deadline = start + cfg.deadline_s - cfg.settle_s, start + cfg.deadline_s
        last_poll, progress, last_progress = 0.0, -1, start
        while True:
            now = time.monotonic()
            self.sup.poll(now)
            self.nemesis.tick(active=now < fault_until)
            if now - last_poll >= 0.5:
                last_poll = now
                self.watch_progress()
                oldest = self.progress.oldest_open(time.time())
                if cfg.mode == "always" and oldest > cfg.abort_after_bounds * self.progress.bound_s:
                    # Stuck, not slow: waiting for the deadline would only burn the machine's time.
                    self.log.write("abort_stalled", oldest_s=round(oldest, 3), bound_s=self.progress.bound_s)
                    self.end_t = time.time()
                    return False
                done, count = self.settled()
                if done:
                    self.end_t = time.time()
                    return True
                if count > progress:
                    progress, last_progress = count, now
                if now > deadline:
                    self.end_t = time.time()
                    return False
                if cfg.mode == "everysec" and now >= fault_until and now - last_progress > 8.0:
                    self._recover_forgotten_ownership()
                    last_progress = now
            time.sleep(0.02)

    def _recover_forgotten_ownership(self) -> None:
        """everysec only: a lost ``complete`` leaves the entry owned by a live worker that believes it
        is done. A worker restart (SIGTERM: close() requeues everything it owns) takes it back; the
        checker reports the lost acks that caused it. Never used with ``always``: a stall there is a bug."""
        self.stall_restarts += 1
        for slot in self.sup.running("worker"):
            self.sup.signal(slot, signal.SIGTERM, "stall_restart")

    def finish(self, finished: bool, start: float) -> RunResult:
        end_t = self.end_t or time.time()
        self.log.write("loop_end", finished=finished, end_t=end_t)
        self.nemesis.release_all()
        fleet.converge(self)
        self.sup.stop_all()
        if self.aof:
            self.aof.stop()
        duration = time.monotonic() - start
        self.watch.close()
        truth = observe(self.server.url, self.queue)
        save_truth(truth, self.log_dir / "truth.json")
        # The watchdog's last word: what the logs and Redis say happened up to the end of the loop.
        for rec in self.tail.read():
            self.progress.feed(rec)
        self.progress.map_ids(truth.ids)
        _settle_truth(self.progress, truth)
        self.progress.finish(end_t)
        records = read_logs(self.log_dir)
        report = checker.check(records, truth, spec_of(asdict(self.cfg)), self.progress)
        faults = Counter(self.nemesis.counts)
        faults["credential"] = sum(rec["op"] == "adv_cmd" and rec["outcome"] != "unavailable" for rec in records)
        self.log.write("run_end", finished=finished, ok=report.ok, duration_s=duration)
        return RunResult(asdict(self.cfg), report, dict(faults), duration, finished, str(self.log_dir),
                         _reaped(self.log_dir, records), self.stall_restarts, self.stalls_live)


def _settle_truth(progress: Progress, truth: Truth) -> None:
    """Feed the final commits and dlq lines (with their stream ids) in time order."""
    lines = [("commits", line["stream_id"], line) for line in truth.commits if line.get("stream_id")]
    lines += [("dlq", line["stream_id"], line) for line in truth.dlq if line.get("stream_id")]
    for stream, stream_id, fields in sorted(lines, key=lambda x: tuple(int(p) for p in x[1].split("-"))):
        progress.settle_line(stream, stream_id, fields)


def _reaped(log_dir: Path, records: list[dict[str, Any]]) -> dict[str, int]:
    """Totals of the reapers' ``reaped`` records: the reaper role's op logs, or the CLI reaper's JSON
    log lines in its .out files (torn lines and tracebacks skipped)."""
    lines = [rec for rec in records if rec["op"] == "reaper_reaped"]
    for path in log_dir.glob("reaper*.out"):
        for raw in path.read_bytes().splitlines():
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue  # a traceback or a torn line: not a reaper record
            if isinstance(line, dict) and line.get("msg") == "reaped":
                lines.append(line)
    totals: Counter[str] = Counter()
    for line in lines:
        for k in ("lost", "expired", "stale", "dead", "holds_expired", "orphans"):
            totals[k] += int(line.get(k, 0))
    return dict(totals)


def spec_of(cfg: Mapping[str, Any]) -> checker.Spec:
    """What the checker must know of a run's config (a RunConfig as its run_start record has it)."""
    return checker.Spec(cfg["groups"], cfg["seed"], cfg["poison_every"], lease_timeout_s=cfg["lease_timeout_s"],
                        hostile_every=cfg.get("hostile_every", 0) if cfg.get("traj_workers") else 0,
                        worker_timeout_s=cfg["worker_timeout_s"])


def run(cfg: RunConfig, keep_logs: bool = False) -> RunResult:
    """Run one chaos run and check it. Logs are removed on success unless kept or a dir was given."""
    r = Run(cfg)
    start = time.monotonic()
    try:
        r.start()
        finished = r.loop()
        result = r.finish(finished, start)
    finally:
        r.server.cleanup(graceful=False)
    if result.ok and not keep_logs and cfg.log_dir is None:
        shutil.rmtree(r.log_dir, ignore_errors=True)  # a temp dir of a passing run: nothing to inspect
    return result


def recheck(log_dir: Path) -> checker.Report:
    """Run the checker again on a finished run's logs and saved Redis truth (no Redis needed)."""
    records = read_logs(log_dir)
    cfg = next(rec["config"] for rec in records if rec["op"] == "run_start")
    spec = spec_of(cfg)
    truth = load_truth(log_dir / "truth.json")
    bound = next((rec["bound_s"] for rec in records if rec["op"] == "progress_bound"), None)
    end = next((rec["end_t"] for rec in records if rec["op"] == "loop_end"), None)
    progress = None
    if bound is not None and end is not None:  # a run of a harness without the watchdog has neither
        progress = replay([r for r in records if r["t"] <= end],
                          [(x["stream_id"], x) for x in truth.commits if x.get("stream_id")],
                          [(x["stream_id"], x) for x in truth.dlq if x.get("stream_id")], truth.ids, bound, end)
    return checker.check(records, truth, spec, progress)
