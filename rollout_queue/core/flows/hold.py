"""Admission holds: close admission, wait until the attempts executing then are terminal, reopen.
"""

from __future__ import annotations

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_optional_seconds, check_seconds, check_string
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.flows.base import Clock, Flow, _wait


def check_holder(holder: str, reason: str) -> tuple[str, str]:
    """Who opens a hold and why, as operators read them back (``holders``: ``holder|since|reason``,
    so a holder has no '|'; the reason is the rest of the line)."""
    check_string(holder, "hold holder")
    if "|" in holder:
        raise InvalidInput(f"hold holder {holder!r} may not contain '|'")
    return holder, check_string(reason, "hold reason", max_len=500, allow_empty=True)


def hold_open(keys: QueueKeys, hold_id: str, timeout_s: float | None, holder: str, reason: str = "") -> Flow[int]:
    """Close admission; returns how many executing attempts the hold waits for (O(1): see hold_open.lua).
    ``timeout_s=None``: the queue's hold_timeout_s. ``holder`` (a trainer id) and ``reason`` are
    recorded for operators (`rollout-queue holds`) for as long as the hold stands."""
    timeout_s = check_optional_seconds(timeout_s, "timeout_s")
    holder, reason = check_holder(holder, reason)
    reply = yield p.build(keys, "hold_open", hold_id=hold_id, timeout_ms=0 if timeout_s is None else int(timeout_s * 1000),
                          holder=holder, reason=reason)
    return p.parse_hold_open(reply, hold_id)


def hold_wait(keys: QueueKeys, hold_id: str, timeout_s: float, clock: Clock) -> Flow[bool]:
    """True once every attempt in the hold's snapshot is terminal; False if ``timeout_s`` passes
    (0: look once)."""
    timeout_s = check_seconds(timeout_s, "timeout_s", allow_zero=True)
    deadline = clock() + timeout_s
    while True:
        reply = yield p.build(keys, "hold_poll", hold_id=hold_id)
        executing, wake_id = p.parse_hold_poll(reply, hold_id)
        if executing == 0:
            return True
        if not (yield from _wait(keys["wake_work"], wake_id, deadline, clock)):
            return False


def hold_release(keys: QueueKeys, hold_id: str | bytes) -> Flow[int]:
    """Release hold ``hold_id``: a str from the caller, or the bytes an index gave the reaper, sent as
    they are (an id written there by hand need not be UTF-8; the script answers it, never the client)."""
    reply = yield p.build(keys, "hold_release", hold_id=hold_id)
    return p.parse_hold_release(reply, hold_id)
