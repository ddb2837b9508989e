"""``rollout-queue verify``: the queue's promise checked against its own records, read-only.

The promise (DESIGN: Guarantees): every submitted group is in exactly one state, none is committed
twice, none is lost, and once a run is over (``final``) none is still owned or waiting. The demo
ends with this same check (demo/ledger.py), so an operator can run the demo's proof on any queue.

Sources, cross-checked (DESIGN: Key layout):
- ``ids`` (source_id -> entry ID): one row per submitted group (a requeued dead letter's row names
  the entry its group lives on in);
- the PEL (XPENDING): the owner of each retained entry; the owner's kind is its state
  (view_models.OWNER_KINDS: a new kind of owner is one line there, and this check follows);
- the backlog: the source stream's entries after the consumer group's last-delivered-id;
- ``ledger``: each entry's settlement (``s|committed|...``, ``s|filtered|...``, ``s|dead|...``);
- ``commits``: one line per committed lease, naming its entries. It is capped at ``commits_maxlen``
  lines: the oldest are trimmed, so a group whose line was trimmed is counted ``committed_unlisted``
  (not a problem) and a second commit of it can no longer be seen; the report says how many lines
  were trimmed;
- ``history``: the ``restored`` attempts of a group that ``restore(step)`` put back to ready after
  its commit, the one legitimate reason for a group to be in two commits lines (DESIGN: Checkpoints).

Rules:
1. Read-only, plain read commands only (XINFO, XRANGE, XPENDING, HSCAN, HLEN, HMGET, HGET, EXISTS),
   so it runs under the read-only operator role. Every command reads one page (PAGE rows, or
   BACKLOG_PAGE stream entries with their payloads), never a whole key, so Redis is never held
   longer as the queue grows; the work grows with the queue, the pauses do not. The checker keeps
   the PEL, the backlog's IDs, the commit counts and the entry IDs it has seen in memory (about
   250 B per group: 100,000 groups took 3 s and 24 MB, docs/OPERATIONS.md).
2. A live queue moves between pages. The reads go commits, backlog, PEL, then ``ids`` with the
   ledger page by page: a group that moves forward meanwhile is found where it went. A group that
   still looks lost, or committed without a line, is read again on its own at the end before it is
   called a problem (at most RECHECK of them).
3. It judges and never repairs: a verdict, and per problem a sentence and example entry IDs
   (``rollout-queue inspect ID`` shows each).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Sequence

from rollout_queue.core import protocol as p
from rollout_queue.core.flows import Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.ops import views
from rollout_queue.ops.view_models import SETTLEMENTS, WHAT, Problem, VerifyReport, owner_kind, stream_id
from rollout_queue.scale.layout import Layout

#: Rows per XPENDING, XRANGE of commits, HSCAN and HMGET.
PAGE = 1000
#: Source stream entries per XRANGE of the backlog (each carries its pristine payload).
BACKLOG_PAGE = 200
#: Groups read again one by one before they are called lost or committed without a line.
RECHECK = 1000
#: Example entry IDs a problem names.
EXAMPLES = 5
ENTRY_ID = re.compile(r"\d+-\d+")

#: progress(phase, done, total or None): called after each page (the CLI draws it on a terminal).
Progress = Callable[[str, int, "int | None"], None]


def _quiet(phase: str, done: int, total: int | None) -> None:
    """No progress to show."""


class _Found:
    """Entry IDs per problem kind while one partition is read (counted, a few kept as examples)."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}

    def add(self, kind: str, entry: str) -> None:
        self.count[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(entry)

    def problems(self) -> list[Problem]:
        return [Problem(kind, self.count[kind], WHAT[kind], tuple(self.examples[kind])) for kind in WHAT
                if self.count[kind]]


def verify(keys: QueueKeys, final: bool = False, progress: Progress | None = None) -> Flow[VerifyReport]:
    """The promise checked on one queue (one partition): see the module docstring. Raises NotFound
    when the queue does not exist."""
    yield from views.require_queue(keys)
    tick = progress or _quiet
    report, found = VerifyReport(keys.queue, final), _Found()
    last_commit = yield from _read_commits(keys, report, tick)
    backlog, horizon = yield from _read_backlog(keys, tick)
    owners = yield from _read_pel(keys, tick)
    # The groups, page by page: each one's state from its owner, its ledger line and the backlog.
    seen: set[str] = set()
    suspects: list[str] = []  # look lost: read again at the end
    unlisted: list[str] = []  # settled committed, in no commits line read so far
    state_of: dict[str, str] = {}  # the state of every group a commits line names
    total = p.parse_count((yield p.Command(("HLEN", keys["ids"]))), "HLEN ids")
    cursor = "0"
    while True:
        cursor, rows = p.parse_hscan((yield p.Command(("HSCAN", keys["ids"], cursor, "COUNT", PAGE))))
        # HSCAN may return a row twice (while the hash is resized): each entry counts once.
        entries = list(dict.fromkeys(e for e in (views.text(v) for _, v in rows) if e not in seen))
        lines = p.parse_hmget((yield p.Command(("HMGET", keys["ledger"], *entries))), entries) if entries else {}
        for entry in entries:
            seen.add(entry)
            state = _judge(entry, owners.get(entry), views.text(lines[entry]) if lines[entry] is not None else None,
                           backlog, horizon, found)
            if state == "suspect":
                suspects.append(entry)
                continue
            report.states[state] = report.states.get(state, 0) + 1
            if entry in report.commits:
                state_of[entry] = state
            elif state == "committed":
                unlisted.append(entry)
        tick("groups", len(seen), total)
        if cursor == "0":
            break
    report.submitted = len(seen)
    yield from _recheck_lost(keys, suspects, report, found, state_of)
    yield from _late_commits(keys, last_commit, report)
    yield from _check_commits(keys, report, found, state_of, unlisted)
    report.unmapped_commits = sum(1 for e in report.commits if e not in seen)
    report.problems = found.problems() + _not_settled(report)
    return report


def _not_settled(report: VerifyReport) -> list[Problem]:
    """With ``final``: the groups still owned or waiting, by state (none: no problem)."""
    if not report.final or not report.unsettled:
        return []
    waiting = ", ".join(f"{s} {n}" for s, n in report.states.items() if n and s not in SETTLEMENTS + ("lost",))
    return [Problem("not_settled", report.unsettled, f"{WHAT['not_settled']}: {waiting}")]


def _judge(entry: str, owner: str | None, ledger: str | None, backlog: set[str], horizon: tuple[int, int],
           found: _Found) -> str:
    """One group's state: its PEL owner's kind, else its settlement, else backlog; 'suspect' when it
    is none of these (read again before it is called lost)."""
    if not ENTRY_ID.fullmatch(entry):  # an ids row written by hand: it names no entry
        found.add("garbage", entry)
        return "lost"
    if ledger is not None and not ledger.startswith(("s|", "a|")):
        found.add("garbage", entry)
    settled = ledger.split("|")[1] if ledger is not None and ledger.startswith("s|") else None
    if owner is not None:
        kind = owner_kind(owner)
        if settled is not None and not kind.settled:
            found.add("settled_owned", entry)
        return kind.state
    if settled is not None:
        if settled in SETTLEMENTS:
            return settled
        found.add("garbage", entry)
        return "lost"
    if entry in backlog or stream_id(entry) > horizon:
        return "backlog"  # in the backlog, or submitted after it was read
    return "suspect"


def _stream_info(key: str) -> Flow[p.StreamInfo | None]:
    """XINFO STREAM of ``key``, None when the key does not exist (XINFO would refuse it)."""
    if not (yield p.Command(("EXISTS", key))):
        return None
    return p.parse_stream_info((yield p.Command(("XINFO", "STREAM", key))))


def _read_commits(keys: QueueKeys, report: VerifyReport, tick: Progress, start: str = "-") -> Flow[str]:
    """Count the commits lines naming each entry (report.commits), from ``start`` on; the last line's
    ID ("0-0" when none)."""
    if start == "-":
        info = yield from _stream_info(keys["commits"])
        if info is not None and info.entries_added is not None:
            report.commit_lines_trimmed = max(0, info.entries_added - info.length)
        total = None if info is None else info.length
    else:
        total = None
    last = "0-0" if start == "-" else start[1:]
    while True:
        page = p.parse_stream_entries((yield p.Command(("XRANGE", keys["commits"], start, "+", "COUNT", PAGE))),
                                      "XRANGE commits")
        for line_id, kv in page:
            ids = views.text(p.field_map(kv).get("ids", b""))
            report.commits.update(x for x in ids.split(",") if x)
            report.commit_lines += 1
            last = line_id
        tick("commits lines", report.commit_lines, total)
        if len(page) < PAGE:
            return last
        start = "(" + last


def _read_backlog(keys: QueueKeys, tick: Progress) -> Flow[tuple[set[str], tuple[int, int]]]:
    """The backlog's entry IDs, and the newest ID the stream had generated when the read began (a
    group with a later ID was submitted during the check: it cannot be lost yet)."""
    info = yield from _stream_info(keys["src"])
    horizon = "0-0" if info is None else info.last_id
    start = "(" + (yield from views.last_delivered(keys))
    backlog: set[str] = set()
    while True:
        page = p.parse_stream_entries((yield p.Command(("XRANGE", keys["src"], start, horizon, "COUNT",
                                                        BACKLOG_PAGE))), "XRANGE src")
        backlog.update(entry for entry, _ in page)
        tick("backlog", len(backlog), None)
        if len(page) < BACKLOG_PAGE:
            return backlog, stream_id(horizon)
        start = "(" + page[-1][0]


def _read_pel(keys: QueueKeys, tick: Progress) -> Flow[dict[str, str]]:
    """Entry ID -> its PEL owner, for the whole PEL (bounded by max_retained_groups), a page at a time."""
    owners: dict[str, str] = {}
    start = "-"
    while True:
        page = p.parse_pending((yield p.Command(("XPENDING", keys["src"], "rollout", start, "+", PAGE))))
        owners.update((row.entry_id, row.consumer) for row in page)
        tick("owned (PEL)", len(owners), None)
        if len(page) < PAGE:
            return owners
        start = "(" + page[-1].entry_id


def _recheck_lost(keys: QueueKeys, suspects: Sequence[str], report: VerifyReport, found: _Found,
                  state_of: dict[str, str]) -> Flow[None]:
    """Each suspect read again on its own (PEL, ledger, stream): lost only if still none of them."""
    after = stream_id((yield from views.last_delivered(keys))) if suspects else (0, 0)
    for i, entry in enumerate(suspects):
        state = "lost"
        if i < RECHECK:
            state = yield from _state_now(keys, entry, after)
        if state == "lost":
            found.add("lost", entry)
        report.states[state] = report.states.get(state, 0) + 1
        if entry in report.commits:
            state_of[entry] = state


def _state_now(keys: QueueKeys, entry: str, after: tuple[int, int]) -> Flow[str]:
    """One group's state read again: its owner, its settlement, backlog, or 'lost'."""
    rows = p.parse_pending((yield p.Command(("XPENDING", keys["src"], "rollout", entry, entry, 1))))
    if rows:
        return owner_kind(rows[0].consumer).state
    ledger = p.parse_text((yield p.Command(("HGET", keys["ledger"], entry))), "HGET ledger") or ""
    if ledger.startswith("s|") and ledger.split("|")[1] in SETTLEMENTS:
        return ledger.split("|")[1]
    in_stream = p.parse_stream_entries((yield p.Command(("XRANGE", keys["src"], entry, entry))), "XRANGE src")
    return "backlog" if in_stream and stream_id(entry) > after else "lost"


def _late_commits(keys: QueueKeys, last: str, report: VerifyReport) -> Flow[None]:
    """The commits lines added while the groups were read (a group committed meanwhile has its
    ledger line but was not in the lines read first)."""
    yield from _read_commits(keys, report, _quiet, "(" + last)


def _check_commits(keys: QueueKeys, report: VerifyReport, found: _Found, state_of: dict[str, str],
                   unlisted: Sequence[str]) -> Flow[None]:
    """Every commits line against the groups' states: a group is in one line per commit since its
    last restore (history), and a committed group is in one line unless its line was trimmed."""
    for entry in unlisted:
        if report.commits[entry]:
            state_of[entry] = "committed"  # committed while the groups were read: its line came late
        elif report.commit_lines_trimmed:
            report.committed_unlisted += 1
        else:
            found.add("committed_without_line", entry)
    odd = [e for e, n in report.commits.items() if n > 1 or state_of.get(e, "committed") != "committed"]
    rechecked = 0
    for i in range(0, len(odd), PAGE):
        page = odd[i:i + PAGE]
        histories = p.parse_hmget((yield p.Command(("HMGET", keys["history"], *page))), page, "HMGET history")
        for entry in page:
            _, attempts = views.attempt_history(histories[entry])
            restored = sum(1 for a in attempts if a.terminal == "restored")
            excess = report.commits[entry] - restored
            if restored and report.commits[entry] > 1:
                report.recommitted_after_restore += 1
            if excess > 1:
                report.committed_twice += 1
                found.add("committed_twice", entry)
            elif excess == 1 and state_of.get(entry, "committed") != "committed":
                rechecked += 1  # committed meanwhile? (at most RECHECK read again)
                if (rechecked > RECHECK or not ENTRY_ID.fullmatch(entry)
                        or (yield from _state_now(keys, entry, (0, 0))) != "committed"):
                    found.add("commit_not_settled", entry)


# -- a logical queue: every partition ------------------------------------------------------------------


def verify_layout(layout: Layout, final: bool = False, progress: Progress | None = None) -> Flow[VerifyReport]:
    """``verify`` on every partition of a logical queue, merged (a plain queue: its own report).
    Example entry IDs name their partition (``q#3/ID``), as every command shows them."""
    if layout.count == 1:
        return (yield from verify(layout.keys[0], final, progress))
    total = VerifyReport(layout.name, final)
    problems: dict[str, list[Problem]] = {}
    for name, keys in zip(layout.names, layout.keys):
        part = yield from verify(keys, final, progress)
        total.submitted += part.submitted
        for state, n in part.states.items():
            total.states[state] = total.states.get(state, 0) + n
        for attr in ("commit_lines", "commit_lines_trimmed", "committed_twice", "committed_unlisted",
                     "recommitted_after_restore", "unmapped_commits"):
            setattr(total, attr, getattr(total, attr) + getattr(part, attr))
        total.commits.update({f"{name}/{e}": n for e, n in part.commits.items()})
        for x in part.problems:
            problems.setdefault(x.kind, []).append(
                Problem(x.kind, x.groups, x.what, tuple(f"{name}/{e}" for e in x.examples)))
    for kind, parts in problems.items():
        if kind != "not_settled":  # that one is said again over the totals
            total.problems.append(Problem(kind, sum(x.groups for x in parts), parts[0].what,
                                          tuple(e for x in parts for e in x.examples)[:EXAMPLES]))
    total.problems += _not_settled(total)
    return total
