"""Every public operation as a generator of calls: written once, driven by the sync and async clients.

A flow yields ``Call`` / ``Command`` values and receives their raw replies; it returns the
operation's result or raises a typed error. Flows never touch a socket, a clock or a sleep of their
own: the driver passes replies in, and ``clock`` is injected, so tests can drive any flow by hand.
Operations that need several round trips (blocking waits, reaper sweeps, bounded batch loops) loop
here; each script they call is one atomic transition, and every loop is safe to interrupt and rerun.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable, Generator, Sequence, TypeVar


from rollout_queue.core import protocol as p
from rollout_queue.core.checks import (
    check_choice,
    check_flag,
    check_instance,
    check_int,
    check_items,
    check_optional_int,
    check_optional_seconds,
    check_seconds,
    check_string,
)
from rollout_queue.core.codec import SCHEMA_VERSION, CodecError, encode_completion, encode_group
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import LeaseLost, PayloadTooLarge, QueueNotFound
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import (
    DeadLetter,
    HeartbeatInfo,
    QueueStats,
    ReapReport,
    Receipt,
    Reservation,
    Sample,
    SourceGroup,
    check_completions,
    check_entry_id,
    check_group_sizes,
    check_reason,
    check_receipt,
    check_text,
    check_worker_id,
)
from rollout_queue.core.models import reason_text as _reason_text
from rollout_queue.core.scripts import LIBRARY_VERSION

T = TypeVar("T")
Flow = Generator[p.Op, Any, T]
Clock = Callable[[], float]

#: Largest policy version: versions are < 2^21 (the bufver score packs them above 32 bits of arrival).
MAX_VERSION = 2**21 - 1
#: Most entries one reap pass handles per script call: each call must stay a few milliseconds.
MAX_REAP_BUDGET = 1024
#: Longest trainer id and weights URI kept in Redis.
MAX_NAME, MAX_URI = 200, 8192

#: Longest single XREAD BLOCK, so a blocked call notices a dead connection within this many ms.
MAX_BLOCK_CHUNK_MS = 2000
#: Entries per call of the bounded loops (reaper, close, rollback, checkpoint): a batched requeue
#: costs ~10 µs of script time per entry with a short attempt history and ~50-100 µs with a full one
#: (32 attempts: decoding and re-encoding it dominates), so 32 keeps a call near 0.35 ms typically
#: and under ~3 ms at worst, well inside a 5 ms bound (scripts/bench_reaper.py, benchmarks/README.md).
BATCH = 32


def new_id() -> str:
    return secrets.token_hex(8)


def _wait(key: str, wake_id: str, deadline: float, clock: Clock) -> Flow[bool]:
    """Block until the wake stream moves past ``wake_id`` or the deadline passes; False on timeout."""
    remaining_ms = int((deadline - clock()) * 1000)
    if remaining_ms <= 0:
        return False
    yield p.Command(("XREAD", "BLOCK", min(remaining_ms, MAX_BLOCK_CHUNK_MS), "COUNT", 1, "STREAMS", key, wake_id or "$"))
    return True


# -- queue ---------------------------------------------------------------------------------------


def open_queue(keys: QueueKeys, config: QueueConfig | None, default: QueueConfig | None = None,
               create: bool = True) -> Flow[QueueConfig]:
    """Create the queue or check ``config`` (None: adopt the stored one) and the library version.
    ``default``: what a new queue opened with config=None stores (a partition's share of the
    logical defaults); QueueConfig() when not given. ``create=False``: raise QueueNotFound instead
    of creating a missing queue (a worker, producer or reaper started with a mistyped name)."""
    check_instance(config, (QueueConfig, type(None)), "config")
    check_flag(create, "create")
    if not create and not (yield p.Command(("EXISTS", keys["meta"]))):
        raise QueueNotFound(keys.queue)
    chosen = config or default or QueueConfig()
    flat = [x for kv in chosen.to_meta().items() for x in kv]
    reply = yield p.build(keys, "open", library=LIBRARY_VERSION, mode="check" if config else "adopt", config=flat)
    _, meta = p.parse_open(reply, keys.queue)
    return QueueConfig.from_meta(meta)


#: Groups (and their bytes) per submit script call: a script adds ~5 µs per group, so a submit of any
#: size holds Redis for about a millisecond per call (issue 12 item 8), not seconds for 150k groups.
SUBMIT_BATCH = 256
SUBMIT_BATCH_BYTES = 1 << 20


def encode_source(g: SourceGroup, max_payload_bytes: int) -> tuple[list[p.Arg], int]:
    """One group's 5 ARGV values as submit and produce take them (add_groups.lua), and its size.
    PayloadTooLarge for a group over the queue's limit (raised before anything is sent)."""
    parents, body = encode_group(g)
    size = len(g.source_id) + len(parents) + len(body)
    if size > max_payload_bytes:
        raise PayloadTooLarge(f"source group {g.source_id!r}", size, max_payload_bytes)
    return [g.source_id, g.n, parents, body, SCHEMA_VERSION], size


def submit(keys: QueueKeys, groups: Sequence[SourceGroup], max_payload_bytes: int,
           max_group_samples: int = 0) -> Flow[list[str]]:
    """Backlog the groups; a source_id already submitted returns its existing entry ID.

    ``max_group_samples``: the largest n the queue can execute (its max_executing_samples; 0: the
    caller checked already). Every group is checked and encoded before anything is sent
    (GroupTooLarge, PayloadTooLarge: nothing written); then they go in calls of SUBMIT_BATCH groups
    or SUBMIT_BATCH_BYTES, in order. Each call is idempotent by source_id, so a submit cut short
    (OutcomeUnknown) is finished by repeating it."""
    groups = check_items(groups, SourceGroup, "groups")
    if max_group_samples:
        check_group_sizes(groups, max_group_samples)
    encoded = [encode_source(g, max_payload_bytes) for g in groups]
    out: list[str] = []
    flat: list[p.Arg] = []
    chunk_bytes = 0
    for i, (args, size) in enumerate(encoded):
        flat += args
        chunk_bytes += size
        last = i == len(encoded) - 1
        if last or len(flat) >= 5 * SUBMIT_BATCH or chunk_bytes + encoded[i + 1][1] > SUBMIT_BATCH_BYTES:
            out += p.parse_submit((yield p.build(keys, "submit", groups=flat)))
            flat, chunk_bytes = [], 0
    return out


def publish_version(keys: QueueKeys, version: int, weights_uri: str | None, hold_id: str = "") -> Flow[bool]:
    """Record a new policy version; True if it was new, False for a replay of the current one."""
    version = check_int(version, "version", 0, MAX_VERSION)
    uri = check_string("" if weights_uri is None else weights_uri, "weights_uri", MAX_URI, allow_empty=True)
    reply = yield p.build(keys, "publish_version", version=version, weights_uri=uri, hold_id=hold_id)
    return p.parse_publish_version(reply, version, hold_id)


def version(keys: QueueKeys) -> Flow[int]:
    return p.parse_count((yield p.Command(("HGET", keys["meta"], "version"))), "HGET meta version")


# -- worker side ---------------------------------------------------------------------------------


def reserve(keys: QueueKeys, worker_id: str, max_groups: int, max_samples: int, block_ms: int,
            clock: Clock, overcommit: bool = False) -> Flow[list[Reservation]]:
    """Up to ``max_groups`` reservations (and at most ``max_samples`` samples, 0: no per-call cap),
    waiting up to ``block_ms`` for work. Undecodable reservations are dead-lettered, never returned.
    A group larger than ``max_samples`` is left for another caller, unless ``overcommit`` (the caller
    queues samples internally): then the oldest such group may be the call's first grant. One script
    call grants at most 64 groups (reserve.lua), whatever ``max_groups`` asks."""
    check_worker_id(worker_id)
    max_groups, max_samples = check_int(max_groups, "max_groups", 1), check_int(max_samples, "max_samples")
    block_ms = check_int(block_ms, "block_ms")
    deadline = clock() + block_ms / 1000
    while True:
        reply = yield p.build(keys, "reserve", worker_id=worker_id, max_groups=max_groups,
                              max_samples=max_samples, request_id=new_id(), overcommit=1 if overcommit else 0)
        r = p.parse_reserve(reply, worker_id)
        out = []
        for receipt, fields in r.granted:
            try:
                group = p.decode_reservation_group(fields)
            except CodecError as exc:
                yield from reject(keys, receipt, str(exc))
                continue
            out.append(Reservation(receipt, group, r.version))
        if out:
            return out
        if r.status == "retry" or r.granted:
            continue  # garbage was dead-lettered on the way: there may be good work behind it
        if block_ms <= 0 or not (yield from _wait(keys["wake_work"], r.wake_id, deadline, clock)):
            return []


def reject(keys: QueueKeys, receipt: Receipt, reason: str) -> Flow[None]:
    reply = yield p.build(keys, "reject", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, reason=_reason_text(reason))
    p.check(reply, ("ok",), p.receipt_context(receipt))


def complete(keys: QueueKeys, receipt: Receipt, samples: Sequence[Sample], max_payload_bytes: int) -> Flow[str]:
    """Hand in an attempt's samples. Returns 'buffered', 'replay' or 'evicted_self' (overflow)."""
    receipt, samples = check_receipt(receipt), check_items(samples, Sample, "samples")
    if not samples:
        where = yield from fail(keys, receipt, "completion has no samples", terminal="malformed")
        # 'dead' when this attempt reached max_attempts. A replay (the first call's reply was lost) cannot
        # tell which it was; the group left this worker either way, so report the usual case.
        where = "ready" if where == "replay" else where
        raise p.ERRORS["malformed"](p.receipt_context(receipt), ["malformed", "completion has no samples", where])
    payload, min_version, slots = _completion_args(receipt, samples, max_payload_bytes)
    reply = yield p.build(keys, "complete", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, payload=payload, min_version=min_version, slots=slots)
    return p.parse_complete(reply, receipt)


def _completion_args(receipt: Receipt, samples: Sequence[Sample], max_payload_bytes: int) -> tuple[bytes, int, str]:
    """(payload, min_version, slots) as complete.lua takes them; no samples: (b'', 0, '') (the script
    ends such an attempt malformed). Raises PayloadTooLarge before anything is sent."""
    if not samples:
        return b"", 0, ""
    payload = encode_completion(samples)
    if len(payload) > max_payload_bytes:
        raise PayloadTooLarge(f"completion of {receipt.entry_id}", len(payload), max_payload_bytes)
    return payload, min(x.version for x in samples), ",".join(str(x.slot) for x in samples)


#: Items per complete_many script call, and their payload bytes: each item costs ~2 commands and its
#: payload's copy inside the script, so a call stays near the cost of a few single completes.
COMPLETE_BATCH = 32
COMPLETE_BATCH_BYTES = 4 << 20


def complete_many(keys: QueueKeys, worker_id: str, items: Sequence[tuple[Receipt, Sequence[Sample]]],
                  max_payload_bytes: int) -> Flow[list[p.CompletionOutcome]]:
    """Hand in several attempts' samples: settled in order, each exactly as its own ``complete`` would
    be, in one script call per chunk of COMPLETE_BATCH items (or COMPLETE_BATCH_BYTES of payload).

    Returns one outcome per item, in order: 'buffered', 'replay' or 'evicted_self', or the item's
    refusal as an exception instance, not raised (StaleReceipt, PayloadTooLarge: still executing,
    MalformedCompletion: ended and requeued), so a refused item never hides the others' outcomes.
    A completion with no samples ends malformed, as with ``complete``. The whole call is safe to
    repeat (each settled item then answers 'replay'). Raises InvalidInput before anything is sent if
    a receipt names another worker; OutcomeUnknown if Redis stays unreachable (chunks already sent
    are settled: repeat the call).
    """
    items = check_completions(items, check_worker_id(worker_id))
    out: list[p.CompletionOutcome] = [""] * len(items)
    chunk: list[tuple[int, Receipt]] = []
    flat: list[p.Arg] = []
    size = 0
    for i, (receipt, samples) in enumerate(items):
        try:
            payload, min_version, slots = _completion_args(receipt, samples, max_payload_bytes)
        except PayloadTooLarge as exc:
            out[i] = exc  # nothing sent: the attempt stays executing, as with complete
            continue
        if chunk and (len(chunk) >= COMPLETE_BATCH or size + len(payload) > COMPLETE_BATCH_BYTES):
            yield from _complete_chunk(keys, worker_id, chunk, flat, out)
            chunk, flat, size = [], [], 0
        chunk.append((i, receipt))
        flat += [receipt.entry_id, receipt.attempt, payload, min_version, slots]
        size += len(payload)
    if chunk:
        yield from _complete_chunk(keys, worker_id, chunk, flat, out)
    return out


def _complete_chunk(keys: QueueKeys, worker_id: str, chunk: Sequence[tuple[int, Receipt]], flat: list[p.Arg],
                    out: list[p.CompletionOutcome]) -> Flow[None]:
    """One complete_many call; its outcomes land in ``out`` at the items' original positions."""
    reply = yield p.build(keys, "complete_many", worker_id=worker_id, items=flat)
    for (i, _), outcome in zip(chunk, p.parse_complete_many(reply, [r for _, r in chunk])):
        out[i] = outcome


def fail(keys: QueueKeys, receipt: Receipt, reason: str, terminal: str = "failed") -> Flow[str]:
    """End the attempt failed (counted toward max_attempts). Returns 'ready', 'dead' or 'replay'."""
    check_receipt(receipt)
    reply = yield p.build(keys, "fail", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, terminal=terminal, reason=_reason_text(reason))
    return p.parse_ended(reply, "fail", receipt)


def abort(keys: QueueKeys, receipt: Receipt, reason: str) -> Flow[str]:
    """End the attempt aborted (not counted). Returns 'ready' or 'replay'."""
    check_receipt(receipt)
    reply = yield p.build(keys, "abort", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, reason=_reason_text(reason))
    return p.parse_ended(reply, "abort", receipt)


def filter_group(keys: QueueKeys, receipt: Receipt, reason: str) -> Flow[str]:
    """Settle the group filtered (consumed, never trained). Returns 'filtered' or 'replay'.

    ``reason`` is free text ("all rewards equal"): the ledger keeps it (capped at 2,000 characters,
    like every reason); the per-reason counter is its normalised token, bounded in filter.lua."""
    check_receipt(receipt)
    reply = yield p.build(keys, "filter", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, reason=check_reason(reason, "filter reason"))
    return p.parse_ended(reply, "filter", receipt)


def heartbeat(keys: QueueKeys, worker_id: str) -> Flow[HeartbeatInfo]:
    reply = yield p.build(keys, "heartbeat", worker_id=check_worker_id(worker_id))
    return p.parse_heartbeat(reply)


def close_worker(keys: QueueKeys, worker_id: str, terminal: str, reason: str) -> Flow[tuple[int, int]]:
    """Requeue everything the worker owns and deregister it. Returns (requeued, dead-lettered)."""
    check_worker_id(worker_id)
    check_choice(terminal, ("aborted", "lost"), "terminal")
    requeued = dead = 0
    while True:
        reply = yield p.build(keys, "close_worker", worker_id=check_worker_id(worker_id), terminal=terminal,
                              reason=_reason_text(reason), count=BATCH)
        n_requeued, n_dead, done = p.parse_close_worker(reply, worker_id)
        requeued, dead = requeued + n_requeued, dead + n_dead
        if done:
            return requeued, dead


# -- trainer side --------------------------------------------------------------------------------


def lease(keys: QueueKeys, trainer_id: str, groups: int, partial: bool, timeout_s: float | None, block_ms: int,
          clock: Clock) -> Flow[tuple[p.LeaseReply, str] | None]:
    """Lease exactly ``groups`` fresh completed groups (>= 1 when partial), waiting up to ``block_ms``.
    Returns (reply, token) or None. The script answers ids and fields; the payloads follow with one
    HMGET (P2). Members whose payload does not decode (garbage written into Redis) or is gone by
    then make the flow hand the lease back and try again: they are regenerated, nothing is lost."""
    groups, block_ms = check_int(groups, "groups", 1), check_int(block_ms, "block_ms")
    check_string(trainer_id, "trainer_id", MAX_NAME)
    check_flag(partial, "partial")
    check_optional_seconds(timeout_s, "timeout_s")
    deadline = clock() + block_ms / 1000
    timeout_ms = 0 if timeout_s is None else max(1, int(timeout_s * 1000))
    while True:
        lease_id, token = new_id(), secrets.token_hex(16)
        reply = yield p.build(keys, "lease", lease_id=lease_id, token=token, trainer_id=trainer_id, groups=groups,
                              partial=1 if partial else 0, timeout_ms=timeout_ms)
        r = p.parse_lease(reply, lease_id, groups)
        if r.status == "ok":
            payloads = (yield p.read_lease_payloads(keys, r)) if r.members else []
            r = p.decode_lease(r, payloads)
            if not r.undecodable:
                return r, token
            yield from _hand_back(keys, lease_id, token)
            continue
        if block_ms <= 0 or not (yield from _wait(keys["wake_done"], r.wake_id, deadline, clock)):
            return None


def _hand_back(keys: QueueKeys, lease_id: str, token: str) -> Flow[None]:
    """Roll back a lease with undecodable members. One that already expired (a payload read after its
    deadline finds the members requeued) has nothing left to hand back: the reaper requeued it."""
    try:
        yield from rollback(keys, lease_id, token)
    except LeaseLost as exc:
        if exc.state != "expired":
            raise


def commit(keys: QueueKeys, lease_id: str, token: str, step: int | None) -> Flow[str]:
    """Settle the lease committed. Returns the commit's ID in the commits stream."""
    step = check_optional_int(step, "step")
    reply = yield p.build(keys, "commit", lease_id=lease_id, token=token, step="" if step is None else int(step))
    return p.parse_commit(reply, lease_id)


def rollback(keys: QueueKeys, lease_id: str, token: str) -> Flow[int]:
    """Requeue every member of the lease, a bounded batch per call. Returns how many went back to
    ready (0 on a replay). The first call already fences the lease: a later commit is refused."""
    total = 0
    while True:
        reply = yield p.build(keys, "rollback", lease_id=lease_id, token=token, count=BATCH)
        n, done = p.parse_rollback(reply, lease_id)
        total += n
        if done:
            return total


def extend(keys: QueueKeys, lease_id: str, token: str, seconds: float) -> Flow[int]:
    """Move the deadline to ``seconds`` from now (server clock). Returns the new deadline in ms."""
    seconds = check_seconds(seconds, "seconds")
    reply = yield p.build(keys, "extend", lease_id=lease_id, token=token, ms=max(1, int(seconds * 1000)))
    return p.parse_extend(reply, lease_id)


# -- admission holds -----------------------------------------------------------------------------


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


# -- checkpoints ---------------------------------------------------------------------------------


def checkpoint(keys: QueueKeys, step: int) -> Flow[int]:
    """Drop the kept payloads committed at or before ``step``. Returns how many were dropped.
    The first call records the checkpoint (restore refuses to go below it from then on); repeating
    it finishes an interrupted one. CheckpointRegression below the last checkpoint, LeasesOpen while
    groups are leased, RestoreInProgress while a restore is unfinished (nothing written)."""
    step = check_int(step, "step")
    total = 0
    while True:
        reply = yield p.build(keys, "checkpoint", step=int(step), count=BATCH)
        n, done = p.parse_checkpoint(reply, step)
        total += n
        if done:
            return total


def restore(keys: QueueKeys, step: int) -> Flow[int]:
    """Requeue every group committed after ``step``. Returns how many were restored. Interrupted, it
    leaves a fence (commits and checkpoints are refused) until restore(step) is called again or the
    reaper finishes it; RestoreInProgress if a restore of another step is unfinished."""
    step = check_int(step, "step")
    total = 0
    while True:
        reply = yield p.build(keys, "restore", step=int(step), count=BATCH)
        n, done = p.parse_restore(reply, step)
        total += n
        if done:
            return total


# -- reaper --------------------------------------------------------------------------------------


#: Most prune calls in one reap pass (BATCH groups each): 8,192 groups, a few tens of ms of Redis
#: time, so a backlog of due groups (after the reaper was down, or retention was shortened) is
#: worked off over several passes without delaying the reaping of workers and leases behind it.
PRUNE_CALLS_PER_PASS = 256


def reap(keys: QueueKeys, budget: int = BATCH) -> Flow[ReapReport]:
    """One reaper pass: silent workers, expired leases, stale groups, expired holds, orphans, and
    the ledger lines and source_id mappings of groups settled longer ago than settled_retention_s.
    Every action is its own script that re-checks its condition, so reapers may run concurrently.
    ``budget``: entries per script call, 1..MAX_REAP_BUDGET."""
    budget = check_int(budget, "budget", 1, MAX_REAP_BUDGET)
    scan = p.parse_reap_scan((yield p.build(keys, "reap_scan", count=budget)))
    report = ReapReport()
    # Names go back to the scripts as the raw bytes Redis gave: a name that is not UTF-8 (garbage
    # written by hand) is then reaped like any other instead of failing the whole pass.
    orphans = list(scan.orphans)
    for worker in list(scan.silent) + [o for o in orphans if not o.startswith(b"@lease:")]:
        report += yield from _reap_worker(keys, worker, orphan=worker in orphans, budget=budget)
    for worker in scan.empty:  # closed or reaped inline: only the consumer is left
        yield from _reap_worker(keys, worker, orphan=False, budget=budget)
    for lease_id in list(scan.expired_leases) + [o[7:] for o in orphans if o.startswith(b"@lease:")]:
        while True:
            reply = yield p.build(keys, "expire_lease", lease_id=lease_id, count=budget)
            expired = p.parse_expire_lease(reply, lease_id)
            if expired is None:  # not due
                break
            requeued, done = expired
            report += ReapReport(expired=requeued)
            if done:
                break
    for hold_id in scan.expired_holds:
        yield from hold_release(keys, hold_id)
        report += ReapReport(holds_expired=1)
    if scan.stale:
        while True:
            evicted, done = p.parse_reap_stale((yield p.build(keys, "reap_stale", count=budget)))
            report += ReapReport(stale=evicted)
            if done:
                break
    if scan.prune_due:
        report += yield from prune(keys, max(budget, BATCH), PRUNE_CALLS_PER_PASS)
    if scan.interrupted:
        report += yield from finish_interrupted(keys, budget, PRUNE_CALLS_PER_PASS)
    reply = yield p.build(keys, "reindex", count=REINDEX_BATCH)
    report += ReapReport(reindexed=p.parse_reindex(reply))
    return report


#: PEL entries one reap pass checks against their index (reindex.lua): ~0.1 ms of script a call, so a
#: queue of 100k owned entries is swept every ~400 passes (minutes at the reaper's 1 s interval).
REINDEX_BATCH = 256


def finish_interrupted(keys: QueueKeys, count: int = BATCH, max_calls: int | None = None) -> Flow[ReapReport]:
    """Finish a restore or checkpoint whose caller died between batches (the step the queue recorded),
    ``count`` entries per call, until done or ``max_calls`` ran."""
    return ReapReport(finished=(yield from _batches(keys, "finish_interrupted", count, max_calls,
                                                    p.parse_finish_interrupted)))


def prune(keys: QueueKeys, count: int = BATCH, max_calls: int | None = None) -> Flow[ReapReport]:
    """Delete the ledger lines and source_id mappings of groups settled longer ago than the queue's
    settled_retention_s, ``count`` groups per call (>= 32), until none is due or ``max_calls`` ran."""
    return ReapReport(pruned=(yield from _batches(keys, "prune", count, max_calls, p.parse_prune)))


def _batches(keys: QueueKeys, script: str, count: int, max_calls: int | None,
             parse: Callable[[Any], tuple[int, bool]]) -> Flow[int]:
    """Call a bounded reaper script until its reply (read by ``parse``: moved, done) says done (or
    ``max_calls`` ran); the sum of what it moved."""
    total, calls = 0, 0
    while max_calls is None or calls < max_calls:
        calls += 1
        moved, done = parse((yield p.build(keys, script, count=count)))
        total += moved
        if done:
            break
    return total


def _reap_worker(keys: QueueKeys, worker: bytes, orphan: bool, budget: int) -> Flow[ReapReport]:
    report = ReapReport(orphans=1 if orphan else 0)
    while True:
        reply = yield p.build(keys, "reap_worker", worker_id=worker, count=budget)
        reaped = p.parse_reap_worker(reply, worker)
        if reaped is None:  # alive
            return report
        lost, dead, done = reaped
        report += ReapReport(lost=lost, dead=dead)
        if done:
            return report


# -- views ---------------------------------------------------------------------------------------


def stats(keys: QueueKeys) -> Flow[QueueStats]:
    return p.parse_stats((yield p.build(keys, "stats")))


def dead_letters(keys: QueueKeys, count: int = 100, start: str = "-") -> Flow[list[DeadLetter]]:
    """The oldest ``count`` dead letters from ``start`` (a dlq stream ID), decoded where possible."""
    count, start = check_int(count, "count", 1), start if start == "-" else check_entry_id(start)
    return p.parse_dead_letters((yield p.Command(("XRANGE", keys["dlq"], start, "+", "COUNT", count))))


def requeue_dead_letter(keys: QueueKeys, dlq_id: str) -> Flow[str]:
    """Submit a dead letter's pristine group again (after a fix). Returns its new entry ID."""
    check_entry_id(dlq_id)
    reply = yield p.build(keys, "dlq_requeue", idempotent=False, dlq_id=dlq_id)
    return p.parse_dlq_requeue(reply, dlq_id)

