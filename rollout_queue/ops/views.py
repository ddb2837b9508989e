"""Operator views: read-only flows over one queue, and QueueView, a handle that only reads.

Rule 1: a view flow yields only ``Command`` ops of read commands (and the read-only ``stats``
script); it never changes a key, so it runs under the read-only ``operator`` ACL role and can never
create a queue by mistake (RolloutQueue's ``open`` would). Views read several keys in several round
trips: a transition landing between two reads can show a mix of before and after; run the view again
(the PEL owner, read first, is the truth of who holds an entry).
Rule 3: lenient on values, strict on shapes. What a command answers has the server's shape and is
read by the parsers of core/protocol.py (ProtocolError otherwise); what was stored, and may have been
written into Redis by hand (a score of 1e308, a history that is not JSON, a ledger line no script
wrote), is read leniently here: it becomes None or 0 and a note in the view (``Garbage``), never an
error, so an operator can always look at a damaged queue.
Rule 2: nothing here changes state. The operator's own transitions (requeue, config set, drain, dlq
purge) are scripts driven by actions.py. Value types live in view_models.py; the CLI (cli/) and the
exporter (metrics.py) only format them.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, Sequence

import orjson
import redis

from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.drivers.cluster import redis_options
from rollout_queue.core.codec import CodecError
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import ConfigMismatch, InvalidInput, NotFound, ProtocolError, QueueNotFound
from rollout_queue.core.flows import Flow, T
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS, bucket_count
from rollout_queue.core.keys import KEY_SUFFIXES, QueueKeys
from rollout_queue.core.models import DeadLetter, QueueStats, SourceGroup, check_entry_id
from rollout_queue.core.policy import Durability, RetryPolicy
from rollout_queue.drivers.transport import SyncClient, SyncDriver
from rollout_queue.scale.layout import Layout
from rollout_queue.ops.view_models import (
    DRAIN_HOLD,
    STATES,
    STEP_SAMPLE,
    Attempt,
    AtRiskView,
    AttemptView,
    DeadLetterView,
    DrainStatus,
    EntryView,
    HoldView,
    PushView,
    LeaseView,
    PelSummary,
    ReapedView,
    Snapshot,
    WorkerProgress,
    WorkerView,
    entry_state,
    step_ms,
    stream_id,
)

Clock = Callable[[], float]
#: Most PEL entries a summary reads (XPENDING pages of PAGE): bounded work on a huge queue.
PEL_LIMIT = 10_000
#: Registered workers read per command by the workers view.
WORKERS_PAGE = 256
PAGE = 1000
#: How far back `inspect` looks for an entry's dead letter.
DLQ_SCAN = 1000
#: Terminals that count toward max_attempts (DESIGN rule 4).
COUNTED_TERMINALS = ("failed", "malformed", "lost")


def text(value: Any) -> str:
    """A raw reply element as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


#: Field/value replies (RESP2 or RESP3) and WITHSCORES replies, read by the protocol's shape helpers.
_flat = p.field_map
_scored = p.scored


#: Largest magnitude a stored ms time, count or version may have: a Lua number is exact up to 2^53.
MAX_STORED = 2**53


def number(raw: Any) -> int | None:
    """A stored number (reply bytes, text, int or a score) as an int, or None when it is absent, not
    a number, not finite, or beyond 2^53 (a score of 1e308 is no time any transition wrote)."""
    if raw is None or isinstance(raw, bool):
        return None
    try:
        value = float(text(raw).strip()) if isinstance(raw, (bytes, str)) else float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(value) if math.isfinite(value) and abs(value) <= MAX_STORED else None


class Garbage:
    """The stored values one view could not read: each becomes None and a note, never an error."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def number(self, name: str, raw: Any) -> int | None:
        """number(raw); an unreadable value (absent is fine: None) adds a note naming it."""
        value = number(raw)
        if value is None and raw is not None:
            self.note(name, raw)
        return value

    def note(self, name: str, raw: Any) -> None:
        shown = text(raw)
        self.notes.append(f"{name}={shown[:80] + ('...' if len(shown) > 80 else '')!r}")


# -- small reads ---------------------------------------------------------------------------------


def server_ms(keys: QueueKeys) -> Flow[int]:
    """The queue clock (lua/include/now_ms.lua): the server's TIME minus the time it was down, the
    clock every score and deadline of the queue is written in. Garbage in the offset counts as 0."""
    raw = yield from server_time(keys)
    offset = yield p.Command(("HGET", keys["clock"], "offset"))
    try:
        return raw - p.parse_count(offset, "HGET clock offset")
    except ProtocolError:
        return raw


def server_time(keys: QueueKeys) -> Flow[int]:
    """The server's own TIME in ms, on the queue's node: the clock stream IDs are written in (not the
    queue clock, which leaves out downtime)."""
    return p.parse_time((yield p.Command(("TIME",), route=keys["clock"])))


def partition_count(name: str) -> Flow[int | None]:
    """The partition count recorded for logical queue ``name`` (GET of QueueKeys(name).partitions),
    None for a queue never opened as partitioned (a plain queue, or none at all)."""
    key = QueueKeys(name).partitions
    return p.parse_partition_record((yield p.Command(("GET", key))), name, key)


def resolve_partitions(name: str, given: int | None) -> Flow[int]:
    """The partition count to read ``name`` with: the recorded one when ``given`` is None (so an
    operator need not know it), else ``given`` checked against the record. Raises QueueNotFound
    for ``given`` > 1 on a name with neither a record nor a plain queue, ConfigMismatch when the
    record (or a plain queue of that name) says otherwise. Reads only (GET, HEXISTS)."""
    recorded = yield from partition_count(name)
    if given is None or given == (recorded or 1):
        return recorded or 1
    if recorded is None:
        if (yield p.Command(("HEXISTS", QueueKeys(name)["meta"], "library"))):
            raise ConfigMismatch(name, "partitions", "1", str(given))
        raise QueueNotFound(name)
    raise ConfigMismatch(name, "partitions", str(recorded), str(given))


def require_queue(keys: QueueKeys) -> Flow[None]:
    """NotFound unless the queue exists (its meta hash names a library)."""
    if not (yield p.Command(("HEXISTS", keys["meta"], "library"))):
        raise NotFound(f"queue {keys.queue!r} does not exist on this server (no {keys['meta']}); check --queue")


def meta(keys: QueueKeys) -> Flow[dict[str, str]]:
    """The meta hash: config, library, policy version, drain and checkpoint state (no counters)."""
    reply = yield p.Command(("HGETALL", keys["meta"]))
    return {k: text(v) for k, v in _flat(reply).items()}


def counters(keys: QueueKeys) -> Flow[dict[str, str]]:
    """The counters hash (kept apart from meta since data layout 4: the worker role writes them)."""
    reply = yield p.Command(("HGETALL", keys["counters"]))
    return {k: text(v) for k, v in _flat(reply).items()}


def config(keys: QueueKeys) -> Flow[QueueConfig]:
    """The queue's stored config (what every script enforces)."""
    yield from require_queue(keys)
    return QueueConfig.from_meta((yield from meta(keys)))


def stored_config(keys: QueueKeys) -> Flow[tuple[dict[str, Any], dict[str, str]]]:
    """The stored config leniently: (each field that decodes, each that does not -> its raw text),
    so `config show` can show a corrupt config instead of failing on it."""
    yield from require_queue(keys)
    return QueueConfig.stored_fields((yield from meta(keys)))


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
    oldest: dict[str, int] = {}
    by_worker: dict[str, int] = {}
    held: dict[str, int] = {}
    newest: dict[str, int] = {}
    start, seen = "-", 0
    while seen < limit:
        want = min(PAGE, limit - seen)
        page = p.parse_pending((yield p.Command(("XPENDING", keys["src"], "rollout", start, "+", want))))
        for row in page:
            state = entry_state(row.consumer)
            attempts[row.deliveries] = attempts.get(row.deliveries, 0) + 1
            states[state] = states.get(state, 0) + 1
            oldest[state] = max(oldest.get(state, 0), row.idle_ms)
            held[row.consumer] = held.get(row.consumer, 0) + 1
            newest[row.consumer] = min(newest.get(row.consumer, row.idle_ms), row.idle_ms)
            if state == "executing":
                ages.append(row.idle_ms)
                by_worker[row.consumer] = max(by_worker.get(row.consumer, 0), row.idle_ms)
        seen += len(page)
        if len(page) < want:
            return PelSummary(attempts, states, tuple(ages), seen, False, oldest, by_worker, held, newest)
        start = "(" + page[-1].entry_id
    return PelSummary(attempts, states, tuple(ages), seen, True, oldest, by_worker, held, newest)


def backlog_oldest(keys: QueueKeys) -> Flow[int | None]:
    """ms since the oldest backlog entry (the first after the group's last-delivered-id) was
    submitted, by the server's clock (a stream ID is the server's time at XADD); None: no backlog."""
    after = yield from last_delivered(keys)
    first = p.parse_stream_entries((yield p.Command(("XRANGE", keys["src"], "(" + after, "+", "COUNT", 1))))
    if not first:
        return None
    return max(0, (yield from server_time(keys)) - stream_id(first[0][0])[0])


def stragglers(keys: QueueKeys, count: int = 20, limit: int = PEL_LIMIT) -> Flow[tuple[list[AttemptView], bool]]:
    """The ``count`` oldest executing attempts (the stragglers), oldest first, and whether the PEL held
    more than ``limit`` entries (then only the first ``limit`` were looked at). Ready, completed and
    leased entries of the PEL (owners @ready, @done, @lease:...) are not attempts and never listed."""
    yield from require_queue(keys)
    found: list[AttemptView] = []
    start, seen = "-", 0
    while seen < limit:
        want = min(PAGE, limit - seen)
        page = p.parse_pending((yield p.Command(("XPENDING", keys["src"], "rollout", start, "+", want))))
        found += [AttemptView(row.entry_id, row.consumer, row.idle_ms, row.deliveries) for row in page
                  if entry_state(row.consumer) == "executing"]
        found = sorted(found, key=lambda a: -a.age_ms)[:count]
        seen += len(page)
        if len(page) < want:
            return found, False
        start = "(" + page[-1].entry_id
    return found, True


def at_risk(keys: QueueKeys, within: int = 1, limit: int = PEL_LIMIT) -> Flow[tuple[list[AtRiskView], bool]]:
    """Entries not yet settled that at most ``within`` more counted failures send to the dead-letter
    queue, fewest left first; and whether the history held more than ``limit`` entries (then only
    those read were looked at). Reads the attempt histories in HSCAN pages and the ledger of the
    candidates (a settled entry's history is kept until it is pruned: it is never at risk)."""
    cfg = yield from config(keys)
    found: list[AtRiskView] = []
    cursor, seen = "0", 0
    while True:
        cursor, pairs = p.parse_hscan((yield p.Command(("HSCAN", keys["history"], cursor, "COUNT", PAGE))))
        seen += len(pairs)
        candidates = []
        for entry_id, raw in pairs:
            failures, history = attempt_history(raw)
            if cfg.max_attempts - failures <= within:
                last = history[-1] if history else None
                candidates.append(AtRiskView(entry_id, failures, max(0, cfg.max_attempts - failures),
                                             last.terminal if last else "", last.reason if last else ""))
        if candidates:
            lines = yield p.Command(("HMGET", keys["ledger"], *(c.entry_id for c in candidates)))
            found += [c for c, line in zip(candidates, lines) if line is not None and not text(line).startswith("s|")]
        if cursor == "0" or seen >= limit:
            return sorted(found, key=lambda c: (c.left, c.entry_id)), cursor != "0"


def buffer_staleness(st: QueueStats) -> tuple[tuple[int, int], ...]:
    """The buffer by staleness: (policy version - oldest sample version, groups) pairs, freshest
    first, from the stats script's bounded per-version counts; () before the first published
    version, when staleness is unknown (DESIGN: Buffer and staleness)."""
    if not st.version_published:
        return ()
    return tuple(sorted((max(0, st.version - v), n) for v, n in st.buffer_versions))


def snapshot(keys: QueueKeys) -> Flow[Snapshot]:
    """Everything `stats`, `top` and the exporter show."""
    st = yield from stats(keys)
    pel = yield from pel_summary(keys)
    ws = yield from workers(keys, pel)
    ls = yield from leases(keys)
    drain = yield from drain_status(keys)
    return Snapshot(st, pel, tuple(ws), tuple(ls), drain, buffer_staleness(st),
                    backlog_oldest_ms=(yield from backlog_oldest(keys)), holds=tuple((yield from holds(keys))),
                    push=(yield from push_round(keys)), step_ms=(yield from recent_step_ms(keys)))


def recent_step_ms(keys: QueueKeys) -> Flow[int | None]:
    """The run's step time from its last STEP_SAMPLE + 1 commits (view_models.step_ms): the commits
    stream's IDs are when each commit happened (server ms). None with too few commits."""
    reply = yield p.Command(("XREVRANGE", keys["commits"], "+", "-", "COUNT", STEP_SAMPLE + 1))
    times = [number(entry_id.partition("-")[0]) for entry_id, _ in p.parse_stream_entries(reply, "XREVRANGE")]
    return step_ms([t for t in times if t is not None])


def push_round(keys: QueueKeys) -> Flow[PushView | None]:
    """The last round of a weights push (weights/push.py), or None when this queue never had one."""
    raw = _flat((yield p.Command(("HGETALL", keys["push"]))))
    if not raw:
        return None
    now = yield from server_ms(keys)
    bad = Garbage()
    opened = bad.number("push opened_ms", raw.get("opened_ms"))
    return PushView(bad.number("push epoch", raw.get("epoch")) or 0, bad.number("push version", raw.get("version")),
                    text(raw.get("state", "")), bad.number("push world", raw.get("world")),
                    bad.number("push acked", raw.get("acked")), bad.number("push dropped", raw.get("dropped")),
                    None if opened is None else now - opened, tuple(bad.notes))


def workers(keys: QueueKeys, pel: PelSummary | None = None) -> Flow[list[WorkerView]]:
    """Registered workers with their last heartbeat, the age of their oldest executing attempt and
    their last reported progress, plus PEL consumers nobody registered (orphans). ``pel``: a summary
    already read (the snapshot's), else one is read here; what each worker holds is counted from it
    (exact unless it was truncated). Every command reads at most WORKERS_PAGE members, so the view
    never holds Redis for longer as the fleet grows (XINFO CONSUMERS, which lists every consumer in
    one reply, is not used: issue 17)."""
    cfg = yield from config(keys)
    now = yield from server_ms(keys)
    pel = pel or (yield from pel_summary(keys))
    held = dict(pel.pending_by_owner)
    timeout_ms = int(cfg.worker_timeout_s * 1000)
    out = []
    start = 0
    while True:
        beats = _scored((yield p.Command(("ZRANGE", keys["workers"], start, start + WORKERS_PAGE - 1, "WITHSCORES"))))
        lines = (yield p.Command(("HMGET", keys["progress"], *(w for w, _ in beats)))) if beats else []
        for (wid, score), line in zip(beats, lines):
            bad = Garbage()
            seen = bad.number("heartbeat score", score)
            silent = None if seen is None else now - seen
            progress = _progress(line, bad)
            out.append(WorkerView(wid, seen, silent, silent is not None and silent <= timeout_ms, held.pop(wid, 0),
                                  pel.newest_by_owner.get(wid), tuple(bad.notes),
                                  oldest_attempt_ms=pel.oldest_by_worker.get(wid), progress=progress))
        if len(beats) < WORKERS_PAGE:
            break
        start += WORKERS_PAGE
    for name, pending in held.items():
        if not name.startswith("@") and pending:
            out.append(WorkerView(name, None, None, False, pending, pel.newest_by_owner.get(name),
                                  oldest_attempt_ms=pel.oldest_by_worker.get(name)))
    return out


def _progress(raw: Any, bad: Garbage) -> WorkerProgress | None:
    """A ``progress`` line (heartbeat.lua), or None: ``groups|tokens|uptime_ms|reported_ms``, then
    (from workers that count their samples) ``|sample_tokens|sample_seconds``, each comma-joined
    counts or empty. Unreadable counts lose only their histogram (noted); the rest still reads."""
    if raw is None:
        return None
    parts = text(raw).split("|")
    values = [number(v) for v in parts[:4]] if len(parts) in (4, 6) else []
    if len(values) != 4 or any(v is None or v < 0 for v in values):
        bad.note("progress", raw)
        return None
    groups, tokens, uptime, reported = values
    lengths, durations = ((_counts(parts[4], TOKEN_BUCKETS, "progress sample_tokens", bad),
                           _counts(parts[5], SECOND_BUCKETS, "progress sample_seconds", bad))
                          if len(parts) == 6 else ((), ()))
    return WorkerProgress(groups, tokens, uptime, reported, lengths, durations)  # type: ignore[arg-type]


def _counts(raw: str, edges: tuple[float, ...], name: str, bad: Garbage) -> tuple[int, ...]:
    """A comma-joined count list over ``edges`` (one count per bucket), () when empty or garbage."""
    if not raw:
        return ()
    values = [number(v) for v in raw.split(",")]
    if len(values) != bucket_count(edges) or any(v is None or v < 0 for v in values):
        bad.note(name, raw)
        return ()
    return tuple(values)  # type: ignore[arg-type]


def holds(keys: QueueKeys, limit: int = 100) -> Flow[list[HoldView]]:
    """The admission holds standing now, earliest deadline first: who holds each, since when, why.
    The operator drain's holder is ``operator`` with its reason from meta (lua/drain.lua)."""
    now = yield from server_ms(keys)
    rows = _scored((yield p.Command(("ZRANGEBYSCORE", keys["holds"], f"({now}", "+inf", "WITHSCORES",
                                     "LIMIT", 0, limit))))
    if not rows:
        return []
    lines = yield p.Command(("HMGET", keys["holders"], *(hid for hid, _ in rows)))
    m = (yield from meta(keys)) if any(hid == DRAIN_HOLD for hid, _ in rows) else {}
    out = []
    for (hold_id, score), line in zip(rows, lines):
        bad = Garbage()
        deadline = bad.number("hold deadline", score)
        if hold_id == DRAIN_HOLD:
            holder, since, reason = "operator", bad.number("drain_since_ms", m.get("drain_since_ms")), m.get(
                "drain_reason", "")
        elif line is None:
            holder, since, reason = "", None, ""  # opened before holders were recorded, or by hand
        else:
            holder, _, rest = text(line).partition("|")
            when, _, reason = rest.partition("|")
            since = bad.number("hold since", when)
        out.append(HoldView(hold_id, holder, since, None if since is None else now - since, reason, deadline,
                            None if deadline is None else deadline - now, tuple(bad.notes)))
    return out


def reaped(keys: QueueKeys, count: int = 20) -> Flow[list[ReapedView]]:
    """The last ``count`` lines of the ``reaped`` stream, newest first: which workers the queue gave
    up on, when, and what they held (lua/include/reap_worker_entries.lua)."""
    yield from require_queue(keys)
    now = yield from server_time(keys)
    reply = yield p.Command(("XREVRANGE", keys["reaped"], "+", "-", "COUNT", count))
    out: list[ReapedView] = []
    for reaped_id, kv in p.parse_stream_entries(reply, "XREVRANGE reaped"):
        f = {k: text(v) for k, v in _flat(kv).items()}
        bad = Garbage()
        ids = tuple(i for i in f.get("ids", "").split(",") if i)
        out.append(ReapedView(
            reaped_id, max(0, now - stream_id(reaped_id)[0]), f.get("worker", ""),
            bad.number("heartbeat_ms", f.get("heartbeat_ms") or None), f.get("terminal", ""), f.get("reason", ""),
            bad.number("requeued", f.get("requeued")) or 0, bad.number("dead", f.get("dead")) or 0, ids,
            f.get("done") == "1", _progress(f.get("progress") or None, bad), tuple(bad.notes)))
    return out


def leases(keys: QueueKeys, limit: int = 1000) -> Flow[list[LeaseView]]:
    """Active leases, the first due first (never their fencing tokens): each with its deadline, its
    holder's last beat and when the reaper takes it (the ``leases`` score, lua/include/lease_due.lua)."""
    yield from require_queue(keys)
    now = yield from server_ms(keys)
    bound = number((yield p.Command(("HGET", keys["meta"], "trainer_silence_ms")))) or None  # 0: off
    ids = _scored((yield p.Command(("ZRANGE", keys["leases"], 0, limit - 1, "WITHSCORES"))))
    out = []
    for lease_id, score in ids:
        bad = Garbage()
        due = bad.number("due score", score)
        names = ("trainer", "created_ms", "members", "version", "state", "deadline", "beat_ms")
        f = p.parse_hmget((yield p.Command(("HMGET", keys.lease(lease_id), *names))), names)
        created, version = bad.number("created_ms", f["created_ms"]), bad.number("version", f["version"])
        deadline = bad.number("deadline", f["deadline"]) if f["deadline"] is not None else due
        beat = bad.number("beat_ms", f["beat_ms"])
        trainer, members, state = (None if v is None else text(v) for v in (f["trainer"], f["members"], f["state"]))
        groups = len(members.split(",")) if members else 0
        out.append(LeaseView(lease_id, trainer or "", deadline, None if deadline is None else deadline - now, groups,
                             version, created, state or "unknown", tuple(bad.notes), beat_ms=beat,
                             silent_ms=None if beat is None else max(0, now - beat), due_ms=due,
                             due_in_ms=None if due is None else due - now, silence_bound_ms=bound))
    return out


def drain_status(keys: QueueKeys) -> Flow[DrainStatus]:
    m = yield from meta(keys)
    if "library" not in m:
        yield from require_queue(keys)
    now = yield from server_ms(keys)
    score = yield p.Command(("ZSCORE", keys["holds"], DRAIN_HOLD))
    others = p.parse_count((yield p.Command(("ZCOUNT", keys["holds"], f"({now}", "+inf"))), "ZCOUNT holds")
    # Active as the scripts count holds (ZCOUNT up to +inf), even when the deadline is no time at all.
    deadline_score = p.parse_score(score, "ZSCORE holds")
    active = deadline_score is not None and deadline_score > now
    others = others - (1 if active else 0)
    bad = Garbage()
    deadline = bad.number("drain deadline score", score)
    c = yield from counters(keys)
    since, executing = bad.number("drain_since_ms", m.get("drain_since_ms")), bad.number(
        "executing_groups", c.get("executing_groups"))
    return DrainStatus(active, deadline, m.get("drain_reason", ""), since, executing or 0, others, now,
                       tuple(bad.notes))


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


def _find_dead_letter(keys: QueueKeys, entry_id: str) -> Flow[tuple[DeadLetter, Any] | None]:
    """The newest dead letter of ``entry_id`` among the last DLQ_SCAN ones, with its raw history
    field (the attempts as they were when it died: the entry's history hash is deleted then)."""
    reply = yield p.Command(("XREVRANGE", keys["dlq"], "+", "-", "COUNT", DLQ_SCAN))
    for dlq_id, kv in p.parse_stream_entries(reply, "XREVRANGE dlq"):
        f = _flat(kv)
        if text(f.get("entry_id", b"")) == entry_id:
            return (yield from dead_letter(keys, dlq_id)), f.get("history")
    return None


def decode_fields(fields: Mapping[bytes, bytes]) -> SourceGroup | None:
    """The pristine group of raw stream fields, or None when they do not decode."""
    try:
        return p.decode_reservation_group(fields)
    except CodecError:
        return None


def attempt_history(raw: Any, bad: Garbage | None = None) -> tuple[int, tuple[Attempt, ...]]:
    """(counted failures, attempts) of a stored history: {"f": failures, "h": [attempts]}
    (lua/include/history.lua) or the bare attempt list a dead letter may carry. Lenient: what does
    not parse is left out (or 0) and noted in ``bad``."""
    bad = bad or Garbage()
    try:
        h = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        bad.note("history", raw)
        return 0, ()
    items = h.get("h") or [] if isinstance(h, dict) else h
    if not isinstance(items, list) or not isinstance(h, (dict, list)):
        bad.note("history", raw)
        return 0, ()
    attempts = _attempts(items, bad)
    if isinstance(h, dict):
        return bad.number("history failures", h.get("f")) or 0, attempts
    # A dead letter's bare list: the attempts DESIGN rule 4 counts toward max_attempts.
    return _counted(attempts), attempts


def _counted(attempts: Sequence[Attempt]) -> int:
    """How many of ``attempts`` count toward max_attempts (DESIGN rule 4)."""
    return sum(1 for a in attempts if a.terminal in COUNTED_TERMINALS)


def _attempts(items: Sequence[Any], bad: Garbage) -> tuple[Attempt, ...]:
    """The attempt records of a history list, leniently (records that are not objects are left out)."""
    return tuple(Attempt(bad.number("attempt", a.get("a")) or 0, _field(a, "w"), _field(a, "t"), _field(a, "r"),
                         bad.number("attempt ms", a.get("ms")) or 0) for a in items if isinstance(a, dict))


def letter_view(d: DeadLetter, server_now: int, queue_now: int, partition: str = "") -> DeadLetterView:
    """A dead letter for people: its time of death is its stream ID (server time, ``server_now`` the
    server's TIME), its attempts' times are queue time (``queue_now``, DESIGN: the queue clock)."""
    bad = Garbage()
    attempts = _attempts(d.history, bad)
    died = stream_id(d.dlq_id)[0]
    return DeadLetterView(d, died, max(0, server_now - died), _counted(attempts), attempts,
                          tuple(max(0, queue_now - a.ms) if a.ms else None for a in attempts), partition,
                          tuple(bad.notes))


def letter_views(keys: QueueKeys, letters: Sequence[DeadLetter], partition: str = "") -> Flow[list[DeadLetterView]]:
    """``letters`` (dead letters of the queue ``keys``) as people read them, with the queue's clocks."""
    if not letters:
        return []
    server_now = yield from server_time(keys)
    queue_now = yield from server_ms(keys)
    return [letter_view(d, server_now, queue_now, partition) for d in letters]


def _requeued_as(raw: Any) -> str | None:
    """The new entry ID a requeued dead letter's group went to (``"q"``, lua/dlq_requeue.lua)."""
    try:
        h = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None
    q = h.get("q") if isinstance(h, dict) else None
    return q if isinstance(q, str) else None


def _field(record: Mapping[str, Any], name: str) -> str:
    value = record.get(name, "")
    return value if isinstance(value, str) else str(value)


def last_delivered(keys: QueueKeys) -> Flow[str]:
    """The consumer group's last-delivered-id: every entry of the source stream after it is backlog."""
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
    pel = p.parse_pending((yield p.Command(("XPENDING", keys["src"], "rollout", entry_id, entry_id, 1))))
    owner, idle, count = (pel[0].consumer, pel[0].idle_ms, pel[0].deliveries) if pel else (None, None, 0)
    src = p.parse_stream_entries((yield p.Command(("XRANGE", keys["src"], entry_id, entry_id))))
    ledger = p.parse_text((yield p.Command(("HGET", keys["ledger"], entry_id))), "HGET ledger")
    bad = Garbage()
    raw_history = yield p.Command(("HGET", keys["history"], entry_id))
    failures, history = attempt_history(raw_history, bad)
    fields = p.raw_fields(src[0][1]) if src else {}
    state = entry_state(owner) if owner else (yield from _unowned_state(keys, entry_id, bool(src), ledger))
    more = yield from _details(keys, entry_id, state, owner or "", count, int(cfg.worker_timeout_s * 1000), bad)
    if "history" in more:  # a dead letter carries the attempts it died with: those are the truth
        failures, history = more.pop("counted_failures"), more.pop("history")
    group = (decode_fields(fields) if fields else None) or more.pop("group", None)
    progress = p.parse_text((yield p.Command(("HGET", keys["partial_head"], entry_id))), "HGET partial:head")
    return EntryView(
        entry_id=entry_id, state=state, owner=owner, attempt=count or _ledger_attempt(ledger), idle_ms=idle,
        counted_failures=failures, history=history, ledger=ledger, server_ms=(yield from server_ms(keys)),
        version=bad.number("version", (yield from meta(keys)).get("version")) or 0,
        source_id=group.source_id if group else (fields.get(b"sid", b"").decode(errors="replace") or None),
        n=group.n if group else None, group=group, garbage=tuple(bad.notes), requeued_as=_requeued_as(raw_history),
        progress=progress, **{k: v for k, v in more.items() if k != "group"})


def _details(keys: QueueKeys, entry_id: str, state: str, owner: str, attempt: int, timeout_ms: int,
             bad: Garbage) -> Flow[dict[str, Any]]:
    """What only one state has: the worker's heartbeat, the buffered version and payload size (the
    payload key of the attempt, its PEL delivery count), the lease, the dead letter (with the
    attempts it carries)."""
    if state == "executing":
        beat = bad.number("heartbeat score", (yield p.Command(("ZSCORE", keys["workers"], owner))))
        now = yield from server_ms(keys)
        return {"worker_id": owner, "worker_heartbeat_ms": beat,
                "worker_alive": beat is not None and now - beat <= timeout_ms}
    if state == "completed":
        score = bad.number("buffer version score", (yield p.Command(("ZSCORE", keys["bufver"], entry_id))))
        size = p.parse_count((yield p.Command(("STRLEN", keys.payload(entry_id, attempt)))), "STRLEN payload")
        return {"min_version": None if score is None else score // 2**32, "completion_bytes": size}
    if state == "leased":
        lease_id = owner[len("@lease:"):]
        names = ("trainer", "deadline", "members", "versions")
        f = p.parse_hmget((yield p.Command(("HMGET", keys.lease(lease_id), *names))), names)
        return {"lease_id": lease_id, "lease_trainer": text(f["trainer"] or b""),
                "lease_deadline_ms": bad.number("lease deadline", f["deadline"]),
                "min_version": _lease_version(entry_id, f["members"], f["versions"], bad)}
    if state == "dead":
        found = yield from _find_dead_letter(keys, entry_id)
        if found is not None:
            letter, raw_history = found
            failures, history = attempt_history(raw_history, bad)
            return {"dlq_id": letter.dlq_id, "dead_reason": letter.reason, "group": letter.group,
                    "counted_failures": failures, "history": history}
    return {}


def _unowned_state(keys: QueueKeys, entry_id: str, in_stream: bool, ledger: str | None) -> Flow[str]:
    """The state of an entry nobody owns: settled (the ledger says how) or still in the backlog."""
    if ledger and ledger.startswith("s|"):
        settlement = ledger.split("|")[1]
        return settlement if settlement in STATES else "unknown"  # a ledger line no script wrote
    if in_stream and stream_id(entry_id) > stream_id((yield from last_delivered(keys))):
        return "backlog"
    raise NotFound(f"entry {entry_id} is not in queue {keys.queue!r} (never submitted, or settled and its ledger "
                   "line pruned after settled_retention_s)")


def _ledger_attempt(ledger: str | None) -> int:
    parts = (ledger or "").split("|")
    index = 1 if parts[0] == "a" else 2
    # isdecimal and ASCII: str.isdigit() also takes '²', which int() refuses.
    return int(parts[index]) if len(parts) > index and parts[index].isascii() and parts[index].isdecimal() else 0


def _lease_version(entry_id: str, members: Any, versions: Any, bad: Garbage) -> int | None:
    ids, vs = text(members or b"").split(","), text(versions or b"").split(",")
    if entry_id not in ids or ids.index(entry_id) >= len(vs):
        return None
    return bad.number("lease version", vs[ids.index(entry_id)])


def memory(keys: QueueKeys, limit: int = 10_000) -> Flow[dict[str, int]]:
    """Bytes each of the queue's keys takes (MEMORY USAGE): its fixed keys and the records of the
    leases in its leases index (at most ``limit``). No SCAN: the operator role may not list key
    names (SCAN is not confined to one queue's keys by ACL), and every key a queue writes is either
    fixed or a lease record named by that index (closed records expire after lease_record_ttl_s)."""
    sizes: dict[str, int] = {}
    leases = yield p.Command(("ZRANGE", keys["leases"], 0, max(0, limit - 1)))
    for key in [keys[role] for role in sorted(KEY_SUFFIXES)] + [keys.lease(text(x)) for x in leases or []]:
        size = p.parse_count((yield p.Command(("MEMORY", "USAGE", key))), "MEMORY USAGE")
        if size:
            sizes[key] = size
    return sizes


# -- a read-only handle ----------------------------------------------------------------------------


class QueueView:
    """A read-only handle on one queue. Unlike RolloutQueue it never runs ``open``, so it cannot create
    a queue (a mistyped --queue is NotFound) and works under the read-only operator ACL role. (The
    one exception: `config set` drives actions.set_config through it, since a queue whose stored
    config is corrupt cannot be opened, and repairing that config is what the command is for.)

    ``partitions``: the logical queue's partition count (resolve_partitions reads it); with more
    than one, ``layout.keys[i]`` are the partitions' keys and ops/partition_views.py runs the views
    on each of them."""

    def __init__(self, client: SyncClient, name: str, retry: RetryPolicy | None = None,
                 clock: Clock = time.monotonic, durability: Durability | None = None, partitions: int = 1) -> None:
        self.name, self.client, self.clock = name, client, clock
        self.layout = Layout(name, partitions)
        self.driver = SyncDriver(client, retry, clock=clock, durability=durability)

    @property
    def keys(self) -> QueueKeys:
        """The keys of a one-partition queue (a partitioned one has ``layout.keys[i]``)."""
        if self.layout.count != 1:
            raise InvalidInput(f"{self.name!r} has {self.layout.count} partitions, each with its own keys: "
                               "use view.layout.keys[i]")
        return self.layout.keys[0]

    @classmethod
    def from_url(cls, url: str, name: str, retry: RetryPolicy | None = None, **redis_kwargs: Any) -> "QueueView":
        return cls(redis.Redis.from_url(url, **redis_options(redis_kwargs)), name, retry)

    def run(self, flow: Flow[T]) -> T:
        return self.driver.run(flow)

    def close(self) -> None:
        self.client.close()
