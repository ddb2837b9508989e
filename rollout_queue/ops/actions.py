"""Operator actions that change state: requeue one attempt, roll back a lease, config set, drain,
dead-letter purge.

Each action is one Lua script (requeue.lua, revoke_lease.lua, config_set.lua, drain.lua, dlq_purge.lua)
that re-checks,
inside Redis, what the operator's view showed (the exact receipt, every stored config field), so
nothing is read, decided in Python and written in a later round trip. The flows here only build the
calls, read what a call needs to name, and parse replies; clients drive them with ``q.run(flow)``.
Split from views.py (read-only) so that the read-only side stays importable and reviewable alone.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_seconds
from rollout_queue.core.config import QueueConfig, corrupt_message
from rollout_queue.core.errors import InvalidInput, LeaseLost, NotFound, StateConflict
from rollout_queue.core.flows import Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import Receipt, check_entry_id, check_reason, check_worker_id
from rollout_queue.core.scripts import LIBRARY_VERSION
from rollout_queue.ops.view_models import entry_state
from rollout_queue.ops.views import entry, meta, require_queue

Clock = Callable[[], float]
#: What lease.lua accepts as a lease id.
LEASE_ID = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


class OperatorRefused(StateConflict):
    """The queue's state forbids the operator action; nothing was written. The message says why."""


class ConfigChanged(StateConflict):
    """The stored config changed between reading it and writing the new one; nothing was written."""

    def __init__(self, queue: str, field: str, stored: str, expected: str) -> None:
        self.queue, self.field, self.stored, self.expected = queue, field, stored, expected
        super().__init__(f"queue {queue!r}: {field} is now {stored!r}, not the {expected!r} this change was "
                         "based on (someone changed the config meanwhile). Nothing was written: run it again.")


def requeue(keys: QueueKeys, entry_id: str, *, force: bool = False, counted: bool = False,
            reason: str = "requeued by operator") -> Flow[tuple[Receipt | None, str]]:
    """End the executing attempt of ``entry_id`` and requeue the entry. Returns (receipt, outcome):
    'ready', 'dead' (max_attempts reached), 'replay' or 'already_ready' (receipt None).

    Without ``force`` only the attempt of a worker silent past worker_timeout (or never registered)
    ends, terminal 'lost' as the reaper would; with it any executing attempt ends, terminal 'aborted'
    (or 'failed' when ``counted``). The script fences on the exact receipt read here, so the worker's
    late complete() of that attempt is refused (StaleReceipt) and nothing is trained twice.
    Raises OperatorRefused (not executing, or the worker is alive), StaleReceipt (it moved meanwhile).
    """
    check_entry_id(entry_id)
    reason = check_reason(reason, "reason")
    pel = p.parse_pending((yield p.Command(("XPENDING", keys["src"], "rollout", entry_id, entry_id, 1))))
    if not pel:
        state = (yield from entry(keys, entry_id)).state
        raise OperatorRefused(f"entry {entry_id} is {state}, not executing: nothing to requeue")
    owner, count = pel[0].consumer, pel[0].deliveries
    if owner == "@ready":
        return None, "already_ready"
    if owner.startswith("@"):
        raise OperatorRefused(f"entry {entry_id} is {entry_state(owner)} (owner {owner}), not executing: a buffered "
                              "or leased group goes back only by lease rollback, expiry or eviction")
    receipt = Receipt(entry_id, count, check_worker_id(owner))
    terminal = "lost" if not force else "failed" if counted else "aborted"
    reply = yield p.build(keys, "requeue", entry_id=entry_id, attempt=count, worker_id=owner,
                          mode="force" if force else "silent", terminal=terminal, reason=reason)
    status, outcome, heartbeat_ms = p.parse_requeue(reply, receipt)
    if status == "alive":
        raise OperatorRefused(
            f"worker {owner!r} still heartbeats (last at server ms {heartbeat_ms}); it may be generating {entry_id}. "
            "Wait for worker_timeout, stop that worker, or pass --force to end exactly this attempt (its "
            "late result will be refused).")
    return receipt, outcome


def revoke_lease(keys: QueueKeys, lease_id: str, reason: str = "rolled back by operator") -> Flow[tuple[str, int]]:
    """Roll back an active lease by its id alone (the operator has no token): its groups go back to
    ready, not counted, and its holder's later commit is refused (LeaseLost 'rolled_back'), so what
    it trained on them is never committed. Returns ('rolled_back' or 'replay': a rollback already
    under way, finished here; groups requeued). One script per batch of flows.BATCH members, the
    first of which flips the record (revoke_lease.lua).

    Raises NotFound (no such lease, or its record expired lease_record_ttl_s after it closed),
    OperatorRefused (committed or expired: nothing to roll back)."""
    if not isinstance(lease_id, str) or not LEASE_ID.fullmatch(lease_id):
        raise InvalidInput(f"{lease_id!r} is not a lease id (the LEASE column of `rollout-queue leases`)")
    reason = check_reason(reason, "reason")
    word, total = "rolled_back", 0
    first = True
    while True:
        reply = yield p.build(keys, "revoke_lease", lease_id=lease_id, reason=reason, count=flows.BATCH)
        try:
            said, n, done = p.parse_revoke_lease(reply, lease_id)
        except LeaseLost as exc:
            if exc.state == "unknown":
                raise NotFound(f"lease {lease_id} not found in {keys.queue!r} (never leased there, or closed longer "
                               "ago than lease_record_ttl_s)") from exc
            raise OperatorRefused(f"lease {lease_id} is {exc.state}: nothing to roll back") from exc
        word = said if first else word
        first = False
        total += n
        if done:
            return word, total


def set_config(keys: QueueKeys, changes: Mapping[str, Any]) -> Flow[tuple[dict[str, Any], QueueConfig, int]]:
    """Validate ``changes`` through QueueConfig and store them atomically. Returns (the old value of
    every field, the new config, fields changed). The script compares every stored field with what
    was read here (ConfigChanged if any moved), so a concurrent change is never overwritten.

    A stored field that is garbage (written by hand, e.g. max_staleness="True") is repaired by
    setting it: the other fields keep their stored values. Raises InvalidInput, before anything is
    written, for a bad value or when a corrupt field is not among ``changes`` (the message names it).
    """
    unknown = sorted(set(changes) - set(QueueConfig.__dataclass_fields__))
    if unknown:
        raise InvalidInput(f"unknown QueueConfig fields: {unknown}")
    stored = yield from meta(keys)
    if "library" not in stored:
        yield from require_queue(keys)
    old, corrupt = QueueConfig.stored_fields(stored)
    unrepaired = {k: v for k, v in corrupt.items() if k not in changes}
    if unrepaired:
        raise InvalidInput(corrupt_message(unrepaired))
    new = QueueConfig(**{**old, **changes})
    old.update({k: v.partition("=")[2] for k, v in corrupt.items()})  # shown as the raw text it was
    wanted = new.to_meta()
    triples = [x for name, value in wanted.items() for x in (name, stored.get(name, ""), value)]
    reply = yield p.build(keys, "config_set", library=LIBRARY_VERSION, fields=triples)
    changed, conflict = p.parse_config_set(reply, keys.queue)
    if conflict is not None:
        raise ConfigChanged(keys.queue, *conflict)
    return old, new, changed


def drain_start(keys: QueueKeys, timeout_s: float, reason: str) -> Flow[tuple[int, int]]:
    """Open (or extend) the operator's drain hold. Returns (deadline_ms, executing groups now)."""
    timeout_s, reason = check_seconds(timeout_s, "timeout_s"), check_reason(reason, "reason")
    reply = yield p.build(keys, "drain", action="start", timeout_ms=max(1, int(timeout_s * 1000)), reason=reason)
    return p.parse_drain_start(reply)


def drain_stop(keys: QueueKeys) -> Flow[int]:
    """Close the drain hold; returns how many other holds still stand (admission reopens at 0)."""
    reply = yield p.build(keys, "drain", action="stop", timeout_ms=0, reason="")
    return p.parse_drain_stop(reply)


def wait_drained(keys: QueueKeys, timeout_s: float, clock: Clock) -> Flow[bool]:
    """True once no attempt is executing; False at the deadline. Read-only."""
    timeout_s = check_seconds(timeout_s, "timeout_s", allow_zero=True)
    deadline = clock() + timeout_s
    while True:
        # The wake ID first: a terminal transition after it writes a newer event, so none is missed.
        last = p.parse_last_id((yield p.Command(("XREVRANGE", keys["wake_work"], "+", "-", "COUNT", 1))))
        executing = p.parse_count((yield p.Command(("HGET", keys["counters"], "executing_groups"))),
                                  "HGET counters executing_groups")
        if executing <= 0:
            return True
        remaining_ms = int((deadline - clock()) * 1000)
        if remaining_ms <= 0:
            return False
        yield p.Command(("XREAD", "BLOCK", min(remaining_ms, flows.MAX_BLOCK_CHUNK_MS), "COUNT", 1, "STREAMS",
                         keys["wake_work"], last or "0-0"))


def purge_dead_letters(keys: QueueKeys, dlq_ids: Sequence[str]) -> Flow[int]:
    """Delete the listed dead letters for good. Returns how many existed."""
    dlq_ids = [check_entry_id(dlq_id) for dlq_id in dlq_ids]
    total = 0
    for i in range(0, len(dlq_ids), flows.BATCH):
        chunk = list(dlq_ids[i:i + flows.BATCH])
        reply = yield p.build(keys, "dlq_purge", count=flows.BATCH, until_id="", dlq_ids=chunk)
        total += p.parse_dlq_purge(reply)[0]
    return total


def purge_all_dead_letters(keys: QueueKeys) -> Flow[int]:
    """Delete every dead letter that exists now (newer ones, arriving meanwhile, are kept)."""
    newest = p.parse_last_id((yield p.Command(("XREVRANGE", keys["dlq"], "+", "-", "COUNT", 1))))
    if newest is None:
        return 0
    total = 0
    while True:
        reply = yield p.build(keys, "dlq_purge", count=flows.BATCH, until_id=newest, dlq_ids=[])
        purged, done = p.parse_dlq_purge(reply)
        total += purged
        if done:
            return total
