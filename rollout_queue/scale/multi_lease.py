"""Composite leases: a lease of ``groups`` gathered as partial leases of several partitions.

Each member is an ordinary lease of one partition (flows.lease / commit / rollback / extend), so
each member commits atomically on its own slot. What this module adds is the gathering (fullest
partitions first, nothing taken until enough is buffered) and the commit order: fence every member,
then commit one by one, remembering which are done, so that exactly-once holds per group whatever
the trainer's fate between two member commits (docs/SCALING.md has the argument).
"""

from __future__ import annotations

from typing import Sequence

from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_flag, check_int, check_optional_int, check_optional_seconds, check_string
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import LeaseLost, OutcomeUnknown
from rollout_queue.core.flows import Clock, Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.liveness import FleetWatch
from rollout_queue.scale.flows import check_fleet, guarded, sweep, wait_any
from rollout_queue.scale.layout import Layout, Selector

#: One leased part: (partition index, the lease reply, its token).
Member = tuple[int, p.LeaseReply, str]


def lease(layout: Layout, sel: Selector, trainer_id: str, groups: int, partial: bool, timeout_s: float | None,
          block_ms: int, clock: Clock) -> Flow[list[Member] | None]:
    """Exactly ``groups`` fresh completed groups (>= 1 when partial) gathered as partial leases from
    the fullest partitions first. Nothing is leased until the buffers together hold enough, so the
    members rarely need handing back; if they do (the deadline passed with fewer, after groups went
    stale under us), they are rolled back: requeued and generated again, never lost."""
    groups, block_ms = check_int(groups, "groups", 1), check_int(block_ms, "block_ms")
    check_flag(partial, "partial")
    check_optional_seconds(timeout_s, "timeout_s")
    check_string(trainer_id, "trainer_id", flows.MAX_NAME)
    if layout.count == 1:
        got = yield from flows.lease(layout.keys[0], trainer_id, groups, partial, timeout_s, block_ms, clock)
        return None if got is None else [(0, *got)]
    deadline = clock() + block_ms / 1000
    held: list[Member] = []
    while True:
        need = groups - sum(len(r.groups) for _, r, _ in held)
        wakes, counts = yield from _buffered(layout, sel, clock)
        if partial or held or sum(counts.values()) >= need:
            for i in sel.order(clock()):
                if need <= 0:
                    break
                if not counts.get(i):
                    continue
                try:
                    got = yield from guarded(flows.lease(layout.keys[i], trainer_id, need, True, timeout_s, 0, clock),
                                             fast=True)
                except OutcomeUnknown:  # a lease made there anyway expires and is requeued by the reaper
                    sel.mark_down(i, clock())
                    continue
                if got is not None:
                    held.append((i, *got))
                    need -= len(got[0].groups)
        if need <= 0 or (partial and held):
            return held
        if clock() >= deadline or not (yield from wait_any(layout, sel, "wake_done", wakes, deadline, clock)):
            yield from _hand_back(layout, held)
            return None


def lease_watched(layout: Layout, sel: Selector, trainer_id: str, groups: int, partial: bool,
                  timeout_s: float | None, block_ms: int, clock: Clock, logical: QueueConfig,
                  fleet: FleetWatch) -> Flow[list[Member] | None]:
    """lease(), and after a blocking one that waited in vain, ``fleet``'s look at the workers
    (check_fleet: WorkersGone once they are gone). A non-blocking poll reads nothing more."""
    members = yield from lease(layout, sel, trainer_id, groups, partial, timeout_s, block_ms, clock)
    if members is not None:
        fleet.note_batch()
    elif block_ms > 0:
        yield from check_fleet(layout, sel, clock, logical, fleet, groups, block_ms / 1000)
    return members


def _buffered(layout: Layout, sel: Selector, clock: Clock) -> Flow[tuple[dict[int, str], dict[int, int]]]:
    """Each live partition's wake_done position, then its buffer size (in that order: a completion
    after the count moves the wake stream past the position, so no wake-up is missed)."""
    def read(i: int) -> Flow[tuple[str, int]]:
        keys = layout.keys[i]
        last = p.parse_last_id((yield p.Command(("XREVRANGE", keys["wake_done"], "+", "-", "COUNT", 1))))
        size = p.parse_count((yield p.Command(("ZCARD", keys["buffer"]))), "ZCARD buffer")
        return last or "0-0", size

    got = yield from sweep(layout, sel, read, clock)
    for i, (_, size) in got.items():
        sel.set_estimate(i, size)
    return {i: w for i, (w, _) in got.items()}, {i: n for i, (_, n) in got.items()}


def _hand_back(layout: Layout, held: Sequence[Member]) -> Flow[None]:
    for i, r, token in held:
        try:
            yield from guarded(flows.rollback(layout.keys[i], r.lease_id, token), fast=False)
        except OutcomeUnknown:
            continue  # the lease expires at its deadline and the reaper requeues its groups


def commit(members: Sequence[tuple[QueueKeys, str, str]], done: dict[int, str], step: int | None,
           fence_s: float) -> Flow[list[str]]:
    """Commit every member lease; ``done`` (member -> commit id) survives a failed call, so a retry
    commits only the rest. First every member is fenced (extended by ``fence_s``): a member already
    lost raises LeaseLost while nothing is committed yet, and none can expire during the commits.
    A single member needs no fence: its one commit is atomic. Once every member is committed, a
    repeated call asks each again: the script replays its answer, or says LeaseLost once the lease
    record is pruned (lease_record_ttl_s)."""
    step = check_optional_int(step, "step")
    todo = _open_members(members, done)  # all again once all are committed: the scripts replay
    for k in todo if len(members) > 1 else ():
        keys, lease_id, token = members[k]
        try:
            yield from flows.extend(keys, lease_id, token, fence_s)
        except LeaseLost as exc:
            if exc.state != "committed":  # committed: an earlier commit() ran but its reply was lost
                raise
    for k in todo:
        keys, lease_id, token = members[k]
        done[k] = yield from flows.commit(keys, lease_id, token, step)
    return [done[k] for k in range(len(members))]


def rollback(members: Sequence[tuple[QueueKeys, str, str]], done: dict[int, str],
             reason: str | None = None) -> Flow[int]:
    """Roll back every member not committed yet (with ``reason``: an errored rollback, flows.rollback).
    Returns how many groups went back."""
    total = 0
    for k in _open_members(members, done):
        keys, lease_id, token = members[k]
        total += yield from flows.rollback(keys, lease_id, token, reason)
    return total


def extend(members: Sequence[tuple[QueueKeys, str, str]], done: dict[int, str], seconds: float) -> Flow[int]:
    """Extend every member not committed yet. Returns the earliest new deadline (ms)."""
    deadlines = []
    for k in _open_members(members, done):
        keys, lease_id, token = members[k]
        deadlines.append((yield from flows.extend(keys, lease_id, token, seconds)))
    return min(deadlines, default=0)


def _open_members(members: Sequence[tuple[QueueKeys, str, str]], done: dict[int, str]) -> list[int]:
    """The members not committed yet; all of them once every one is (the scripts then answer
    LeaseLost 'committed': a committed lease cannot be rolled back or extended)."""
    return [k for k in range(len(members)) if k not in done] or list(range(len(members)))
