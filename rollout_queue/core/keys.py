"""Key names of one queue: the only place that spells them.

Every key of a queue shares the hash tag ``{<queue>}`` so that each script touches one Redis Cluster
slot. Nothing else in the package builds a key string; Lua scripts receive these through KEYS (the
lease and hold records and the completion payloads are built inside scripts from the ``meta`` key's
prefix, same tag: lua/include/payloads.lua spells the payload key as ``payload`` does here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout_queue.core.checks import describe
from rollout_queue.core.errors import InvalidInput

#: role -> key suffix. Roles are the names the Lua headers use in their KEYS sections.
KEY_SUFFIXES: dict[str, str] = {
    "src": "src",
    "meta": "meta",
    "counters": "counters",
    "ready": "ready",
    "buffer": "buffer",
    "bufver": "bufver",
    "workers": "workers",
    "reserves": "reserves",
    "leases": "leases",
    "holds": "holds",
    "history": "history",
    "ledger": "ledger",
    "dlq": "dlq",
    "wake_work": "wake:work",
    "wake_done": "wake:done",
    "ids": "ids",
    "commits": "commits",
    "kept": "kept",
    "producers": "producers",
    "settled": "settled",
    "clock": "clock",
    "intake": "intake",
    "progress": "progress",
    "reaped": "reaped",
    "retired": "retired",
    "holders": "holders",
    "push": "push",
    "push_members": "push:members",
    "suspects": "suspects",
    # Progress of unfinished attempts (partial rollouts): entry ID -> the record the next attempt
    # continues from, and entry ID -> its small head (attempt, worker, tokens, oldest version, bytes)
    # that reserve reads without copying the record. Not `progress`: that is the workers' heartbeats.
    "partial": "partial",
    "partial_head": "partial:head",
    "parked": "parked",
    # Entry ID -> '<lease_id>|<attempt>' for every leased group: the ownership a worker credential
    # cannot forge (only the trainer, reaper and admin roles write it; lua/include/leased_guard.lua).
    "leased": "leased",
    # '<entry ID>:<attempt>' -> the token count of that attempt's adopted completion, kept exactly as
    # long as its payload (lua/include/payloads.lua builds it from meta's prefix): what commit and every
    # discard add to counters.tokens_* without reading a payload.
    "tokens": "tokens",
}

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:#\-]{0,127}$")


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it is a usable queue name; braces would break the hash tag."""
    if not isinstance(name, str) or not _QUEUE_NAME.match(name):
        raise InvalidInput(  # a ValueError
            f"bad queue name {describe(name)}: use 1-128 characters from letters, digits and _ . : # - "
            "(no braces: the name becomes the Redis Cluster hash tag)"
        )
    return name


@dataclass(frozen=True)
class QueueKeys:
    """All key names of one queue, by role."""

    queue: str

    def __post_init__(self) -> None:
        validate_queue_name(self.queue)

    @property
    def prefix(self) -> str:
        return f"rollout:{{{self.queue}}}:"

    def __getitem__(self, role: str) -> str:
        return self.prefix + KEY_SUFFIXES[role]

    def lease(self, lease_id: str) -> str:
        """The hash of one lease (built the same way inside the scripts)."""
        return f"{self.prefix}lease:{lease_id}"

    def payload(self, entry_id: str, attempt: int) -> str:
        """The completion payload of one attempt: a string the worker writes in the same MULTI as the
        complete / complete_many script that adopts it (lua/include/payloads.lua), kept while the
        group is buffered or leased, deleted when it is committed, evicted or requeued."""
        return f"{self.prefix}payload:{entry_id}:{attempt}"

    def hold(self, hold_id: str) -> str:
        """The snapshot set of one admission hold."""
        return f"{self.prefix}hold:{hold_id}"

    @property
    def partitions(self) -> str:
        """The partition count of a logical queue split into ``<queue>#0 …`` (absent: one partition,
        the queue itself); written once by partitioned.py, never by a script."""
        return f"{self.prefix}partitions"

    @property
    def versions_channel(self) -> str:
        """Pub/sub channel on which publish_version announces ``<version>|<weights_uri>``."""
        return f"{self.prefix}versions"

    @property
    def pattern(self) -> str:
        """SCAN pattern matching every key of this queue."""
        escaped = self.queue.replace("[", "\\[").replace("]", "\\]").replace("*", "\\*").replace("?", "\\?")
        return f"rollout:{{{escaped}}}:*"
