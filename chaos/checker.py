"""The history checker: proves a run's guarantees from the processes' logs and the Redis truth.

Two witnesses: what each process was told (its JSONL log: acks, refusals, receipts, lease ids) and
what Redis holds at the end (commits stream, ledger, PEL, indexes, dlq). The checker proves:

1. lost = 0: every submitted group (source_id) was committed, or dead-lettered with a reason and
   an attempt history.
2. trained twice = 0: no source group is in two committed leases (the commits stream, plus any
   commit the trainer was told succeeded).
3. stuck = 0: nothing is owned at the end: empty PEL, ready, buffer, backlog and lease index.
4. no late settlement was accepted: no settlement was accepted after a later attempt of the same
   entry had been reserved; every accepted settlement matches the receipt the ledger recorded
   (or a later attempt superseded it); the ledger's receipt of every committed entry is one its
   worker logged and was not refused; each commit matches a lease the trainer logged.
5. acknowledged means durable: every ack a process logged (submit, complete, fail, commit) is
   reflected in Redis. With ``appendfsync everysec`` and a simulated host crash, an ack may be
   lost only inside a loss window ``[loss_from, kill_t + slack]`` (aof.py); each loss is reported
   with its age before the kill, and every lost / trained-twice group must be explained by one.
It only reads; it never changes Redis or the logs.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from .roles import source_id
from .truth import Truth

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
    slack_s: float = 0.5


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
    commits: int = 0
    commits_refused: int = 0
    rollbacks: int = 0
    unknown_exits: int = 0
    lost_acks: list[dict[str, Any]] = field(default_factory=list)
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
            for eid, attempt, sid in rec["grants"]:
                self.reserves[eid].append((attempt, rec["t"]))
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


class Checker:
    def __init__(self, history: History, truth: Truth, spec: Spec, windows: list[Window]) -> None:
        self.h, self.truth, self.spec, self.windows = history, truth, spec, windows
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
                      self.check_late_commits, self.check_counters):
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
            r.violate(f"lease {rec['lease']} carried samples that are not the test engine's for their "
                      f"attempt: {rec['ids']}")
        r.unknown_exits = len(self.h.by_op["exit_unknown"])
        for rec in self.h.by_op["exit"]:
            # 0: done; 3: OutcomeUnknown (roles.py rule 1) or unreachable Redis (CLI); SIGKILL/SIGTERM: ours.
            if rec.get("role") == "harness" and rec.get("code") not in (0, 3, -9, -15):
                r.violate(f"{rec['slot']} (pid {rec['child']}) exited with code {rec['code']}: see its .out file")
        for role in ("producer", "worker", "trainer"):
            if not any(rec["role"] == role for rec in self.h.by_op["start"]):
                r.violate(f"no {role} process ever started")

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
        for i in range(spec.groups):
            sid = source_id(spec.seed, i)
            poison = spec.poison_every > 0 and i % spec.poison_every == spec.poison_every - 1
            leases = trained.get(sid, set())
            if sid in dead:
                r.dead += 1
                r.dead_poison += poison
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
        # A receipt is granted once, unless a data loss (everysec) rolled the delivery count back and
        # the same (entry, attempt, worker) was granted again: only a refusal after the last grant counts.
        granted: dict[tuple[str, int, str], float] = {}
        for rec in h.by_op["reserve_ok"]:
            for eid, attempt, _ in rec["grants"]:
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
            earlier = h.superseded_before(rec["eid"], rec["attempt"], t0)
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
        committed = sum(len(list(filter(None, line["ids"].split(",")))) for line in t.commits)
        for name, want in (("committed", committed), ("dead", len(t.dlq)), ("retained", 0),
                           ("executing_groups", 0), ("executing_samples", 0), ("leased", 0)):
            have = int(meta.get(name, 0) or 0)
            if have != want:
                self.report.violate(f"meta counter {name} = {have}, the records say {want}")


def check(records: list[dict[str, Any]], truth: Truth, spec: Spec) -> Report:
    windows = [Window(rec["loss_from"], rec["kill_t"]) for rec in records
               if rec["op"] == "redis_kill" and rec.get("loss_from") is not None]
    return Checker(History(records), truth, spec, windows).run()
