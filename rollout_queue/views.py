"""Operator views: read-only flows over one queue, and QueueView, a handle that only reads.

Rule 1: a view flow yields only ``Command`` ops of read commands (and the read-only ``stats``
script); it never changes a key, so it runs under the read-only ``operator`` ACL role and can never
create a queue by mistake (RolloutQueue's ``open`` would). Views read several keys in several round
trips: a transition landing between two reads can show a mix of before and after; run the view again
(the PEL owner, read first, is the truth of who holds an entry).
Rule 2: nothing here changes state. The operator's own transitions (requeue, config set, drain, dlq
purge) are scripts driven by actions.py. Value types live in view_models.py; the CLI (cli/) and the
exporter (metrics.py) only format them.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import orjson
import redis

from . import flows
from . import protocol as p
from .client import redis_options
from .codec import CodecError
from .config import QueueConfig
from .errors import NotFound
from .flows import Flow, T
from .keys import QueueKeys
from .models import DeadLetter, QueueStats, SourceGroup, check_entry_id
from .transport import RetryPolicy, SyncTransport
from .view_models import (
    DRAIN_HOLD,
    Attempt,
    DrainStatus,
    EntryView,
    LeaseView,
    PelSummary,
    Snapshot,
    WorkerView,
    entry_state,
    stream_id,
)

Clock = Callable[[], float]
#: Most PEL entries a summary reads (XPENDING pages of PAGE): bounded work on a huge queue.
PEL_LIMIT = 10_000
PAGE = 1000
#: How far back `inspect` looks for an entry's dead letter.
DLQ_SCAN = 1000


def text(value: Any) -> str:
    """A raw reply element as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _flat(kv: Sequence[Any] | Mapping[Any, Any]) -> dict[str, Any]:
    """A field/value reply by name: a RESP3 map, or a RESP2 flat [name, value, ...] list."""
    if isinstance(kv, Mapping):
        return {text(k): v for k, v in kv.items()}
    return {text(kv[i]): kv[i + 1] for i in range(0, len(kv), 2)}


def _scored(reply: Sequence[Any]) -> list[tuple[str, float]]:
    """A WITHSCORES reply: RESP3 [[member, score], ...] or RESP2 [member, score, ...]."""
    if reply and isinstance(reply[0], (list, tuple)):
        return [(text(m), float(sc)) for m, sc in reply]
    return [(text(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


# -- small reads ---------------------------------------------------------------------------------


def server_ms(keys: QueueKeys) -> Flow[int]:
    """The queue clock (lua/include/now_ms.lua): the server's TIME minus the time it was down, the
    clock every score and deadline of the queue is written in. Garbage in the offset counts as 0."""
    reply = yield p.Command(("TIME",))
    offset = yield p.Command(("HGET", keys["clock"], "offset"))
    raw = int(reply[0]) * 1000 + int(reply[1]) // 1000
    try:
        return raw - int(offset or 0)
    except ValueError:
        return raw


def require_queue(keys: QueueKeys) -> Flow[None]:
    """NotFound unless the queue exists (its meta hash names a library)."""
    if not (yield p.Command(("HEXISTS", keys["meta"], "library"))):
        raise NotFound(f"queue {keys.queue!r} does not exist on this server (no {keys['meta']}); check --queue")


def meta(keys: QueueKeys) -> Flow[dict[str, str]]:
    reply = yield p.Command(("HGETALL", keys["meta"]))
    return {k: text(v) for k, v in _flat(reply).items()}


def config(keys: QueueKeys) -> Flow[QueueConfig]:
    """The queue's stored config (what every script enforces)."""
    yield from require_queue(keys)
    return QueueConfig.from_meta((yield from meta(keys)))


def stats(keys: QueueKeys) -> Flow[QueueStats]:
    yield from require_queue(keys)
    return (yield from flows.stats(keys))


# -- the PEL --------------------------------------------------------------------------------------


def pel_summary(keys: QueueKeys, limit: int = PEL_LIMIT) -> Flow[PelSummary]:
    """Entries by attempt number (delivery count) and by state over the PEL, read in pages; the ages
    of executing attempts (ms since their delivery). At most ``limit`` entries (``truncated``)."""
    attempts: dict[int, int] = {}
    states: dict[str, int] = {}
    ages: list[int] = []
    start, seen = "-", 0
    while seen < limit:
        want = min(PAGE, limit - seen)
        page = yield p.Command(("XPENDING", keys["src"], "rollout", start, "+", want))
        for _, owner, idle, count in page:
            state = entry_state(text(owner))
            attempts[int(count)] = attempts.get(int(count), 0) + 1
            states[state] = states.get(state, 0) + 1
            if state == "executing":
                ages.append(int(idle))
        seen += len(page)
        if len(page) < want:
            return PelSummary(attempts, states, tuple(ages), seen, False)
        start = "(" + text(page[-1][0])
    return PelSummary(attempts, states, tuple(ages), seen, True)


def buffer_staleness(keys: QueueKeys) -> Flow[tuple[int, ...]]:
    """Staleness of each buffered group (policy version - its oldest sample version); () before the
    first published version, when staleness is unknown (DESIGN: Buffer and staleness)."""
    version = yield p.Command(("HGET", keys["meta"], "version"))
    if version is None:
        return ()
    scores = _scored((yield p.Command(("ZRANGE", keys["bufver"], 0, -1, "WITHSCORES"))))
    # bufver scores pack min_version * 2^32 + arrival (lua/include/buffer_score.lua).
    return tuple(max(0, int(version) - int(score) // 2**32) for _, score in scores)


def snapshot(keys: QueueKeys) -> Flow[Snapshot]:
    """Everything `stats`, `top` and the exporter show."""
    st = yield from stats(keys)
    pel = yield from pel_summary(keys)
    ws = yield from workers(keys)
    ls = yield from leases(keys)
    drain = yield from drain_status(keys)
    return Snapshot(st, pel, tuple(ws), tuple(ls), drain, (yield from buffer_staleness(keys)))


def workers(keys: QueueKeys) -> Flow[list[WorkerView]]:
    """Registered workers with their last heartbeat, plus PEL consumers nobody registered (orphans)."""
    cfg = yield from config(keys)
    now = yield from server_ms(keys)
    beats = _scored((yield p.Command(("ZRANGE", keys["workers"], 0, -1, "WITHSCORES"))))
    consumers = yield p.Command(("XINFO", "CONSUMERS", keys["src"], "rollout"))
    held = {text(c["name"]): (int(c["pending"]), int(c["idle"])) for c in map(_flat, consumers)}
    timeout_ms = int(cfg.worker_timeout_s * 1000)
    out = []
    for wid, score in beats:
        seen = int(score)
        pending, idle = held.pop(wid, (0, None))
        out.append(WorkerView(wid, seen, now - seen, now - seen <= timeout_ms, pending, idle))
    for name, (pending, idle) in held.items():
        if not name.startswith("@") and pending:
            out.append(WorkerView(name, None, None, False, pending, idle))
    return out


def leases(keys: QueueKeys, limit: int = 1000) -> Flow[list[LeaseView]]:
    """Active leases by deadline (never their fencing tokens)."""
    yield from require_queue(keys)
    now = yield from server_ms(keys)
    ids = _scored((yield p.Command(("ZRANGE", keys["leases"], 0, limit - 1, "WITHSCORES"))))
    out = []
    for lease_id, score in ids:
        deadline = int(score)
        f = yield p.Command(("HMGET", keys.lease(lease_id), "trainer", "created_ms", "members", "version", "state"))
        trainer, created, members, version, state = (None if v is None else text(v) for v in f)
        groups = len(members.split(",")) if members else 0
        out.append(LeaseView(lease_id, trainer or "", deadline, deadline - now, groups, int(version or 0),
                             int(created or 0), state or "unknown"))
    return out


def drain_status(keys: QueueKeys) -> Flow[DrainStatus]:
    m = yield from meta(keys)
    if "library" not in m:
        yield from require_queue(keys)
    now = yield from server_ms(keys)
    deadline = yield p.Command(("ZSCORE", keys["holds"], DRAIN_HOLD))
    others = yield p.Command(("ZCOUNT", keys["holds"], f"({now}", "+inf"))
    active = deadline is not None and float(deadline) > now
    others = int(others) - (1 if active else 0)
    return DrainStatus(active, int(float(deadline)) if deadline is not None else None, m.get("drain_reason", ""),
                       int(m["drain_since_ms"]) if "drain_since_ms" in m else None,
                       int(m.get("executing_groups", 0) or 0), others, now)


# -- one entry ------------------------------------------------------------------------------------


def dead_letters(keys: QueueKeys, count: int = 100, start: str = "-") -> Flow[list[DeadLetter]]:
    """The oldest ``count`` dead letters from ``start`` (a dlq stream ID)."""
    yield from require_queue(keys)
    return (yield from flows.dead_letters(keys, count, start))


def dead_letter(keys: QueueKeys, dlq_id: str) -> Flow[DeadLetter]:
    """One dead letter by its dlq stream ID. Raises NotFound."""
    found = yield from flows.dead_letters(keys, 1, dlq_id)
    if not found or found[0].dlq_id != dlq_id:
        raise NotFound(f"dead letter {dlq_id} not found in {keys['dlq']} (see `rollout-queue dlq list`)")
    return found[0]


def _find_dead_letter(keys: QueueKeys, entry_id: str) -> Flow[DeadLetter | None]:
    """The newest dead letter of ``entry_id`` among the last DLQ_SCAN ones."""
    reply = yield p.Command(("XREVRANGE", keys["dlq"], "+", "-", "COUNT", DLQ_SCAN))
    for dlq_id, kv in reply:
        if text(_flat(kv).get("entry_id", b"")) == entry_id:
            return (yield from dead_letter(keys, text(dlq_id)))
    return None


def decode_fields(fields: Mapping[bytes, bytes]) -> SourceGroup | None:
    """The pristine group of raw stream fields, or None when they do not decode."""
    try:
        return p.decode_reservation_group(fields)
    except CodecError:
        return None


def _history(raw: Any) -> tuple[int, tuple[Attempt, ...]]:
    try:
        h = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return 0, ()
    # Stored as {"f": counted failures, "h": [attempts]} (lua/include/history.lua).
    items = h.get("h") or [] if isinstance(h, dict) else h if isinstance(h, list) else []
    failures = int(h.get("f") or 0) if isinstance(h, dict) else 0
    return failures, tuple(Attempt(int(a.get("a") or 0), str(a.get("w", "")), str(a.get("t", "")), str(a.get("r", "")),
                                   int(a.get("ms") or 0)) for a in items if isinstance(a, dict))


def _last_delivered(keys: QueueKeys) -> Flow[str]:
    groups = yield p.Command(("XINFO", "GROUPS", keys["src"]))
    for g in map(_flat, groups):
        if text(g["name"]) == "rollout":
            return text(g["last-delivered-id"])
    return "0-0"


def entry(keys: QueueKeys, entry_id: str) -> Flow[EntryView]:
    """Everything the queue knows about one entry: its state, owner, attempts, versions, pristine group.
    Raises NotFound when the queue has never seen it."""
    check_entry_id(entry_id)
    cfg = yield from config(keys)
    pel = yield p.Command(("XPENDING", keys["src"], "rollout", entry_id, entry_id, 1))
    owner, idle, count = (text(pel[0][1]), int(pel[0][2]), int(pel[0][3])) if pel else (None, None, 0)
    src = yield p.Command(("XRANGE", keys["src"], entry_id, entry_id))
    raw_ledger = yield p.Command(("HGET", keys["ledger"], entry_id))
    ledger = None if raw_ledger is None else text(raw_ledger)
    failures, history = _history((yield p.Command(("HGET", keys["history"], entry_id))))
    kv = src[0][1] if src else []
    fields = {bytes(kv[i]): bytes(kv[i + 1]) for i in range(0, len(kv), 2)}
    state = entry_state(owner) if owner else (yield from _unowned_state(keys, entry_id, bool(src), ledger))
    more = yield from _details(keys, entry_id, state, owner or "", int(cfg.worker_timeout_s * 1000))
    group = (decode_fields(fields) if fields else None) or more.pop("group", None)
    return EntryView(
        entry_id=entry_id, state=state, owner=owner, attempt=count or _ledger_attempt(ledger), idle_ms=idle,
        counted_failures=failures, history=history, ledger=ledger, server_ms=(yield from server_ms(keys)),
        version=int((yield from meta(keys)).get("version", 0) or 0),
        source_id=group.source_id if group else (fields.get(b"sid", b"").decode(errors="replace") or None),
        n=group.n if group else None, group=group, **{k: v for k, v in more.items() if k != "group"})


def _details(keys: QueueKeys, entry_id: str, state: str, owner: str, timeout_ms: int) -> Flow[dict[str, Any]]:
    """What only one state has: the worker's heartbeat, the buffered version, the lease, the dead letter."""
    if state == "executing":
        seen = yield p.Command(("ZSCORE", keys["workers"], owner))
        beat = None if seen is None else int(float(seen))
        now = yield from server_ms(keys)
        return {"worker_id": owner, "worker_heartbeat_ms": beat,
                "worker_alive": beat is not None and now - beat <= timeout_ms}
    if state == "completed":
        score = yield p.Command(("ZSCORE", keys["bufver"], entry_id))
        size = yield p.Command(("HSTRLEN", keys["results"], entry_id))
        return {"min_version": None if score is None else int(float(score)) // 2**32, "completion_bytes": int(size)}
    if state == "leased":
        lease_id = owner[len("@lease:"):]
        f = yield p.Command(("HMGET", keys.lease(lease_id), "trainer", "deadline", "members", "versions"))
        return {"lease_id": lease_id, "lease_trainer": text(f[0] or b""), "lease_deadline_ms": int(f[1] or 0),
                "min_version": _lease_version(entry_id, f[2], f[3])}
    if state == "dead":
        letter = yield from _find_dead_letter(keys, entry_id)
        if letter is not None:
            return {"dlq_id": letter.dlq_id, "dead_reason": letter.reason, "group": letter.group}
    return {}


def _unowned_state(keys: QueueKeys, entry_id: str, in_stream: bool, ledger: str | None) -> Flow[str]:
    """The state of an entry nobody owns: settled (the ledger says how) or still in the backlog."""
    if ledger and ledger.startswith("s|"):
        return ledger.split("|")[1]
    if in_stream and stream_id(entry_id) > stream_id((yield from _last_delivered(keys))):
        return "backlog"
    raise NotFound(f"entry {entry_id} is not in queue {keys.queue!r} (never submitted, or settled and its ledger "
                   "line pruned after settled_retention_s)")


def _ledger_attempt(ledger: str | None) -> int:
    parts = (ledger or "").split("|")
    index = 1 if parts[0] == "a" else 2
    return int(parts[index]) if len(parts) > index and parts[index].isdigit() else 0


def _lease_version(entry_id: str, members: Any, versions: Any) -> int | None:
    ids, vs = text(members or b"").split(","), text(versions or b"").split(",")
    return int(vs[ids.index(entry_id)]) if entry_id in ids and ids.index(entry_id) < len(vs) else None


def memory(keys: QueueKeys, limit: int = 10_000) -> Flow[dict[str, int]]:
    """Bytes each of the queue's keys takes (MEMORY USAGE), found with SCAN; at most ``limit`` keys."""
    cursor, sizes = b"0", {}
    while True:
        cursor, found = yield p.Command(("SCAN", cursor, "MATCH", keys.pattern, "COUNT", 1000))
        for key in found:
            if len(sizes) >= limit:
                return sizes
            sizes[text(key)] = int((yield p.Command(("MEMORY", "USAGE", key))) or 0)
        if text(cursor) == "0":
            return sizes


# -- a read-only handle ----------------------------------------------------------------------------


def drive(transport: SyncTransport, flow: Flow[T]) -> T:
    """Drive a flow over a sync transport (RolloutQueue.run's loop, for a handle that never opens)."""
    reply: Any = None
    while True:
        try:
            op = flow.send(reply)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply = transport.execute(op)


class QueueView:
    """A read-only handle on one queue. Unlike RolloutQueue it never runs ``open``, so it cannot create
    a queue (a mistyped --queue is NotFound) and works under the read-only operator ACL role."""

    def __init__(self, client: redis.Redis, name: str, retry: RetryPolicy | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.name, self.keys, self.client, self.clock = name, QueueKeys(name), client, clock
        self.transport = SyncTransport(client, retry, clock=clock)

    @classmethod
    def from_url(cls, url: str, name: str, retry: RetryPolicy | None = None, **redis_kwargs: Any) -> "QueueView":
        return cls(redis.Redis.from_url(url, **redis_options(redis_kwargs)), name, retry)

    def run(self, flow: Flow[T]) -> T:
        return drive(self.transport, flow)

    def close(self) -> None:
        self.client.close()
