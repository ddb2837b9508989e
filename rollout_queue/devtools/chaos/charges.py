"""Who caused each counted failure: every one must be charged to a group that caused it (issue 29 item 2).

A counted failure (DESIGN, An attempt: terminal ``failed`` or ``malformed``, and ``lost`` unless the
queue marked it ``(not counted)`` after an outage) costs its group one of its ``max_attempts``; a
group charged for failures that were not its own ends in the dead letters without having done
anything wrong, which is what issue 29's defects did (a hung tool call, a bad reward or a fatal
engine error on one group charging every group its worker held). The witness is the queue's own
per-attempt history (key ``history``, or the dead letter's copy): each attempt's worker, terminal
and reason. For each counted attempt:

- ``failed``: charged to the group when the group is designed to cause it and the reason says so:
  a poison prompt (``envs.POISON_REASON``), or a hostile group on a shipped worker failing with its
  hostility's reason (``envs.HOSTILITIES``; a test-engine worker ignores hostility, so a hostile
  group failing there is as innocent as any other).
- ``malformed``: no group of a run is designed to be malformed: always a violation.
- ``lost``: a fact about the worker, not the group. Explained when that worker's process was
  SIGKILLed or SIGSTOPped by the nemesis (a worker id names one process: ``kill``, ``pause``), exited
  on an ``OutcomeUnknown`` (roles.py rule 1: it leaves its work to the reaper: ``exit``), or was reaped
  while Redis was down or within the post-outage grace after it (the ``reaped`` stream's time:
  ``outage``). Otherwise the group was charged for its worker's fault: a violation (a starved
  heartbeat, a worker that died of another group's fault).

A violation names the entry, its group and designation, the attempt, worker, terminal and reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, Iterable

from rollout_queue.devtools.chaos.envs import BY_NAME, POISON_REASON, hostile_kind, reason_matches
from rollout_queue.devtools.chaos.progress import OUTAGE_GRACE, stream_time
from rollout_queue.devtools.chaos.roles import is_poison, source_id

if TYPE_CHECKING:
    from rollout_queue.devtools.chaos.checker import Checker

#: The reason reap_worker_entries.lua gives a lost attempt it does not count (after an outage).
UNCOUNTED = "(not counted)"


def is_counted(terminal: str, reason: str) -> bool:
    return terminal in ("failed", "malformed") or (terminal == "lost" and UNCOUNTED not in (reason or ""))


def attempts(c: "Checker") -> Iterable[tuple[str, dict[str, Any]]]:
    """(entry id, attempt record) of every attempt the queue remembers: its history key, and for an
    entry whose history is gone (pruned) the dead letter's copy."""
    seen = set()
    for eid, value in c.truth.history.items():
        seen.add(eid)
        for item in value.get("h", []):
            if isinstance(item, dict):
                yield eid, item
    for line in c.truth.dlq:
        if line["entry_id"] not in seen:
            for item in line["history"]:
                if isinstance(item, dict):
                    yield line["entry_id"], item


class Charges:
    """The rule above over one run's history (``Checker.check_charges``)."""

    def __init__(self, c: "Checker") -> None:
        self.c = c
        self.index = {source_id(c.spec.seed, i): i for i in range(c.spec.groups)}
        records = [rec for rec in c.h.ops("start", "spawned") if rec.get("worker")]
        self.pid_of = {rec["worker"]: rec["pid"] for rec in records}
        self.shipped = {rec["worker"] for rec in records if rec.get("role") == "traj"}
        signals = c.h.by_op["signal"]
        self.killed = {rec["child"] for rec in signals if rec.get("sig") == "SIGKILL"}
        self.paused = {rec["child"] for rec in signals if rec.get("sig") == "SIGSTOP"}
        self.exited = {rec["pid"] for rec in c.h.by_op["exit_unknown"]}
        self.reaped: dict[tuple[str, str], list[float]] = defaultdict(list)  # (worker, entry) -> reap times
        for line in c.truth.reaped:
            for eid in filter(None, line.get("ids", "").split(",")):
                self.reaped[(line.get("worker", ""), eid)].append(stream_time(line["stream_id"]))

    def designation(self, eid: str) -> tuple[bool, str | None]:
        """(poison, hostile kind) of the group behind ``eid``."""
        i = self.index.get(self.c.h.sid_of.get(eid, ""))
        if i is None:
            return False, None
        poison = is_poison(i, self.c.spec.poison_every)
        return poison, None if poison else hostile_kind(i, self.c.spec.hostile_every)

    def lost_cause(self, eid: str, worker: str) -> str | None:
        """What explains a counted ``lost`` of ``worker``'s attempt of ``eid`` (None: nothing)."""
        pid = self.pid_of.get(worker)
        if pid in self.killed:
            return "kill"
        if pid in self.paused:
            return "pause"
        if pid in self.exited:
            return "exit"
        grace = (1 + OUTAGE_GRACE) * self.c.spec.worker_timeout_s + self.c.spec.slack_s
        for t in self.reaped.get((worker, eid), []):
            if any(s <= t <= e + grace for s, e, _ in self.c.down):
                return "outage"
        return None

    def charge(self, eid: str, item: dict[str, Any]) -> str | None:
        """The charge of one counted attempt (``poison``, a hostility, ``lost:<cause>``), or None
        when nothing the group or the faults did explains it."""
        terminal, reason, worker = str(item.get("t")), str(item.get("r", "")), str(item.get("w", ""))
        poison, hostile = self.designation(eid)
        if terminal == "failed":
            if poison and reason_matches(POISON_REASON, reason):
                return "poison"
            if hostile and worker in self.shipped and reason_matches(BY_NAME[hostile].reason, reason):
                return hostile
            return None
        if terminal == "lost":
            cause = self.lost_cause(eid, worker)
            return None if cause is None else f"lost:{cause}"
        return None  # malformed: no group is designed to be

    def run(self) -> None:
        r, counts = self.c.report, Counter[str]()
        for eid, item in attempts(self.c):
            if not is_counted(str(item.get("t")), str(item.get("r", ""))):
                continue
            charge = self.charge(eid, item)
            if charge is not None:
                counts[charge] += 1
                continue
            poison, hostile = self.designation(eid)
            role = "shipped" if item.get("w") in self.shipped else "test-engine" if item.get("w") in self.pid_of else "unknown"
            r.violate(f"counted failure charged to a group that did not cause it: entry {eid} "
                      f"({self.c.h.sid_of.get(eid, '?')}, {'poison' if poison else hostile or 'healthy'}) attempt "
                      f"{item.get('a')} by {role} worker {item.get('w')}: terminal {item.get('t')}, reason "
                      f"{str(item.get('r'))[:300]!r}")
            counts["innocent"] += 1
        r.charges = dict(counts)
