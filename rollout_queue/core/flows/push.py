"""Rounds of a weights push: the trainer opens one, workers join, the trainer seals and closes it.

The rendezvous of a torch.distributed push (rollout_queue/weights/push.py) goes through the queue so
that membership, address and epoch are agreed by one script each, never by processes that guess:
a round's world is fixed when it is sealed, a worker that was not a member at that instant is
never waited for, and a worker that starts late joins the next round. Only live workers take ranks
(an id that never heartbeat cannot fill a round), a resent open is a replay of its round, and a
retry round leaves out the members that never reached the trainer's rendezvous.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_choice, check_int, check_items, check_string, describe
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.flows.base import MAX_URI, MAX_VERSION, Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import PushSeal, PushTicket, check_worker_id

#: torch.distributed backends a round may use: gloo (CPU tensors) and NCCL (GPU tensors).
PUSH_BACKENDS = ("gloo", "nccl")
#: How a round ended (push_close.lua).
PUSH_OUTCOMES = ("done", "partial", "failed", "empty")
#: Most members of one round (push_join.lua's MAX_MEMBERS), hence most workers a round leaves out.
MAX_PUSH_MEMBERS = 4096
#: A round id (push_open.lua checks the same).
_ROUND_ID = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
#: Longest join window and round a trainer may ask for (an hour): a round is a bounded wait.
MAX_PUSH_MS = 3_600_000


def push_open(keys: QueueKeys, round_id: str, version: int, uri: str, addr: str, backend: str, join_s: float,
              deadline_s: float, unreached: Sequence[str] = ()) -> Flow[int]:
    """Open a round for ``version`` (recorded later with ``uri``); returns its epoch. ``round_id``:
    new for each round (flows.new_id()): a resent open answers the same epoch, never opens a second
    round (DESIGN rule 5). ``unreached``: workers not admitted (they never reached the rendezvous
    in this version's earlier round: a retry must not wait on them again). Raises
    VersionRegression when the version is not newer than the queue's."""
    check_int(version, "version", 0, MAX_VERSION)
    join_ms = check_int(round(join_s * 1000), "join window (ms)", 0, MAX_PUSH_MS)
    deadline_ms = check_int(round(deadline_s * 1000), "round deadline (ms)", max(1, join_ms), MAX_PUSH_MS)
    left_out = [check_worker_id(w) for w in check_items(unreached, str, "unreached workers")]
    if len(left_out) > MAX_PUSH_MEMBERS:
        raise InvalidInput(f"{len(left_out)} unreached workers: a round has at most {MAX_PUSH_MEMBERS} members")
    if not isinstance(round_id, str) or not _ROUND_ID.match(round_id):
        raise InvalidInput(f"bad push round id {describe(round_id)}: 1-64 letters, digits and - _ . (flows.new_id())")
    reply = yield p.build(keys, "push_open", round_id=round_id, version=version,
                          uri=check_string(uri, "weights uri", MAX_URI),
                          addr=check_string(addr, "rendezvous address", 300),
                          backend=check_choice(backend, PUSH_BACKENDS, "push backend"),
                          join_ms=join_ms, deadline_ms=deadline_ms,
                          unreached=left_out)
    return p.parse_push_open(reply, version)


def push_join(keys: QueueKeys, worker_id: str, epoch: int = 0, newer_than: int = -1) -> Flow[PushTicket | None]:
    """Join round ``epoch`` (0: whichever is joinable now) if it pushes a version newer than
    ``newer_than``; None when no such round is joinable. A member must take part: the round waits
    for every member until its deadline. Raises WorkerNotLive when the worker is not live (it must
    heartbeat first: an id that never did cannot take a rank)."""
    reply = yield p.build(keys, "push_join", epoch=check_int(epoch, "epoch"), worker_id=check_worker_id(worker_id),
                          newer_than=check_int(newer_than, "newer_than", -1))
    return p.parse_push_join(reply, worker_id)


def push_seal(keys: QueueKeys, epoch: int, expect: int = 0) -> Flow[PushSeal | None | tuple[int, int]]:
    """Seal round ``epoch`` once ``expect`` live workers joined (0: every live worker) or its window
    passed. Returns the members, (live members, expected) while still joinable, or None if it was
    superseded or closed."""
    reply = yield p.build(keys, "push_seal", epoch=check_int(epoch, "epoch", 1), expect=check_int(expect, "expect"))
    return p.parse_push_seal(reply, epoch)


def push_close(keys: QueueKeys, epoch: int, outcome: str, acked: int, dropped: int) -> Flow[bool]:
    """Record how round ``epoch`` ended; False when it was superseded (nothing written)."""
    reply = yield p.build(keys, "push_close", epoch=check_int(epoch, "epoch", 1),
                          outcome=check_choice(outcome, PUSH_OUTCOMES, "push outcome"),
                          acked=check_int(acked, "acked"), dropped=check_int(dropped, "dropped"))
    return p.parse_push_close(reply, epoch)
