"""The value types of the stateful model: reservation states, one entry, one lease.

This module owns the names of DESIGN's states as the model spells them, and the two records the
model keeps per source group and per lease. It does no I/O and holds no transition logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from rollout_queue import Receipt, Sample, SourceGroup

BACKLOG, EXECUTING, READY, COMPLETED, LEASED = "backlog", "executing", "ready", "completed", "leased"
COMMITTED, FILTERED, DEAD = "committed", "filtered", "dead"
# Not a DESIGN state: a dead entry whose dead letter was requeued lives on under a new entry ID, so
# the old ID must be gone from every index (its ledger line stays, for replays, until it is pruned).
RETIRED = "retired"
RETAINED = frozenset({EXECUTING, READY, COMPLETED, LEASED})  # the states that hold a PEL entry
STATES = (BACKLOG, EXECUTING, READY, COMPLETED, LEASED, COMMITTED, FILTERED, DEAD)


def id_key(entry_id: str) -> tuple[int, int]:
    """Stream IDs order by (ms, seq), numerically."""
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def attempt_line(attempt: int, worker: str, terminal: str) -> str:
    """The ledger line of an attempt that ended without a settlement (lua/include/ledger.lua)."""
    return f"a|{attempt}|{worker}|{terminal}"


class Attempt(NamedTuple):
    """One record of an entry's attempt history (lua/include/append_histories.lua): the attempt, who
    ended it, how, and (for a completion requeued from the buffer, a lease or a restore) whose
    completion it was. Kept after settlement until prune, so late settlements can be answered."""

    a: int
    w: str
    t: str
    c: str | None = None


def completer(ledger: str | None, attempt: int) -> str | None:
    """The worker whose completion of ``attempt`` the ledger line names, if it names one."""
    parts = (ledger or "").split("|")
    if parts[0] == "a" and len(parts) == 4 and parts[3] == "completed" and parts[1] == str(attempt):
        return parts[2]
    if parts[:2] == ["s", "committed"] and len(parts) > 3 and parts[2] == str(attempt):
        return parts[3] or None
    return None


@dataclass
class Entry:
    """One submitted source group as the model expects it to be."""

    entry_id: str
    group: SourceGroup
    state: str = BACKLOG
    attempt: int = 0               # the PEL delivery count once delivered
    worker: str | None = None      # the executing owner
    failures: int = 0              # counted failures (history's "f"), kept until prune
    samples: tuple[Sample, ...] = ()
    min_version: int = 0
    arrival: int = 0               # buffer order
    lease_id: str | None = None
    kept_step: int | None = None   # committed with a kept pristine copy, at this step
    commits: int = 0               # lines of the commits stream naming it
    restores: int = 0
    ledger: str | None = None      # the exact line the ledger hash should hold
    recorded: bool = False         # in the settled stream, waiting for prune (settled_retention_s)
    pruned: bool = False           # its ledger line and source_id mapping were pruned
    history: list[Attempt] = field(default_factory=list)  # until prune, as the ledger line
    marks: int = 0                 # leases rolled back on a trainer error that held it (suspects), until prune
    stale_evictions: int = 0       # evictions for staleness (history's "s": the fairness rule), until prune
    progress: Progress | None = None       # its progress record (partial rollouts), ready or executing only
    handed: tuple[Sample, ...] = ()        # the progress its executing attempt was handed by reserve
    continued_from: tuple[Sample, ...] = ()  # the record its buffered completion continued, if any

    @property
    def n(self) -> int:
        return self.group.n

    def owns(self, r: Receipt) -> bool:
        return self.state == EXECUTING and self.worker == r.worker_id and self.attempt == r.attempt


@dataclass(frozen=True)
class Progress:
    """One progress record (partial rollouts) as the model expects it: the head's fields
    (lua/include/partial_keys.lua) and the samples the next attempt must be handed (by slot)."""

    attempt: int
    worker: str
    tokens: int
    min_version: int
    size: int                      # the record's byte length (codec.encode_partial)
    samples: tuple[Sample, ...]

    @property
    def head(self) -> str:
        return f"{self.attempt}|{self.tokens}|{self.min_version}|{self.size}|{self.worker}"


@dataclass
class LeaseRecord:
    lease_id: str
    members: list[str]
    version: int
    state: str = "active"          # active | committed | rolled_back | expired
    commit_id: str | None = None
    handle: object = None           # the client's Lease object
