"""The worker's operations: reserve, settle an attempt (complete, complete_many, fail, abort, filter,
reject), heartbeat and close. Every settlement carries the exact receipt and is refused when stale.
"""

from __future__ import annotations

from typing import Sequence

from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_choice, check_int, check_items
from rollout_queue.core.codec import CodecError, decode_partial, encode_completion, encode_partial
from rollout_queue.core.errors import PartialTooLarge, PayloadTooLarge
from rollout_queue.core.histograms import format_counts
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import (
    HeartbeatInfo,
    Progress,
    Receipt,
    Reservation,
    Sample,
    check_completions,
    check_reason,
    check_receipt,
    check_worker_id,
)
from rollout_queue.core.flows.base import BATCH, Clock, Flow, _wait, new_id
from rollout_queue.core.models import reason_text as _reason_text


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
        out = yield from reservations(keys, r)
        if out:
            return out
        if r.status == "retry" or r.granted:
            continue  # garbage was dead-lettered on the way: there may be good work behind it
        if block_ms <= 0 or not (yield from _wait(keys["wake_work"], r.wake_id, deadline, clock)):
            return []


def reservations(keys: QueueKeys, r: p.ReserveReply) -> Flow[list[Reservation]]:
    """The granted reservations of a reserve reply, each with the progress an earlier attempt left
    (one HMGET, only when some grant has a record). An undecodable body is dead-lettered (``reject``),
    never returned; an undecodable progress record is ignored: that attempt starts from the prompt
    (its own progress, if it saves any, replaces the record; settlement drops it)."""
    out: list[Reservation] = []
    sizes: dict[str, int] = {}
    for (receipt, fields), size in zip(r.granted, r.progress_bytes or (0,) * len(r.granted)):
        try:
            group = p.decode_reservation_group(fields)
        except CodecError as exc:
            yield from reject(keys, receipt, str(exc))
            continue
        out.append(Reservation(receipt, group, r.version))
        if size:
            sizes[receipt.entry_id] = size
    if not sizes:
        return out
    ids = list(sizes)
    records = dict(zip(ids, p.parse_progress((yield p.read_progress(keys, ids)), ids)))
    return [_with_progress(res, records.get(res.entry_id)) for res in out]


def _with_progress(res: Reservation, record: bytes | None) -> Reservation:
    if not record:
        return res
    try:
        by_slot = decode_partial(record, res.group.n)
    except CodecError:
        return res  # garbage (a hand edit): start from the prompt
    return Reservation(res.receipt, res.group, res.version, tuple(by_slot[k] for k in sorted(by_slot)))


def progress_args(receipt: Receipt, samples: Sequence[Sample], max_partial_bytes: int) -> tuple[int, int, bytes]:
    """(tokens, min_version, record) of an attempt's progress as save_partial and abort take them.
    Raises PartialTooLarge (over the queue's max_partial_bytes) or InvalidInput before anything is sent."""
    samples = check_items(samples, Sample, "progress")
    record = encode_partial(samples)
    if len(record) > max_partial_bytes:
        raise PartialTooLarge(f"progress record of {receipt.entry_id}", len(record), max_partial_bytes)
    return sum(len(s.token_ids) for s in samples), min(s.version for s in samples), record


def save_partial(keys: QueueKeys, receipt: Receipt, samples: Sequence[Sample], max_partial_bytes: int) -> Flow[str]:
    """Record the attempt's progress (partial rollouts): the next attempt of the group continues from
    it. Returns 'saved' or 'replay'. Raises StaleReceipt (another attempt owns the entry: nothing
    written), PartialTooLarge (nothing sent, or refused by the stored bound)."""
    receipt = check_receipt(receipt)
    tokens, min_version, record = progress_args(receipt, samples, max_partial_bytes)
    reply = yield p.build(keys, "save_partial", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, tokens=tokens, min_version=min_version, record=record)
    return p.parse_save_partial(reply, receipt)


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
                          worker_id=receipt.worker_id, size=len(payload), min_version=min_version, slots=slots,
                          tokens=completion_tokens(samples),
                          stage=((keys.payload(receipt.entry_id, receipt.attempt), payload),))
    return p.parse_complete(reply, receipt)


def _completion_args(receipt: Receipt, samples: Sequence[Sample], max_payload_bytes: int) -> tuple[bytes, str, str]:
    """(payload, min_version, slots) as complete.lua takes them; no samples: (b'', '0', '') (the script
    ends such an attempt malformed). min_version is 'oldest' or 'oldest:newest' (the newest version
    any sample's tokens have, when it differs: what staleness_mode 'continue' judges the group by).
    Raises PayloadTooLarge before anything is sent."""
    if not samples:
        return b"", "0", ""
    payload = encode_completion(samples)
    if len(payload) > max_payload_bytes:
        raise PayloadTooLarge(f"completion of {receipt.entry_id}", len(payload), max_payload_bytes)
    oldest, newest = min(x.version for x in samples), max(x.newest_version for x in samples)
    versions = str(oldest) if newest == oldest else f"{oldest}:{newest}"
    return payload, versions, ",".join(str(x.slot) for x in samples)


#: The most tokens one completion (or a filtered group) may declare: parse_tokens.lua's bound.
MAX_COMPLETION_TOKENS = 2 ** 31 - 1


def completion_tokens(samples: Sequence[Sample]) -> int:
    """The tokens a completion holds (every sample's token ids), as complete.lua takes them: the script
    never reads the payload, and counts these in counters.tokens_generated / tokens_trained / the
    tokens_<reason> of a discard (DESIGN, Token accounting)."""
    return sum(len(x.token_ids) for x in samples)


#: Items per complete_many script call, and their payload bytes: each item costs ~2 commands in the
#: script and one SET of its payload in the call's MULTI, so a call stays near the cost of a few single
#: completes (the payloads of one call are applied together, atomically, at its EXEC).
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
    stage: list[tuple[str, bytes]] = []
    size = 0
    for i, (receipt, samples) in enumerate(items):
        try:
            payload, min_version, slots = _completion_args(receipt, samples, max_payload_bytes)
        except PayloadTooLarge as exc:
            out[i] = exc  # nothing sent: the attempt stays executing, as with complete
            continue
        if chunk and (len(chunk) >= COMPLETE_BATCH or size + len(payload) > COMPLETE_BATCH_BYTES):
            yield from _complete_chunk(keys, worker_id, chunk, flat, stage, out)
            chunk, flat, stage, size = [], [], [], 0
        chunk.append((i, receipt))
        flat += [receipt.entry_id, receipt.attempt, len(payload) if slots else "", min_version, slots,
                 completion_tokens(samples)]
        if slots:  # no samples: nothing to stage, the script ends the attempt malformed
            stage.append((keys.payload(receipt.entry_id, receipt.attempt), payload))
        size += len(payload)
    if chunk:
        yield from _complete_chunk(keys, worker_id, chunk, flat, stage, out)
    return out


def _complete_chunk(keys: QueueKeys, worker_id: str, chunk: Sequence[tuple[int, Receipt]], flat: list[p.Arg],
                    stage: list[tuple[str, bytes]], out: list[p.CompletionOutcome]) -> Flow[None]:
    """One complete_many call (its payloads staged in its MULTI); its outcomes land in ``out`` at the
    items' original positions."""
    reply = yield p.build(keys, "complete_many", worker_id=worker_id, items=flat, stage=tuple(stage))
    for (i, _), outcome in zip(chunk, p.parse_complete_many(reply, [r for _, r in chunk])):
        out[i] = outcome


def fail(keys: QueueKeys, receipt: Receipt, reason: str, terminal: str = "failed") -> Flow[str]:
    """End the attempt failed (counted toward max_attempts). Returns 'ready', 'dead' or 'replay'."""
    check_receipt(receipt)
    reply = yield p.build(keys, "fail", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, terminal=terminal, reason=_reason_text(reason))
    return p.parse_ended(reply, "fail", receipt)


def abort(keys: QueueKeys, receipt: Receipt, reason: str, progress: Sequence[Sample] = (),
          max_partial_bytes: int = 0, discarded: int = 0) -> Flow[str]:
    """End the attempt aborted (not counted). Returns 'ready' or 'replay'.

    ``progress``: the attempt's samples so far, stored in the same script call as the progress record
    the next attempt continues from (partial rollouts). Raises PartialTooLarge, before anything is
    sent, when the record is over ``max_partial_bytes`` (or the stored bound refused it): the attempt
    is still owned; abort again without progress. ``discarded``: the tokens it generated that no
    record keeps, counted as waste (counters.tokens_aborted)."""
    check_receipt(receipt)
    tokens, min_version, record = progress_args(receipt, progress, max_partial_bytes) if progress else ("", "", b"")
    reply = yield p.build(keys, "abort", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, reason=_reason_text(reason), tokens=tokens,
                          min_version=min_version, progress=record,
                          discarded=check_int(discarded, "discarded", 0, MAX_COMPLETION_TOKENS))
    return p.parse_ended(reply, "abort", receipt)


def filter_group(keys: QueueKeys, receipt: Receipt, reason: str, tokens: int = 0) -> Flow[str]:
    """Settle the group filtered (consumed, never trained). Returns 'filtered' or 'replay'.

    ``reason`` is free text ("all rewards equal"): the ledger keeps it (capped at 2,000 characters,
    like every reason); the per-reason counter is its normalised token, bounded in filter.lua.
    ``tokens``: what the attempt generated for the group, counted in counters.tokens_filtered (its
    waste: the scripts never see the samples of a filtered group)."""
    check_receipt(receipt)
    reply = yield p.build(keys, "filter", entry_id=receipt.entry_id, attempt=receipt.attempt,
                          worker_id=receipt.worker_id, reason=check_reason(reason, "filter reason"),
                          tokens=check_int(tokens, "tokens", 0, MAX_COMPLETION_TOKENS))
    return p.parse_ended(reply, "filter", receipt)


def heartbeat(keys: QueueKeys, worker_id: str, progress: Progress | None = None) -> Flow[HeartbeatInfo]:
    """Liveness, the policy version to follow, and (when given) the worker's own progress."""
    counts = ("", "", "", "", "") if progress is None else (
        progress.groups, progress.tokens, progress.uptime_ms,
        format_counts(progress.sample_tokens), format_counts(progress.sample_seconds))
    groups, tokens, uptime_ms, sample_tokens, sample_seconds = counts
    reply = yield p.build(keys, "heartbeat", worker_id=check_worker_id(worker_id), groups=groups, tokens=tokens,
                          uptime_ms=uptime_ms, sample_tokens=sample_tokens, sample_seconds=sample_seconds)
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
