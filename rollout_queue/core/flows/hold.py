"""Admission holds: close admission, wait until the attempts executing then are terminal, reopen.
"""

from __future__ import annotations

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_optional_seconds, check_seconds
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.flows.base import Clock, Flow, _wait


def hold_open(keys: QueueKeys, hold_id: str, timeout_s: float | None) -> Flow[int]:
    """Close admission; returns how many executing attempts the hold waits for (O(1): see hold_open.lua).
    ``timeout_s=None``: the queue's hold_timeout_s."""
    timeout_s = check_optional_seconds(timeout_s, "timeout_s")
    reply = yield p.build(keys, "hold_open", hold_id=hold_id, timeout_ms=0 if timeout_s is None else int(timeout_s * 1000))
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


def hold_release(keys: QueueKeys, hold_id: str) -> Flow[int]:
    reply = yield p.build(keys, "hold_release", hold_id=hold_id)
    return p.parse_hold_release(reply, hold_id)
