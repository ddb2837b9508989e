"""The progress watchdog: for every submitted group, how long it went without an observable change.

"Nothing is left at the end" proves no group was stuck forever, not that none was stuck for a long
time and only freed by luck (a reaper pass, the fault-free phase, the end of the run). This module
measures liveness while the run goes: every group's timeline of observable state changes, from
the processes' operation logs (first submit, each new attempt granted, each settlement accepted or
refused, each lease, commit, commit refusal or rollback) and from the queue's own records of
settlement (the commits and dlq streams, whose ids are the Redis time of the settlement, so a commit
whose trainer died before logging it still counts). A group's "time without progress" is the gap
between two consecutive changes, or from its last change to now while it is unsettled. The worst
gap of the run is reported, and every gap longer than ``bound_s`` is a stall: the run fails on it.

The bound is derived from the run's timeouts (see ``bound_for``): what a group may legitimately wait
when the worker executing it dies (worker_timeout_s, then the grace the queue grants after an
outage), when its trainer dies (lease_timeout_s), plus the longest outage of the run and a slack for
process restarts, reaper intervals and queueing behind the backlog. A group waiting longer than that
is stuck whatever eventually freed it (issue 12: a group larger than every caller's slots, a stale
group nobody evicts, an outage counted against the workers).

It owns no I/O besides what the harness hands it: ``feed`` takes log records, ``settle_line`` the
raw stream lines, ``tick`` the current time. The same object judges a finished run (``recheck``):
feed all records and the final truth, then ``tick`` at the run's end. Live, records arrive up to one
poll late, so an open gap can be over-measured by that much (never under-measured).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable

#: The queue grants every client this many worker timeouts after an outage before anything it owns
#: is taken away (rollout_queue/core/lua/include/now_ms.lua, OUTAGE_GRACE): the bound allows for it.
OUTAGE_GRACE = 2


def bound_for(worker_timeout_s: float, lease_timeout_s: float, max_outage_s: float, slack_s: float) -> float:
    """The longest a group may go without an observable change in a run with these timeouts:
    the longer of a dead trainer's lease running out and a dead worker's silence plus the post-outage
    grace, plus the longest outage, plus a slack (restarts, reaper passes, queueing)."""
    return max(lease_timeout_s, worker_timeout_s * (1 + OUTAGE_GRACE)) + max_outage_s + slack_s


def stream_time(stream_id: str) -> float:
    """Seconds (wall clock) of a Redis stream id: its milliseconds part is the server's time at XADD."""
    return int(stream_id.split("-", 1)[0]) / 1000.0


@dataclass
class Gap:
    """One stretch of a group's life without an observable change."""

    sid: str
    state: str              # what the group was waiting in: backlog, executing, completed, ready, leased
    start: float
    end: float | None       # None: still open (the group made no change since ``start``)
    length: float

    def as_dict(self) -> dict[str, Any]:
        return {"sid": self.sid, "state": self.state, "start": round(self.start, 3),
                "end": None if self.end is None else round(self.end, 3), "length_s": round(self.length, 3)}


@dataclass
class _Group:
    sid: str
    state: str
    last: float
    settled: str | None = None
    stalled_since: float | None = None  # the open gap has been reported as a stall (live)
    key: tuple[int, int] | None = None  # its backlog entry id, as a sortable pair


def entry_key(entry_id: str) -> tuple[int, int] | None:
    """A stream id as a sortable (ms, seq) pair; None for anything else."""
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else None


class BacklogHead:
    """When the backlog last moved past a point: the backlog is FIFO, so a group waiting in it makes
    progress each time an older entry gets its first grant (it moved up), and none when only newer
    ones are granted (skipped: the starvation issue 12 item 2 is about). ``moved_before(k)`` is the
    latest time an entry older than ``k`` was first granted. A grant of key k at time t makes every
    earlier record with a key above k useless (t is newer), so the records stay sorted by key and
    by time at once, and a query is one bisect."""

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.times: list[float] = []

    def granted(self, key: tuple[int, int], t: float) -> None:
        if self.times and t < self.times[-1]:
            return  # records arrive in time order; a late one changes nothing newer already known
        cut = bisect.bisect_right(self.keys, key)
        del self.keys[cut:], self.times[cut:]
        self.keys.append(key)
        self.times.append(t)

    def moved_before(self, key: tuple[int, int]) -> float:
        i = bisect.bisect_left(self.keys, key)
        return self.times[i - 1] if i else float("-inf")


# The state a group waits in after each observed operation.
_STATE_AFTER = {"submit_ok": "backlog", "reserve_ok": "executing", "complete_ok": "completed",
                "fail_ok": "ready", "complete_refused": "ready", "fail_refused": "ready", "lease_ok": "leased",
                "commit_refused": "ready", "rollback_ok": "ready", "abort_ok": "ready"}


@dataclass
class Progress:
    bound_s: float
    groups: dict[str, _Group] = field(default_factory=dict)
    sid_of: dict[str, str] = field(default_factory=dict)            # entry id -> source id
    lease_sids: dict[str, list[str]] = field(default_factory=dict)  # lease id -> its members' source ids
    attempts: set[tuple[str, int]] = field(default_factory=set)
    settled_lines: set[str] = field(default_factory=set)            # stream ids already applied
    unmapped: list[tuple[str, float, str]] = field(default_factory=list)  # (entry id, t, how) to settle later
    worst: Gap | None = None
    stalls: list[Gap] = field(default_factory=list)                 # every gap over bound_s
    head: BacklogHead = field(default_factory=BacklogHead)

    # -- input --------------------------------------------------------------------------------------

    def feed(self, rec: dict[str, Any]) -> None:
        """One operation-log record (any role; unknown ops are ignored)."""
        op, t = rec.get("op"), float(rec.get("t", 0.0))
        if op == "submit_ok":
            for sid, eid in zip(rec["sids"], rec["ids"]):
                self.sid_of[eid] = sid
                if sid not in self.groups:
                    self.groups[sid] = _Group(sid, "backlog", t, key=entry_key(eid))
            self._resolve()
        elif op == "reserve_ok":
            for grant in rec["grants"]:
                # A shipped worker's grant names no source id (its event has none): the submit did.
                eid, attempt, sid = grant[0], int(grant[1]), grant[2] or self.sid_of.get(grant[0])
                if sid is None:
                    continue
                self.sid_of[eid] = sid
                if (eid, attempt) not in self.attempts:  # a replayed reserve is no change
                    self.attempts.add((eid, attempt))
                    key = entry_key(eid)
                    if attempt == 1 and key is not None:
                        self.head.granted(key, t)
                    self._change(sid, t, "executing")
            self._resolve()
        elif op in ("complete_ok", "fail_ok", "complete_refused", "fail_refused", "abort_ok"):
            sid = rec.get("sid") or self.sid_of.get(rec.get("eid", ""))
            if sid:
                self._change(sid, t, _STATE_AFTER[op])
        elif op == "lease_ok":
            sids = [m[2] for m in rec["members"]]
            self.lease_sids[rec["lease"]] = sids
            for m in rec["members"]:
                self.sid_of[m[0]] = m[2]
            for sid in sids:
                self._change(sid, t, "leased")
        elif op == "commit_ok":
            for sid in self.lease_sids.get(rec["lease"], []):
                self._settle(sid, t, "committed")
        elif op in ("commit_refused", "rollback_ok"):
            for sid in self.lease_sids.get(rec["lease"], []):
                self._change(sid, t, "ready")

    def settle_line(self, stream: str, stream_id: str, fields: dict[str, str]) -> None:
        """A line of the commits stream (``ids``: entry ids) or of the dlq (``source_id``)."""
        key = f"{stream}:{stream_id}"
        if key in self.settled_lines:
            return
        self.settled_lines.add(key)
        t = stream_time(stream_id)
        if stream == "dlq":
            sid = fields.get("source_id") or self.sid_of.get(fields.get("entry_id", ""), "")
            if sid:
                self._settle(sid, t, "dead")
            return
        for eid in filter(None, fields.get("ids", "").split(",")):
            committed_sid = self.sid_of.get(eid)
            if committed_sid is None:
                self.unmapped.append((eid, t, "committed"))
            else:
                self._settle(committed_sid, t, "committed")

    def map_ids(self, ids: dict[str, str]) -> None:
        """source_id -> entry id (the queue's ids hash, at the end): resolves commit lines whose
        members no log named."""
        for sid, eid in ids.items():
            self.sid_of.setdefault(eid, sid)
        self._resolve()

    # -- time ---------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Gap]:
        """Judge the open gaps at ``now``; returns the ones that just crossed the bound (once each)."""
        new = []
        for g in self.groups.values():
            if g.settled is not None:
                continue
            since = self._since(g)
            age = now - since
            gap = Gap(g.sid, g.state, since, None, age)
            if self.worst is None or age > self.worst.length:
                self.worst = gap
            if age > self.bound_s and g.stalled_since != since:
                g.stalled_since = since
                new.append(gap)
        return new

    def oldest_open(self, now: float) -> float:
        """The longest an unsettled group has now gone without a change (0 when none is open)."""
        return max((now - self._since(g) for g in self.groups.values() if g.settled is None), default=0.0)

    def finish(self, end: float) -> None:
        """The run is over at ``end``: every gap still open is closed there (and judged)."""
        self.tick(end)
        for g in self.groups.values():
            if g.settled is None:
                self._gap(g, end, open_=True)

    # -- what it found ------------------------------------------------------------------------------

    @property
    def unsettled(self) -> int:
        return sum(g.settled is None for g in self.groups.values())

    def summary(self) -> dict[str, Any]:
        return {"bound_s": round(self.bound_s, 1), "groups": len(self.groups), "unsettled": self.unsettled,
                "worst_s": round(self.worst.length, 2) if self.worst else 0.0,
                "worst": self.worst.as_dict() if self.worst else None,
                "stalls": len(self.stalls), "stalled": [s.as_dict() for s in self.stalls[:10]]}

    # -- inside -------------------------------------------------------------------------------------

    def _since(self, g: _Group) -> float:
        """When ``g`` last made progress: its last change, or for a group in the backlog also the
        last time the backlog moved up to it (an older entry's first grant)."""
        if g.state == "backlog" and g.key is not None:
            return max(g.last, self.head.moved_before(g.key))
        return g.last

    def _gap(self, g: _Group, t: float, open_: bool = False) -> None:
        since = self._since(g)
        length = t - since
        gap = Gap(g.sid, g.state, since, None if open_ else t, length)
        if self.worst is None or length >= self.worst.length:
            self.worst = gap
        if length > self.bound_s:
            self.stalls.append(gap)

    def _change(self, sid: str, t: float, state: str) -> None:
        g = self.groups.get(sid)
        if g is None:  # its submit_ok was never logged (the producer died before the line): first seen now
            self.groups[sid] = _Group(sid, state, t)
            return
        if g.settled is not None:
            return
        if t > g.last:
            self._gap(g, t)
            g.last = t
        g.state = state

    def _settle(self, sid: str, t: float, how: str) -> None:
        g = self.groups.get(sid)
        if g is None:
            self.groups[sid] = _Group(sid, how, t, settled=how)
            return
        if g.settled is not None:
            return
        if t > g.last:
            self._gap(g, t)
            g.last = t
        g.settled = how

    def _resolve(self) -> None:
        if not self.unmapped:
            return
        left = []
        for eid, t, how in self.unmapped:
            sid = self.sid_of.get(eid)
            if sid is None:
                left.append((eid, t, how))
            else:
                self._settle(sid, t, how)
        self.unmapped = left


def replay(records: Iterable[dict[str, Any]], commits: Iterable[tuple[str, dict[str, str]]],
           dlq: Iterable[tuple[str, dict[str, str]]], ids: dict[str, str], bound_s: float, end: float) -> Progress:
    """A finished run's progress, from all its records (in time order) and the final stream lines."""
    p = Progress(bound_s)
    for rec in sorted(records, key=lambda r: r.get("t", 0.0)):
        p.feed(rec)
    p.map_ids(ids)
    settlements = [("commits", i, f) for i, f in commits] + [("dlq", i, f) for i, f in dlq]
    for stream, stream_id, fields in sorted(settlements, key=lambda s: stream_time(s[1])):
        p.settle_line(stream, stream_id, fields)
    p.finish(end)
    return p
