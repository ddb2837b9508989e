"""The history checker: proves a run's guarantees from the processes' logs and the Redis truth.

Two witnesses: what each process was told (its JSONL log: acks, refusals, receipts, lease ids) and
what Redis holds at the end (commits stream, ledger, PEL, indexes, dlq). The checker proves:

1. lost = 0: every submitted group (source_id) was committed, or dead-lettered with a reason and
   an attempt history.
2. trained twice = 0: no source group is in two committed leases (the commits stream, plus any
   commit the trainer was told succeeded).
3. stuck = 0: nothing is owned at the end: empty PEL, ready, buffer, backlog and lease index; and,
   measured during the run (progress.py), no group went without an observable change for longer
   than the run's bound, derived from its timeouts and its longest outage.
3b. dead letters only for groups that caused them (the poison prompts, and the hostile groups a
   shipped worker ran): any other group dead-lettered is a failure, whatever its history says (an
   outage counted against its workers, issue 12 item 5, looks just like that). And every counted
   failure is charged to a group that caused it (charges.py): a counted failure of an innocent
   group fails the run, naming entry, attempt, worker, terminal and reason.
4. no late settlement was accepted: no settlement was accepted after a later attempt of the same
   entry had been reserved; every accepted settlement matches the receipt the ledger recorded
   (or a later attempt superseded it); the ledger's receipt of every committed entry is one its
   worker logged and was not refused; each commit matches a lease the trainer logged.
5. acknowledged means durable: every ack a process logged (submit, complete, fail, commit) is
   reflected in Redis. With ``appendfsync everysec`` and a simulated host crash, an ack may be
   lost only inside a loss window ``[loss_from, kill_t + slack]`` (aof.py); each loss is reported
   with its age before the kill, and every lost / trained-twice group must be explained by one.
6. downtime counts against nobody: no settlement was refused to a worker that was not paused while
   it held the receipt, when Redis was down (an outage or a kill) in that time; no lease expired and
   no admission hold was lost across a Redis outage by a trainer that was alive throughout (with
   everysec, unless the grant, lease or hold was acknowledged inside a loss window).
7. the bounds callers give are kept: no reserve grants more samples than the worker's slots
   (``max_samples``), except one group alone to a worker that overcommits; a lease no bound can ever
   satisfy is refused with LeaseUnsatisfiable at once (the trainer's probe), and a partial lease
   within the bounds never is.
8. the shipped workers never die of their groups: one exits 0 or by the nemesis's SIGKILL (or
   SIGTERM before it handled signals), never with a fatal error.
9. weight pushes (pushes.check_pushes): rounds end by their deadline, invented ids never join, a
   member that never reached the trainer is left out of the retry, no worker applies a version no
   publisher recorded, every live shipped worker ends on the last recorded version.
10. a worker credential used adversarially (adversary.check_adversary): what the rules refuse is
   refused, and every violation names the command that ran against its entry.
11. partial rollouts (samples.py): every trained sample's per-token versions are ones it could have
   run under (published by then, loaded by a worker that held an attempt of it, well formed), no
   token is trained twice within a sample (each engine's output is replayed exactly), and no
   progress record is left for a group that settled.
It only reads; it never changes Redis or the logs.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from rollout_queue.devtools.chaos import adversary, pushes, samples
from rollout_queue.devtools.chaos.charges import Charges
from rollout_queue.devtools.chaos.envs import hostile_kind
from rollout_queue.devtools.chaos.progress import Gap, Progress
from rollout_queue.devtools.chaos.roles import HOLD_TIMEOUT_S, is_poison, source_id
from rollout_queue.devtools.chaos.truth import Truth

_LEDGER = re.compile(r"^[as]\|(?:(committed|dead|filtered)\|)?(\d+)\|([^|]*)\|")


@dataclass(frozen=True)
class Window:
    """Writes acknowledged in [loss_from, kill_t] may be lost (a simulated everysec host crash)."""

    loss_from: float
    kill_t: float


@dataclass(frozen=True)
class Spec:
    groups: int
    seed: int
    poison_every: int
    lease_timeout_s: float  # the run's QueueConfig.lease_timeout_s
    slack_s: float = 0.5
    hostile_every: int = 0  # every k-th group is hostile to the shipped workers (envs.hostile_kind)
    worker_timeout_s: float = 2.0


@dataclass
class Report:
    groups: int = 0
    committed: int = 0
    dead: int = 0
    dead_poison: int = 0
    lost: int = 0
    trained_twice: int = 0
    stuck: int = 0
    settlements_accepted: int = 0
    settlements_refused: int = 0
    late_refused: int = 0
    late_accepted: int = 0
    dead_valid: int = 0
    dead_hostile: int = 0                     # hostile groups the shipped workers failed max_attempts times
    hang_after_pause: int = 0  # hostile hang groups a shipped worker completed because it was paused across the step
    commits: int = 0
    commits_refused: int = 0
    rollbacks: int = 0
    unknown_exits: int = 0
    checkpoints: int = 0
    checkpoints_refused: dict[str, int] = field(default_factory=dict)
    oversize_grants: int = 0                  # grants beyond a worker's slots (overcommit, one group alone)
    oversize_queue: dict[str, int] = field(default_factory=dict)  # the queue's own oversize_* counters
    refused_paused: int = 0                   # settlements refused to a worker paused while it held them
    refused_lost_write: int = 0               # everysec: the grant was acknowledged in a loss window
    refused_unexplained: int = 0              # refused with no pause and no outage (a starved heartbeat?)
    refused_across_outage: int = 0            # refused to a live worker across an outage: a violation
    holds_lost: int = 0                       # weight updates whose hold expired first (after its timeout of up-time)
    outages: list[dict[str, Any]] = field(default_factory=list)  # Redis down: how, planned and real length
    progress: dict[str, Any] = field(default_factory=dict)
    lost_acks: list[dict[str, Any]] = field(default_factory=list)
    charges: dict[str, int] = field(default_factory=dict)      # counted failures by what they are charged to
    shipped: dict[str, Any] = field(default_factory=dict)      # the shipped workers' settlements and exits
    pushes: dict[str, Any] = field(default_factory=dict)
    adversary: dict[str, Any] = field(default_factory=dict)
    counters_forged: dict[str, Any] = field(default_factory=dict)  # counters skewed by the adversary's own writes
    samples: dict[str, int] = field(default_factory=dict)      # trained samples replayed (samples.py)
    partials: dict[str, Any] = field(default_factory=dict)     # the progress-record counters and what was left
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violate(self, message: str) -> None:
        self.violations.append(message)


def ledger_receipt(value: str) -> tuple[str, int, str] | None:
    """(settlement or '', attempt, worker) of a ledger value."""
    m = _LEDGER.match(value or "")
    return (m.group(1) or "", int(m.group(2)), m.group(3)) if m else None


class History:
    """The logs, indexed by what the checks ask."""

    def __init__(self, records: Iterable[dict[str, Any]]) -> None:
        self.by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for rec in records:
            self.by_op[rec["op"]].append(rec)
        self.reserves: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.sid_of: dict[str, str] = {}
        for rec in self.by_op["reserve_ok"]:
            for eid, attempt, sid, *_ in rec["grants"]:  # [eid, attempt, sid] or [..., n]; sid None: shipped
                self.reserves[eid].append((attempt, rec["t"]))
                if sid:
                    self.sid_of[eid] = sid
        for rec in self.by_op["submit_ok"]:
            self.sid_of.update(zip(rec["ids"], rec["sids"]))
        self.leases = {rec["lease"]: rec for rec in self.by_op["lease_ok"]}
        self.commit_ok = {rec["lease"]: rec for rec in self.by_op["commit_ok"]}
        self.commit_invoked = {rec["lease"] for rec in self.by_op["commit_invoke"]}
        self.commit_refused = {rec["lease"] for rec in self.by_op["commit_refused"]}

    def ops(self, *names: str) -> list[dict[str, Any]]:
        return [rec for name in names for rec in self.by_op[name]]

    def superseded_before(self, eid: str, attempt: int, t: float) -> list[float]:
        """Times of reserve acks of a later attempt of ``eid`` logged before ``t``."""
        return [rt for a, rt in self.reserves.get(eid, ()) if a > attempt and rt < t]


Span = tuple[float, float, dict[str, Any]]


def _intervals(records: list[dict[str, Any]], begin: set[str], end: str, key: str | None = None) -> list[Span]:
    """[start, end] stretches from the harness log: a ``begin`` record up to the next ``end`` record
    (of the same ``key`` value when given); open at the end of the log: up to +inf."""
    out: list[Span] = []
    open_: dict[Any, dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: r["t"]):
        k = rec.get(key) if key else None
        if rec["op"] in begin:
            open_.setdefault(k, rec)
        elif rec["op"] == end and k in open_:
            start = open_.pop(k)
            out.append((start["t"], rec["t"], start))
    out += [(rec["t"], float("inf"), rec) for rec in open_.values()]
    return out


def _overlaps(spans: list[Span], a: float, b: float) -> bool:
    return any(s <= b and a <= e for s, e, _ in spans)


def _up_s(down: list[Span], a: float, b: float) -> float:
    """Seconds of [a, b] outside every span of ``down``: the time the queue clock counts between
    two instants (now_ms.lua stops it while Redis is down)."""
    cuts = sorted((max(a, s), min(b, e)) for s, e, _ in down if s < b and a < e)
    up, at = 0.0, a
    for s, e in cuts:
        up += max(0.0, s - at)
        at = max(at, e)
    return up + max(0.0, b - at)


class Checker:
    def __init__(self, history: History, truth: Truth, spec: Spec, windows: list[Window],
                 progress: Progress | None = None) -> None:
        self.h, self.truth, self.spec, self.windows, self.progress = history, truth, spec, windows, progress
        harness = [rec for rec in history.ops("redis_kill", "redis_outage", "redis_restart")]
        #: Redis was down: from a kill or an outage's start to the next restart.
        self.down = _intervals(harness, {"redis_kill", "redis_outage"}, "redis_restart")
        #: A worker process was SIGSTOPped: from the stop to its SIGCONT (by child pid).
        signals = [rec for rec in history.by_op["signal"] if rec.get("sig") in ("SIGSTOP", "SIGCONT")]
        self.paused: dict[int, list[Span]] = defaultdict(list)
        for start, stop, rec in _intervals([{**r, "op": r["sig"]} for r in signals], {"SIGSTOP"}, "SIGCONT",
                                           key="child"):
            self.paused[rec["child"]].append((start, stop, rec))
        self.report = Report(groups=spec.groups)
        for eid, sid in ((e, s) for s, e in truth.ids.items()):
            history.sid_of.setdefault(eid, sid)
        for line in truth.dlq:
            history.sid_of.setdefault(line["entry_id"], line["source_id"])

    def in_window(self, t: float) -> Window | None:
        for w in self.windows:
            if w.loss_from - 0.05 <= t <= w.kill_t + self.spec.slack_s:
                return w
        return None

    def lost_ack(self, kind: str, t: float, **what: Any) -> bool:
        """Record an ack Redis does not reflect; True when a loss window explains it."""
        w = self.in_window(t)
        self.report.lost_acks.append({"kind": kind, "t": t, "age_before_kill_s": None if w is None
                                      else round(w.kill_t - t, 3), "explained": w is not None, **what})
        if w is None:
            self.report.violate(f"acknowledged {kind} is not in Redis and no loss window explains it: {what}")
        return w is not None

    def run(self) -> Report:
        for check in (self.check_processes, self.check_submits, self.check_commit_lines, self.check_dead,
                      self.check_groups, self.check_stuck, self.check_ledger, self.check_settlements,
                      self.check_late_commits, self.check_counters, self.check_downtime, self.check_bounds,
                      self.check_trainer_refusals, self.check_progress, self.check_charges, self.check_shipped,
                      self.check_samples, self.check_leftover_partials,
                      self.check_pushes, self.check_adversary):  # the adversary last: it blames the others
            check()
        return self.report

    # -- 0. the processes themselves ---------------------------------------------------------------

    def check_processes(self) -> None:
        r = self.report
        if not any(rec.get("groups") == self.spec.groups for rec in self.h.by_op["done"]):
            r.violate("the producer never logged that it submitted every group")
        for rec in self.h.by_op["crash"]:
            r.violate(f"{rec['role']} {rec['pid']} crashed with {rec['error_type']}: {rec['error']}")
        for rec in self.h.by_op["payload_mismatch"]:
            why = {eid: reason for eid, reason in (rec.get("why") or {}).items()
                   if not self._hang_outlived_by_a_pause(eid, reason)}
            if why or not rec.get("why"):
                r.violate(f"lease {rec['lease']} carried samples that are not what their attempt generated: "
                          f"{why or rec['ids']}")
        r.unknown_exits = len(self.h.by_op["exit_unknown"])
        for rec in self.h.by_op["exit"]:
            # 0: done; 3: OutcomeUnknown (roles.py rule 1) or unreachable Redis (CLI); SIGKILL/SIGTERM: ours.
            # A shipped worker is held to more (check_shipped).
            if rec.get("role") == "harness" and rec.get("code") not in (0, 3, -9, -15) and not rec["slot"].startswith("traj"):
                r.violate(f"{rec['slot']} (pid {rec['child']}) exited with code {rec['code']}: see its .out file")
        for role in ("producer", "worker", "trainer"):
            if not any(rec["role"] == role for rec in self.h.by_op["start"]):
                r.violate(f"no {role} process ever started")

    def _hang_outlived_by_a_pause(self, eid: str, reason: str) -> bool:
        """A hanging tool call (hostile ``hang``/``hang_async``) returns a valid step after 3 x the step
        deadline. If the shipped worker was SIGSTOPped across that step, the call and the deadline
        both ended while it was stopped, and on SIGCONT it took the step that was there: the worker
        never waited past its deadline (it was not running), and the trajectory is a real one. So a
        hang group completed by a worker paused between its reserve and its complete is no mismatch."""
        if not re.search(r"\((hang|hang_async)\)", reason):
            return False
        for done in self.h.by_op["complete_ok"]:
            if done.get("eid") != eid or not done.get("shipped"):
                continue
            began = [g for g in self.h.by_op["reserve_ok"] if g.get("pid") == done["pid"]
                     and any(grant[0] == eid and grant[1] == done["attempt"] for grant in g.get("grants", []))]
            start = min((g["t"] for g in began), default=done["t"])
            if any(p_start < done["t"] and p_stop > start for p_start, p_stop, _ in self.paused.get(done["pid"], [])):
                self.report.hang_after_pause += 1
                return True
        return False

    # -- 1. submits --------------------------------------------------------------------------------

    def check_submits(self) -> None:
        for rec in self.h.by_op["submit_ok"]:
            for sid, eid in zip(rec["sids"], rec["ids"]):
                if self.truth.ids.get(sid) != eid:
                    self.lost_ack("submit", rec["t"], sid=sid, eid=eid)

    # -- 2. commit lines against the trainer's leases -------------------------------------------

    def check_commit_lines(self) -> None:
        r, h = self.report, self.h
        seen: Counter[str] = Counter(line["lease"] for line in self.truth.commits)
        for lease_id, n in seen.items():
            if n > 1:
                r.violate(f"lease {lease_id} has {n} lines in the commits stream")
        redis_ids = {line["lease"]: set(filter(None, line["ids"].split(","))) for line in self.truth.commits}
        for lease_id, ids in redis_ids.items():
            logged = h.leases.get(lease_id)
            if logged is None or {m[0] for m in logged["members"]} != ids:
                r.violate(f"commit line of lease {lease_id} does not match a lease the trainer logged")
            if lease_id not in h.commit_invoked:
                r.violate(f"lease {lease_id} was committed but the trainer never asked to commit it")
            if lease_id in h.commit_refused:
                r.violate(f"lease {lease_id} is committed in Redis but the trainer was told LeaseLost")
        for lease_id, rec in h.commit_ok.items():
            if lease_id not in redis_ids:
                self.lost_ack("commit", rec["t"], lease=lease_id, ids=rec["ids"])
            elif redis_ids[lease_id] != set(rec["ids"]):
                r.violate(f"lease {lease_id}: the trainer committed {rec['ids']}, Redis {sorted(redis_ids[lease_id])}")
        r.commits, r.commits_refused = len(redis_ids), len(h.commit_refused)
        r.rollbacks = len(h.by_op["rollback_ok"])

    # -- 3. dead letters -----------------------------------------------------------------------------

    def check_dead(self) -> None:
        per_entry = Counter(line["entry_id"] for line in self.truth.dlq)
        for line in self.truth.dlq:
            if per_entry[line["entry_id"]] > 1:
                self.report.violate(f"entry {line['entry_id']} is dead-lettered {per_entry[line['entry_id']]} times")
            if not line["reason"] or not line["history"]:
                self.report.violate(f"dead letter of {line['entry_id']} has no reason or no attempt history: {line}")

    # -- 4. every group: committed exactly once or dead -----------------------------------------

    def _trained(self) -> dict[str, set[str]]:
        """source_id -> leases that trained it (Redis commit lines + acked commits lost from Redis)."""
        out: dict[str, set[str]] = defaultdict(set)
        for line in self.truth.commits:
            for eid in filter(None, line["ids"].split(",")):
                out[self.h.sid_of.get(eid, eid)].add(line["lease"])
        for lease_id, rec in self.h.commit_ok.items():
            for eid in rec["ids"]:
                out[self.h.sid_of.get(eid, eid)].add(lease_id)
        return out

    def check_groups(self) -> None:
        r, spec = self.report, self.spec
        trained = self._trained()
        redis_leases = {line["lease"] for line in self.truth.commits}
        dead = {line["source_id"] for line in self.truth.dlq}
        lost_submits = {a["sid"] for a in r.lost_acks if a["kind"] == "submit" and a["explained"]}
        dead_lines = {line["source_id"]: line for line in self.truth.dlq}
        for i in range(spec.groups):
            sid = source_id(spec.seed, i)
            poison = is_poison(i, spec.poison_every)
            leases = trained.get(sid, set())
            hostile = not poison and hostile_kind(i, spec.hostile_every) is not None
            if sid in dead:
                r.dead += 1
                r.dead_poison += poison
                r.dead_hostile += hostile
                if not poison and not hostile:
                    r.dead_valid += 1
                    line = dead_lines[sid]
                    r.violate(f"valid group {sid} ({line['entry_id']}) was dead-lettered: only poison and hostile "
                              f"groups may be; reason {line['reason']!r} at attempt {line['attempt']}, history "
                              f"{line['history']}")
                if leases:
                    r.violate(f"group {sid} is both dead-lettered and trained in {sorted(leases)}")
            elif leases:
                r.committed += 1
                if poison:
                    r.violate(f"poison group {sid} was trained: the test engine never completes it")
            else:
                r.lost += 1
                if sid not in lost_submits or sid in self.truth.ids:
                    r.violate(f"group {sid} was neither committed nor dead-lettered (lost)")
            if len(leases) > 1:
                r.trained_twice += 1
                if len(leases & redis_leases) > 1 or not all(
                        self.in_window(self.h.commit_ok[x]["t"]) for x in leases - redis_leases):
                    r.violate(f"group {sid} was trained in {len(leases)} leases: {sorted(leases)}")

    # -- 5. nothing left owned ---------------------------------------------------------------------

    def check_stuck(self) -> None:
        t = self.truth
        owned = set(t.pel) | set(t.ready) | set(t.buffer) | set(t.backlog)
        self.report.stuck = len(owned)
        if owned:
            sample = sorted(owned)[:10]
            self.report.violate(f"{len(owned)} entries are still owned at the end, e.g. "
                                + ", ".join(f"{e} pel={t.pel.get(e)} ledger={t.ledger.get(e)!r}" for e in sample))
        if t.leases:
            self.report.violate(f"leases still due at the end: {t.leases[:10]}")

    # -- 6. the ledger's receipts against the logs ------------------------------------------------

    def check_ledger(self) -> None:
        r, h = self.report, self.h
        invoked = {(rec["eid"], rec["attempt"], rec["worker"]) for rec in h.ops("complete_invoke")}
        # A shipped worker logs no invoke (no event precedes a settlement): a receipt it was granted.
        invoked |= {(g[0], g[1], rec["worker"]) for rec in h.by_op["reserve_ok"] if rec.get("shipped")
                    for g in rec["grants"]}
        # A receipt is granted once, unless a data loss (everysec) rolled the delivery count back and
        # the same (entry, attempt, worker) was granted again: only a refusal after the last grant counts.
        granted: dict[tuple[str, int, str], float] = {}
        for rec in h.by_op["reserve_ok"]:
            for eid, attempt, *_ in rec["grants"]:
                granted[(eid, attempt, rec["worker"])] = rec["t"]
        refused = {(rec["eid"], rec["attempt"], rec["worker"]) for rec in h.ops("complete_refused")
                   if rec["t"] > granted.get((rec["eid"], rec["attempt"], rec["worker"]), 0.0)}
        for line in self.truth.commits:
            lease = h.leases.get(line["lease"], {"members": []})
            attempts = {m[0]: m[1] for m in lease["members"]}
            for eid in filter(None, line["ids"].split(",")):
                got = ledger_receipt(self.truth.ledger.get(eid, ""))
                detail = self.truth.ledger.get(eid, "")
                if got is None or got[0] != "committed" or f"|{line['lease']}|" not in detail:
                    r.violate(f"entry {eid} of commit {line['lease']} has ledger {detail!r}")
                    continue
                receipt = (eid, got[1], got[2])
                if attempts.get(eid) != got[1]:
                    r.violate(f"entry {eid}: ledger attempt {got[1]} but lease {line['lease']} had {attempts.get(eid)}")
                if receipt not in invoked:
                    r.violate(f"entry {eid}: the ledger's receipt {receipt} was never sent by that worker")
                if receipt in refused:
                    r.violate(f"entry {eid}: receipt {receipt} was refused to its worker but trained")

    # -- 7. settlements: none late, each reflected by the ledger --------------------------------

    def check_settlements(self) -> None:
        r, h = self.report, self.h
        # Each answer belongs to the last invocation of its receipt before it (after a data loss the
        # same receipt can be granted, and sent, twice).
        invokes: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
        for rec in h.ops("complete_invoke", "fail_invoke"):
            invokes[(rec["op"][:-7], rec["eid"], rec["attempt"], rec["worker"])].append(rec["t"])
        for rec in h.ops("complete_refused", "fail_refused"):
            r.settlements_refused += 1
            r.late_refused += bool(rec.get("late"))
        for rec in h.ops("complete_ok", "fail_ok"):
            r.settlements_accepted += 1
            r.late_accepted += bool(rec.get("late"))
            op = rec["op"][:-3]
            sent = [t for t in invokes.get((op, rec["eid"], rec["attempt"], rec["worker"]), []) if t <= rec["t"]]
            t0 = max(sent, default=rec["t"])
            # A shipped worker's record is written when the answer came, not when the call was sent.
            earlier = [] if rec.get("shipped") else h.superseded_before(rec["eid"], rec["attempt"], t0)
            if earlier and not all(self.in_window(t) for t in earlier):
                r.violate(f"late {op} accepted: {rec['eid']} attempt {rec['attempt']} by {rec['worker']} "
                          f"sent at {t0:.3f}, after attempt {rec['attempt'] + 1}+ was reserved at {min(earlier):.3f}")
            self._reflected(op, rec)

    def _reflected(self, op: str, rec: dict[str, Any]) -> None:
        """An accepted settlement is what the ledger ended with, or a later attempt replaced it."""
        got = ledger_receipt(self.truth.ledger.get(rec["eid"], ""))
        if got is not None and (got[1] > rec["attempt"] or (got[1] == rec["attempt"] and got[2] == rec["worker"])):
            return
        self.lost_ack(op, rec["t"], eid=rec["eid"], attempt=rec["attempt"], worker=rec["worker"],
                      ledger=self.truth.ledger.get(rec["eid"]))

    def check_late_commits(self) -> None:
        """A commit accepted after one of its members was reserved again (its lease had expired)."""
        for lease_id, rec in self.h.commit_ok.items():
            lease = self.h.leases.get(lease_id)
            if lease is None:
                continue
            for eid, attempt, *_ in lease["members"]:
                earlier = self.h.superseded_before(eid, attempt, rec["t"])
                if earlier and not all(self.in_window(t) for t in earlier):
                    self.report.violate(f"lease {lease_id} committed after its member {eid} was reserved again")

    # -- 8. the queue's own counters agree with its records -------------------------------------

    def check_counters(self) -> None:
        meta, t = self.truth.meta, self.truth
        self.report.oversize_queue = {k: int(meta.get(k, 0) or 0) for k in ("oversize_skipped", "oversize_granted")}
        committed = sum(len(list(filter(None, line["ids"].split(",")))) for line in t.commits)
        # The worker role writes the counters hash, so a worker credential that wrote it directly
        # (the adversary's HSET / HINCRBY counters) skews them by design (OPERATIONS.md, "Roles and
        # ACLs"), and so does one that took entries with XREADGROUP or XCLAIM outside the scripts that
        # count them (a reaped made-up consumer's entries are released as executing though no reserve
        # counted them): then a mismatch is reported, not a violation; ownership is checked from the
        # records.
        forged = [rec for rec in self.h.by_op.get("adv_cmd", ())
                  if rec["outcome"] == "ran" and (rec["key"] == "counters"
                                                  or (rec["key"] == "src" and rec["command"] in ("xreadgroup", "xclaim")))]
        skewed = {}
        for name, want in (("committed", committed), ("dead", len(t.dlq)), ("retained", 0),
                           ("executing_groups", 0), ("executing_samples", 0), ("leased", 0)):
            raw = str(meta.get(name, 0) or 0)
            have = int(raw) if raw.lstrip("-").isdigit() else raw
            if have != want:
                if forged:
                    skewed[name] = {"have": have, "records": want}
                else:
                    self.report.violate(f"meta counter {name} = {have}, the records say {want}")
        if skewed:
            self.report.counters_forged = {"adversary_writes": len(forged), "skewed": skewed}


    # -- 9. downtime counts against nobody --------------------------------------------------------

    def check_downtime(self) -> None:
        """A StaleReceipt means the reaper took the attempt away: right when the worker was paused
        past worker_timeout_s while holding it, or (everysec) when the grant was acknowledged inside
        a loss window, so a simulated host crash dropped it and the group was granted again; wrong
        when Redis was down meanwhile otherwise (the outage was counted against a live worker: issue
        12 item 5). Refusals with none of these are counted (a heartbeat thread starved on a loaded
        machine can do it), not failed."""
        r, h = self.report, self.h
        r.outages = [{"how": rec.get("how", "kill"), "down_s": round(min(e, 1e12) - s, 2),
                      "planned_s": rec.get("down_s"), "longer_than_worker_timeout":
                      (min(e, 1e12) - s) > float(rec.get("worker_timeout_s") or 1e12)}
                     for s, e, rec in self.down if rec["op"] == "redis_outage"]
        # The worker held a receipt from when its reserve call was sent (Redis may grant it at any
        # moment until the reply: a worker paused inside the call logs its grant only after SIGCONT).
        grants: dict[tuple[str, int, str], float] = {}
        for rec in h.by_op["reserve_ok"]:
            for eid, attempt, *_ in rec["grants"]:
                grants.setdefault((eid, attempt, rec["worker"]), float(rec.get("sent", rec["t"])))
        for rec in h.ops("complete_refused", "fail_refused"):
            if rec.get("error") != "StaleReceipt":
                continue
            start = grants.get((rec["eid"], rec["attempt"], rec["worker"]), rec["t"])
            if _overlaps(self.paused.get(rec["pid"], []), start, rec["t"]):
                r.refused_paused += 1
            elif self.in_window(start):
                r.refused_lost_write += 1  # everysec: a host crash dropped the grant itself
            elif _overlaps(self.down, start, rec["t"]):
                r.refused_across_outage += 1
                r.violate(f"{rec['op'][:-8]} of {rec['eid']} attempt {rec['attempt']} was refused to live worker "
                          f"{rec['worker']} (never paused while it held the receipt) after Redis was down: "
                          f"downtime was counted against it (granted at {start:.3f}, refused at {rec['t']:.3f})")
            else:
                r.refused_unexplained += 1

    # -- 10. the callers' bounds --------------------------------------------------------------------

    def check_bounds(self) -> None:
        r = self.report
        for rec in self.h.by_op["reserve_ok"]:
            cap = int(rec.get("max_samples") or 0)
            sizes = [g[3] for g in rec["grants"] if len(g) > 3]
            if not cap or len(sizes) < len(rec["grants"]) or sum(sizes) <= cap:
                continue
            if rec.get("overcommit") and len(sizes) == 1:
                r.oversize_grants += 1
                continue
            r.violate(f"worker {rec['worker']} with {cap} slots (overcommit={bool(rec.get('overcommit'))}) was "
                      f"granted {sum(sizes)} samples in {len(sizes)} groups: {rec['grants']}")
        for rec in self.h.by_op["lease_probe_answered"]:
            r.violate(f"a lease of {rec['groups']} groups, more than any bound allows, answered {rec['got']} "
                      "instead of LeaseUnsatisfiable: a trainer would wait on it forever")
        for rec in self.h.by_op["lease_unsatisfiable"]:
            r.violate(f"a partial lease of {rec['groups']} groups was refused as unsatisfiable ({rec['bound']} "
                      f"allows {rec['limit']}): the run's bounds always allow one group")

    # -- 11. leases, holds and checkpoints of live trainers -----------------------------------------

    def counted_against(self, start: float, end: float, timeout_s: float) -> bool:
        """Whether a lease or hold that was alive at ``start`` and gone at ``end`` had downtime
        counted against it: Redis was down in between, yet less than its timeout of up-time passed
        (with the run's slack for the harness logging a restart after clients may use it). A live
        trainer is normally far inside its timeouts, but on a loaded machine the first calls after
        a restart can take seconds: an expiry after the whole timeout of up-time is correct."""
        return (not self.in_window(start) and _overlaps(self.down, start, end)
                and _up_s(self.down, start, end) < timeout_s - self.spec.slack_s)

    def check_trainer_refusals(self) -> None:
        """A live trainer's lease expiring, or its hold being lost, across a Redis outage before its
        timeout of Redis's up-time passed is downtime counted against it. Refused checkpoints are
        counted, never failed: the trainer skips one when another trainer holds a lease (LeasesOpen)
        or checkpointed further."""
        r, h = self.report, self.h
        for rec in h.by_op["commit_refused"]:
            lease = h.leases.get(rec["lease"])
            if (rec.get("state") == "expired" and lease
                    and self.counted_against(lease["t"], rec["t"], self.spec.lease_timeout_s)):
                r.violate(f"lease {rec['lease']} of a live trainer expired across a Redis outage (leased at "
                          f"{lease['t']:.3f}, commit refused at {rec['t']:.3f}, "
                          f"{_up_s(self.down, lease['t'], rec['t']):.2f} s of up-time between): "
                          "downtime was counted against it")
        invoked: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for rec in h.by_op["publish_invoke"]:
            invoked[rec["pid"]].append(rec)
        r.holds_lost = len(h.by_op["publish_refused"])
        for rec in h.by_op["publish_refused"]:
            # The hold was opened no earlier than the update was invoked: its longest possible life.
            began = max((i for i in invoked.get(rec["pid"], []) if i["t"] <= rec["t"]), key=lambda i: i["t"],
                        default={"t": rec["t"]})
            start, timeout_s = began["t"], float(began.get("hold_timeout_s", HOLD_TIMEOUT_S))
            if self.counted_against(start, rec["t"], timeout_s):
                r.violate(f"admission hold {rec['hold']} of a live trainer was lost across a Redis outage "
                          f"(opened after {start:.3f}, refused at {rec['t']:.3f}, {_up_s(self.down, start, rec['t']):.2f} s "
                          f"of up-time between, timeout {timeout_s} s): downtime was counted against it")
        r.checkpoints = len(h.by_op["checkpoint_ok"])
        r.checkpoints_refused = dict(Counter(rec["error"] for rec in h.by_op["checkpoint_refused"]))

    # -- 12. liveness during the run ----------------------------------------------------------------

    def check_progress(self) -> None:
        """Every gap longer than the bound fails the run, unless (everysec) it overlaps a loss window:
        an acknowledged write that a host crash dropped leaves its group owned by a worker that thinks
        it is done, until the harness restarts the workers (harness._recover_forgotten_ownership).
        With frequent simulated host crashes that excuses most gaps: the watchdog is a liveness check
        for ``always``, a measurement for ``everysec``."""
        if self.progress is None:
            return
        p = self.progress
        self.report.progress = p.summary()
        for gap in p.stalls:
            if self.windows and self._gap_in_window(gap):
                continue
            self.report.violate(f"group {gap.sid} made no progress for {gap.length:.1f}s (bound {p.bound_s:.1f}s) "
                                f"while {gap.state}, from {gap.start:.3f}"
                                + (" to the end of the run" if gap.end is None else f" to {gap.end:.3f}"))

    def _gap_in_window(self, gap: Gap) -> bool:
        end = gap.end if gap.end is not None else float("inf")
        return any(w.loss_from - 0.05 <= end and gap.start <= w.kill_t + self.spec.slack_s for w in self.windows)


    # -- 13. counted failures, shipped workers, pushes, the adversary ------------------------------

    def check_charges(self) -> None:
        Charges(self).run()

    def check_shipped(self) -> None:
        """A shipped worker never dies of its groups (issue 29): it exits 0 (drained), or by a SIGKILL
        the harness sent (a fault, or a straggler at shutdown), or by SIGTERM before it handled
        signals; never 1 (a fatal error) nor 3. Its settlements are counted by kind."""
        r, h = self.report, self.h
        killed = {rec["child"] for rec in h.by_op["signal"] if rec.get("sig") == "SIGKILL"}
        exits = Counter[str]()
        for rec in h.by_op["exit"]:
            if rec.get("role") != "harness" or not rec["slot"].startswith("traj"):
                continue
            code = rec.get("code")
            exits[str(code)] += 1
            if code not in (0, -15) and not (code == -9 and rec["child"] in killed):
                r.violate(f"shipped worker {rec['slot']} (pid {rec['child']}) exited with code {code}"
                          f"{' without a SIGKILL from the harness' if code == -9 else ''}: see its .out file")
        for rec in h.by_op["fatal"]:
            r.violate(f"shipped worker {rec.get('worker')} stopped on a fatal error: {rec.get('error')}")
        shipped = [rec for rec in h.ops("complete_ok", "fail_ok", "abort_ok", "complete_refused", "malformed")
                   if rec.get("shipped")]
        r.shipped = {"settled": dict(Counter(rec["op"] for rec in shipped)), "exits": dict(exits),
                     "reserved": sum(len(rec["grants"]) for rec in h.by_op["reserve_ok"] if rec.get("shipped"))}

    # -- 14. partial rollouts: versions, tokens trained once, no record left (samples.py) ----------

    def check_samples(self) -> None:
        samples.check_samples(self)

    def check_leftover_partials(self) -> None:
        samples.check_leftover(self)

    def check_pushes(self) -> None:
        if self.h.by_op["push_invoke"] or self.h.by_op["weights_applied"]:
            pushes.check_pushes(self)

    def check_adversary(self) -> None:
        adversary.check_adversary(self)


def check(records: list[dict[str, Any]], truth: Truth, spec: Spec, progress: Progress | None = None) -> Report:
    windows = [Window(rec["loss_from"], rec["kill_t"]) for rec in records
               if rec["op"] in ("redis_kill", "redis_outage") and rec.get("loss_from") is not None]
    return Checker(History(records), truth, spec, windows, progress).run()
