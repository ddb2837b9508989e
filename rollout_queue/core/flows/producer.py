"""The producer's operations as flows: read its cursor, and enqueue a batch with the cursor advanced.

Exactly-once enqueue across producer crashes rests on one script (``lua/produce.lua``): the groups
of a batch and the producer's cursor move in the same atomic step, guarded by a compare-and-set on
the cursor the producer last saw. So a producer killed at any instant restarts from the cursor in
Redis and neither repeats nor skips a group; a batch resent after a lost reply answers ``replay``.
No decision is taken here across round trips: reading the cursor only tells a restarted producer
where to resume, and the script re-checks it.

Like the other flows, this module yields calls and leaves replies to the protocol's parsers; it never touches
a socket or a clock.
"""

from __future__ import annotations

import re
from typing import Sequence

from rollout_queue.core import protocol as p
from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.flows.base import Flow
from rollout_queue.core.flows.queue import SUBMIT_BATCH, encode_source
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import Produced, SourceGroup

__all__ = ["Produced", "check_producer_name", "encode_groups", "produce", "read_cursor"]

_PRODUCER_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


def check_producer_name(name: str) -> str:
    """Producer names become source_id prefixes and hash fields: short tokens only."""
    if not isinstance(name, str) or not _PRODUCER_NAME.match(name):
        raise InvalidInput(f"bad producer name {name!r}: 1-128 characters from letters, digits and _ . : -")
    return name


def encode_groups(groups: Sequence[SourceGroup], max_payload_bytes: int) -> list[p.Arg]:
    """The flat 5-values-per-group ARGV tail that submit and produce take (``add_groups.lua``)."""
    return [x for g in groups for x in encode_source(g, max_payload_bytes)[0]]


def read_cursor(keys: QueueKeys, producer: str) -> Flow[tuple[int, str | None]]:
    """(cursor, plan) of ``producer``: how many groups it enqueued, and the plan it enqueued them by
    ((0, None) for a new name)."""
    return p.parse_producer_cursor((yield p.Command(("HGET", keys["producers"], check_producer_name(producer)))))


def produce(keys: QueueKeys, producer: str, plan: str, start: int, groups: Sequence[SourceGroup],
            max_backlog: int, max_payload_bytes: int) -> Flow[Produced]:
    """Enqueue ``groups`` as positions ``start .. start+len-1`` of ``producer``'s plan.

    Safe to resend after a lost connection (the script answers 'replay'). Raises ProducerConflict
    when another instance moved the cursor or the name was used with another plan, and
    PayloadTooLarge for a group over the queue's limit (nothing written either way).
    """
    if start < 0 or max_backlog < 0:
        raise ValueError("start and max_backlog must be >= 0")
    if len(groups) > SUBMIT_BATCH:
        # One produce is one atomic step of the cursor: bounded like a submit call (issue 12 item 8).
        raise InvalidInput(f"produce takes at most {SUBMIT_BATCH} groups per call, got {len(groups)}: send the "
                           "plan in batches (run_producer's batch_size)")
    flat = encode_groups(groups, max_payload_bytes)
    reply = yield p.build(keys, "produce", producer=check_producer_name(producer), plan=plan, start=start,
                          stop=start + len(groups), max_backlog=max_backlog, groups=flat)
    return p.parse_produce(reply, producer, plan, start)
