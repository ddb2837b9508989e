"""The trainer's operations on completed groups: lease, commit, rollback, extend, beat.
"""

from __future__ import annotations

import secrets

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import (
    check_flag,
    check_int,
    check_optional_int,
    check_optional_seconds,
    check_seconds,
    check_string,
)
from rollout_queue.core.errors import LeaseLost
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import check_reason
from rollout_queue.core.flows.base import BATCH, Clock, Flow, MAX_NAME, _wait, new_id


def lease(keys: QueueKeys, trainer_id: str, groups: int, partial: bool, timeout_s: float | None, block_ms: int,
          clock: Clock) -> Flow[tuple[p.LeaseReply, str] | None]:
    """Lease exactly ``groups`` fresh completed groups (>= 1 when partial), waiting up to ``block_ms``.
    Returns (reply, token) or None. The script answers ids and fields; the payloads follow with one
    HMGET (P2). Members whose payload does not decode (garbage written into Redis) or is gone by
    then make the flow hand the lease back and try again: they are regenerated, nothing is lost."""
    groups, block_ms = check_int(groups, "groups", 1), check_int(block_ms, "block_ms")
    check_string(trainer_id, "trainer_id", MAX_NAME)
    check_flag(partial, "partial")
    check_optional_seconds(timeout_s, "timeout_s")
    deadline = clock() + block_ms / 1000
    timeout_ms = 0 if timeout_s is None else max(1, int(timeout_s * 1000))
    while True:
        lease_id, token = new_id(), secrets.token_hex(16)
        reply = yield p.build(keys, "lease", lease_id=lease_id, token=token, trainer_id=trainer_id, groups=groups,
                              partial=1 if partial else 0, timeout_ms=timeout_ms)
        r = p.parse_lease(reply, lease_id, groups)
        if r.status == "ok":
            payloads = (yield p.read_lease_payloads(keys, r)) if r.members else []
            r = p.decode_lease(r, payloads)
            if not r.undecodable:
                return r, token
            yield from _hand_back(keys, lease_id, token)
            continue
        if block_ms <= 0 or not (yield from _wait(keys["wake_done"], r.wake_id, deadline, clock)):
            return None


def _hand_back(keys: QueueKeys, lease_id: str, token: str) -> Flow[None]:
    """Roll back a lease with undecodable members. One that already expired (a payload read after its
    deadline finds the members requeued) has nothing left to hand back: the reaper requeued it."""
    try:
        yield from rollback(keys, lease_id, token)
    except LeaseLost as exc:
        if exc.state != "expired":
            raise


def commit(keys: QueueKeys, lease_id: str, token: str, step: int | None) -> Flow[str]:
    """Settle the lease committed. Returns the commit's ID in the commits stream."""
    step = check_optional_int(step, "step")
    reply = yield p.build(keys, "commit", lease_id=lease_id, token=token, step="" if step is None else int(step))
    return p.parse_commit(reply, lease_id)


def rollback(keys: QueueKeys, lease_id: str, token: str, reason: str | None = None) -> Flow[int]:
    """Hand back every member of the lease, a bounded batch per call. Returns how many went back (0
    on a replay). The first call already fences the lease: a later commit is refused.

    ``reason`` None: a plain rollback (the trainer stops or gave up): the members go back to ready
    to be generated again, not counted. A reason (the trainer raised on this data): an errored
    rollback, counted per member (DESIGN rule 4); the first call's choice holds for the whole
    rollback, and dead-lettered members are not in the count returned."""
    text = "" if reason is None else (check_reason(reason) or "error")  # '' is the plain form on the wire
    total = 0
    while True:
        reply = yield p.build(keys, "rollback", lease_id=lease_id, token=token, reason=text, count=BATCH)
        n, _, done = p.parse_rollback(reply, lease_id)
        total += n
        if done:
            return total


def extend(keys: QueueKeys, lease_id: str, token: str, seconds: float) -> Flow[int]:
    """Move the deadline to ``seconds`` from now (server clock). Returns the new deadline in ms."""
    seconds = check_seconds(seconds, "seconds")
    reply = yield p.build(keys, "extend", lease_id=lease_id, token=token, ms=max(1, int(seconds * 1000)))
    return p.parse_extend(reply, lease_id)


def beat(keys: QueueKeys, lease_id: str, token: str) -> Flow[tuple[int, int, int]]:
    """The holder of the lease is alive (lease_beat.lua): the reaper rolls the lease back
    trainer_silence_s after the last beat instead of waiting for the deadline. Returns (deadline,
    when the lease falls due if no beat follows, the stored trainer_silence; 0: off), in ms. Raises
    LeaseLost once the lease is closed or past its deadline: beating it is pointless from then on."""
    reply = yield p.build(keys, "lease_beat", lease_id=lease_id, token=token)
    return p.parse_lease_beat(reply, lease_id)
