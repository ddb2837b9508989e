"""Sans-IO core: builds each script call and parses its reply. No Redis client is imported here.

Rule 1: a builder turns typed arguments into an immutable ``Call`` whose keys and ARGV order come
from the script's own header (scripts.py), so the Lua and the Python cannot drift apart.
Rule 2: a parser turns a raw reply into a value or raises the typed error for its status word. The
status -> exception table lives here and nowhere else; an unknown status raises ProtocolError, it is
never read as success.
Rule 3: this is the only module that reads reply positions; flows, actions and the partitioned flows
call its parsers, and a reply of the wrong shape raises ProtocolError, never IndexError or TypeError.
Multi-call operations (blocking reserve, reaper sweeps, ...) are generators in flows/.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, replace
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import orjson

from rollout_queue.core.codec import CodecError, decode_columns, decode_group
from rollout_queue.core.errors import (
    CheckpointPruned,
    CheckpointRegression,
    ConfigMismatch,
    HoldLost,
    InvalidInput,
    LayoutMigrationRefused,
    LeaseLost,
    LeaseUnsatisfiable,
    LeasesOpen,
    MalformedCompletion,
    NotFound,
    PartialTooLarge,
    PayloadTooLarge,
    ProducerConflict,
    ProtocolError,
    QueueCreateRefused,
    RestoreInProgress,
    RolloutQueueError,
    StaleReceipt,
    VersionRegression,
    WorkerNotLive,
)
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import (PushSeal, PushTicket, CompletedGroup, DeadLetter, HeartbeatInfo, OwnedAttempt, Produced, QueueStats,
                                       Receipt, SourceGroup)
from rollout_queue.core.scripts import SCRIPTS, Script

Arg = bytes | str | int | float
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """One script invocation. ``idempotent``: safe to send again after a lost connection.

    ``stage``: (key, bytes) pairs the transport SETs (NX) in the same MULTI as the script, just before it
    (a completion's payloads: lua/include/payloads.lua), so large values reach Redis once, as keys,
    never through ARGV into Lua; MULTI makes the SETs and the script one step that a dying client
    cannot cut in two."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    idempotent: bool = True
    stage: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Command:
    """One plain Redis command (reads and blocking waits; never a state change). ``route``: a key
    whose hash tag picks the cluster node of a keyless command (the queue's own node's TIME: on a
    cluster each node has its own clock)."""

    args: tuple[Arg, ...]
    idempotent: bool = True
    route: str | None = None


Op = Call | Command


def build(keys: QueueKeys, name: str, *, idempotent: bool = True, stage: tuple[tuple[str, bytes], ...] = (),
          **argv: Any) -> Call:
    """A call of script ``name``; ``argv`` must name exactly the header's ARGV entries. ``stage``: see Call."""
    script = SCRIPTS[name]
    fixed = [a for a in script.argv if not a.startswith("*")]
    expected = set(fixed) | ({script.variadic} if script.variadic else set())
    if set(argv) != expected:
        raise TypeError(f"script {name} takes ARGV {sorted(expected)}, got {sorted(argv)}")
    args: list[Arg] = [argv[n] for n in fixed]
    if script.variadic:
        args.extend(argv[script.variadic])
    return Call(script, tuple(keys[r] for r in script.keys), tuple(args), idempotent, stage)


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
    "partial_too_large": lambda c, r: PartialTooLarge(f"progress record of {c.get('entry_id', '?')}", int(r[1]), int(r[2])),
    "config_mismatch": lambda c, r: ConfigMismatch(c["queue"], s(r[1]), s(r[2]), s(r[3])),
    "migration_refused": lambda c, r: LayoutMigrationRefused(c["queue"], s(r[1]), s(r[2])),
    "create_refused": lambda c, r: QueueCreateRefused(c["queue"]),
    "malformed": lambda c, r: MalformedCompletion(c["entry_id"], s(r[1]), s(r[2])),
    "version_regression": lambda c, r: VersionRegression(c["version"], int(r[1])),
    "not_live": lambda c, r: WorkerNotLive(c["worker_id"]),
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
    """A parsed reserve reply; ``granted`` still holds raw fields (flows/worker.py decodes them)."""

    status: str
    version: int
    version_published: bool
    wake_id: str
    dead_lettered: int
    granted: tuple[tuple[Receipt, Mapping[bytes, bytes]], ...]
    #: per grant, the byte length of its entry's progress record (0: none), read after the call
    #: with read_progress (partial rollouts: the record never passes through the script)
    progress_bytes: tuple[int, ...] = ()


RESERVE_STATUSES = ("ok", "held", "backpressure", "capacity", "admission", "retained_full", "empty", "oversized",
                    "retry")


@_shaped
def parse_reserve(reply: Any, worker_id: str) -> ReserveReply:
    status, r = check(reply, RESERVE_STATUSES, {"worker_id": worker_id})
    granted, sizes = [], []
    for grant in r[5]:
        entry_id, attempt, kv = grant[:3]
        if len(grant) > 4:
            raise ValueError(f"a grant has {len(grant)} fields")
        fields = {bytes(kv[i]): bytes(kv[i + 1]) for i in range(0, len(kv), 2)}
        granted.append((Receipt(s(entry_id), int(attempt), worker_id), fields))
        sizes.append(_int(grant[3]) if len(grant) == 4 else 0)
    return ReserveReply(status, int(r[1]), bool(int(r[2])), s(r[3]), int(r[4]), tuple(granted), tuple(sizes))


def read_progress(keys: QueueKeys, entry_ids: Sequence[str]) -> Command:
    """One HMGET of the progress records of granted entries (a plain read: the entries are owned by
    the reserving worker, and only an entry's owner writes its record). Needs >= 1 entry ID."""
    return Command(("HMGET", keys["partial"], *entry_ids))


@_shaped
def parse_progress(reply: Any, entry_ids: Sequence[str]) -> list[bytes | None]:
    """read_progress's reply: one record (bytes) or None per entry ID, in order."""
    if not isinstance(reply, (list, tuple)) or len(reply) != len(entry_ids):
        raise ValueError("not one value per entry")
    return [None if v is None else bytes(v) for v in reply]


@_shaped
def parse_save_partial(reply: Any, receipt: Receipt) -> str:
    """save_partial: 'saved' or 'replay' (StaleReceipt, PartialTooLarge: nothing written)."""
    return _fields("save_partial", reply, receipt_context(receipt), _word)[0]


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
    """One MGET of a granted lease's completion payloads (each member's payload key, named by its
    entry and attempt), in member order (a plain read: the members are owned by the lease until it is
    committed, rolled back or expires). Needs >= 1 member."""
    return Command(("MGET", *(keys.payload(m.entry_id, m.attempt) for m in reply.members)))


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
            cols = decode_columns(payload or b"")
            # The record holds the version the queue judged the group by (its samples' newest tokens
            # in staleness_mode 'continue', the current one for a group the fairness rule protects);
            # the group's min_version is its oldest token's, as the samples say (DESIGN: Staleness modes).
            judged, oldest = int(m.min_version), min(cols.versions, default=None)
            groups.append(CompletedGroup.from_columns(m.entry_id, decode_group(m.fields), cols, m.attempt,
                                                      judged if oldest is None else oldest))
        except (CodecError, ValueError):  # ValueError: a version that is not an integer (edited by hand)
            bad.append(m.entry_id)
    return replace(reply, available=len(groups), groups=tuple(groups), undecodable=tuple(bad))


@_shaped
def parse_heartbeat(reply: Any) -> HeartbeatInfo:
    version, published, uri, held, now = _fields("heartbeat", reply, {}, _int, _flag, _word, _flag, _int)
    return HeartbeatInfo(version, published, uri or None, held, now)


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


# -- reply fields ---------------------------------------------------------------------------------
# Every other reply is read here too: flows, actions and the partitioned flows call these parsers and
# never index a reply themselves (tests/unit/test_reply_parsing.py checks both). A reply of the wrong
# shape (None, too short, a list where a number belongs) raises ProtocolError naming the script or
# command and the reply it got.


def _int(value: Any) -> int:
    """A numeric reply element (an integer, or digits as bytes/text)."""
    if isinstance(value, (list, tuple, dict)) or value is None:
        raise TypeError(f"expected a number, got {value!r}")
    return int(value)


def _flag(value: Any) -> bool:
    """A 0|1 reply element; any non-zero number reads as 1."""
    return _int(value) != 0


def _word(value: Any) -> str:
    """A text reply element (bytes that are not UTF-8 are replaced, as by ``s``)."""
    if not isinstance(value, (bytes, str)):
        raise TypeError(f"expected text, got {value!r}")
    return s(value)


def _name(value: Any) -> bytes:
    """A key member (worker, lease or hold id) as the raw bytes Redis gave: a name that is not UTF-8
    (garbage written by hand) goes back to the scripts unchanged instead of failing the reply."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value).encode()
    raise TypeError(f"expected a name, got {value!r}")


def _items(value: Any) -> Sequence[Any]:
    """A nested list of a reply."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"expected a list, got {value!r}")
    return value


def _fields(script: str, reply: Any, context: Mapping[str, Any], *kinds: Callable[[Any], Any],
            ok: tuple[str, ...] = ("ok",)) -> tuple[Any, ...]:
    """Check ``reply`` (check()) and read the fields after its status word, one converter each;
    at least ``len(kinds)`` must be there. ProtocolError names the script and the reply otherwise."""
    _, r = check(reply, ok, context)
    if len(r) < len(kinds) + 1:
        raise ProtocolError(f"{script}: reply {reply!r} has {len(r) - 1} fields, expected {len(kinds)}")
    try:
        return tuple(kind(v) for kind, v in zip(kinds, r[1:]))
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{script}: reply {reply!r} does not have the documented shape: {exc}") from exc


def _one_of(script: str, word: str, allowed: tuple[str, ...]) -> str:
    if word not in allowed:
        raise ProtocolError(f"{script}: {word!r} is not one of {allowed}")
    return word


def raw_fields(kv: Any) -> dict[bytes, bytes]:
    """A stream entry's flat [field, value, ...] list as raw bytes (as reserve grants and XRANGE give it)."""
    kv = _items(kv)
    if len(kv) % 2:
        raise ValueError(f"odd field list {kv!r}")
    return {bytes(kv[i]): bytes(kv[i + 1]) for i in range(0, len(kv), 2)}


def field_map(kv: Sequence[Any] | Mapping[Any, Any]) -> dict[str, Any]:
    """A field/value reply by name: a RESP3 map, or a RESP2 flat [name, value, ...] list."""
    if isinstance(kv, Mapping):
        return {s(k): v for k, v in kv.items()}
    return {s(kv[i]): kv[i + 1] for i in range(0, len(kv), 2)}


def scored(reply: Sequence[Any]) -> list[tuple[str, float]]:
    """A WITHSCORES reply: RESP3 [[member, score], ...] or RESP2 [member, score, ...]."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(s(m), float(sc)) for m, sc in reply]
    return [(s(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


# -- queue replies --------------------------------------------------------------------------------


@_shaped
def parse_submit(reply: Any) -> list[str]:
    """submit: the entry ID of each group, in order ({'ok', new_count, entry_id, ...})."""
    _fields("submit", reply, {"what": "source group"}, _int)
    return [_word(x) for x in reply[2:]]


@_shaped
def parse_publish_version(reply: Any, version: int, hold_id: str) -> bool:
    """publish_version: True if the version was new, False for a replay of the current one."""
    word, _ = _fields("publish_version", reply, {"version": version, "hold_id": hold_id}, _word, _int)
    return _one_of("publish_version", word, ("published", "replay")) == "published"


@_shaped
def parse_push_open(reply: Any, version: int) -> int:
    """push_open: the round's epoch (a resent open's reply is the same epoch)."""
    return _fields("push_open", reply, {"version": version}, _int)[0]


@_shaped
def parse_push_join(reply: Any, worker_id: str) -> PushTicket | None:
    """push_join: the worker's ticket, or None when no round is joinable (WorkerNotLive: it is, but
    not to a worker that is not live)."""
    status, r = check(reply, ("ok", "closed"), {"worker_id": worker_id})
    if status == "closed":
        return None
    epoch, rank, version, uri, addr, backend, remaining = _fields(
        "push_join", reply, {}, _int, _int, _int, _word, _word, _word, _int)
    return PushTicket(epoch, rank, version, uri, addr, backend, remaining)


@_shaped
def parse_push_seal(reply: Any, epoch: int) -> PushSeal | None | tuple[int, int]:
    """push_seal: the sealed round; (joined, expected) while it is still joinable; None when the
    round was superseded."""
    status, r = check(reply, ("ok", "waiting", "closed"), {"epoch": epoch})
    if status == "closed":
        return None
    if status == "waiting":
        return _int(r[1]), _int(r[2])
    members = {k: _int(v) for k, v in pairs(r[2:]).items()}
    world = _int(r[1])
    if sorted(members.values()) != list(range(1, world)):
        raise ProtocolError(f"push_seal: ranks {sorted(members.values())} are not 1..{world - 1}")
    return PushSeal(epoch, world, members)


@_shaped
def parse_push_close(reply: Any, epoch: int) -> bool:
    """push_close: True if recorded, False when the round was superseded."""
    status, _ = check(reply, ("ok", "closed"), {"epoch": epoch})
    return status == "ok"


@_shaped
def parse_count(reply: Any, command: str) -> int:
    """A number a plain command answers (XLEN, ZCARD, an HGET of a counter); absent or empty: 0."""
    if reply is None or reply == b"" or reply == "":
        return 0
    try:
        return _int(reply)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{command}: expected a number, got {reply!r}") from exc


@_shaped
def parse_hmget(reply: Any, names: Sequence[str], command: str = "HMGET") -> dict[str, Any]:
    """An HMGET reply by field name (each value raw, None when absent)."""
    values = _items(reply)
    if len(values) != len(names):
        raise ProtocolError(f"{command}: {len(values)} values for {len(names)} fields in {reply!r}")
    return dict(zip(names, values))


@_shaped
def parse_time(reply: Any) -> int:
    """TIME ([seconds, microseconds]) in ms."""
    r = _items(reply)
    if len(r) != 2:
        raise ProtocolError(f"TIME: expected [seconds, microseconds], got {reply!r}")
    return _int(r[0]) * 1000 + _int(r[1]) // 1000


@_shaped
def parse_stream_entries(reply: Any, command: str = "XRANGE") -> list[tuple[str, Any]]:
    """XRANGE / XREVRANGE: [(entry ID, its raw field list, or a mapping as RESP3 sends it), ...]."""
    out = []
    for row in _items(reply):
        if (not isinstance(row, (list, tuple)) or len(row) != 2 or not isinstance(row[1], (list, tuple, Mapping))
                or (isinstance(row[1], (list, tuple)) and len(row[1]) % 2)):
            raise ProtocolError(f"{command}: expected [id, [field, value, ...]], got {row!r}")
        out.append((_word(row[0]), row[1]))
    return out


@dataclass(frozen=True)
class StreamInfo:
    """What XINFO STREAM says of a stream's size: its ``length``, the last ID it ever generated, and
    how many entries were ever added (None on a server before Redis 7, which does not count them):
    ``entries_added - length`` is how many were trimmed (MAXLEN) or deleted."""

    length: int
    last_id: str
    entries_added: int | None


@_shaped
def parse_stream_info(reply: Any) -> StreamInfo:
    """XINFO STREAM (a RESP3 map or a RESP2 flat list)."""
    if isinstance(reply, Mapping):
        f = {_word(k): v for k, v in reply.items()}
    else:
        flat = _items(reply)
        if len(flat) % 2:
            raise ValueError(f"odd field list {flat!r}")
        f = {_word(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
    added = _int(f["entries-added"]) if "entries-added" in f else None
    return StreamInfo(_int(f["length"]), _word(f["last-generated-id"]), added)


@_shaped
def parse_last_id(reply: Any, command: str = "XREVRANGE") -> str | None:
    """The ID of the one entry of ``XREVRANGE key + - COUNT 1``; None for an empty stream."""
    entries = parse_stream_entries(reply, command)
    return entries[0][0] if entries else None


@_shaped
def parse_producer_cursor(reply: Any) -> tuple[int, str | None]:
    """HGET of a producer's 'cursor|plan' field: (cursor, plan); (0, None) for a new producer."""
    if reply is None:
        return 0, None
    cursor, _, plan = _word(reply).partition("|")
    return int(cursor), plan


@_shaped
def parse_produce(reply: Any, producer: str, plan: str, start: int) -> Produced:
    """produce: what the call did (ProducerConflict, PayloadTooLarge: nothing written)."""
    context = {"producer": producer, "from": start, "plan": plan, "what": "source group"}
    status, r = check(reply, ("ok", "replay", "backlog_full"), context)
    if status == "ok":
        new, stop, backlog = _fields("produce", r, context, _int, _int, _int, ok=("ok",))
        return Produced("ok", stop, new, backlog)
    if status == "replay":
        stop, backlog = _fields("produce", r, context, _int, _int, ok=("replay",))
        return Produced("replay", stop, 0, backlog)
    backlog, _ = _fields("produce", r, context, _int, _int, ok=("backlog_full",))
    return Produced("backlog_full", start, 0, backlog)


_INTEGER = re.compile(r"-?[0-9]+")
#: A filter reason's counter name: filter.lua's tokens, and the tokens earlier builds took as given.
_TOKEN = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
#: The stats reply's fields after 'ok' (stats.lua's Returns).
#: meta fields that are times, not counters.
_NOT_COUNTERS = frozenset({"last_commit_ms"})
_STATS = ("meta", "server_ms", "length", "ready", "buffer", "workers_alive", "workers_silent", "leases", "holds",
          "dlq", "commits", "bufvers", "ledger_lines", "source_ids", "outages", "submitted", "partial_records")


def _version_counts(items: Sequence[Any]) -> tuple[tuple[int, int], ...]:
    """stats.lua's {v, count, ...}: (min version, buffered groups) pairs, oldest first. Strict: the
    script writes only versions in 0..2^21-1 and counts >= 1 (ProtocolError for anything else)."""
    if len(items) % 2:
        raise ProtocolError(f"stats: buffer versions must come in (version, count) pairs, got {len(items)} items")
    pairs = [(_int(items[i]), _int(items[i + 1])) for i in range(0, len(items), 2)]
    if any(not (0 <= v < 2**21 and c >= 1) for v, c in pairs):
        raise ProtocolError(f"stats: bad buffer version counts {pairs[:4]!r}")
    return tuple(pairs)


@_shaped
def parse_stats(reply: Any) -> QueueStats:
    """stats: one consistent snapshot. Lenient on the meta hash (garbage written there by hand is
    skipped or read as 0), strict on the reply's own shape."""
    values = _fields("stats", reply, {}, _items, *([_int] * 10), _items, _int, _int, _int, _int, _int)
    f = dict(zip(_STATS, values))
    meta = {k: s(v) for k, v in pairs(f["meta"]).items()}

    def n(name: str) -> int:  # garbage (not a decimal integer) reads as 0, as the scripts repair it
        raw = meta.get(name, "")
        return int(raw) if _INTEGER.fullmatch(raw) else 0

    published = "version" in meta
    ver = n("version")
    buffered = _version_counts(f["bufvers"])
    stale = [(ver - v, c) for v, c in buffered] if published else []
    stale_groups = sum(c for _, c in stale)
    retained, kept = n("retained"), n("kept")
    evictions = {k: n(f"evicted_{k}") for k in ("stale", "overflow")}
    terminals = {k: n(k) for k in ("failed", "malformed", "aborted", "lost", "expired", "rolled_back")}
    # Only decimal integers count (load_config refuses garbage in the known fields; others are skipped).
    ints = {k: int(v) for k, v in meta.items() if _INTEGER.fullmatch(v)}
    # filter.lua writes bounded tokens (reason_counter); a field of any other shape was written by hand.
    reasons = {k[len("filtered_reason:"):]: v for k, v in ints.items() if k.startswith("filtered_reason:")}
    filtered_by = {k: v for k, v in reasons.items() if _TOKEN.fullmatch(k)}
    counters = {k: v for k, v in ints.items() if not k.startswith("filtered_reason:") and k not in _NOT_COUNTERS}
    last_commit = ints.get("last_commit_ms")
    counters["submitted"] = f["submitted"]  # kept in the intake key (the producer role may only read meta)
    return QueueStats(
        backlog=f["length"] - retained - kept - n("parked"), ready=f["ready"], executing_groups=n("executing_groups"),
        executing_samples=n("executing_samples"), completed=f["buffer"], leased=n("leased"), retained=retained,
        committed=n("committed"), filtered=n("filtered"), dead=n("dead"), version=ver, version_published=published,
        submitted=f["submitted"], kept=kept, workers_alive=f["workers_alive"], workers_silent=f["workers_silent"],
        active_leases=f["leases"], active_holds=f["holds"],
        staleness_max=max(s for s, _ in stale) if stale else None,
        staleness_mean=sum(s * c for s, c in stale) / stale_groups if stale_groups else None,
        buffer_versions=buffered,
        evictions=evictions, terminals=terminals, filtered_by_reason=filtered_by, counters=counters,
        ledger_lines=f["ledger_lines"], source_ids=f["source_ids"], outages=f["outages"],
        partial_records=f["partial_records"], staleness_mode=meta.get("staleness_mode", "")[:16],
        since_commit_ms=None if last_commit is None else max(0, f["server_ms"] - last_commit),
    )


@_shaped
def parse_dead_letters(reply: Any) -> list[DeadLetter]:
    """XRANGE of the dlq stream: each line decoded where possible. The stream's shape is checked;
    its fields are read leniently (a dlq line written by hand must not make the listing fail)."""
    return [_dead_letter(dlq_id, kv) for dlq_id, kv in parse_stream_entries(reply, "XRANGE dlq")]


def _dead_letter(dlq_id: str, kv: Sequence[Any]) -> DeadLetter:
    f = {s(kv[i]): bytes(kv[i + 1]) for i in range(0, len(kv), 2)}
    pristine = {k[2:].encode(): v for k, v in f.items() if k.startswith("f:")}
    try:
        group: SourceGroup | None = decode_reservation_group(pristine)
    except CodecError:
        group = None
    try:
        raw = orjson.loads(f.get("history", b"[]") or b"[]")
    except orjson.JSONDecodeError:
        raw = []
    # The history is stored as {"f": counted failures, "h": [attempts]} or as the bare attempt list.
    attempts = raw.get("h") if isinstance(raw, dict) else raw
    history = tuple(a for a in attempts if isinstance(a, dict)) if isinstance(attempts, list) else ()
    attempt = f.get("attempt", b"0")
    # A dlq line written by hand must not make the listing fail: text is decoded leniently.
    return DeadLetter(dlq_id, f.get("entry_id", b"").decode(errors="replace"),
                      f.get("source_id", b"").decode(errors="replace"), f.get("reason", b"").decode(errors="replace"),
                      int(attempt) if attempt.isdigit() else 0, f.get("worker", b"").decode(errors="replace"),
                      history, group, pristine)


@_shaped
def parse_dlq_requeue(reply: Any, dlq_id: str) -> str:
    """dlq_requeue: the new entry ID (NotFound for no such dead letter)."""
    return _fields("dlq_requeue", reply, {"what": "dead letter", "id": dlq_id}, _word)[0]


# -- worker replies -------------------------------------------------------------------------------


@_shaped
def parse_complete(reply: Any, receipt: Receipt) -> str:
    """complete: 'buffered', 'replay' or 'evicted_self'."""
    return _fields("complete", reply, completion_context(receipt), _word, _word)[0]


@_shaped
def parse_ended(reply: Any, script: str, receipt: Receipt) -> str:
    """fail / abort / filter / reject: where the attempt went ('ready', 'dead', 'filtered', 'replay')."""
    return _fields(script, reply, receipt_context(receipt), _word)[0]


@_shaped
def parse_close_worker(reply: Any, worker_id: str) -> tuple[int, int, bool]:
    """close_worker: (requeued, dead-lettered, done) of one call."""
    return _fields("close_worker", reply, {"worker_id": worker_id}, _int, _int, _flag)


# -- trainer replies ------------------------------------------------------------------------------


@_shaped
def parse_commit(reply: Any, lease_id: str) -> str:
    """commit: the commit's ID in the commits stream."""
    context = {"lease_id": lease_id, "what": f"commit of lease {lease_id}"}
    word, commit_id, _ = _fields("commit", reply, context, _word, _word, _int)
    _one_of("commit", word, ("committed", "replay"))
    return commit_id


@_shaped
def parse_rollback(reply: Any, lease_id: str) -> tuple[int, int, bool]:
    """rollback: (groups handed back by this call, groups it dead-lettered, done)."""
    word, n, dead, done = _fields("rollback", reply, {"lease_id": lease_id}, _word, _int, _int, _flag)
    _one_of("rollback", word, ("rolled_back", "replay"))
    return n, dead, done


@_shaped
def parse_extend(reply: Any, lease_id: str) -> int:
    """extend: the new deadline (server ms)."""
    return _fields("extend", reply, {"lease_id": lease_id}, _int)[0]


@_shaped
def parse_lease_beat(reply: Any, lease_id: str) -> tuple[int, int, int]:
    """lease_beat: (the lease's deadline, when the reaper takes it if no beat follows, in queue ms;
    the stored trainer_silence in ms, 0: off)."""
    return _fields("lease_beat", reply, {"lease_id": lease_id}, _int, _int, _int)


@_shaped
def parse_revoke_lease(reply: Any, lease_id: str) -> tuple[str, int, bool]:
    """revoke_lease: ('rolled_back' or 'replay', groups requeued by this call, done); LeaseLost when
    there is no active lease (state 'unknown': no record)."""
    word, n, done = _fields("revoke_lease", reply, {"lease_id": lease_id}, _word, _int, _flag)
    _one_of("revoke_lease", word, ("rolled_back", "replay"))
    return word, n, done


@_shaped
def parse_hold_open(reply: Any, hold_id: str) -> int:
    """hold_open: how many executing attempts the hold waits for."""
    return _fields("hold_open", reply, {"hold_id": hold_id}, _int, _int)[0]


@_shaped
def parse_hold_poll(reply: Any, hold_id: str) -> tuple[int, str]:
    """hold_poll: (attempts still executing, the wake ID to wait on)."""
    return _fields("hold_poll", reply, {"hold_id": hold_id}, _int, _word)


@_shaped
def parse_hold_release(reply: Any, hold_id: str | bytes) -> int:
    """hold_release: how many holds are still active."""
    return _fields("hold_release", reply, {"hold_id": hold_id}, _int)[0]


@_shaped
def parse_checkpoint(reply: Any, step: int) -> tuple[int, bool]:
    """checkpoint: (payloads dropped by this call, done)."""
    return _fields("checkpoint", reply, {"step": step, "what": f"checkpoint {step}"}, _int, _flag)


@_shaped
def parse_restore(reply: Any, step: int) -> tuple[int, bool]:
    """restore: (groups restored by this call, done)."""
    return _fields("restore", reply, {"step": step, "what": f"restore({step})"}, _int, _flag)


# -- reaper replies -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReapScan:
    """What reap_scan found to do. Names are the raw bytes Redis gave (see ``_name``)."""

    silent: tuple[bytes, ...]
    expired_leases: tuple[bytes, ...]
    expired_holds: tuple[bytes, ...]
    stale: int
    prune_due: bool
    interrupted: bool
    retired: tuple[bytes, ...]


def _names(value: Any) -> tuple[bytes, ...]:
    return tuple(_name(x) for x in _items(value))


@_shaped
def parse_reap_scan(reply: Any) -> ReapScan:
    return ReapScan(*_fields("reap_scan", reply, {}, _names, _names, _names, _int, _flag, _flag, _names))


@_shaped
def parse_sweep_owners(reply: Any) -> tuple[tuple[bytes, ...], bool]:
    """sweep_owners: (orphan consumer names among the entries looked at, wrapped to the PEL's start)."""
    return _fields("sweep_owners", reply, {}, _names, _flag)


@_shaped
def parse_reap_worker(reply: Any, worker_id: Any) -> tuple[int, int, bool] | None:
    """reap_worker: (requeued, dead-lettered, done) of one call; None when the worker is alive."""
    status, _ = check(reply, ("ok", "alive"), {"worker_id": worker_id})
    if status == "alive":
        _fields("reap_worker", reply, {}, _int, ok=("alive",))
        return None
    return _fields("reap_worker", reply, {}, _int, _int, _flag)


@_shaped
def parse_expire_lease(reply: Any, lease_id: Any) -> tuple[int, bool] | None:
    """expire_lease: (groups requeued by this call, done); None when the lease is not due."""
    status, _ = check(reply, ("ok", "not_due"), {"lease_id": lease_id})
    if status == "not_due":
        return None
    word, n, done = _fields("expire_lease", reply, {}, _word, _int, _flag)
    _one_of("expire_lease", word, ("expired",))
    return n, done


@_shaped
def parse_reap_stale(reply: Any) -> tuple[int, bool]:
    """reap_stale: (groups evicted by this call, done)."""
    return _fields("reap_stale", reply, {}, _int, _flag)


@_shaped
def parse_reindex(reply: Any) -> int:
    """reindex: owned entries re-indexed or requeued by this call."""
    return _fields("reindex", reply, {}, _int, _flag)[0]


@_shaped
def parse_settle_parked(reply: Any) -> tuple[int, bool]:
    """settle_parked: (parked entries settled, plus entries a parking consumer held without a record
    and that went back to ready, by this call; done)."""
    settled, requeued, done = _fields("settle_parked", reply, {}, _int, _int, _flag)
    return settled + requeued, done


@_shaped
def parse_prune(reply: Any) -> tuple[int, bool]:
    """prune: (ledger lines deleted by this call, done)."""
    return _fields("prune", reply, {}, _int, _flag)


@_shaped
def parse_finish_interrupted(reply: Any) -> tuple[int, bool]:
    """finish_interrupted: (entries moved by this call, done)."""
    word, _, n, done = _fields("finish_interrupted", reply, {}, _word, _int, _int, _flag)
    _one_of("finish_interrupted", word, ("restore", "checkpoint", "none"))
    return n, done


# -- the PEL --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """One row of the extended XPENDING reply."""

    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int


@_shaped
def parse_pending(reply: Any) -> list[Pending]:
    """The extended XPENDING reply ``[[id, consumer, idle_ms, delivery_count], ...]``."""
    out = []
    for row in _items(reply):
        if not isinstance(row, (list, tuple)) or len(row) != 4:
            raise ProtocolError(f"XPENDING: expected [id, consumer, idle, count], got {row!r}")
        entry_id, consumer, idle, count = row
        try:
            out.append(Pending(_word(entry_id), _word(consumer), _int(idle), _int(count)))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"XPENDING: malformed row {row!r}: {exc}") from exc
    return out


@_shaped
def parse_hscan(reply: Any) -> tuple[str, list[tuple[str, Any]]]:
    """HSCAN's ``[cursor, [field, value, ...]]``: (the next cursor, "0" when done; the field names as
    text with their raw values). A value is left raw: the caller's own lenient parser reads it."""
    if not isinstance(reply, (list, tuple)) or len(reply) != 2 or not isinstance(reply[1], (list, tuple)) \
            or len(reply[1]) % 2:
        raise ProtocolError(f"HSCAN: expected [cursor, [field, value, ...]], got {reply!r}")
    flat = reply[1]
    return _word(reply[0]), [(_word(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]


def parse_owned(reply: Sequence[Any], worker_id: str) -> list[OwnedAttempt]:
    """One page of the extended XPENDING reply filtered to ``worker_id`` (core/owned.py). Raises
    ProtocolError for a row of another shape or another consumer (the filter was not applied)."""
    out = []
    for row in parse_pending(reply):
        if row.consumer != worker_id:
            raise ProtocolError(f"XPENDING filtered to {worker_id!r} listed an entry of {row.consumer!r}")
        try:
            receipt = Receipt(row.entry_id, row.deliveries, worker_id)
            # A server wall clock stepped back can make idle negative: read it as "just delivered",
            # the reading that can never make a fresh grant look orphaned.
            out.append(OwnedAttempt(receipt, max(0, row.idle_ms)))
        except (InvalidInput, ValueError, TypeError) as exc:
            raise ProtocolError(f"XPENDING: malformed row {row!r}: {exc}") from exc
    return out


# -- operator actions -----------------------------------------------------------------------------


@_shaped
def parse_requeue(reply: Any, receipt: Receipt) -> tuple[str, str, int]:
    """requeue: ('ok', where the attempt went, 0) or ('alive', '', the worker's last heartbeat ms)."""
    status, _ = check(reply, ("ok", "alive"), receipt_context(receipt))
    if status == "alive":
        return "alive", "", _fields("requeue", reply, {}, _int, ok=("alive",))[0]
    return "ok", _fields("requeue", reply, {}, _word)[0], 0


@_shaped
def parse_config_set(reply: Any, queue: str) -> tuple[int, tuple[str, str, str] | None]:
    """config_set: (fields changed, None), or (0, (field, stored now, expected)) when the stored
    config changed since it was read (nothing written)."""
    status, _ = check(reply, ("ok", "config_changed"), {"queue": queue})
    if status == "config_changed":
        return 0, _fields("config_set", reply, {}, _word, _word, _word, ok=("config_changed",))
    return _fields("config_set", reply, {}, _int)[0], None


def parse_derive_admission(reply: Any, queue: str) -> tuple[int, bool]:
    """derive_admission: (batch_groups stored now: -1 unset, 0 off, n; whether this call set it)."""
    stored, changed = _fields("derive_admission", reply, {"queue": queue}, _int, _flag)
    return stored, changed


@_shaped
def parse_drain_start(reply: Any) -> tuple[int, int]:
    """drain start: (deadline_ms, executing groups now)."""
    word, deadline, executing = _fields("drain", reply, {}, _word, _int, _int)
    _one_of("drain", word, ("draining",))
    return deadline, executing


@_shaped
def parse_drain_stop(reply: Any) -> int:
    """drain stop: how many other holds still stand."""
    word, left = _fields("drain", reply, {}, _word, _int)
    _one_of("drain", word, ("stopped",))
    return left


@_shaped
def parse_dlq_purge(reply: Any) -> tuple[int, bool]:
    """dlq_purge: (dead letters deleted by this call, done)."""
    return _fields("dlq_purge", reply, {}, _int, _flag)


# -- plain reads of single values ---------------------------------------------------------------------


@_shaped
def parse_text(reply: Any, command: str) -> str | None:
    """A GET / HGET of text: None when absent (bytes that are not UTF-8 are replaced)."""
    if reply is None:
        return None
    if not isinstance(reply, (bytes, str)):
        raise ProtocolError(f"{command}: expected text, got {reply!r}")
    return s(reply)


@_shaped
def parse_score(reply: Any, command: str) -> float | None:
    """A ZSCORE: None when the member is absent."""
    if reply is None:
        return None
    try:
        return float(_word(reply) if isinstance(reply, (bytes, str)) else reply)
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"{command}: expected a score, got {reply!r}") from exc


@_shaped
def parse_partition_record(reply: Any, name: str, key: str) -> int | None:
    """GET of a logical queue's partition record: its count, None when there is none (a plain queue,
    or none at all); ProtocolError for a value that is no count >= 1 (written by hand)."""
    if reply is None:
        return None
    shown = s(reply)
    try:
        value = float(shown.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or abs(value) > 2**53 or int(value) < 1:
        raise ProtocolError(f"queue {name!r}: the partition record {key} holds {shown[:80]!r}, not a partition "
                            "count (written by hand?)")
    return int(value)
