"""Sans-IO core: builds each script call and parses its reply. No Redis client is imported here.

Rule 1: a builder turns typed arguments into an immutable ``Call`` whose keys and ARGV order come
from the script's own header (scripts.py), so the Lua and the Python cannot drift apart.
Rule 2: a parser turns a raw reply into a value or raises the typed error for its status word. The
status -> exception table lives here and nowhere else; an unknown status raises ProtocolError, it is
never read as success.
Multi-call operations (blocking reserve, reaper sweeps, ...) are generators in flows.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence, TypeVar

from rollout_queue.core.codec import CodecError, decode_columns, decode_group
from rollout_queue.core.errors import (
    CheckpointPruned,
    CheckpointRegression,
    ConfigMismatch,
    HoldLost,
    InvalidInput,
    LeaseLost,
    LeaseUnsatisfiable,
    LeasesOpen,
    MalformedCompletion,
    NotFound,
    PayloadTooLarge,
    ProducerConflict,
    ProtocolError,
    RestoreInProgress,
    RolloutQueueError,
    StaleReceipt,
    VersionRegression,
)
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import CompletedGroup, HeartbeatInfo, Receipt, SourceGroup
from rollout_queue.core.scripts import SCRIPTS, Script

Arg = bytes | str | int | float
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One script invocation. ``idempotent``: safe to send again after a lost connection."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    idempotent: bool = True


@dataclass(frozen=True)
class Command:
    """One plain Redis command (reads and blocking waits; never a state change)."""

    args: tuple[Arg, ...]
    idempotent: bool = True


Op = Call | Command


def build(keys: QueueKeys, name: str, *, idempotent: bool = True, **argv: Any) -> Call:
    """A call of script ``name``; ``argv`` must name exactly the header's ARGV entries."""
    script = SCRIPTS[name]
    fixed = [a for a in script.argv if not a.startswith("*")]
    expected = set(fixed) | ({script.variadic} if script.variadic else set())
    if set(argv) != expected:
        raise TypeError(f"script {name} takes ARGV {sorted(expected)}, got {sorted(argv)}")
    args: list[Arg] = [argv[n] for n in fixed]
    if script.variadic:
        args.extend(argv[script.variadic])
    return Call(script, tuple(keys[r] for r in script.keys), tuple(args), idempotent)


def s(value: Any) -> str:
    """A reply element as text (bytes that are not UTF-8, written into Redis by hand, are replaced
    rather than failing the whole reply)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def pairs(flat: Sequence[Any]) -> dict[str, Any]:
    """A flat [name, value, ...] reply as a dict keyed by text."""
    return {s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


# -- the status table -----------------------------------------------------------------------------
# status word -> function(context, reply) -> exception. ``context`` names what the call was about.

Raiser = Callable[[Mapping[str, Any], Sequence[Any]], Exception]

ERRORS: dict[str, Raiser] = {
    "stale_receipt": lambda c, r: StaleReceipt(c["entry_id"], c["attempt"], c["worker_id"], s(r[1]), int(r[2])),
    "lease_lost": lambda c, r: LeaseLost(c["lease_id"], s(r[1])),
    "hold_lost": lambda c, r: HoldLost(c["hold_id"]),
    "payload_too_large": lambda c, r: PayloadTooLarge(c.get("what", "payload"), int(r[-2]), int(r[-1])),
    "config_mismatch": lambda c, r: ConfigMismatch(c["queue"], s(r[1]), s(r[2]), s(r[3])),
    "malformed": lambda c, r: MalformedCompletion(c["entry_id"], s(r[1]), s(r[2])),
    "version_regression": lambda c, r: VersionRegression(c["version"], int(r[1])),
    "checkpoint_pruned": lambda c, r: CheckpointPruned(c["step"], int(r[1])),
    "unsatisfiable": lambda c, r: LeaseUnsatisfiable(c["groups"], s(r[1]), int(r[2])),
    "checkpoint_regression": lambda c, r: CheckpointRegression(c["step"], int(r[1])),
    "leases_open": lambda c, r: LeasesOpen(c["step"], int(r[1])),
    "restore_in_progress": lambda c, r: RestoreInProgress(int(r[1]), c.get("what", "this call")),
    "not_found": lambda c, r: NotFound(f"{c.get('what', 'record')} {c.get('id', '')} not found"),
    "cursor_moved": lambda c, r: ProducerConflict(c["producer"], f"its cursor is at {int(r[1])}, not {c['from']}"),
    "plan_mismatch": lambda c, r: ProducerConflict(c["producer"], f"it was started with plan {s(r[1])}, not {c['plan']}"),
}


def check(reply: Any, ok: tuple[str, ...], context: Mapping[str, Any]) -> tuple[str, Sequence[Any]]:
    """The reply's status word if it is one of ``ok``; the mapped exception for a known refusal."""
    if not isinstance(reply, (list, tuple)) or not reply:
        raise ProtocolError(f"reply is not a status list: {reply!r}")
    status = s(reply[0])
    if status in ok:
        return status, reply
    if status in ERRORS:
        try:
            error = ERRORS[status](context, reply)
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed {status!r} reply {reply!r}: {exc!r}") from exc
        raise error
    raise ProtocolError(f"unknown status {status!r} in reply {reply!r}")


def _shaped(parse: Callable[..., T]) -> Callable[..., T]:
    """A parser indexes into its reply: a reply of the wrong shape raises ProtocolError, never IndexError."""

    @functools.wraps(parse)
    def checked(reply: Any, *args: Any) -> T:
        try:
            return parse(reply, *args)
        except RolloutQueueError as exc:
            if type(exc) is not InvalidInput:
                raise  # a refusal mapped by check(), or already a ProtocolError
            bad: Exception = exc  # a reply value our own types refuse, e.g. a receipt with a bad entry ID
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            bad = exc
        raise ProtocolError(f"{parse.__name__}: reply {reply!r} does not have the documented shape") from bad

    return checked


def receipt_context(r: Receipt) -> dict[str, Any]:
    return {"entry_id": r.entry_id, "attempt": r.attempt, "worker_id": r.worker_id}


def completion_context(r: Receipt) -> dict[str, Any]:
    """What a complete / complete_many refusal is about (PayloadTooLarge names the completion)."""
    return {**receipt_context(r), "what": f"completion of {r.entry_id}"}


# -- complete_many: refusals are per item ------------------------------------------------------------

#: The refusals complete_many answers per item; each is returned in its item's place, not raised.
COMPLETION_REFUSALS = (StaleReceipt, PayloadTooLarge, MalformedCompletion)
#: One item's outcome: 'buffered', 'replay' or 'evicted_self', or the refusal (one of COMPLETION_REFUSALS).
CompletionOutcome = str | RolloutQueueError


@_shaped
def parse_complete_many(reply: Any, receipts: Sequence[Receipt]) -> list[CompletionOutcome]:
    """One outcome per receipt, in order. Only the refusals of COMPLETION_REFUSALS are per item: an
    unknown status word in any item raises ProtocolError for the whole reply."""
    _, r = check(reply, ("ok",), {})
    items = r[1:]
    if len(items) != len(receipts):
        raise ProtocolError(f"complete_many answered {len(items)} items for {len(receipts)} sent")
    out: list[CompletionOutcome] = []
    for receipt, item in zip(receipts, items):
        try:
            out.append(s(check(item, ("ok",), completion_context(receipt))[1][1]))
        except COMPLETION_REFUSALS as exc:
            out.append(exc)
    return out


# -- parsers of the replies that carry data ------------------------------------------------------


@dataclass(frozen=True)
class ReserveReply:
    """A parsed reserve reply; ``granted`` still holds raw fields (flows.py decodes them)."""

    status: str
    version: int
    version_published: bool
    wake_id: str
    dead_lettered: int
    granted: tuple[tuple[Receipt, Mapping[bytes, bytes]], ...]


RESERVE_STATUSES = ("ok", "held", "backpressure", "capacity", "admission", "retained_full", "empty", "oversized",
                    "retry")


@_shaped
def parse_reserve(reply: Any, worker_id: str) -> ReserveReply:
    status, r = check(reply, RESERVE_STATUSES, {"worker_id": worker_id})
    granted = []
    for entry_id, attempt, kv in r[5]:
        fields = {bytes(kv[i]): bytes(kv[i + 1]) for i in range(0, len(kv), 2)}
        granted.append((Receipt(s(entry_id), int(attempt), worker_id), fields))
    return ReserveReply(status, int(r[1]), bool(int(r[2])), s(r[3]), int(r[4]), tuple(granted))


def decode_reservation_group(fields: Mapping[bytes, bytes]) -> SourceGroup:
    """The pristine group of a granted entry (CodecError: the caller dead-letters it)."""
    return decode_group(fields)


@dataclass(frozen=True)
class LeaseMember:
    """One member of a granted lease as the script names it: its payload is read after the script."""

    entry_id: str
    attempt: int
    min_version: str  # as the lease record stores it; decode_lease reads it as an integer
    fields: Mapping[bytes, bytes]


@dataclass(frozen=True)
class LeaseReply:
    """A parsed lease reply (granted) or why nothing was leased. A granted reply names its
    ``members``; ``groups`` and ``undecodable`` are filled by decode_lease once the payloads are read."""

    status: str
    available: int
    wake_id: str
    lease_id: str = ""
    deadline_ms: int = 0
    version: int = 0
    groups: tuple[CompletedGroup, ...] = ()
    undecodable: tuple[str, ...] = ()
    members: tuple[LeaseMember, ...] = ()


@_shaped
def parse_lease(reply: Any, lease_id: str, groups: int = 0) -> LeaseReply:
    """The lease script's answer; a granted one lists its members without payloads (P2: the script
    returns no payload, so its time does not grow with them). read_lease_payloads, then decode_lease."""
    status, r = check(reply, ("ok", "held", "insufficient"), {"lease_id": lease_id, "groups": groups})
    if status != "ok":
        return LeaseReply(status, int(r[1]), s(r[2]))
    members = []
    for entry_id, attempt, min_version, kv in r[4]:
        fields = {bytes(kv[i]): bytes(kv[i + 1]) for i in range(0, len(kv), 2)}
        members.append(LeaseMember(s(entry_id), int(attempt), s(min_version), fields))
    return LeaseReply("ok", len(members), "", s(r[1]), int(r[2]), int(r[3]), members=tuple(members))


def read_lease_payloads(keys: QueueKeys, reply: LeaseReply) -> Command:
    """One HMGET of a granted lease's completion payloads, in member order (a plain read: the members
    are owned by the lease until it is committed, rolled back or expires). Needs >= 1 member."""
    return Command(("HMGET", keys["results"], *(m.entry_id for m in reply.members)))


@_shaped
def decode_lease(reply: LeaseReply, payloads: Sequence[bytes | None]) -> LeaseReply:
    """The granted lease with its groups decoded (columns now, Samples on first access) from each
    member's fields and payload. A member whose payload or fields do not decode, or whose payload is
    missing (the lease expired before the read and its members were requeued, or the hash was edited
    by hand), is listed in ``undecodable``: the caller hands the lease back, it is never trained on."""
    if len(payloads) != len(reply.members):
        raise ProtocolError(f"{len(payloads)} payloads read for {len(reply.members)} lease members")
    groups, bad = [], []
    for m, payload in zip(reply.members, payloads):
        try:
            groups.append(CompletedGroup.from_columns(m.entry_id, decode_group(m.fields),
                                                      decode_columns(payload or b""), m.attempt, int(m.min_version)))
        except (CodecError, ValueError):  # ValueError: a version that is not an integer (edited by hand)
            bad.append(m.entry_id)
    return replace(reply, available=len(groups), groups=tuple(groups), undecodable=tuple(bad))


@_shaped
def parse_heartbeat(reply: Any) -> HeartbeatInfo:
    _, r = check(reply, ("ok",), {})
    uri = s(r[3])
    return HeartbeatInfo(int(r[1]), bool(int(r[2])), uri or None, bool(int(r[4])), int(r[5]))


@_shaped
def parse_open(reply: Any, queue: str) -> tuple[bool, dict[str, str]]:
    _, r = check(reply, ("ok",), {"queue": queue})
    return bool(int(r[1])), {k: s(v) for k, v in pairs(r[2:]).items()}


@dataclass(frozen=True)
class Probe:
    """An op whose failure the driver throws back into the flow instead of out of it, so an
    operation over partitions can skip (or report) an unreachable one. ``fast``: send it with
    the driver's probe retry (drivers.transport.PROBE_RETRY) instead of the client's full retry window."""

    op: Op
    fast: bool = True
