"""`rollout-queue top`'s screen: what is urgent first, then the queue at a glance, in any terminal.

An operator opens `top` during an incident, often in a small pane. So the frame is plain lines laid
out for the terminal's exact size (no table borders): a header, then one line per urgent condition
(a silent worker, a lease whose holder went silent or that is overdue, a held admission and by whom,
a drain, a stalled trainer by the run's own step time (view_models.stall_after_ms), an unreachable
partition, dead letters), then states with their longest waits, rates and the policy
line, where the generated tokens went (tokens: generated, trained, discarded, continued from
progress) and a line saying so when the queue has no admission control, then as many worker and lease
rows as the height leaves, urgent rows first (silent workers, overdue leases) and a "... N more"
line for the rest. Every line is cut to the width, and IDs are cut from their middle (fit.middle)
so that the pid:nonce telling two workers on one host apart stays. `stats` on a terminal prints the
same frame once, without rates (its concise default; `stats --full` prints every table). Pure
functions of a Snapshot: no Redis, no terminal here (status.py draws them).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rollout_queue.cli.fit import middle
from rollout_queue.cli.render import WAITING, _rate, duration, edge_text, hold_text, sparkline, tokens_text, worker_status
from rollout_queue.ops.escape import clean
from rollout_queue.ops.view_models import LeaseView, SampleDistribution, Snapshot, WorkerView

#: The `rates` keys (status.RATES labels) of groups in, completed and out, in that order.
RATE_LABELS = ("in/s (submitted)", "completed/s", "out/s (committed)")
#: State names short enough for two 80-column lines (groups per state, and the longest wait in each).
SHORT = {"backlog": "backlog", "ready": "ready", "executing": "exec", "completed": "done", "leased": "leased"}
#: The smallest frame laid out; a smaller terminal gets this many lines cut to its width.
MIN_HEIGHT, MIN_WIDTH = 12, 40
#: The narrowest a worker or trainer ID is cut to in an urgent line: the ID gets what the rest of the
#: line leaves, because the rest (how long silent, what it holds, when it goes back) is the news.
URGENT_ID = 12
#: The narrowest ID column of the worker and lease rows (wider terminals give it the rest of the line).
ID_COLUMN = 24


def _per_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def urgent_lines(snap: Snapshot, width: int = 80) -> list[str]:
    """One line per condition an operator must look at now, most urgent first (empty: all is well).
    Whole-queue conditions (admission, partitions) come before per-row ones, and many silent
    workers or overdue leases collapse into a count, so one cause never pushes the others away.
    A worker or trainer ID is cut from its middle to what its line leaves of ``width``: the frame
    cuts every line at the width, and the end of an alarm (when a lease goes back) must survive it."""
    out = [f"! partition {name} UNREACHABLE: its groups are left out below" for name in snap.unreachable]
    if snap.drain.active:
        out.append(f"! DRAINING ({snap.drain.reason or 'no reason given'}), {snap.drain.executing_groups} "
                   "group(s) still executing")
    out += [f"! admission HELD by {hold_text(h)}" for h in snap.holds
            if h.hold_id != "operator-drain"]
    if snap.stats.active_holds and not snap.holds and not snap.drain.active:
        out.append(f"! admission HELD by {snap.stats.active_holds} hold(s)")
    silent = sorted((w for w in snap.workers if not w.alive), key=lambda w: -(w.silent_ms or 0))
    lines = []
    for w in silent:
        what = "unregistered PEL consumer" if w.last_heartbeat_ms is None and not w.garbage else (
            f"{worker_status(w)} for {duration(w.silent_ms)}")
        tail = f" {what}, holding {w.executing_groups} group(s)" + (
            f", oldest {duration(w.oldest_attempt_ms)}" if w.oldest_attempt_ms is not None else "")
        lines.append(_with_id("! worker ", w.worker_id, tail, width))
    out += _collapsed(lines, "workers silent or unregistered")
    out += _collapsed([_lease_alarm(lv, width) for lv in snap.leases if lv.holder_silent or lv.overdue],
                      "leases silent or overdue")
    st = snap.stats
    if st.completed and st.since_commit_ms is not None and st.since_commit_ms > snap.stall_after_ms:
        steps = "" if snap.step_ms is None else f" (steps take {duration(snap.step_ms)})"
        out.append(f"! trainer stalled? last commit {duration(st.since_commit_ms)} ago{steps}, {st.completed} "
                   "completed group(s) waiting")
    if st.dead:
        out.append(f"! {st.dead} dead letter(s): rollout-queue dlq list")
    return out


def _with_id(head: str, ident: str, tail: str, width: int) -> str:
    """``head + ident + tail`` in ``width`` characters where it can be: the ID cut from its middle to
    the room the rest leaves (never below URGENT_ID; the frame then cuts the line's end)."""
    return head + middle(ident, max(URGENT_ID, width - len(head) - len(tail))) + tail


def _lease_alarm(lv: LeaseView, width: int = 80) -> str:
    """A lease whose holder stopped beating (likely dead: it goes back at its due time), or overdue:
    its ID (what `leases rollback` takes), then how long silent or late, its groups and when the
    reaper takes it back; its trainer (the lease rows name it too) only where the width leaves room."""
    groups = f"{lv.groups} group(s)"
    if lv.holder_silent:
        when = (": reaper rolls it back" if lv.overdue else
                f": rolled back in {duration(lv.due_in_ms)}" if lv.due_in_ms is not None else "")
        rest = f"holder SILENT {duration(lv.silent_ms)}, {groups}{when}"
    else:
        late = lv.remaining_ms if lv.remaining_ms is not None and lv.remaining_ms < 0 else lv.due_in_ms
        rest = f"OVERDUE by {duration(-(late or 0))}, {groups}: reaper rolls it back"
    head, tail = f"! lease {lv.lease_id} (", f") {rest}"
    if width - len(head) - len(tail) >= min(len(lv.trainer), URGENT_ID):
        return _with_id(head, lv.trainer, tail, width)
    return f"! lease {lv.lease_id} {rest}"


def holder_text(lv: LeaseView) -> str:
    """``beat 3.2s`` (its holder beats), ``SILENT 42.0s`` (missed two beats), ``-`` (never beat: the
    deadline alone decides)."""
    if lv.silent_ms is None:
        return "-"
    return f"{'SILENT' if lv.holder_silent else 'beat'} {duration(lv.silent_ms)}"


def samples_line(snap: Snapshot) -> str | None:
    """``samples 1200 · tokens p50/90/99 512/2048/8192 · seconds 5.0s/20.0s/1m00s``: quantiles as
    bucket upper edges, over the registered workers since they started; None before any sample."""
    tokens, seconds = snap.sample_tokens, snap.sample_seconds
    if not tokens.count and not seconds.count:
        return None

    def quantiles(d: SampleDistribution, secs: bool) -> str:
        return "/".join(edge_text(v, d.edges, secs) for v in (d.p50, d.p90, d.p99))

    return (f"samples {max(tokens.count, seconds.count)} · tokens p50/90/99 {quantiles(tokens, False)} · "
            f"seconds {quantiles(seconds, True)}")


def _collapsed(lines: list[str], what: str, keep: int = 3) -> list[str]:
    """At most ``keep`` lines: the first ones, then a count of the rest."""
    if len(lines) <= keep:
        return lines
    return lines[:keep - 1] + [f"! ... {len(lines) - keep + 1} more {what}"]


def _worker_order(w: WorkerView) -> tuple[int, int]:
    """Silent and unregistered first (longest silent first), then the oldest running attempt."""
    return (0 if not w.alive else 1, -(w.silent_ms or 0) if not w.alive else -(w.oldest_attempt_ms or 0))


def worker_lines(ws: Sequence[WorkerView], room: int, width: int = 80, more: str = "") -> list[str]:
    """The worker rows, silent first, in ``room`` lines of ``width`` (also `workers`' concise view)."""
    if room <= 0:
        return []
    rows = sorted(ws, key=_worker_order)
    alive = sum(1 for w in ws if w.alive)
    wid = max(ID_COLUMN, width - 47)  # the indent and the other columns take 47 characters
    head = [f"workers: {alive} alive, {len(ws) - alive} silent", f"  {'WORKER':<{wid}} {'STATUS':<8} {'BEAT':>7} "
            f"{'EXEC':>4} {'OLDEST':>7} {'GRP/S':>6} {'TOK/S':>7}"]
    body = []
    for w in rows:
        p = w.progress
        status = "GARBAGE" if w.garbage else worker_status(w)
        body.append(f"  {middle(w.worker_id, wid):<{wid}} {status:<8} {duration(w.silent_ms):>7} "
                    f"{w.executing_groups:>4} {duration(w.oldest_attempt_ms):>7} "
                    f"{_rate(p.groups_per_s if p else None):>6} {_rate(p.tokens_per_s if p else None):>7}")
    return _fit(head, body, room, more)


def lease_lines(ls: Sequence[LeaseView], room: int, width: int = 80, more: str = "") -> list[str]:
    """The lease rows, the first due first (a silent holder's before the rest), in ``room`` lines of
    ``width`` (also `leases`' concise view). The lease ID is never cut: it is what `inspect` and
    `leases rollback` take. HOLDER is its holder's last beat (SILENT after two missed beats), or
    OVERDUE past the deadline. DUE is when the reaper takes it back: its deadline while its holder
    beats, the silence bound once it went silent (a dead trainer's lease goes back in seconds, not at
    a deadline minutes away: the column must not say otherwise). The policy version is left to
    `--full`, so that the trainer's host and pid:nonce both fit 80 columns."""
    if room <= 0:
        return []
    lid = max([16] + [len(lv.lease_id) for lv in ls])
    # The indent, groups, holder (SILENT 42.0s) and when it is due (23h59m ago) take 32.
    tid = max(12, width - lid - 32)
    silent = sum(1 for lv in ls if lv.holder_silent)
    head = [f"leases: {len(ls)} active" + (f", {silent} with a SILENT holder" if silent else ""),
            f"  {'LEASE':<{lid}} {'TRAINER':<{tid}} {'GRPS':>4} {'HOLDER':<12} DUE"]
    body = []
    for lv in sorted(ls, key=lambda x: (x.due_ms is None, x.due_ms or 0)):
        late = lv.remaining_ms is not None and lv.remaining_ms < 0
        if lv.holder_silent and lv.due_in_ms is not None and not late:
            left = "now" if lv.due_in_ms < 0 else f"in {duration(lv.due_in_ms)}"
        else:
            left = "?" if lv.remaining_ms is None else (
                f"{duration(-lv.remaining_ms)} ago" if late else f"in {duration(lv.remaining_ms)}")
        body.append(f"  {lv.lease_id:<{lid}} {middle(lv.trainer, tid):<{tid}} {lv.groups:>4} "
                    f"{'OVERDUE' if late else holder_text(lv):<12} {left}")
    return _fit(head, body, room, more)


def _fit(head: list[str], body: list[str], room: int, more: str = "") -> list[str]:
    """The head and as many body rows as ``room`` lines hold, the rest counted in a last line."""
    if not body:
        return head[:1][:room]
    if room < 2:
        return head[:1]
    fits = room - len(head)
    if len(body) > fits:
        shown = max(0, fits - 1)
        return head + body[:shown] + [f"  ... {len(body) - shown} more" + (f" {more}" if more else "")]
    return head + body


def ended_line(snap: Snapshot) -> str:
    """``ended   failed 3 · lost 1 · evicted stale 2``: the attempt terminals, evictions and filters
    that happened (zeros left out), for `stats`' concise view."""
    st = snap.stats
    counts = [(k, v) for k, v in sorted(st.terminals.items())] + [
        (f"evicted {k}", v) for k, v in sorted(st.evictions.items())] + [
        (f"filtered {k}", v) for k, v in sorted(st.filtered_by_reason.items())]
    return "ended   " + (" · ".join(f"{k} {v}" for k, v in counts if v) or "no attempt ended without a completion")


def top_lines(snap: Snapshot, rates: Mapping[str, float | None] | None, spark: Sequence[float | None], queue: str,
              width: int, height: int, command: str = "top") -> list[str]:
    """The whole frame: at most ``height`` lines of at most ``width`` characters. ``rates`` None:
    `stats`' one frame (no rates; what ended instead)."""
    width, height = max(width, MIN_WIDTH), max(height, MIN_HEIGHT)
    st = snap.stats
    version = st.version if st.version_published else "none"
    hint = "(Ctrl-C quits)" if rates is not None else "(--full: every table)"
    lines = [f"rollout-queue {command}  queue {queue}  policy v{version}  {hint}"]
    urgent = urgent_lines(snap, width)
    counts = {"backlog": st.backlog, "ready": st.ready, "executing": st.executing_groups,
              "completed": st.completed, "leased": st.leased}
    in_s, done_s, out_s = (None if rates is None else rates.get(label) for label in RATE_LABELS)
    staleness = "-" if st.staleness_max is None else f"max {st.staleness_max} mean {st.staleness_mean:.2f}"
    summary = [
        "groups  " + " · ".join(f"{SHORT[s]} {counts[s]}" for s in WAITING),
        "waited  " + " · ".join(f"{SHORT[s]} {duration(snap.oldest_ms(s))}" for s in WAITING),
        f"settled committed {st.committed} · filtered {st.filtered} · dead {st.dead} · kept {st.kept}",
        ended_line(snap) if rates is None else
        f"rates   in {_per_s(in_s)} · completed {_per_s(done_s)} · out {_per_s(out_s)} groups/s  {sparkline(spark)}",
        f"policy  staleness {staleness} (versions) · last commit "
        + ("never" if st.since_commit_ms is None else f"{duration(st.since_commit_ms)} ago"),
    ]
    if snap.partitions:
        summary.append(f"parts   {len(snap.partitions)}: " + " · ".join(
            f"{name} DOWN" if part is None else f"{name} {part.stats.executing_groups} exec {part.stats.completed} done"
            for name, part in snap.partitions))
    # Urgent lines come first and take at most half the screen (their count says if some are cut).
    room_urgent = max(1, (height - len(lines) - len(summary)) // 2)
    if len(urgent) > room_urgent:
        urgent = urgent[:room_urgent - 1] + [f"! ... {len(urgent) - room_urgent + 1} more urgent lines"]
    lines += urgent or ["ok: nothing urgent"]
    lines += summary
    # Where the generated tokens went (none yet: nothing to say), where it leaves the worker and lease
    # rows their room: waste is worth seeing, not an alarm.
    waste = st.waste
    if (waste.generated or waste.trained) and height - len(lines) > 5:
        lines.append("tokens  " + tokens_text(waste))
    # No admission control: a line of its own (an 80-column terminal shows it whole), where it leaves
    # the worker and lease rows their room (it is no alarm: the queue works, it may waste generation).
    if st.admission_batch is None and height - len(lines) > 5:
        lines.append("admit   no admission control: generation may run ahead of training without bound")
    # The samples line only where it leaves the worker and lease rows their room (it is no alarm).
    samples = samples_line(snap)
    if samples and height - len(lines) > 5:
        lines.append(samples)
    room = height - len(lines)
    overdue = any(x.overdue or x.holder_silent for x in snap.leases)
    # Leases get a fair share (all they need, up to a third of what is left), workers the rest.
    lease_room = min(len(snap.leases) + 2 if snap.leases else 1, max(room // 3, 3 if overdue else 1))
    more = "" if rates is not None else "(--full lists all)"
    lines += worker_lines(snap.workers, room - lease_room, width, more)
    lines += lease_lines(snap.leases, height - len(lines), width, more)
    return [clean(line)[:width] for line in lines[:height]]
