"""An in-memory model of one queue's ownership ledger, for the stateful machine.

This module owns what each transition *should* do, written from DESIGN.md's state machine and the
scripts' headers: which reservation goes where, which attempt and ledger line it gets, and which
counter moves. The machine predicts with it, runs the real call, compares, and then checks the
model against Redis truth (redis_truth.py). It must not import a Redis client or read Redis state:
a model that copied its answers from Redis could never disagree with it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from rollout_queue import QueueConfig, Receipt, Sample, SourceGroup

from .model_entries import (
    BACKLOG,
    COMMITTED,
    COMPLETED,
    DEAD,
    EXECUTING,
    FILTERED,
    READY,
    RETAINED,
    RETIRED,
    Attempt,
    Entry,
    LeaseRecord,
    Progress,
    attempt_line,
    completer,
    id_key,
)
from .trainer_model import VERSION_SHIFT, TrainerModel, bufver_order


@dataclass
class LedgerModel(TrainerModel):
    """The expected state of one queue; every public method is one transition (or a view)."""

    cfg: QueueConfig
    entries: dict[str, Entry] = field(default_factory=dict)
    by_source: dict[str, str] = field(default_factory=dict)
    version: int = 0
    published: bool = False
    weights_uri: str = ""
    holds: dict[str, set[tuple[str, int, str]]] = field(default_factory=dict)
    leases: dict[str, LeaseRecord] = field(default_factory=dict)
    workers: set[str] = field(default_factory=set)
    receipts: list[Receipt] = field(default_factory=list)
    arrivals: int = 0
    checkpoint: int | None = None
    step: int = 0                   # the trainer's last step
    counters: Counter[str] = field(default_factory=Counter)
    last_reserve: str = ""          # the status word of the last reserve call, for coverage events
    in_grace: bool = False          # a server restart happened: nothing expires for 2 worker timeouts

    # -- views -----------------------------------------------------------------------------------

    @property
    def staleness_bound(self) -> int:
        return self.cfg.max_staleness or 0

    @property
    def mode(self) -> str:
        """load_config.lua: strictly on-policy (max_staleness None) judges as 'drop', whatever is stored."""
        return "drop" if self.cfg.max_staleness is None else self.cfg.staleness_mode

    def stale_floor(self) -> int | None:
        """lua/include/stale_floor.lua: none before a version is published, or in 'pace'."""
        if not self.published or self.mode == "pace":
            return None
        return self.version - self.staleness_bound

    def protected(self, e: Entry) -> bool:
        """lua/include/stale_protected.lua: the fairness rule protects e from further stale evictions."""
        return self.cfg.max_staleness is not None and 0 < self.cfg.max_stale_evictions <= e.stale_evictions

    def in_state(self, *states: str) -> list[Entry]:
        return sorted((e for e in self.entries.values() if e.state in states), key=lambda e: id_key(e.entry_id))

    def count(self, state: str) -> int:
        return sum(1 for e in self.entries.values() if e.state == state)

    def retained(self) -> int:
        return sum(1 for e in self.entries.values() if e.state in RETAINED)

    def executing_samples(self) -> int:
        return sum(e.n for e in self.entries.values() if e.state == EXECUTING)

    def buffer(self) -> list[Entry]:
        """Completed groups in the order lease walks them."""
        # Equal scores (a lifo errored rollback's head may meet a later arrival) order by member, as in Redis.
        done = sorted((e for e in self.entries.values() if e.state == COMPLETED), key=lambda e: (e.arrival, e.entry_id))
        return done[::-1] if self.cfg.buffer_order == "lifo" else done

    def executing_receipts(self) -> list[Receipt]:
        return [Receipt(e.entry_id, e.attempt, e.worker or "") for e in self.in_state(EXECUTING)]

    def old_receipts(self) -> list[Receipt]:
        """Receipts of attempts that are over: every settlement with one must change nothing."""
        return [r for r in dict.fromkeys(self.receipts) if not self.entries[r.entry_id].owns(r)]

    def active_leases(self) -> list[LeaseRecord]:
        return [x for x in self.leases.values() if x.state == "active"]

    def closed_leases(self) -> list[LeaseRecord]:
        return [x for x in self.leases.values() if x.state != "active"]

    def kept(self) -> dict[str, int]:
        return {e.entry_id: e.kept_step for e in self.entries.values() if e.kept_step is not None}

    @property
    def records(self) -> bool:
        """Settlements are recorded for prune unless settled_retention_s is None (keep forever)."""
        return self.cfg.settled_retention_s is not None

    def recorded(self) -> dict[str, str]:
        """entry ID -> source_id of every group the settled stream should name (not yet pruned)."""
        return {e.entry_id: e.group.source_id for e in self.entries.values() if e.recorded}

    # -- producer --------------------------------------------------------------------------------

    def submitted(self, groups: Sequence[SourceGroup], ids: Sequence[str]) -> None:
        """Record submit's answer, checking idempotency by source_id and stream order."""
        assert len(ids) == len(groups)
        for g, entry_id in zip(groups, ids):
            known = self.by_source.get(g.source_id)
            if known is not None:
                assert entry_id == known, f"{g.source_id} resubmitted as {entry_id}, stored as {known}"
                continue
            assert entry_id not in self.entries, f"new source {g.source_id} got the used entry {entry_id}"
            if self.entries:
                newest = max(self.entries, key=id_key)
                assert id_key(entry_id) > id_key(newest), f"{entry_id} is not after {newest}"
            self.entries[entry_id] = Entry(entry_id, g)
            self.by_source[g.source_id] = entry_id

    def requeue_dead_letter(self, entry_id: str, new_id: str) -> None:
        """The dead letter's pristine group goes back to the backlog under a new entry ID."""
        old = self.entries[entry_id]
        assert old.state == DEAD and new_id not in self.entries
        assert id_key(new_id) > max(id_key(i) for i in self.entries), f"{new_id} is not the newest entry"
        old.state, old.recorded = RETIRED, self.records
        self.entries[new_id] = Entry(new_id, old.group)
        self.by_source[old.group.source_id] = new_id

    # -- worker side -----------------------------------------------------------------------------

    def reserve(self, worker: str, max_groups: int, max_samples: int = 0, reply_lost: bool = False,
                overcommit: bool = False) -> list[tuple[str, int]]:
        """(entry_id, attempt) of each grant, in reply order. The client repeats a 'retry' at once;
        but when the first reply was lost, the resent call replays it as 'ok' with nothing granted
        (the request id matches), and the client stops there."""
        self.workers.add(worker)
        while True:
            status, grants = self._reserve_once(worker, max_groups, max_samples, overcommit)
            self.last_reserve = status
            if grants or status != "retry" or reply_lost:
                return grants

    def _invalid(self, e: Entry) -> str | None:
        if e.n > self.cfg.max_executing_samples:
            return f"malformed_reservation: n={e.n} exceeds max_executing_samples={self.cfg.max_executing_samples}"
        return None

    def evict_stale(self, budget: int = 32) -> int:
        """The stale buffered groups, stalest first, back to ready (reserve and lease do it inline)."""
        floor = self.stale_floor()
        if floor is None:
            return 0
        stale = sorted((e for e in self.in_state(COMPLETED) if e.min_version < floor),
                       key=bufver_order)[:budget]
        for e in stale:
            self._evict(e, "stale")
        return len(stale)

    def _reserve_once(self, worker: str, max_groups: int, max_samples: int,
                      overcommit: bool) -> tuple[str, list[tuple[str, int]]]:
        """One reserve script (lua/reserve.lua): stale groups evicted, then ready first (submission
        order), then the backlog; a group too large for the caller's max_samples is skipped when the
        call has nothing yet (parked in ready at attempt 0 when it came from the backlog), taken as
        the first grant with overcommit, and ends a call that has grants."""
        self.evict_stale()
        if self.holds:
            return "held", []
        if self.count(COMPLETED) >= self.cfg.max_completed_groups:
            return "backpressure", []
        retained, committed = self.retained(), self.count(COMMITTED)  # read once, before any grant
        call = _Call(max(1, min(max_groups, 64)), self.cfg.max_executing_samples - self.executing_samples(),
                     max_samples if max_samples > 0 else 10**9, overcommit)
        stop = self._grant_ready(call)
        if stop is None and len(call.grants) < call.groups:
            stop = self._grant_backlog(call, worker, retained, committed)
        if stop == "full":
            stop = None
        for e in call.grants:
            e.state, e.worker = EXECUTING, worker
            self.receipts.append(Receipt(e.entry_id, e.attempt, worker))
            self._hand_out(e)
        if not call.grants:
            return (stop or ("retry" if call.dead else "oversized" if call.skipped else "empty")), []
        return "ok", [(e.entry_id, e.attempt) for e in call.grants]

    def _hand_out(self, e: Entry) -> None:
        """lua/include/attach_partials.lua on a fresh grant: a record already past the staleness bound
        is dropped (its tokens counted stale), any other is handed to the attempt (counted continued)."""
        p = e.progress
        e.handed = ()
        if p is None:
            return
        if (self.published and self.mode == "drop" and not self.protected(e)
                and self.version - p.min_version > self.staleness_bound):
            self.counters["partial_stale"] += p.tokens
            e.stale_evictions += 1  # count_stale: a dropped prefix counts toward the fairness rule
            self._drop_progress(e)
            return
        self.counters["partial_continued"] += p.tokens
        e.handed = p.samples

    def _drop_progress(self, e: Entry) -> None:
        if e.progress is not None:
            self.counters["partial_bytes"] -= e.progress.size
            e.progress = None

    def _write_progress(self, e: Entry, r: Receipt, samples: Sequence[Sample], size: int) -> bool:
        """lua/include/write_partial.lua: replaces any earlier record, moves partial_bytes by the difference
        and counts it. False, nothing written or counted, when the stored record is already this one
        (the same attempt sending the same samples in the same order: the same bytes)."""
        p = e.progress
        if p is not None and (p.attempt, p.worker, p.samples) == (r.attempt, r.worker_id, tuple(samples)):
            return False
        self._drop_progress(e)
        e.progress = Progress(r.attempt, r.worker_id, sum(len(s.token_ids) for s in samples),
                              min(s.version for s in samples), size, tuple(sorted(samples, key=lambda s: s.slot)))
        self.counters["partial_bytes"] += size
        self.counters["partial_saved"] += 1
        return True

    def save_partial(self, r: Receipt, samples: Sequence[Sample], size: int) -> str:
        """'saved' | 'replay' (the stored record is its own and the attempt ended, or it is this very
        record: a resend) | 'stale' | 'too_large' (refused by the client before anything is sent)."""
        if size > self.cfg.max_partial_bytes:
            return "too_large"
        e = self.entries[r.entry_id]
        if not e.owns(r):
            p = e.progress
            return "replay" if p is not None and (p.attempt, p.worker) == (r.attempt, r.worker_id) else "stale"
        return "saved" if self._write_progress(e, r, samples, size) else "replay"

    def _grant_ready(self, call: "_Call") -> str | None:
        for e in self.in_state(READY):
            if len(call.grants) >= call.groups or call.skipped >= 32:
                return None
            verdict = call.fit(e.n)
            if verdict in ("stop", "full"):
                return "capacity" if verdict == "stop" else "full"
            if verdict == "grant":
                call.taken += e.n
                e.attempt += 1
                call.grants.append(e)
        return None

    def _grant_backlog(self, call: "_Call", worker: str, retained: int, committed: int) -> str | None:
        """First deliveries, bounded by retained capacity and admission: granted, or parked in ready
        (too large for this caller); both become retained."""
        allow = self.cfg.max_retained_groups - retained
        if allow <= 0:
            return "retained_full"
        if self.cfg.batch_groups:
            room = (self.version + self.staleness_bound + 1) * self.cfg.batch_groups - retained - committed
            if room <= 0:
                return "admission"
            allow = min(allow, room)
        delivered, stop = 0, None
        for e in self.in_state(BACKLOG):
            if delivered >= allow or len(call.grants) >= call.groups or call.skipped >= 32:
                break
            verdict = call.fit(e.n)
            if verdict == "stop":
                stop = "capacity"
                break
            if verdict == "full":
                break
            delivered += 1
            if verdict == "skip":
                e.state, e.attempt = READY, 0
            else:
                call.taken += e.n
                e.attempt = 1
                call.grants.append(e)
        return stop

    def complete(self, r: Receipt, samples: Sequence[Sample]) -> tuple[str, str]:
        """('buffered', evicted id or '') | ('evicted_self', id) | ('malformed', 'ready'|'dead')
        | ('replay', '') | ('stale', '')."""
        e = self.entries[r.entry_id]
        if not samples:  # the client ends it malformed through fail() before raising
            where = self.fail(r, "malformed")
            return ("stale", "") if where == "stale" else ("malformed", where)
        if not e.owns(r):
            return ("replay", "") if self._completed_before(e, r) else ("stale", "")
        slots = [s.slot for s in samples]
        if any(not 0 <= s < e.n for s in slots) or len(set(slots)) < e.n:
            return "malformed", self._end_attempt(e, "malformed", counted=True)
        self.arrivals += 1
        # The completion holds every token of the record (complete_attempt.lua): dropped either way.
        self._drop_progress(e)
        e.continued_from, e.handed = e.handed, ()
        # parse_min_version.lua: the version the group is judged by; buffer_completion.lua: raised to
        # the current one for a group the fairness rule protects.
        if self.mode == "continue":
            min_version = max(s.newest_version for s in samples)
        else:
            min_version = min(s.version for s in samples)
        if self.protected(e) and min_version < self.version:
            min_version = self.version
        evicted = ""
        done = [x for x in self.entries.values() if x.state == COMPLETED]
        if len(done) >= self.cfg.max_completed_groups:
            victim = min(done, key=bufver_order)
            if bufver_order(victim)[:2] < (min_version, self.arrivals % VERSION_SHIFT):
                self._evict(victim, "overflow")
                evicted = victim.entry_id
            else:
                self.counters["evicted_overflow"] += 1
                e.history.append(Attempt(r.attempt, r.worker_id, "overflow"))
                self._requeue(e, counted=False)
                e.ledger = attempt_line(r.attempt, r.worker_id, "completed")
                return "evicted_self", e.entry_id
        e.state, e.worker, e.samples = COMPLETED, None, tuple(samples)
        e.min_version, e.arrival = min_version, self.arrivals
        e.ledger = attempt_line(r.attempt, r.worker_id, "completed")
        return "buffered", evicted

    def _completed_before(self, e: Entry, r: Receipt) -> bool:
        """replayed.lua, kind 'completed': the ledger still says so, or the history kept the
        completion's requeue (from the buffer, a lease or a restore, or its own overflow)."""
        if e.ledger == attempt_line(r.attempt, r.worker_id, "completed") or (e.ledger or "").startswith(
                f"s|committed|{r.attempt}|{r.worker_id}|"):
            return True
        return any(h.a == r.attempt and (h.c == r.worker_id or (h.w == r.worker_id and h.t == "overflow"))
                   for h in e.history)

    def _ended_before(self, e: Entry, r: Receipt, terminal: str) -> bool:
        """replayed.lua: this attempt already ended as ``terminal`` by this worker."""
        if e.ledger == attempt_line(r.attempt, r.worker_id, terminal):
            return True
        if terminal != "aborted" and e.ledger == f"s|dead|{r.attempt}|{r.worker_id}|max_attempts":
            return True
        return any(h.a == r.attempt and h.w == r.worker_id and h.t == terminal for h in e.history)

    def fail(self, r: Receipt, terminal: str = "failed") -> str:
        """'ready' | 'dead' | 'replay' | 'stale'."""
        e = self.entries[r.entry_id]
        if not e.owns(r):
            return "replay" if self._ended_before(e, r, terminal) else "stale"
        return self._end_attempt(e, terminal, counted=True)

    def abort(self, r: Receipt, progress: Sequence[Sample] = (), size: int = 0) -> str:
        """'ready' | 'replay' | 'stale' | 'too_large' (progress over max_partial_bytes: refused by the
        client before anything is sent). With progress, the owner's record is written in the same call."""
        if progress and size > self.cfg.max_partial_bytes:
            return "too_large"
        e = self.entries[r.entry_id]
        if not e.owns(r):
            return "replay" if self._ended_before(e, r, "aborted") else "stale"
        if progress:
            self._write_progress(e, r, progress, size)
        return self._end_attempt(e, "aborted", counted=False)

    def filter(self, r: Receipt, reason: str) -> str:
        e = self.entries[r.entry_id]
        line = f"s|filtered|{r.attempt}|{r.worker_id}|{reason}"
        if not e.owns(r):
            return "replay" if e.ledger == line else "stale"
        e.state, e.worker, e.ledger = FILTERED, None, line
        e.recorded = self.records
        self._drop_progress(e)
        self.counters[f"filtered_reason:{reason}"] += 1
        return "filtered"

    def close_worker(self, worker: str, terminal: str) -> tuple[int, int]:
        """(requeued, dead-lettered); the worker is deregistered."""
        wheres = [self._end_attempt(e, terminal, counted=terminal == "lost")
                  for e in self.in_state(EXECUTING) if e.worker == worker]
        self.workers.discard(worker)
        return wheres.count("ready"), wheres.count("dead")

    # -- shared edges ----------------------------------------------------------------------------

    def _end_attempt(self, e: Entry, terminal: str, counted: bool) -> str:
        attempt, worker = e.attempt, e.worker or ""
        self.counters[terminal] += 1
        e.history.append(Attempt(attempt, worker, terminal))
        where = self._requeue(e, counted)
        if where == "ready":
            e.ledger = attempt_line(attempt, worker, terminal)
        return where

    def _requeue(self, e: Entry, counted: bool) -> str:
        """PEL -> ready with the same attempt, or dead once counted failures reach max_attempts."""
        if counted:
            e.failures += 1
            if e.failures >= self.cfg.max_attempts:
                self._settle_dead(e, "max_attempts", e.attempt, e.worker or "")
                return "dead"
        e.state, e.worker, e.lease_id, e.samples = READY, None, None, ()
        e.handed, e.continued_from = (), ()  # the record, if any, stays for the next attempt
        return "ready"

    def _evict(self, e: Entry, reason: str) -> None:
        self.counters[f"evicted_{reason}"] += 1
        if reason == "stale":
            e.stale_evictions += 1
        e.history.append(Attempt(e.attempt, "@done", reason, completer(e.ledger, e.attempt)))
        self._requeue(e, counted=False)

    def _settle_dead(self, e: Entry, reason: str, attempt: int, worker: str) -> None:
        e.state, e.worker, e.lease_id, e.samples = DEAD, None, None, ()
        self._drop_progress(e)  # settle_dead_many.lua: no attempt will continue it
        e.ledger = f"s|dead|{attempt}|{worker}|{reason}"


@dataclass
class _Call:
    """One reserve call's budget (lua/include/reserve_fit.lua)."""

    groups: int
    queue_free: int
    call_cap: int
    overcommit: bool
    taken: int = 0
    skipped: int = 0
    dead: int = 0
    grants: list[Entry] = field(default_factory=list)

    def fit(self, n: int) -> str:
        if self.taken + n > self.queue_free:
            return "stop"
        if self.taken + n <= self.call_cap:
            return "grant"
        if self.grants:
            return "full"
        if self.overcommit:
            return "grant"
        self.skipped += 1
        return "skip"
