"""Operations on a partitioned queue, written once as flows over the partitions' single-queue flows.

Each step here runs an ordinary flow of core/flows/ on one partition, so every state change is still
one script on one slot: nothing about a transition is implemented twice. What this module adds is
only *which* partitions, in what order, and what to do when one is unreachable:

- sweeps (reserve, lease, stats, reap, heartbeat) send their ops as fast ``Probe``s and skip a
  partition that does not answer, so a dead node stalls nobody;
- fan-outs (publish_version, holds, checkpoint, restore, close) must reach every partition: they
  run on all, then raise ``PartitionsUnreachable`` naming those that failed (all are idempotent per
  partition, so the caller repeats the call);
- a source group's operations (submit, complete, ...) go to the one partition that owns it.

Composite leases (gathering, commit, rollback) are in multi_lease.py.

Like core/flows/ this module touches no socket or clock of its own (``clock`` is injected); the
drivers (drivers/transport.py) send each op and throw a Probe's failure back in.

With one partition (``layout.count == 1``) every flow here is the plain queue's own flow from
core/flows/ and nothing else: the facade (rollout_queue.api) calls these flows for every queue,
so a plain queue pays nothing for being a partitioned queue of one.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable, Sequence, cast

from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.checks import check_int, check_items, check_seconds
from rollout_queue.core.config import QueueConfig
from rollout_queue.core.errors import (ConfigMismatch, InvalidInput, OutcomeUnknown, PartitionsUnreachable,
                                       ProtocolError, QueueNotFound, WorkersGone)
from rollout_queue.core.flows import Clock, Flow, T
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.liveness import SHOWN, FleetWatch, WorkerSeen, last_workers
from rollout_queue.core.models import (
    DeadLetter,
    HeartbeatInfo,
    Progress,
    QueueStats,
    ReapReport,
    Receipt,
    Reservation,
    Sample,
    SourceGroup,
    check_completions,
    check_group_sizes,
    check_receipt,
)
from rollout_queue.core.flows.owned import OwnedAttempt, owned_attempts
from rollout_queue.core.protocol import CompletionOutcome, Probe
from rollout_queue.scale.layout import (
    Layout,
    PartitionReceipt,
    Selector,
    largest_group,
    merge_heartbeats,
    share,
    split_config,
    sum_stats,
)

#: A blocked reserve or lease watches one partition's wake stream at a time for this long.
WAIT_SLICE_MS = 100


class Trace:
    """The last op a guarded flow sent and the reply it got (None while in flight)."""

    op: p.Op | None = None
    reply: Any = None


def guarded(flow: Flow[T], fast: bool, trace: Trace | None = None) -> Flow[T]:
    """Run ``flow`` with every op sent as a Probe: a failure raises OutcomeUnknown here, in the
    caller's flow, which decides whether to skip the partition or report it."""
    reply: Any = None
    while True:
        try:
            op = cast(p.Op, flow.send(reply))  # the flows guarded here send plain ops, never a Probe
        except StopIteration as stop:
            return stop.value
        if trace is not None:
            trace.op, trace.reply = op, None
        reply = yield Probe(op, fast)  # the driver unwraps it
        if trace is not None:
            trace.reply = reply


def each(layout: Layout, what: str, make: Callable[[int], Flow[T]],
         indices: Sequence[int] | None = None) -> Flow[dict[int, T]]:
    """Run ``make(i)`` on every partition (with the full retry window); then raise
    PartitionsUnreachable if any failed, having still run on all the others."""
    results: dict[int, T] = {}
    failed: list[str] = []
    for i in range(layout.count) if indices is None else indices:
        try:
            results[i] = yield from guarded(make(i), fast=False)
        except OutcomeUnknown:
            failed.append(layout.names[i])
    if failed:
        raise PartitionsUnreachable(what, tuple(layout.names[i] for i in results), tuple(failed))
    return results


def sweep(layout: Layout, sel: Selector, make: Callable[[int], Flow[T]], clock: Clock) -> Flow[dict[int, T]]:
    """Run ``make(i)`` on every partition that answers; unreachable ones are left out and marked down."""
    results: dict[int, T] = {}
    for i in range(layout.count):
        if sel.is_down(i, clock()):
            continue
        try:
            results[i] = yield from guarded(make(i), fast=True)
        except OutcomeUnknown:
            sel.mark_down(i, clock())
            continue
        sel.mark_up(i)
    return results


# -- queue ---------------------------------------------------------------------------------------


def open_partitioned(layout: Layout, config: QueueConfig | None,
                     create: bool = True) -> Flow[tuple[QueueConfig, ...]]:
    """Check (or record) the partition count, then open every partition with its share of ``config``
    (None: adopt each partition's stored share; a new partition gets its share of QueueConfig()).
    Returns each partition's config; ``partitions.logical_config`` sums them back.

    The count is recorded once with SET NX (idempotent, never changed) because placement by
    ``crc32(source_id) % P`` is only idempotent while P stays the same. Raises InvalidInput before
    anything is written if a logical bound is below P (split_config). ``create=False``: raise
    QueueNotFound for a queue that does not exist yet instead of creating it."""
    shares = split_config(config or QueueConfig(), layout.count)
    stored = yield p.Command(("GET", layout.record))
    if layout.count == 1 and stored is None:  # the plain queue (not one recorded as partitioned)
        return ((yield from flows.open_queue(layout.keys[0], config, create=create)),)
    if stored is None and layout.count > 1:
        if (yield p.Command(("EXISTS", QueueKeys(layout.name)["meta"]))):
            raise ConfigMismatch(layout.name, "partitions", "1", str(layout.count))
        if not create:
            raise QueueNotFound(layout.name)
        yield p.Command(("SET", layout.record, layout.count, "NX"))
        stored = yield p.Command(("GET", layout.record))
    have = 1 if stored is None else p.parse_count(stored, f"GET {layout.record}")
    if have != layout.count:
        raise ConfigMismatch(layout.name, "partitions", str(have), str(layout.count))
    # create=False reaches every partition too: a queue its creator is still opening (the count is
    # recorded, a partition not yet) is not found, never completed here with the default config.
    opened = yield from each(layout, "open", lambda i: flows.open_queue(layout.keys[i],
                                                                        shares[i] if config else None, shares[i],
                                                                        create=create))
    return tuple(opened[i] for i in range(layout.count))


def submit(layout: Layout, groups: Sequence[SourceGroup], shares: Sequence[QueueConfig]) -> Flow[list[str]]:
    """Backlog each group in its source_id's partition. Returns entry IDs in the order given (unique
    within a partition only). Partitions that answered keep their groups even if another failed.

    Every group is checked first: one with more samples than the smallest partition's share of
    max_executing_samples (``largest_group``) refuses the whole call with GroupTooLarge before
    anything is sent, whichever partition it would have gone to, so the rule does not depend on
    where a source_id hashes."""
    if layout.count == 1:
        return (yield from flows.submit(layout.keys[0], groups, shares[0].max_payload_bytes,
                                        shares[0].max_executing_samples))
    groups = check_items(groups, SourceGroup, "groups")
    check_group_sizes(groups, largest_group(shares), layout.count, sum(c.max_executing_samples for c in shares))
    max_payload_bytes = shares[0].max_payload_bytes
    by_partition: dict[int, list[int]] = defaultdict(list)
    for pos, g in enumerate(groups):
        by_partition[layout.of_source(g.source_id)].append(pos)
    out = [""] * len(groups)
    stored = yield from each(layout, "submit", lambda i: flows.submit(
        layout.keys[i], [groups[pos] for pos in by_partition[i]], max_payload_bytes), sorted(by_partition))
    for i, ids in stored.items():
        for pos, entry_id in zip(by_partition[i], ids):
            out[pos] = entry_id
    return out


def version(layout: Layout) -> Flow[int]:
    """The lowest policy version of any partition: the one every partition has reached."""
    if layout.count == 1:
        return (yield from flows.version(layout.keys[0]))
    versions = yield from each(layout, "version", lambda i: flows.version(layout.keys[i]))
    return min(versions.values())


def derive_admission(layout: Layout, batch_groups: int) -> Flow[tuple[int | None, ...]]:
    """derive_admission on every partition, each with its share of ``batch_groups`` (at least 1 per
    partition: a share of 0 would admit nothing there). Returns each partition's batch_groups in
    force after it (None: off)."""
    total = max(check_int(batch_groups, "batch_groups", 1), layout.count)
    if layout.count == 1:
        return ((yield from flows.derive_admission(layout.keys[0], total)),)
    got = yield from each(layout, "derive_admission",
                          lambda i: flows.derive_admission(layout.keys[i], share(total, layout.count, i)))
    return tuple(got[i] for i in range(layout.count))


def publish_version(layout: Layout, version: int, weights_uri: str | None, hold_id: str = "") -> Flow[bool]:
    """Publish on every partition in order; True if any partition took it as new."""
    if layout.count == 1:
        return (yield from flows.publish_version(layout.keys[0], version, weights_uri, hold_id))
    new = yield from each(layout, "publish_version",
                          lambda i: flows.publish_version(layout.keys[i], version, weights_uri, hold_id))
    return any(new.values())


def partition_stats(layout: Layout, sel: Selector, clock: Clock) -> Flow[dict[str, QueueStats | None]]:
    if layout.count == 1:
        return {layout.name: (yield from flows.stats(layout.keys[0]))}
    got = yield from sweep(layout, sel, lambda i: flows.stats(layout.keys[i]), clock)
    return {name: got.get(i) for i, name in enumerate(layout.names)}


def stats(layout: Layout, sel: Selector, clock: Clock, logical: QueueConfig | None = None) -> Flow[QueueStats]:
    """The sum over the partitions that answered (see partitions.sum_stats); ``logical``: the
    logical config, whose bounds the counters report even while a partition is unreachable."""
    if layout.count == 1:
        return (yield from flows.stats(layout.keys[0]))
    got = yield from sweep(layout, sel, lambda i: flows.stats(layout.keys[i]), clock)
    if not got:
        raise PartitionsUnreachable("stats", (), layout.names)
    return sum_stats([got[i] for i in sorted(got)], layout.count - len(got), logical)


def check_fleet(layout: Layout, sel: Selector, clock: Clock, logical: QueueConfig, watch: FleetWatch,
                groups: int, waited_s: float) -> Flow[None]:
    """After a blocking lease came back empty from a wait of ``waited_s``: one stats snapshot for
    ``watch`` (core/liveness.py), and WorkersGone, naming the last workers seen, once the fleet is
    gone. Only reads."""
    st = yield from stats(layout, sel, clock, logical)
    timeout_s = st.counters.get("worker_timeout_ms", int(logical.worker_timeout_s * 1000)) / 1000
    down_s = watch.observe(st, timeout_s, clock(), waited_s)
    if down_s is None:
        return
    seen: list[WorkerSeen] = []
    for i, keys in enumerate(layout.keys):
        try:  # what the message shows, best effort: a node down or garbage must not hide the verdict
            seen += yield from guarded(last_workers(keys, layout.names[i] if layout.count > 1 else ""), fast=True)
        except (OutcomeUnknown, ProtocolError):
            continue
    seen.sort(key=lambda w: (w.silent_s is None, w.silent_s or 0.0))
    raise WorkersGone(layout.name, groups, down_s, st, tuple(seen[:SHOWN]), timeout_s, watch.grace(timeout_s))


def reap(layout: Layout, sel: Selector, budget: int, clock: Clock) -> Flow[ReapReport]:
    if layout.count == 1:
        return (yield from flows.reap(layout.keys[0], budget))
    got = yield from sweep(layout, sel, lambda i: flows.reap(layout.keys[i], budget), clock)
    return sum(got.values(), ReapReport())


def settle_parked(layout: Layout) -> Flow[int]:
    """Settle what workers parked, in every partition (the reaper's pass does it too)."""
    if layout.count == 1:
        return (yield from flows.settle_parked(layout.keys[0])).settled
    got = yield from each(layout, "settle_parked", lambda i: flows.settle_parked(layout.keys[i]))
    return sum(r.settled for r in got.values())


def dead_letters(layout: Layout, count: int, start: str = "-") -> Flow[list[DeadLetter]]:
    """Up to ``count`` oldest dead letters of each partition from ``start`` (a dlq stream ID, applied
    in each partition), each naming its partition in ``queue``."""
    if layout.count == 1:
        return [replace(d, queue=layout.name) for d in (yield from flows.dead_letters(layout.keys[0], count, start))]
    got = yield from each(layout, "dead_letters", lambda i: flows.dead_letters(layout.keys[i], count, start))
    return [replace(d, queue=layout.names[i]) for i in sorted(got) for d in got[i]]


def requeue_dead_letter(layout: Layout, dlq_id: str, partition: str | None) -> Flow[str]:
    """Submit a dead letter's pristine group again in its partition (DeadLetter.queue); with one
    partition ``partition`` may be left out. Returns the new entry ID."""
    if partition is None and layout.count == 1:
        partition = layout.name
    if partition not in layout.names:
        raise InvalidInput(f"dead letter {dlq_id!r}: name its partition (DeadLetter.queue), one of {layout.names}, "
                           f"not {partition!r}: dlq IDs repeat across partitions")
    return (yield from flows.requeue_dead_letter(layout.keys[layout.names.index(partition)], dlq_id))


# -- worker side ---------------------------------------------------------------------------------


def reserve(layout: Layout, sel: Selector, worker_id: str, max_groups: int, max_samples: int, block_ms: int,
            clock: Clock, overcommit: bool = False) -> Flow[list[Reservation]]:
    """Up to ``max_groups`` reservations (``max_samples`` samples, 0: no cap) gathered over the
    partitions in the selector's order, waiting up to ``block_ms`` on their wake streams."""
    if layout.count == 1:
        return (yield from flows.reserve(layout.keys[0], worker_id, max_groups, max_samples, block_ms, clock, overcommit))
    max_groups, max_samples = check_int(max_groups, "max_groups", 1), check_int(max_samples, "max_samples")
    block_ms = check_int(block_ms, "block_ms")
    deadline = clock() + block_ms / 1000
    while True:
        if sel.refresh_due(clock()):
            yield from _refresh_backlog(layout, sel, clock)
        out: list[Reservation] = []
        wakes: dict[int, str] = {}
        for i in sel.order(clock()):
            groups = max_groups - len(out)
            samples = max_samples - sum(r.group.n for r in out) if max_samples else 0
            if groups <= 0 or (max_samples and samples <= 0):
                break
            if out and sel.estimate[i] == 0:
                continue  # known empty: only worth a call when nothing was found anywhere
            trace = Trace()
            try:
                # Only the call's first grant may be oversized (flows.reserve): overcommit until one arrives.
                got = yield from _reserve_one(layout, sel, i, worker_id, groups, samples, clock, trace,
                                              overcommit and not out)
            except OutcomeUnknown:
                if isinstance(trace.op, p.Call) and trace.op.script.name == "reserve":
                    sel.pending[i] = trace.op
                sel.mark_down(i, clock())
                continue
            sel.mark_up(i)
            out += [replace(r, receipt=PartitionReceipt(r.receipt.entry_id, r.receipt.attempt, r.receipt.worker_id,
                                                        layout.names[i])) for r in got]
            if len(got) >= groups or not (isinstance(trace.op, p.Call) and trace.op.script.name == "reserve"):
                sel.took(i, len(got), groups, drained=False)
                continue
            last = p.parse_reserve(trace.reply, worker_id)
            # Only 'empty' (or a short 'ok') means no work: a hold, backpressure or a full bound
            # refuses work that is there, and the partition is asked again next time.
            sel.took(i, len(got), groups, drained=last.status in ("ok", "empty"))
            if not got:
                wakes[i] = last.wake_id
        if out or block_ms <= 0:
            return out
        if not (yield from wait_any(layout, sel, "wake_work", wakes, deadline, clock)):
            return []


def _reserve_one(layout: Layout, sel: Selector, i: int, worker_id: str, groups: int, samples: int, clock: Clock,
                 trace: Trace, overcommit: bool = False) -> Flow[list[Reservation]]:
    keys = layout.keys[i]
    call = sel.pending.pop(i, None)
    if call is None:
        return (yield from guarded(flows.reserve(keys, worker_id, groups, samples, 0, clock, overcommit), True, trace))
    # Replay a reserve whose reply was lost, with its own request id: the script answers with the
    # grants it made then (possibly more than ``groups``: the worker asked for them back then).
    trace.op, trace.reply = call, None
    reply = trace.reply = yield Probe(call)
    r = p.parse_reserve(reply, worker_id)
    # As in flows.reserve: garbage is dead-lettered, never returned; progress records are read.
    return (yield from guarded(flows.reservations(keys, r), True, trace))


def _refresh_backlog(layout: Layout, sel: Selector, clock: Clock) -> Flow[None]:
    """Backlog + ready of each live partition: XLEN src - retained - kept, plus ZCARD ready."""
    def read(i: int) -> Flow[int]:
        keys = layout.keys[i]
        length = p.parse_count((yield p.Command(("XLEN", keys["src"]))), "XLEN src")
        ready = p.parse_count((yield p.Command(("ZCARD", keys["ready"]))), "ZCARD ready")
        counters = p.parse_hmget((yield p.Command(("HMGET", keys["counters"], "retained", "kept"))), ("retained", "kept"))
        retained, kept = (p.parse_count(counters[k], f"HGET counters {k}") for k in ("retained", "kept"))
        return max(0, length - retained - kept) + ready

    for i, available in (yield from sweep(layout, sel, read, clock)).items():
        sel.set_estimate(i, available)


def wait_any(layout: Layout, sel: Selector, role: str, wakes: dict[int, str], deadline: float,
             clock: Clock) -> Flow[bool]:
    """Watch the partitions' wake streams in turn (a blocking read spans one slot only) until one
    moves past the ID its last reply gave (True), or the deadline passes (False). Returns True after
    MAX_BLOCK_CHUNK_MS anyway, so the caller re-polls as the single-queue flows do."""
    if not wakes:
        return False  # every partition failed: the caller's own retry paces it
    chunk = flows.MAX_BLOCK_CHUNK_MS if len(wakes) == 1 else WAIT_SLICE_MS
    give_up = min(deadline, clock() + flows.MAX_BLOCK_CHUNK_MS / 1000)
    while True:
        for i, wake_id in wakes.items():
            remaining_ms = int((give_up - clock()) * 1000)
            if remaining_ms <= 0:
                return clock() < deadline
            try:
                moved = yield Probe(p.Command(("XREAD", "BLOCK", max(1, min(remaining_ms, chunk)), "COUNT", 1,
                                               "STREAMS", layout.keys[i][role], wake_id or "$")))
            except OutcomeUnknown:
                sel.mark_down(i, clock())
                continue
            if moved:
                sel.woke(i)
                return True


def settle_keys(layout: Layout, receipt: Receipt, worker_id: str) -> QueueKeys:
    """The keys of the partition that issued ``receipt``, once it is known to be ``worker_id``'s."""
    return layout.keys[layout.index(check_receipt(receipt, worker_id))]


def complete_many(layout: Layout, worker_id: str, items: Sequence[tuple[Receipt, Sequence[Sample]]],
                  max_payload_bytes: int) -> Flow[list[CompletionOutcome]]:
    """flows.complete_many per partition, the outcomes back in the order of ``items``. After
    OutcomeUnknown the whole call is safe to repeat: the items settled already replay."""
    items = check_completions(items, worker_id)
    if layout.count == 1:
        return (yield from flows.complete_many(layout.keys[0], worker_id, items, max_payload_bytes))
    by_partition: dict[int, list[int]] = defaultdict(list)
    for pos, (receipt, _) in enumerate(items):
        by_partition[layout.index(receipt)].append(pos)
    out: list[Any] = [None] * len(items)
    for i, positions in sorted(by_partition.items()):
        got = yield from flows.complete_many(layout.keys[i], worker_id, [items[pos] for pos in positions],
                                             max_payload_bytes)
        for pos, outcome in zip(positions, got):
            out[pos] = outcome
    return out


def owned(layout: Layout, worker_id: str, min_idle_ms: int) -> Flow[list[OwnedAttempt]]:
    """What the PEL of each partition gives ``worker_id`` (receipts naming their partition)."""
    if layout.count == 1:
        return (yield from owned_attempts(layout.keys[0], worker_id, min_idle_ms))
    out: list[OwnedAttempt] = []
    for i, keys in enumerate(layout.keys):
        for a in (yield from owned_attempts(keys, worker_id, min_idle_ms)):
            r = a.receipt
            out.append(replace(a, receipt=PartitionReceipt(r.entry_id, r.attempt, r.worker_id, layout.names[i])))
    return out


def heartbeat(layout: Layout, sel: Selector, worker_id: str, clock: Clock,
              progress: Progress | None = None) -> Flow[HeartbeatInfo]:
    """Heartbeat every partition (work reserved from any of them stays this worker's). The worker's
    progress is recorded on the first partition only, so that a sum over partitions counts it once."""
    if layout.count == 1:
        return (yield from flows.heartbeat(layout.keys[0], worker_id, progress))
    got = yield from sweep(layout, sel, lambda i: flows.heartbeat(layout.keys[i], worker_id,
                                                                 progress if i == 0 else None), clock)
    if not got:
        raise PartitionsUnreachable("heartbeat", (), layout.names)
    return merge_heartbeats(list(got.values()))


def close_worker(layout: Layout, worker_id: str, terminal: str, reason: str) -> Flow[tuple[int, int]]:
    if layout.count == 1:
        return (yield from flows.close_worker(layout.keys[0], worker_id, terminal, reason))
    got = yield from each(layout, "close_worker",
                          lambda i: flows.close_worker(layout.keys[i], worker_id, terminal, reason))
    return sum(r for r, _ in got.values()), sum(d for _, d in got.values())


# -- holds and checkpoints: every partition -------------------------------------------------------


def hold_open(layout: Layout, hold_id: str, timeout_s: float | None, holder: str, reason: str = "") -> Flow[int]:
    """Open the hold on every partition (same id). If some cannot be reached, the others are
    released again before PartitionsUnreachable is raised: a hold is all or nothing."""
    if layout.count == 1:
        return (yield from flows.hold_open(layout.keys[0], hold_id, timeout_s, holder, reason))
    try:
        waiting = yield from each(layout, "hold",
                                  lambda i: flows.hold_open(layout.keys[i], hold_id, timeout_s, holder, reason))
    except PartitionsUnreachable as exc:
        for name in exc.done:
            try:
                yield from guarded(flows.hold_release(layout.keys[layout.names.index(name)], hold_id), fast=False)
            except OutcomeUnknown:
                continue  # that partition's hold expires after hold_timeout_s by itself
        raise
    return sum(waiting.values())


def hold_wait(layout: Layout, hold_id: str, timeout_s: float, clock: Clock) -> Flow[bool]:
    """True once every partition's snapshot is terminal; False when ``timeout_s`` passes first."""
    timeout_s = check_seconds(timeout_s, "timeout_s", allow_zero=True)
    deadline = clock() + timeout_s
    for keys in layout.keys:
        if not (yield from flows.hold_wait(keys, hold_id, max(0.0, deadline - clock()), clock)):
            return False
    return True


def hold_release(layout: Layout, hold_id: str) -> Flow[int]:
    """Release on every partition; returns the most holds still active on any one of them."""
    if layout.count == 1:
        return (yield from flows.hold_release(layout.keys[0], hold_id))
    left = yield from each(layout, "hold_release", lambda i: flows.hold_release(layout.keys[i], hold_id))
    return max(left.values())


def checkpoint(layout: Layout, step: int) -> Flow[int]:
    if layout.count == 1:
        return (yield from flows.checkpoint(layout.keys[0], step))
    got = yield from each(layout, "checkpoint", lambda i: flows.checkpoint(layout.keys[i], step))
    return sum(got.values())


def restore(layout: Layout, step: int) -> Flow[int]:
    if layout.count == 1:
        return (yield from flows.restore(layout.keys[0], step))
    got = yield from each(layout, "restore", lambda i: flows.restore(layout.keys[i], step))
    return sum(got.values())
