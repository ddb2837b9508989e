"""The trainer, operator and reaper transitions of the stateful model (a mixin of LedgerModel).

This module owns what lease, commit, rollback, expiry, reaping, policy versions, admission holds and
checkpoints should do to the model's entries, written from DESIGN.md and the scripts' headers. Like
ledger_model.py, it must not read Redis: it predicts, and the machine compares.
"""

from __future__ import annotations

from typing import Sequence

from rollout_queue import ReapReport, Receipt

from .model_entries import (
    COMMITTED,
    COMPLETED,
    EXECUTING,
    LEASED,
    READY,
    RETAINED,
    Attempt,
    Entry,
    LeaseRecord,
    attempt_line,
    completer,
    id_key,
)

#: lua/lease.lua: marked groups passed over in one call at most
HELD_APART = 1024
#: lua/include/buffer_score.lua: bufver packs min_version * 2^32 + arrival mod 2^32
VERSION_SHIFT = 2**32


def bufver_order(e: Entry) -> tuple[int, int, str]:
    """An entry's place in bufver: (min_version, arrival mod 2^32), equal scores by member. An errored
    rollback's head may give a negative arrival in fifo: Lua's modulo wraps it, as Python's does."""
    return e.min_version, e.arrival % VERSION_SHIFT, e.entry_id


class TrainerModel:
    """Trainer-side transitions; ``self`` is always a LedgerModel."""

    def lease_limit(self) -> tuple[str, int]:
        """lua/include/lease_limit.lua: the most groups the bounds can ever have completed at once."""
        cfg = self.cfg
        retained = sum(1 for e in self.entries.values() if e.state in RETAINED)
        bound, possible = "max_retained_groups", cfg.max_retained_groups
        if cfg.batch_groups:
            admitted = (self.version + self.staleness_bound + 1) * cfg.batch_groups - self.count(COMMITTED)
            if admitted < possible:
                bound, possible = "batch_groups", admitted
        possible = max(possible, retained)
        if cfg.max_completed_groups < possible:
            return "max_completed_groups", cfg.max_completed_groups
        return bound, possible

    def unsatisfiable(self, groups: int, partial: bool) -> bool:
        """A lease the bounds can never satisfy is refused at once (LeaseUnsatisfiable)."""
        return self.lease_limit()[1] < (1 if partial else groups)

    held_apart: int = 0  # marked groups the last lease passed over and left in the buffer

    def lease(self, groups: int, partial: bool) -> list[str] | None:
        """The members a lease gets, in order (stale groups are requeued first), or None. The caller
        checks ``unsatisfiable`` first, and binds the members to the client's lease id with ``leased``."""
        self.held_apart = 0
        self.evict_stale()
        if self.holds:
            return None
        floor = self.stale_floor()
        order = self.buffer()
        available = sum(1 for e in order if floor is None or e.min_version >= floor)
        want = groups
        if available < groups:
            if not partial or available < 1:
                return None
            want = available
        # lua/lease.lua: groups marked by an errored rollback are held apart, one per lease, while
        # another group can come (an attempt executing and room in the buffer); else they fill it.
        buffered, executing = self.count(COMPLETED), self.count(EXECUTING)
        members: list[Entry] = []
        apart: list[Entry] = []
        took_marked = False
        for e in order:
            if len(members) >= want:
                break
            if floor is not None and e.min_version < floor:
                self._evict(e, "stale")
            elif e.marks and took_marked and len(apart) < HELD_APART:
                apart.append(e)
            else:
                took_marked = took_marked or bool(e.marks)
                members.append(e)
        if len(members) < want and apart and (executing == 0 or buffered >= self.cfg.max_completed_groups):
            members += apart[:want - len(members)]
        self.held_apart = len([e for e in apart if e not in members])  # for the machine's coverage events
        if not members or (len(members) < groups and not partial):
            return None
        for e in members:
            e.state = LEASED
        return [e.entry_id for e in members]

    def leased(self, lease_id: str, members: list[str], handle: object) -> None:
        for entry_id in members:
            self.entries[entry_id].lease_id = lease_id
        self.leases[lease_id] = LeaseRecord(lease_id, members, self.version, handle=handle)

    def commit(self, lease_id: str, step: int | None) -> tuple[str, str]:
        """('committed', '') | ('replay', commit id) | ('lost', state)."""
        lease = self.leases[lease_id]
        if lease.state == "committed":
            return "replay", lease.commit_id or ""
        if lease.state != "active":
            return "lost", lease.state
        keep = step is not None and (self.checkpoint is None or step > self.checkpoint)
        for entry_id in lease.members:
            e = self.entries[entry_id]
            parts = (e.ledger or "").split("|")
            attempt, worker = (parts[1], parts[2]) if parts[0] == "a" else ("0", "")
            e.ledger = f"s|committed|{attempt}|{worker}|{lease_id}|{'' if step is None else step}"
            e.state, e.lease_id, e.samples = COMMITTED, None, ()
            e.kept_step = step if keep else None
            e.recorded = self.records and not keep  # a kept copy is recorded when checkpoint drops it
            e.commits += 1
        lease.state = "committed"
        return "committed", ""

    def rollback(self, lease_id: str, reason: str | None = None, batch: int = 32,
                 errored_calls: int | None = None) -> tuple[str, int | str]:
        """('rolled_back', groups handed back) | ('replay', 0) | ('lost', state).

        With ``reason`` an errored rollback (lua/include/requeue_errored.lua), in calls of ``batch``
        members (PEL order: entry IDs); only the first ``errored_calls`` calls when the trainer died
        after them and a reaper finished the rest plain (expire_lease)."""
        lease = self.leases[lease_id]
        if lease.state == "rolled_back":
            return "replay", 0
        if lease.state != "active":
            return "lost", lease.state
        if reason is None:
            return "rolled_back", self._requeue_lease(lease, "rolled_back")
        members = sorted(self._lease_members(lease), key=lambda e: id_key(e.entry_id))
        back = 0
        for k in range(0, len(members), batch):
            chunk = members[k:k + batch]
            if errored_calls is not None and k // batch >= errored_calls:
                self._requeue_plain(chunk, lease.lease_id, "rolled_back")
            else:
                back += self._errored(chunk, lease.lease_id, reason)
        lease.state = "rolled_back"
        return "rolled_back", back

    def _errored(self, chunk: list[Entry], lease_id: str, reason: str) -> int:
        """One errored rollback call: marks, then the head of the buffer (or ready without room), or
        dead at max_attempts marks. Returns how many were handed back."""
        owner = f"@lease:{lease_id}"
        dying = [e for e in chunk if e.marks + 1 >= self.cfg.max_attempts]
        back = [e for e in chunk if e not in dying]
        for e in chunk:
            e.history.append(Attempt(e.attempt, owner, "trainer_error", completer(e.ledger, e.attempt)))
        if len(back) <= self.cfg.max_completed_groups - self.count(COMPLETED):
            head = sorted(back, key=lambda e: -e.marks)  # stable: the most marked first, then ID order
            for e, score in zip(head, self._head_scores(len(back))):
                e.state, e.lease_id, e.arrival = COMPLETED, None, score
        else:
            for e in back:
                self._requeue(e, counted=False)
        for e in back:
            e.marks += 1
        for e in dying:
            self._settle_dead(e, f"trainer_error: {reason}", e.attempt, owner)
            e.marks = 0
        self.counters["rolled_back"] += len(chunk)
        return len(back)

    def _head_scores(self, n: int) -> list[int]:
        """Buffer scores the lease walk meets before every buffered group (requeue_errored.lua)."""
        arrivals = [e.arrival for e in self.entries.values() if e.state == COMPLETED]
        if self.cfg.buffer_order == "lifo":
            base = max(arrivals) if arrivals else self.arrivals
            return [base + n - i + 1 for i in range(1, n + 1)]
        base = min(arrivals) if arrivals else self.arrivals + 1
        return [base - n + i - 1 for i in range(1, n + 1)]

    def expire(self, lease_id: str) -> int:
        """The reaper (or reserve/lease opportunistically) rolls back a lease past its deadline."""
        return self._requeue_lease(self.leases[lease_id], "expired")

    def reap(self, silent: Sequence[str] = (), expired: Sequence[str] = ()) -> ReapReport:
        """One reaper pass: the silent workers, the expired leases, every stale group, then the
        settled groups past settled_retention_s."""
        lost = dead = 0
        for worker in silent:
            requeued, died = self.close_worker(worker, "lost")
            lost, dead = lost + requeued, dead + died
        n_expired = sum(self.expire(lease_id) for lease_id in expired)
        floor = self.stale_floor()
        stale = 0
        if floor is not None:
            for e in sorted(self.in_state(COMPLETED), key=bufver_order):
                if e.min_version < floor:
                    self._evict(e, "stale")
                    stale += 1
        return ReapReport(lost=lost, expired=n_expired, stale=stale, dead=dead, pruned=self.prune())

    @property
    def prunes_at_reap(self) -> bool:
        """With the machine's 1 ms retention (it waits past it before every reap) everything recorded
        is due at each reap; with a day's retention nothing ever is."""
        retention = self.cfg.settled_retention_s
        return retention is not None and retention < 1

    def prune(self) -> int:
        """Every recorded group loses its ledger line, and its source_id mapping while that still
        names it (a requeued dead letter's source maps to its new entry)."""
        if not self.prunes_at_reap:
            return 0
        gone = [e for e in self.entries.values() if e.recorded]
        for e in gone:
            e.recorded, e.pruned, e.ledger = False, True, None
            # The history (its failures and stale evictions) and marks go with the ledger line.
            e.history, e.failures, e.marks, e.stale_evictions = [], 0, 0, 0
            if self.by_source.get(e.group.source_id) == e.entry_id:
                del self.by_source[e.group.source_id]
        return len(gone)

    # -- policy versions, holds and checkpoints --------------------------------------------------

    def publish(self, version: int, weights_uri: str, hold_id: str | None = None) -> str:
        """'published' | 'replay' | 'regression' | 'hold_lost'."""
        if hold_id is not None and hold_id not in self.holds:
            return "hold_lost"
        if self.published:
            if version == self.version and weights_uri == self.weights_uri:
                return "replay"
            if version <= self.version:
                return "regression"
        self.version, self.weights_uri, self.published = version, weights_uri, True
        return "published"

    def hold_open(self, hold_id: str) -> int:
        snap = {(e.entry_id, e.attempt, e.worker or "") for e in self.in_state(EXECUTING)}
        self.holds[hold_id] = snap
        return len(snap)

    def hold_wait(self, hold_id: str) -> bool:
        """wait_terminal(0): True when every attempt of the snapshot is over."""
        snap = self.holds[hold_id]
        snap -= {x for x in snap if not self.entries[x[0]].owns(Receipt(*x))}
        return not snap

    def hold_release(self, hold_id: str) -> int:
        self.holds.pop(hold_id, None)
        return len(self.holds)

    def checkpoint_at(self, step: int) -> int | str:
        """How many kept copies were dropped; or 'regression' (a step below the last checkpoint) or
        'leases_open' (a new checkpoint while groups are leased): refused, nothing written."""
        if self.checkpoint is not None and step < self.checkpoint:
            return "regression"
        if step != self.checkpoint and self.count(LEASED):
            return "leases_open"
        pruned = [e for e in self.entries.values() if e.kept_step is not None and e.kept_step <= step]
        for e in pruned:
            e.kept_step, e.recorded = None, self.records
        self.checkpoint = step
        return len(pruned)

    def restore(self, step: int) -> int | None:
        """How many groups went back to ready; None when the checkpoint was pruned (refused)."""
        if self.checkpoint is not None and step < self.checkpoint:
            return None
        restored = [e for e in self.entries.values() if e.kept_step is not None and e.kept_step > step]
        for e in restored:
            e.attempt = int((e.ledger or "").split("|")[2]) or 1
            e.history.append(Attempt(e.attempt, "@restore", "restored", completer(e.ledger, e.attempt)))
            e.state, e.kept_step = READY, None
            e.ledger = attempt_line(e.attempt, "@restore", "restored")
            e.restores += 1
        self.counters["restored"] += len(restored)
        return len(restored)

    def _lease_members(self, lease: LeaseRecord) -> list[Entry]:
        return [self.entries[i] for i in lease.members if self.entries[i].state == LEASED
                and self.entries[i].lease_id == lease.lease_id]

    def _requeue_lease(self, lease: LeaseRecord, terminal: str) -> int:
        members = self._lease_members(lease)
        self._requeue_plain(members, lease.lease_id, terminal)
        lease.state = terminal
        return len(members)

    def _requeue_plain(self, members: list[Entry], lease_id: str, terminal: str) -> None:
        for e in members:
            e.history.append(Attempt(e.attempt, f"@lease:{lease_id}", terminal, completer(e.ledger, e.attempt)))
            self._requeue(e, counted=False)
        self.counters[terminal] += len(members)
