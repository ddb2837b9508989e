"""Formatting of the views for people: titled tables, rendered with rich when it is installed (the
``cli`` extra) and as aligned plain text otherwise or when output is not a terminal.

Pure functions from view values to ``Section``s, and two renderers. No Redis here.
Rule: every value shown passes through ``clean`` (escape.py): ``section`` applies it to every title
and cell, common.print_line to every field, logs.py and the error line on stderr too, so text from
Redis (a source_id with a newline, a reason with ANSI escapes) can neither forge a line nor drive the
terminal; the rich renderer also escapes markup (``[bold]``), so brackets print as typed.
"""

from __future__ import annotations

import math
import shutil
import sys
import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from rollout_queue.cli import fit
from rollout_queue.core.models import SourceGroup, TokenWaste
from rollout_queue.ops.escape import clean
from rollout_queue.ops.view_models import (
    STATES,
    WAITING,
    AtRiskView,
    AttemptView,
    DeadLetterView,
    DrainStatus,
    EntryView,
    HoldView,
    LeaseView,
    PushView,
    ReapedView,
    Snapshot,
    VerifyReport,
    WorkerView,
    state_counts,
)

SPARKS = "▁▂▃▄▅▆▇█"
#: A table row before ``section`` cleans it: text, or a count (shown as its digits). A table whose
#: layout varies (a partition column, a "... N more" row) builds its rows as this.
Cells = tuple[str | int, ...]


@dataclass(frozen=True)
class Section:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    #: the columns shown whole however narrow the terminal (IDs to copy): the others wrap, or are cut
    whole: tuple[int, ...] = ()
    #: the columns of IDs, cut from the middle in the concise layout (fit.middle), free text from its end
    ids: tuple[int, ...] = ()
    #: the columns (reasons) the concise layout puts on a line of their own under each row
    below: tuple[int, ...] = ()


def section(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], whole: Sequence[int] = (),
            ids: Sequence[int] = (), below: Sequence[int] = ()) -> Section:
    """A table whose every title and cell is clean text (None shows as empty)."""
    return Section(clean(title), tuple(clean(c) for c in columns),
                   tuple(tuple("" if v is None else clean(v) for v in r) for r in rows), tuple(whole), tuple(ids),
                   tuple(below))


#: Beyond this a duration is shown as a bound: no stored time a script writes is this far away.
LONGEST_MS = 10_000 * 86_400_000


def duration(ms: int | float | None) -> str:
    """A signed duration for people: 850ms, 12.3s, 4m05s, 2h10m, 3d04h; '?' for a value that is no
    duration (NaN), '>10000d' beyond ~27 years (a garbage score of 1e308 is not 200 digits)."""
    if ms is None:
        return "-"
    if not isinstance(ms, (int, float)) or (isinstance(ms, float) and math.isnan(ms)):
        return "?"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms > LONGEST_MS:
        return f"{sign}>10000d"
    if ms < 1000:
        return f"{sign}{int(ms)}ms"
    s = ms / 1000
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 172_800:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86_400)}d{int(s % 86_400 // 3600):02d}h"


def _since(a: int | None, b: int | None) -> int | None:
    """a - b, or None when either is unknown (garbage in Redis)."""
    return None if a is None or b is None else a - b


def sparkline(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    top = max(known, default=0) or 1
    return "".join(" " if v is None else SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1)))]
                   for v in values)


def bar(n: int, most: int, width: int = 20) -> str:
    return "█" * max(1 if n else 0, round(n / most * width)) if most else ""


def progress_text(head: str) -> str:
    """A progress record's head (partial rollouts) in words; a head of another shape as it is."""
    parts = head.split("|", 4)
    if len(parts) != 5 or not all(x.isdigit() for x in parts[:4]):
        return f"GARBAGE {head!r}"
    attempt, tokens, version, size, worker = parts
    return (f"{tokens} tokens from version {version} left by attempt {attempt} ({worker}), {size} bytes: "
            "the next attempt continues them")


def states_section(snap: Snapshot) -> Section:
    st = snap.stats
    counts = state_counts(st)
    rows = [(s, counts[s], duration(snap.oldest_ms(s)) if s in WAITING else "", "") for s in STATES]
    rows[STATES.index("executing")] = ("executing", st.executing_groups, duration(snap.oldest_ms("executing")),
                                       f"{st.executing_samples} samples")
    rows[STATES.index("committed")] = ("committed", st.committed, "",
                                       f"{st.kept} kept until a checkpoint" if st.kept else "")
    rows.append(("retained", st.retained, "", "reservations in the PEL (ready + executing + completed + leased)"))
    rows.append(("ledger lines", st.ledger_lines, "", f"{st.source_ids} source ids; {st.counters.get('pruned', 0)} "
                 "settled lines pruned after settled_retention_s"))
    truncated = " (of the first PEL entries)" if snap.pel.truncated else ""
    return section("groups by state", ("state", "groups", "longest wait" + truncated, ""), rows)


def policy_section(snap: Snapshot) -> Section:
    st, drain = snap.stats, snap.drain
    staleness = "unknown (no version published)" if not st.version_published else (
        "buffer empty" if st.staleness_max is None else f"max {st.staleness_max}, mean {st.staleness_mean:.2f}")
    rows = [("policy version", st.version if st.version_published else "none published"),
            ("buffer staleness", staleness),
            ("admission", _admission(drain, st.active_holds, snap.holds)),
            ("admission control", admission_control(st)),
            ("staleness mode", staleness_mode_text(st)),
            ("last commit", "none yet" if st.since_commit_ms is None else f"{duration(st.since_commit_ms)} ago")]
    if snap.push is not None:
        rows.append(("last weights push", _push(snap.push)))
    rows += [(f"evicted ({k})", v) for k, v in sorted(st.evictions.items())]
    rows += [(f"attempts ended {k}", v) for k, v in sorted(st.terminals.items())]
    rows += [(f"filtered ({k})", v) for k, v in sorted(st.filtered_by_reason.items())]
    rows += token_rows(st.waste)
    return section("policy, staleness, evictions", ("", "value"), rows)


def count_text(n: int) -> str:
    """A count in at most 5 characters (12.3k, 4.5M), so a line of several fits 80 columns."""
    for unit, size in (("G", 10 ** 9), ("M", 10 ** 6), ("k", 10 ** 3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def tokens_text(w: TokenWaste) -> str:
    """``gen 12.3k · trained 10.1k (1.22 gen/trained) · discarded 2.2k · cont 512``: where generated
    tokens went, in one 80-column line (the reasons are `stats --full`'s rows)."""
    ratio = "" if w.per_trained is None else f" ({w.per_trained:.2f} gen/trained)"
    cont = f" · cont {count_text(w.continued)}" if w.continued else ""
    return (f"gen {count_text(w.generated)} · trained {count_text(w.trained)}{ratio} · "
            f"discarded {count_text(w.discarded_total)}{cont}")


def token_rows(w: TokenWaste) -> list[tuple[str, Any]]:
    """The token accounting for `stats --full`: each discard reason that threw tokens away, the ratio."""
    ratio = "nothing trained yet" if w.per_trained is None else f"{w.per_trained:.3f} (1.000 wastes nothing)"
    return ([("generated tokens", w.generated), ("trained tokens", w.trained), ("generated per trained", ratio)]
            + [(f"discarded tokens ({k})", v) for k, v in w.discarded.items() if v]
            + [("continued tokens (from progress)", w.continued)])


def admission_control(st: Any) -> str:
    """The queue's admission control for people: its batch, or that there is none (DESIGN: Capacity)."""
    batch = st.admission_batch
    if batch is None:
        return "no admission control: generation may run ahead of training without bound (batch_groups unset or none)"
    return f"batch_groups {batch}: at most (version + max_staleness + 1) x {batch} groups admitted, less those committed"


#: What each staleness mode does with work past the bound, for people (DESIGN: Staleness modes).
STALENESS_MODES = {"drop": "stale groups and prefixes are generated again",
                   "continue": "judged by their newest tokens; prefixes continue",
                   "pace": "nothing evicted for staleness; admission paces"}


def staleness_mode_text(st: Any) -> str:
    """``drop: stale groups ... (12 reserves waited for admission)``: the mode and how often admission
    control made a worker wait (what pace mode measures)."""
    mode = st.staleness_mode
    waits = st.counters.get("admission_waits", 0)
    waited = f" ({waits} reserves waited for admission)" if waits else ""
    return f"{mode}: {STALENESS_MODES.get(mode, 'unknown mode (garbage in meta)')}{waited}"


def _push(push: PushView) -> str:
    members = "" if push.world is None else f", {push.acked or 0} of {max(0, push.world - 1)} members received it"
    dropped = f", {push.dropped} dropped (they load the folder)" if push.dropped else ""
    ago = "" if push.age_ms is None else f", {duration(push.age_ms)} ago"
    return f"round {push.epoch} of version {push.version}: {push.state}{members}{dropped}{ago}"


def _admission(drain: DrainStatus, holds: int, who: Sequence[HoldView] = ()) -> str:
    if drain.active:
        ends = "? (garbage)" if drain.deadline_ms is None else duration(_since(drain.deadline_ms, drain.server_ms))
        return f"DRAINING ({drain.reason or 'no reason given'}), ends in {ends}"
    if not holds:
        return "open"
    named = "; ".join(hold_text(h) for h in who[:3]) + ("; ..." if len(who) > 3 else "")
    return f"HELD by {holds} admission hold(s)" + (f": {named}" if named else "")


def hold_text(h: HoldView) -> str:
    """``trainer-0 for 3.2s (weight update), ends in 56s``: who, how long, why, until when."""
    since = "" if h.held_ms is None else f" for {duration(h.held_ms)}"
    ends = "?" if h.remaining_ms is None else duration(h.remaining_ms)
    return f"{h.holder or 'unknown holder'}{since} ({h.reason or 'no reason given'}), ends in {ends}"


def holds_section(hs: Sequence[HoldView], partitioned: bool = False) -> Section:
    """Who holds admission: one row per standing hold (on a partitioned queue, per partition)."""
    cols = ("hold",) + (("partition",) if partitioned else ()) + ("holder", "held for", "reason", "ends in")
    rows = [(h.hold_id,) + ((h.partition,) if partitioned else ()) + (
        h.holder or "?", "-" if h.held_ms is None else duration(h.held_ms), h.reason,
        "?" if h.remaining_ms is None else duration(h.remaining_ms)) for h in hs]
    return section(f"admission holds: {len(hs)} standing" + (" (admission closed)" if hs else " (admission open)"),
                   cols, rows, whole=(0,), ids=(cols.index("holder"),), below=(cols.index("reason"),))


def reaped_section(rs: Sequence[ReapedView], partitioned: bool = False) -> Section:
    """Workers the queue gave up on, newest first: when, who, why, and what they held then."""
    cols = ("reaped", "worker") + (("partition",) if partitioned else ()) + (
        "terminal", "requeued", "dead", "entries", "groups/s", "reason")
    rows = [(f"{duration(r.age_ms)} ago", r.worker_id) + ((r.partition,) if partitioned else ()) + (
        r.terminal, r.requeued, r.dead, _ids(r.entry_ids), _rate(r.progress.groups_per_s if r.progress else None),
        r.reason) for r in rs]
    return section(f"reaped workers: the last {len(rs)}, newest first", cols, rows, ids=(1,),
                   below=(cols.index("reason"), cols.index("entries")))


def _ids(ids: Sequence[str], shown: int = 3) -> str:
    return ",".join(ids[:shown]) + (f" +{len(ids) - shown}" if len(ids) > shown else "") if ids else "-"


def _rate(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:.3g}"


def edge_text(edge: float | None, edges: Sequence[float], seconds: bool = False) -> str:
    """A quantile's bucket upper edge for people: ``512``, ``5.0s``; ``>32768`` above the last edge,
    ``-`` with no samples."""
    if edge is None:
        return "-"
    if math.isinf(edge):
        return ">" + edge_text(float(edges[-1]), edges, seconds)
    return duration(edge * 1000) if seconds else f"{edge:g}"


def samples_rows(snap: Snapshot) -> list[tuple[str, int, str, str, str, str]]:
    """(what, samples, p50, p90, p99, max) of sample lengths and durations."""
    rows = []
    for what, d, secs in (("tokens", snap.sample_tokens, False), ("seconds", snap.sample_seconds, True)):
        p50, p90, p99, top = (edge_text(v, d.edges, secs) for v in (d.p50, d.p90, d.p99, d.max))
        rows.append((what, d.count, p50, p90, p99, top))
    return rows


def samples_section(snap: Snapshot) -> Section:
    """How long samples (trajectories) are and take: quantiles as bucket upper edges, over the
    registered workers' counts since each started."""
    workers = snap.sample_tokens.workers
    return section(f"samples: lengths and durations reported by {workers} worker(s) since they started "
                   "(quantiles are bucket upper edges)", ("", "samples", "p50", "p90", "p99", "max"),
                   samples_rows(snap))


def attempts_section(snap: Snapshot) -> Section:
    pel = snap.pel
    most = max(pel.attempts.values(), default=0)
    rows = [(f"attempt {k}", v, bar(v, most)) for k, v in sorted(pel.attempts.items())]
    title = "attempts histogram (PEL delivery counts" + (f", first {pel.sampled} entries)" if pel.truncated else ")")
    return section(title, ("attempt", "groups", ""), rows)


def workers_section(ws: Sequence[WorkerView], limit: int = 20, partitioned: bool = False) -> Section:
    """One row per worker; on a partitioned queue one per worker and partition (sorted by worker),
    with a partition column, and the title counts each worker once (alive: alive in every partition
    it is registered in)."""
    columns = ("worker", "status", "last heartbeat", "executing", "oldest attempt", "groups/s", "tokens/s")
    rows: list[Cells]
    if not partitioned:
        alive = sum(1 for w in ws if w.alive)
        rows = [(w.worker_id, worker_status(w), duration(w.silent_ms), w.executing_groups) + _speed(w)
                for w in ws[:limit]]
        if len(ws) > limit:
            rows.append((f"... {len(ws) - limit} more",) + ("",) * (len(columns) - 1))
        return section(f"workers: {alive} alive, {len(ws) - alive} silent or unregistered", columns, rows, ids=(0,))
    ordered = sorted(ws, key=lambda w: (w.worker_id, w.partition))
    ids = {w.worker_id for w in ws}
    dead = {w.worker_id for w in ws if not w.alive}
    rows = [(w.worker_id, w.partition, worker_status(w), duration(w.silent_ms), w.executing_groups) + _speed(w)
            for w in ordered[:limit]]
    if len(ws) > limit:
        rows.append((f"... {len(ws) - limit} more",) + ("",) * len(columns))
    return section(f"workers: {len(ids - dead)} alive, {len(dead)} silent or unregistered in some partition "
                   f"({sum(w.executing_groups for w in ws)} groups executing)",
                   columns[:1] + ("partition",) + columns[1:], rows, ids=(0,))


def _speed(w: WorkerView) -> tuple[str, str, str]:
    """(oldest executing attempt's age, groups/s, tokens/s since the worker started)."""
    g = w.progress.groups_per_s if w.progress else None
    t = w.progress.tokens_per_s if w.progress else None
    return duration(w.oldest_attempt_ms), _rate(g), _rate(t)


def worker_status(w: WorkerView) -> str:
    if w.garbage:
        return "GARBAGE " + "; ".join(w.garbage)
    return "alive" if w.alive else ("unregistered" if w.last_heartbeat_ms is None else "SILENT")


def leases_section(ls: Sequence[LeaseView], limit: int = 20, partitioned: bool = False) -> Section:
    """One row per lease; on a partitioned queue one per member lease, with a partition column."""
    rows: list[Cells]
    if not partitioned:
        rows = [(lv.lease_id, lv.trainer, lv.groups, "?" if lv.version is None else lv.version, _holder(lv),
                 _deadline(lv)) for lv in ls[:limit]]
        return section(f"leases: {len(ls)} active", ("lease", "trainer", "groups", "version", "holder", "deadline"),
                       rows, whole=(0,), ids=(1,))
    rows = [(lv.lease_id, lv.partition, lv.trainer, lv.groups, "?" if lv.version is None else lv.version,
             _holder(lv), _deadline(lv)) for lv in ls[:limit]]
    return section(f"leases: {len(ls)} active in the partitions ({sum(lv.groups for lv in ls)} groups)",
                   ("lease", "partition", "trainer", "groups", "version", "holder", "deadline"), rows, whole=(0,),
                   ids=(2,))


def stragglers_section(attempts: Sequence[AttemptView], truncated: bool, partitioned: bool = False) -> Section:
    """The oldest executing attempts first: which entry, on which worker, for how long."""
    title = f"stragglers: the {len(attempts)} oldest executing attempts" + (
        " (of the first entries of a large PEL)" if truncated else "")
    rows: list[Cells]
    if partitioned:
        rows = [(a.entry_id, a.partition, a.worker_id, duration(a.age_ms), a.attempt) for a in attempts]
        return section(title, ("entry", "partition", "worker", "age", "attempt"), rows, whole=(0,), ids=(2,))
    rows = [(a.entry_id, a.worker_id, duration(a.age_ms), a.attempt) for a in attempts]
    return section(title, ("entry", "worker", "age", "attempt"), rows, whole=(0,), ids=(1,))


def at_risk_section(entries: Sequence[AtRiskView], truncated: bool, partitioned: bool = False) -> Section:
    """Entries closest to the dead-letter queue first, with the last reason they failed."""
    title = f"at risk: {len(entries)} entries near max_attempts" + (
        " (of the first histories of a large queue)" if truncated else "")
    cols = ("entry",) + (("partition",) if partitioned else ()) + ("failures", "left", "last terminal", "last reason")
    rows = [(a.entry_id,) + ((a.partition,) if partitioned else ()) + (a.counted_failures, a.left, a.last_terminal,
                                                                      a.last_reason) for a in entries]
    return section(title, cols, rows, whole=(0,), below=(len(cols) - 1,))


def partitions_section(snap: Snapshot) -> Section:
    """One row per partition of a partitioned queue, then the total (the sum the other sections show);
    a partition that did not answer says so."""
    columns = ("partition",) + STATES + ("version", "workers", "leases", "admission")
    rows: list[tuple[Any, ...]] = []
    for name, part in snap.partitions:
        if part is None:
            rows.append((name, "UNREACHABLE") + ("",) * (len(columns) - 2))
            continue
        counts = state_counts(part.stats)
        rows.append((name, *(counts[s] for s in STATES),
                     part.stats.version if part.stats.version_published else "-",
                     sum(1 for w in part.workers if w.alive), len(part.leases),
                     _admission(part.drain, part.stats.active_holds, part.holds)))
    total = state_counts(snap.stats)
    alive = {w.worker_id for w in snap.workers} - {w.worker_id for w in snap.workers if not w.alive}
    rows.append(("total", *(total[s] for s in STATES),
                 snap.stats.version if snap.stats.version_published else "-", len(alive), len(snap.leases),
                 _admission(snap.drain, snap.stats.active_holds)))
    down = snap.unreachable
    title = f"partitions: {len(snap.partitions)}" + (f", {len(down)} UNREACHABLE (left out of the totals: "
                                                     f"{', '.join(down)})" if down else "")
    return section(title, columns, rows)


def _holder(lv: LeaseView) -> str:
    """The holder's last beat, and when the reaper takes the lease if the holder stays silent."""
    if lv.silent_ms is None:
        return "never beat (deadline only)"
    if not lv.holder_silent:
        return f"beat {duration(lv.silent_ms)} ago"
    return f"SILENT {duration(lv.silent_ms)}, " + (
        "due: the reaper rolls it back" if lv.overdue else f"rolled back in {duration(lv.due_in_ms)}")


def _deadline(lv: LeaseView) -> str:
    left = "?" if lv.remaining_ms is None else (
        f"in {duration(lv.remaining_ms)}" if lv.remaining_ms >= 0 else f"OVERDUE {duration(-lv.remaining_ms)}")
    return left + (f" (GARBAGE {'; '.join(lv.garbage)})" if lv.garbage else "")


def snapshot_sections(snap: Snapshot) -> list[Section]:
    parted = bool(snap.partitions)
    return ([partitions_section(snap)] if parted else []) + [
        states_section(snap), policy_section(snap), attempts_section(snap), samples_section(snap),
        workers_section(snap.workers, partitioned=parted), leases_section(snap.leases, partitioned=parted)]


def _prompt(group: SourceGroup) -> str:
    """A group's prompt as a table shows it: its first 200 characters."""
    return group.prompt if len(group.prompt) <= 200 else group.prompt[:200] + "…"


def entry_sections(e: EntryView) -> list[Section]:
    rows: list[tuple[Any, ...]] = ([("partition", e.partition)] if e.partition else []) + [
        ("state", e.state), ("owner (PEL)", e.owner or "none"),
                                   ("attempt", e.attempt), ("counted failures", e.counted_failures)]
    if e.idle_ms is not None:
        rows.append(("since delivery", duration(e.idle_ms)))
    if e.worker_id:
        beat = "never registered" if e.worker_heartbeat_ms is None else duration(e.server_ms - e.worker_heartbeat_ms) + " ago"
        # The ID on a row of its own: a long one cut from the middle still leaves its status whole.
        rows += [("worker", e.worker_id), ("worker status", f"{'alive' if e.worker_alive else 'SILENT'}, last heartbeat {beat}")]
    if e.lease_id:
        rows.append(("lease", f"{e.lease_id} by {e.lease_trainer}, deadline in "
                     f"{duration(_since(e.lease_deadline_ms, e.server_ms))}"))
    if e.min_version is not None:
        rows.append(("oldest sample version", f"{e.min_version} (staleness {e.staleness} at version {e.version})"))
    if e.completion_bytes is not None:
        rows.append(("completion", f"{e.completion_bytes} bytes"))
    if e.progress is not None:
        rows.append(("progress", progress_text(e.progress)))
    if e.dlq_id:
        rows.append(("dead letter", f"{e.dlq_id}: {e.dead_reason}"))
    if e.requeued_as:
        rows.append(("requeued as", f"{e.requeued_as} (its dead letter was requeued: the group lives on there)"))
    elif e.state == "dead" and not e.dlq_id:
        rows.append(("dead letter", "no longer in the DLQ (purged, or beyond the last entries inspect reads)"))
    rows += [("ledger", e.ledger or "-"), ("source_id", e.source_id or "-"), ("n", e.n or "-")]
    if e.group is not None:
        rows.append(("prompt", _prompt(e.group)))
    if e.garbage:
        rows.append(("GARBAGE (unreadable in Redis)", "; ".join(e.garbage)))
    history = [(a.attempt, a.worker_id, a.terminal, a.reason) for a in e.history]
    return [section(f"entry {e.entry_id}", ("", ""), rows, whole=(0,), ids=(1,)),
            section(f"attempts that ended without a completion: {len(history) or 'none'}",
                    ("attempt", "worker", "terminal", "reason"), history,
                    ids=(1,), below=(3,))]


def utc(ms: int, sep: str = " ") -> str:
    """A server time (ms since the epoch) in UTC, to the second: ``2025-06-01 12:00:03Z``; ``sep="T"``
    gives ISO 8601 (sortable, for scripts)."""
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime(f"%Y-%m-%d{sep}%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # a dlq ID written by hand, beyond any calendar
        return "?"


def letter_id(d: DeadLetterView, ident: str) -> str:
    """An ID as the commands take it back: bare on a plain queue, ``partition/ID`` on a partitioned one."""
    return f"{d.partition}/{ident}" if d.partition else ident


def letter_why(d: DeadLetterView) -> str:
    """Why it died, then what its last attempt said (usually the thing to fix)."""
    last = d.last
    if last is None or not (last.terminal or last.reason):
        return d.letter.reason
    return f"{d.letter.reason}; last attempt {last.terminal}: {last.reason}"


def letter_fields(d: DeadLetterView) -> tuple[str, ...]:
    """`dlq list` piped: one tab-separated line (no header, so `cut -f1` feeds `dlq show`)."""
    letter, last = d.letter, d.last
    return (letter_id(d, letter.dlq_id), letter_id(d, letter.entry_id), letter.source_id, f"attempt={letter.attempt}",
            f"died={utc(d.died_ms, 'T')}", letter.reason, f"last={last.terminal}: {last.reason}" if last else "last=")


def dead_letters_section(ds: Sequence[DeadLetterView], queue: str) -> Section:
    """`dlq list` on a terminal: oldest first, when each died and why."""
    rows = [(letter_id(d, d.letter.dlq_id), d.letter.source_id, d.letter.attempt, f"{duration(d.age_ms)} ago",
             letter_why(d)) for d in ds]
    return section(f"dead letters of queue {queue}: {len(ds)}, oldest first (more: `dlq show ID`)",
                   ("dead letter", "source_id", "attempts", "died", "why"), rows, whole=(0,), ids=(1,), below=(4,))


def letter_sections(d: DeadLetterView) -> list[Section]:
    """`dlq show`: the dead letter, then every attempt it carries, oldest first."""
    letter = d.letter
    rows: list[tuple[Any, ...]] = ([("partition", d.partition)] if d.partition else []) + [
        ("entry", letter.entry_id), ("source_id", letter.source_id or "-"), ("reason", letter.reason),
        ("died", f"{utc(d.died_ms)} ({duration(d.age_ms)} ago)"),
        ("attempts", f"{letter.attempt} ({d.counted_failures} counted toward max_attempts)"),
        ("last worker", letter.worker_id or "-")]
    if letter.group is not None:
        rows += [("n", letter.group.n), ("prompt", _prompt(letter.group))]
    else:
        rows.append(("group", "its pristine payload does not decode"))
    if d.garbage:
        rows.append(("GARBAGE (unreadable in Redis)", "; ".join(d.garbage)))
    rows.append(("next", f"`rollout-queue dlq requeue {letter_id(d, letter.dlq_id)} --yes` once fixed"))
    attempts = [(a.attempt, a.worker_id, a.terminal, "?" if ago is None else f"{duration(ago)} ago", a.reason)
                for a, ago in zip(d.attempts, d.ago_ms)]
    return [section(f"dead letter {letter_id(d, letter.dlq_id)}", ("", ""), rows, whole=(0,), ids=(1,)),
            section("its attempts", ("attempt", "worker", "terminal", "ended", "reason"), attempts, ids=(1,),
                    below=(4,))]


#: `verify`'s checks: the promise each states, and the problem kinds (view_models.WHAT) that break it.
VERIFY_CHECKS = (
    ("every group in exactly one state", ("settled_owned", "commit_not_settled", "committed_without_line", "garbage")),
    ("none committed twice", ("committed_twice",)),
    ("none lost", ("lost",)),
    ("none owned or waiting (--final)", ("not_settled",)),
)


#: Where a group in each state is, in a few words (DESIGN: States).
STATE_MEANING = {"backlog": "never reserved yet", "ready": "requeued, waits for a worker",
                 "executing": "on a worker", "completed": "in the buffer", "leased": "in a trainer's lease",
                 "committed": "trained", "filtered": "consumed, never trained", "dead": "in the dead letters",
                 "lost": "in none of these: a problem"}


def verify_sections(r: VerifyReport) -> list[Section]:
    """`verify`'s tables: the submitted groups by state, then each promise with its result."""
    states = section(f"verify: the {r.submitted} groups of queue {r.queue}", ("state", "groups", "where"),
                     [(s, n, STATE_MEANING.get(s, "")) for s, n in r.states.items()])
    failing = {x.kind: x.groups for x in r.problems}
    rows = []
    for promise, kinds in VERIFY_CHECKS:
        bad = sum(failing.get(k, 0) for k in kinds)
        if bad:
            rows.append((promise, f"FAIL: {bad} group(s)"))
        elif kinds == ("not_settled",) and not r.final:
            rows.append((promise, f"not checked (--final): {r.unsettled} still move"))
        else:
            rows.append((promise, "ok"))
    trimmed = (f"{r.commit_lines_trimmed} older lines trimmed past commits_maxlen ({r.committed_unlisted} committed "
               "groups lost their line: a second commit of them cannot be seen)" if r.commit_lines_trimmed
               else "none trimmed")
    rows += [("commits stream", f"{r.commit_lines} line(s) read, {trimmed}"),
             ("committed again after a restore", f"{r.recommitted_after_restore} group(s)")]
    return [states, section("the promise (DESIGN: Guarantees)", ("check", "result"), rows)]


def verify_verdict(r: VerifyReport, width: int = 80) -> str:
    """The verdict and each problem, wrapped to ``width``: what is wrong, some entry IDs, what to do."""
    if r.ok:
        return "\n".join(textwrap.wrap(clean(
            f"PASS: the {r.submitted} submitted groups of queue {r.queue} are each in one state, none committed "
            "twice, none lost" + (", all settled" if r.final else "")), width)) + "\n"
    out = textwrap.wrap(clean(f"FAIL: {len(r.problems)} problem(s) in queue {r.queue} (`rollout-queue inspect ID` "
                              "shows an entry; DESIGN.md, Guarantees, says what must hold):"), width)
    for x in r.problems:
        shown = f"e.g. {', '.join(x.examples)}" if x.examples else ""
        out += textwrap.wrap(clean(f"- {x.kind}: {x.groups} group(s) {x.what}. {shown}"), width,
                             subsequent_indent="  ")
    return "\n".join(out) + "\n"


def emit(sections: Sequence[Section], full: bool = False, reserve: int = 0, rich_ok: bool = True) -> None:
    """Print the sections. On a terminal: by default laid out to fit it (fit.py; ``reserve`` lines
    kept for what the command prints after them), with ``full`` every table whole (rich when it is
    installed). Piped: plain aligned text, nothing left out (scripts grep it; --json parses)."""
    if not sys.stdout.isatty():
        sys.stdout.write(plain(sections))
    elif not full:
        width, height = terminal_size()
        sys.stdout.write("\n".join(concise(sections, width, height - reserve)) + "\n")
    elif (group := rich_group(sections) if rich_ok else None) is not None:
        from rich.console import Console

        Console().print(group)
    else:
        sys.stdout.write(plain(sections))
    sys.stdout.flush()


def terminal_size() -> tuple[int, int]:
    """(columns, lines) of stdout's terminal, less two lines: the command's own line and the prompt
    after it stay on the screen with the output."""
    size = shutil.get_terminal_size((80, 24))
    return max(size.columns, 20), max(size.lines - 2, 6)


def concise(sections: Sequence[Section], width: int, height: int) -> list[str]:
    """The sections laid out for a ``width`` x ``height`` terminal (fit.py)."""
    return fit.fit_lines([fit.section_blocks(s.title, s.columns, s.rows, width, s.ids, s.whole, s.below)
                          for s in sections], width, height)


def rich_group(sections: Sequence[Section]) -> Any:
    """The sections as one rich renderable, or None when rich (the ``cli`` extra) is not installed."""
    try:
        from rich.console import Group
        from rich.markup import escape
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        return None
    tables: list[Any] = []
    for s in sections:
        if not any(s.columns) and not s.rows:  # a title alone (stats' "queue X"): an empty Table draws nothing
            tables.append(Text(s.title))
            continue
        table = Table(title=escape(s.title), title_justify="left", show_header=any(s.columns))
        for i, c in enumerate(s.columns):
            widest = max((len(row[i]) for row in s.rows), default=0) if i in s.whole else None
            # An ID is never cut with an ellipsis here (--full shows everything): folded over lines.
            table.add_column(escape(c), min_width=widest, no_wrap=i in s.whole,
                             overflow="fold" if i in s.ids else "ellipsis")
        for row in s.rows:
            table.add_row(*(escape(v) for v in row))  # reasons and prompts may hold [brackets]
        tables.append(table)
    return Group(*tables)


def plain(sections: Sequence[Section]) -> str:
    width = shutil.get_terminal_size((120, 40)).columns
    out = []
    for s in sections:
        out.append(f"== {s.title}")
        rows = ([s.columns] if any(s.columns) else []) + list(s.rows)
        widths = [max(len(r[i]) for r in rows) for i in range(len(s.columns))] if rows else []
        for r in rows:
            out.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip()[:max(width, 80) * 2])
        out.append("")
    return "\n".join(out) + "\n"
