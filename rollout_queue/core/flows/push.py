"""Rounds of a weights push: the trainer opens one, workers join, the trainer seals and closes it.

The rendezvous of a torch.distributed push (rollout_queue/weights/push.py) goes through the queue so
that membership, address and epoch are agreed by one script each, never by processes that guess:
a round's world is fixed when it is sealed, a worker that was not a member at that instant is
never waited for, and a worker that starts late joins the next round.
"""

from __future__ import annotations

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_choice, check_int, check_string
from rollout_queue.core.flows.base import MAX_URI, MAX_VERSION, Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import PushSeal, PushTicket, check_worker_id

#: torch.distributed backends a round may use: gloo (CPU tensors) and NCCL (GPU tensors).
PUSH_BACKENDS = ("gloo", "nccl")
#: How a round ended (push_close.lua).
PUSH_OUTCOMES = ("done", "partial", "failed", "empty")
#: Longest join window and round a trainer may ask for (an hour): a round is a bounded wait.
MAX_PUSH_MS = 3_600_000


def push_open(keys: QueueKeys, version: int, uri: str, addr: str, backend: str, join_s: float,
              deadline_s: float) -> Flow[int]:
    """Open a round for ``version`` (recorded later with ``uri``); returns its epoch. Raises
    VersionRegression when the version is not newer than the queue's."""
    check_int(version, "version", 0, MAX_VERSION)
    join_ms = check_int(round(join_s * 1000), "join window (ms)", 0, MAX_PUSH_MS)
    deadline_ms = check_int(round(deadline_s * 1000), "round deadline (ms)", max(1, join_ms), MAX_PUSH_MS)
    reply = yield p.build(keys, "push_open", version=version, uri=check_string(uri, "weights uri", MAX_URI),
                          addr=check_string(addr, "rendezvous address", 300),
                          backend=check_choice(backend, PUSH_BACKENDS, "push backend"),
                          join_ms=join_ms, deadline_ms=deadline_ms)
    return p.parse_push_open(reply, version)


def push_join(keys: QueueKeys, worker_id: str, epoch: int = 0, newer_than: int = -1) -> Flow[PushTicket | None]:
    """Join round ``epoch`` (0: whichever is joinable now) if it pushes a version newer than
    ``newer_than``; None when no such round is joinable. A member must take part: the round waits
    for every member until its deadline."""
    reply = yield p.build(keys, "push_join", epoch=check_int(epoch, "epoch"), worker_id=check_worker_id(worker_id),
                          newer_than=check_int(newer_than, "newer_than", -1))
    return p.parse_push_join(reply)


def push_seal(keys: QueueKeys, epoch: int, expect: int = 0) -> Flow[PushSeal | None | tuple[int, int]]:
    """Seal round ``epoch`` once ``expect`` workers joined (0: every live worker) or its window passed.
    Returns the members, (joined, expected) while still joinable, or None if it was superseded."""
    reply = yield p.build(keys, "push_seal", epoch=check_int(epoch, "epoch", 1), expect=check_int(expect, "expect"))
    return p.parse_push_seal(reply, epoch)


def push_close(keys: QueueKeys, epoch: int, outcome: str, acked: int, dropped: int) -> Flow[bool]:
    """Record how round ``epoch`` ended; False when it was superseded (nothing written)."""
    reply = yield p.build(keys, "push_close", epoch=check_int(epoch, "epoch", 1),
                          outcome=check_choice(outcome, PUSH_OUTCOMES, "push outcome"),
                          acked=check_int(acked, "acked"), dropped=check_int(dropped, "dropped"))
    return p.parse_push_close(reply, epoch)
