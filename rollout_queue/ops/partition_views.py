"""Operator views of a logical queue: each read-only view of views.py run on every partition, merged.

A logical queue ``q`` with P partitions is P ordinary queues ``q#0 … q#P-1`` (scale/layout.py), so
every view here is the plain view run once per partition, and nothing else: what this module adds is
only the merge (counts summed with scale/layout.sum_stats, rows concatenated with their partition
named) and which partition an operator's entry or dead-letter ID means. With one partition each
flow is the plain view itself, the same reads and the same value.

Rules:
1. Read-only, like views.py: only read commands and the read-only ``stats`` script, so they run
   under the operator ACL role and never create anything.
2. A partition that does not answer is left out of the snapshot (``Snapshot.partitions`` has None
   for it, and ``unreachable`` names it), so one dead cluster node never blinds the operator to the
   others; views of rows (workers, leases, dead letters) and of one entry must read every partition
   and raise PartitionsUnreachable instead.
3. Entry and dead-letter IDs repeat across partitions (each partition's stream makes its own): an ID
   is taken as ``partition/id`` (the partition's name ``q#3`` or its index ``3``), or looked up in
   every partition; found in several, it is ambiguous (InvalidInput naming the candidates).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping, Sequence

from rollout_queue.core.errors import InvalidInput, NotFound, OutcomeUnknown, PartitionsUnreachable
from rollout_queue.core.flows import Flow, T
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import DeadLetter
from rollout_queue.ops import views
from rollout_queue.ops.view_models import (AtRiskView, AttemptView, DeadLetterView, DrainStatus, EntryView, HoldView,
                                           LeaseView, PelSummary, ReapedView, Snapshot, WorkerView)
from rollout_queue.scale.flows import each, guarded
from rollout_queue.scale.layout import Layout, sum_maps, sum_stats


def _all(layout: Layout, what: str, make: Callable[[QueueKeys], Flow[T]]) -> Flow[list[T]]:
    """``make`` on every partition, in order (PartitionsUnreachable if any does not answer)."""
    if layout.count == 1:
        return [(yield from make(layout.keys[0]))]
    got = yield from each(layout, what, lambda i: make(layout.keys[i]))
    return [got[i] for i in range(layout.count)]


# -- the snapshot ----------------------------------------------------------------------------------


def snapshot(layout: Layout) -> Flow[Snapshot]:
    """Everything `stats`, `top` and the exporter show: the plain snapshot for one partition, else the
    merge of every partition's own (those that did not answer left out; all missing: raised)."""
    if layout.count == 1:
        return (yield from views.snapshot(layout.keys[0]))
    parts: list[tuple[str, Snapshot | None]] = []
    for name, keys in zip(layout.names, layout.keys):
        try:
            part = yield from guarded(views.snapshot(keys), fast=True)
        except OutcomeUnknown:
            part = None
        parts.append((name, None if part is None else _named(part, name)))
    return merge_snapshots(parts)


def _named(snap: Snapshot, name: str) -> Snapshot:
    """A partition's snapshot with its rows naming the partition."""
    return replace(snap, workers=tuple(replace(w, partition=name) for w in snap.workers),
                   leases=tuple(replace(x, partition=name) for x in snap.leases),
                   holds=tuple(replace(h, partition=name) for h in snap.holds))


def merge_snapshots(parts: Sequence[tuple[str, Snapshot | None]]) -> Snapshot:
    """One Snapshot of the logical queue: stats summed (sum_stats: the lowest partition's version,
    staleness over every buffered group), the PEL summaries added, workers and leases concatenated
    (leases by deadline), the drain active while any partition's stands."""
    got = [s for _, s in parts if s is not None]
    if not got:
        raise PartitionsUnreachable("stats", (), tuple(name for name, _ in parts))
    stats = sum_stats([s.stats for s in got], len(parts) - len(got))
    pel = PelSummary(sum_maps([s.pel.attempts for s in got]), sum_maps([s.pel.states for s in got]),
                     tuple(a for s in got for a in s.pel.executing_ages_ms), sum(s.pel.sampled for s in got), any(s.pel.truncated for s in got),
                     _most([s.pel.oldest_ms for s in got]), _most([s.pel.oldest_by_worker for s in got]),
                     sum_maps([s.pel.pending_by_owner for s in got]), _least([s.pel.newest_by_owner for s in got]))
    leases = sorted((x for s in got for x in s.leases),
                    key=lambda x: (x.due_ms is None, x.due_ms or 0, x.partition))
    backlog = [s.backlog_oldest_ms for s in got if s.backlog_oldest_ms is not None]
    return Snapshot(stats, pel, tuple(w for s in got for w in s.workers), tuple(leases),
                    merge_drains([s.drain for s in got]),
                    _sum_counts([s.buffer_staleness for s in got]), max(backlog, default=None),
                    tuple(h for s in got for h in s.holds), push=got[0].push if got else None,
                    partitions=tuple(parts),
                    # the slowest partition's step: a stall is called no sooner than any partition's rule says
                    step_ms=max((s.step_ms for s in got if s.step_ms is not None), default=None))


def _sum_counts(parts: Sequence[Sequence[tuple[int, int]]]) -> tuple[tuple[int, int], ...]:
    """(value, count) pairs of several partitions as one, summed per value."""
    out: dict[int, int] = {}
    for pairs in parts:
        for value, n in pairs:
            out[value] = out.get(value, 0) + n
    return tuple(sorted(out.items()))


def _most(maps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Per key, the largest value any map has (the oldest wait over the partitions)."""
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = max(out.get(k, 0), v)
    return out


def _least(maps: Sequence[Mapping[str, int]]) -> dict[str, int]:
    """Per key, the smallest value any map has (the newest hand-over over the partitions)."""
    out: dict[str, int] = {}
    for m in maps:
        for k, v in m.items():
            out[k] = min(out.get(k, v), v)
    return out


def merge_drains(drains: Sequence[DrainStatus]) -> DrainStatus:
    """The drain of the logical queue: active while any partition's drain hold stands (a reserve or
    lease of that partition is refused), with the earliest deadline; executing groups summed."""
    active = [d for d in drains if d.active]
    deadlines = [d.deadline_ms for d in active if d.deadline_ms is not None]
    since = [d.since_ms for d in active if d.since_ms is not None]
    return DrainStatus(bool(active), min(deadlines) if deadlines else None, active[0].reason if active else "",
                       min(since) if since else None, sum(d.executing_groups for d in drains),
                       sum(d.other_holds for d in drains), max(d.server_ms for d in drains),
                       tuple(n for d in drains for n in d.garbage))


def drain_status(layout: Layout) -> Flow[DrainStatus]:
    """`drain status`: merge_drains over every partition (each must answer)."""
    found = yield from _all(layout, "drain_status", views.drain_status)
    return found[0] if layout.count == 1 else merge_drains(found)


def drain_statuses(layout: Layout) -> Flow[list[tuple[str, DrainStatus]]]:
    """Each partition's own drain status, in order."""
    found = yield from _all(layout, "drain_status", views.drain_status)
    return list(zip(layout.names, found))


# -- rows ------------------------------------------------------------------------------------------


def workers(layout: Layout) -> Flow[list[WorkerView]]:
    """Every partition's workers, each row naming its partition (a partitioned worker registers in
    each partition, so it has one row per partition: each heartbeat and its executing groups there;
    a plain queue's rows name none)."""
    found = yield from _all(layout, "workers", views.workers)
    if layout.count == 1:
        return found[0]
    return [replace(w, partition=name) for name, ws in zip(layout.names, found) for w in ws]


def leases(layout: Layout) -> Flow[list[LeaseView]]:
    """Every partition's active leases, the first due first, each naming its partition (a trainer's
    lease of a partitioned queue is one member lease per partition it took groups from)."""
    found = yield from _all(layout, "leases", views.leases)
    if layout.count == 1:
        return found[0]
    rows = [replace(x, partition=name) for name, ls in zip(layout.names, found) for x in ls]
    return sorted(rows, key=lambda x: (x.due_ms is None, x.due_ms or 0, x.partition))


def stragglers(layout: Layout, count: int = 20) -> Flow[tuple[list[AttemptView], bool]]:
    """The ``count`` oldest executing attempts over every partition, each naming its partition (a
    plain queue's name none), and whether some partition's PEL was only partly looked at."""
    found = yield from _all(layout, "stragglers", lambda keys: views.stragglers(keys, count))
    if layout.count == 1:
        return found[0]
    rows = [replace(a, partition=name) for name, (attempts, _) in zip(layout.names, found) for a in attempts]
    return sorted(rows, key=lambda a: -a.age_ms)[:count], any(truncated for _, truncated in found)


def at_risk(layout: Layout, within: int = 1) -> Flow[tuple[list[AtRiskView], bool]]:
    """Entries of every partition that at most ``within`` more counted failures dead-letter, each
    naming its partition (a plain queue's name none), fewest left first."""
    found = yield from _all(layout, "at_risk", lambda keys: views.at_risk(keys, within))
    if layout.count == 1:
        return found[0]
    rows = [replace(a, partition=name) for name, (entries, _) in zip(layout.names, found) for a in entries]
    return sorted(rows, key=lambda a: (a.left, a.partition, a.entry_id)), any(t for _, t in found)


def holds(layout: Layout) -> Flow[list[HoldView]]:
    """Every partition's standing holds, each naming its partition (a hold is opened on all of them)."""
    found = yield from _all(layout, "holds", views.holds)
    if layout.count == 1:
        return found[0]
    return [replace(h, partition=name) for name, hs in zip(layout.names, found) for h in hs]


def reaped(layout: Layout, count: int = 20) -> Flow[list[ReapedView]]:
    """The last ``count`` reaped-worker lines over every partition, newest first, naming each partition."""
    found = yield from _all(layout, "reaped", lambda keys: views.reaped(keys, count))
    if layout.count == 1:
        return found[0]
    rows = [replace(r, partition=name) for name, rs in zip(layout.names, found) for r in rs]
    return sorted(rows, key=lambda r: r.age_ms if r.age_ms is not None else 0)[:count]


def dead_letters(layout: Layout, count: int = 100) -> Flow[list[DeadLetter]]:
    """The oldest ``count`` dead letters of each partition, each naming its partition in ``queue``
    (a plain queue's as views.dead_letters has them)."""
    found = yield from _all(layout, "dead_letters", lambda keys: views.dead_letters(keys, count))
    if layout.count == 1:
        return found[0]
    return [replace(d, queue=name) for name, ds in zip(layout.names, found) for d in ds]


def letter_views(layout: Layout, letters: Sequence[DeadLetter]) -> Flow[list[DeadLetterView]]:
    """Dead letters (of dead_letters or dead_letter) as people read them, each with its own
    partition's clocks and, on a partitioned queue, its partition named; in the order given."""
    if layout.count == 1:
        return (yield from views.letter_views(layout.keys[0], letters))
    shown: dict[str, DeadLetterView] = {}
    for name, keys in zip(layout.names, layout.keys):
        mine = [d for d in letters if d.queue == name]
        for d, view in zip(mine, (yield from views.letter_views(keys, mine, name))):
            shown[f"{name}/{d.dlq_id}"] = view
    return [shown[f"{d.queue}/{d.dlq_id}"] for d in letters]


# -- one entry or dead letter ------------------------------------------------------------------------


def split_ref(layout: Layout, ref: str) -> tuple[int | None, str]:
    """(partition index or None, id) of ``partition/id`` or a bare ``id``. The partition is its
    name (``q#3``) or its index (``3``); a plain queue also takes its own name."""
    head, sep, tail = ref.rpartition("/")
    if not sep:
        return (0 if layout.count == 1 else None), ref
    if head in layout.names:
        return layout.names.index(head), tail
    if head.isascii() and head.isdecimal() and int(head) < layout.count:
        return int(head), tail
    raise InvalidInput(f"{ref!r}: {head!r} is no partition of {layout.name!r} (one of {', '.join(layout.names)}, "
                       f"or an index 0..{layout.count - 1})")


def qualified(layout: Layout, partition: str, ident: str) -> str:
    """How an ID is shown: bare on a plain queue, ``partition/id`` on a partitioned one."""
    return ident if layout.count == 1 else f"{partition}/{ident}"


def locate(layout: Layout, ref: str, what: str,
           make: Callable[[QueueKeys, str], Flow[T]]) -> Flow[tuple[int, T]]:
    """(partition index, ``make(keys, id)``) of ``ref``: in the partition it names, else in the one
    partition where ``make`` does not raise NotFound. Raises NotFound (nowhere), InvalidInput (in
    several: name the partition), PartitionsUnreachable (not found, and some partition did not answer)."""
    index, ident = split_ref(layout, ref)
    if index is not None:
        return index, (yield from make(layout.keys[index], ident))
    found: list[tuple[int, T]] = []
    failed: list[str] = []
    missing: NotFound | None = None
    for i, keys in enumerate(layout.keys):
        try:
            found.append((i, (yield from guarded(make(keys, ident), fast=False))))
        except NotFound as exc:
            missing = exc
        except OutcomeUnknown:
            failed.append(layout.names[i])
    if len(found) > 1:
        raise InvalidInput(f"{what} {ident} exists in {len(found)} partitions ({what} IDs repeat across partitions): "
                           "name one as " + " or ".join(f"{layout.names[i]}/{ident}" for i, _ in found))
    if found:
        return found[0]
    if failed:
        raise PartitionsUnreachable(f"find {what} {ident}", tuple(n for n in layout.names if n not in failed),
                                    tuple(failed))
    raise NotFound(f"{what} {ident} is in no partition of queue {layout.name!r}"
                   + (f" ({missing})" if missing is not None and layout.count == 1 else ""))


def _require_all(layout: Layout) -> Flow[None]:
    """NotFound naming the first partition that does not exist (a half-created queue)."""
    yield from _all(layout, "open", views.require_queue)


def entry(layout: Layout, ref: str) -> Flow[EntryView]:
    """`inspect`: views.entry in the partition ``ref`` names or the one where it is found."""
    if layout.count == 1:
        return (yield from views.entry(layout.keys[0], split_ref(layout, ref)[1]))
    yield from _require_all(layout)
    index, found = yield from locate(layout, ref, "entry", views.entry)
    return replace(found, partition=layout.names[index])


def dead_letter(layout: Layout, ref: str) -> Flow[DeadLetter]:
    """One dead letter by ``[partition/]dlq_id``, naming its partition in ``queue``."""
    if layout.count == 1:
        return (yield from views.dead_letter(layout.keys[0], split_ref(layout, ref)[1]))
    yield from _require_all(layout)
    index, found = yield from locate(layout, ref, "dead letter", views.dead_letter)
    return replace(found, queue=layout.names[index])
