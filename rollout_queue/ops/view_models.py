"""Value types of the operator views (views.py): frozen, plain data, no I/O.

They say what Redis holds in DESIGN's words (state, owner, attempt, lease, staleness); the CLI and the
Prometheus exporter only format them. ``OWNER_KINDS`` is the one place that maps a PEL owner name to
a state (DESIGN: "How each state shows in Redis").

Views parse leniently: a stored value that is not what a transition writes (a lease's
``created_ms=abc``, a heartbeat score of 1e308, a history that is not JSON) becomes None (or is
left out) and is named in the record's ``garbage`` notes, so one hand-edited key never stops an
operator from seeing the rest. Text from Redis is kept as it is: renderers escape it (cli/render.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections import Counter
from typing import Any, Mapping, Sequence

from rollout_queue.core.histograms import (SECOND_BUCKETS, TOKEN_BUCKETS, add_counts, bucket_count, max_edge,
                                           quantile_edge)
from rollout_queue.core.config import BEATS_PER_SILENCE
from rollout_queue.core.models import DeadLetter, SourceGroup

#: The hold id of `rollout-queue drain` (lua/drain.lua); client holds use random hex ids.
DRAIN_HOLD = "operator-drain"
STATES = ("backlog", "ready", "executing", "completed", "leased", "committed", "filtered", "dead")
#: The states a group waits in, whose longest wait the views measure (Snapshot.oldest_ms).
WAITING = ("backlog", "ready", "executing", "completed", "leased")


@dataclass(frozen=True)
class OwnerKind:
    """One kind of PEL owner: the owner's name (a prefix when it ends with ``:``) and the state an
    entry it owns is in. ``settled``: the entry's ledger line already says its settlement while this
    owner holds it (a group parked until the reaper finishes settling it); for every other kind a
    settled ledger line on an owned entry is a broken ledger (``rollout-queue verify`` says so)."""

    owner: str
    state: str
    settled: bool = False

    def owns(self, name: str) -> bool:
        return name.startswith(self.owner) if self.owner.endswith(":") else name == self.owner


#: The queue's own PEL owners (DESIGN: "How each state shows in Redis"). Any other owner is a worker,
#: executing an attempt. A new owner kind is one line here: every view and `verify` read this table.
OWNER_KINDS = (OwnerKind("@ready", "ready"), OwnerKind("@done", "completed"), OwnerKind("@lease:", "leased"),
               # Parked by a worker's script (lua/include/park_many.lua) until settle_parked XACKs it: the
               # ledger already says the settlement, so the group counts as dead or filtered.
               OwnerKind("@dead", "dead", settled=True), OwnerKind("@filtered", "filtered", settled=True))
WORKER = OwnerKind("", "executing")


def owner_kind(owner: str) -> OwnerKind:
    """The kind of a PEL owner name (WORKER for a worker id)."""
    return next((k for k in OWNER_KINDS if k.owns(owner)), WORKER)


def entry_state(owner: str) -> str:
    """The state of a pending entry, from its PEL owner (worker id, @ready, @done, @lease:<id>)."""
    return owner_kind(owner).state


def state_counts(stats: Any) -> dict[str, int]:
    """Groups in each of STATES, from a QueueStats."""
    return {"backlog": stats.backlog, "ready": stats.ready, "executing": stats.executing_groups,
            "completed": stats.completed, "leased": stats.leased, "committed": stats.committed,
            "filtered": stats.filtered, "dead": stats.dead}


def stream_id(entry_id: str) -> tuple[int, int]:
    """A stream ID as a comparable (ms, seq) pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class Attempt:
    """One attempt that ended without a completion, from the history hash (lua/include/history.lua)
    or, once dead, from its dead letter's own copy. ``attempt``/``ms`` are 0 when unreadable."""

    attempt: int
    worker_id: str
    terminal: str
    reason: str
    ms: int


@dataclass(frozen=True)
class EntryView:
    """What `rollout-queue inspect ENTRY_ID` shows. ``attempt`` is the PEL delivery count (or the last
    one the ledger recorded once settled); ``history`` holds the attempts that ended without a
    completion, with their reasons; ``counted_failures`` is what max_attempts compares against."""

    entry_id: str
    state: str
    owner: str | None
    attempt: int
    idle_ms: int | None
    counted_failures: int
    history: tuple[Attempt, ...]
    ledger: str | None
    server_ms: int
    version: int
    source_id: str | None = None
    n: int | None = None
    group: SourceGroup | None = None
    worker_id: str | None = None
    worker_heartbeat_ms: int | None = None
    worker_alive: bool | None = None
    lease_id: str | None = None
    lease_trainer: str | None = None
    lease_deadline_ms: int | None = None
    min_version: int | None = None
    completion_bytes: int | None = None
    dlq_id: str | None = None
    dead_reason: str | None = None
    garbage: tuple[str, ...] = ()
    #: the partition (queue name) the entry lives in (entry IDs are unique within one partition only)
    partition: str = ""
    #: a dead entry whose dead letter was requeued: the entry ID its group lives on as
    requeued_as: str | None = None
    #: its progress record's head (partial rollouts), as stored: 'attempt|tokens|min_version|bytes|worker'
    progress: str | None = None

    @property
    def staleness(self) -> int | None:
        """Policy version now minus the oldest sample version, for a completed or leased group."""
        return None if self.min_version is None else max(0, self.version - self.min_version)


@dataclass(frozen=True)
class WorkerProgress:
    """What a worker reported of itself in its last heartbeat (lua/heartbeat.lua): groups completed
    and tokens generated since its process started, its uptime, and when (queue clock) it said so.
    The rates are lifetime averages; `top` and Prometheus' rate() give the current ones."""

    groups: int
    tokens: int
    uptime_ms: int
    reported_ms: int
    #: its samples per bucket of core/histograms.py's TOKEN_BUCKETS and SECOND_BUCKETS since its
    #: process started (one count per edge plus one above the last); () when it reported none
    sample_tokens: tuple[int, ...] = ()
    sample_seconds: tuple[int, ...] = ()

    @property
    def groups_per_s(self) -> float | None:
        return self.groups * 1000 / self.uptime_ms if self.uptime_ms > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens * 1000 / self.uptime_ms if self.uptime_ms > 0 else None


@dataclass(frozen=True)
class SampleDistribution:
    """Samples (trajectories) counted per bucket over a set of workers: their lengths in tokens or
    their durations in seconds, each worker's counts since its process started, added. Quantiles
    are bucket upper edges (``p90 == 2048``: at least 90% of the samples had at most 2048 tokens;
    inf: above the last edge; None: no samples), as Prometheus' histogram_quantile reads buckets."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    #: how many workers' counts are in it (those that reported any)
    workers: int = 0

    @classmethod
    def of(cls, edges: Sequence[float], lists: Sequence[Sequence[int]]) -> "SampleDistribution":
        """The sum of ``lists`` (each one worker's counts; empty ones are workers that reported none)."""
        reported = [c for c in lists if len(c) == bucket_count(edges)]
        return cls(tuple(edges), add_counts(edges, reported), len(reported))

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        return quantile_edge(self.edges, self.counts, q)

    @property
    def p50(self) -> float | None:
        return self.quantile(0.5)

    @property
    def p90(self) -> float | None:
        return self.quantile(0.9)

    @property
    def p99(self) -> float | None:
        return self.quantile(0.99)

    @property
    def max(self) -> float | None:
        """The upper edge of the highest bucket any sample is in."""
        return max_edge(self.edges, self.counts)


@dataclass(frozen=True)
class WorkerView:
    """A worker as the queue sees it. ``last_heartbeat_ms`` is None for a PEL consumer that holds work
    but is not registered (an orphan the reaper will requeue), or when its heartbeat score is not a
    time (``garbage`` says so)."""

    worker_id: str
    last_heartbeat_ms: int | None
    silent_ms: int | None
    alive: bool
    executing_groups: int
    idle_ms: int | None
    garbage: tuple[str, ...] = ()
    #: the partition (queue name) this registration is in: a partitioned worker has one per partition
    partition: str = ""
    #: ms since the worker's oldest executing attempt was reserved (None: it executes nothing). Unlike
    #: ``idle_ms`` (ms since its newest attempt was reserved) this grows only while one attempt runs.
    oldest_attempt_ms: int | None = None
    progress: WorkerProgress | None = None


@dataclass(frozen=True)
class PushView:
    """The last round of a torch.distributed weights push (push_open.lua's ``push`` hash): its epoch,
    the version pushed, its state (open, sealed, done, partial, failed, empty), the world (the
    trainer counts), the members that received it and those dropped, and how long ago it opened."""

    epoch: int
    version: int | None
    state: str
    world: int | None
    acked: int | None
    dropped: int | None
    age_ms: int | None
    garbage: tuple[str, ...] = ()


@dataclass(frozen=True)
class HoldView:
    """An admission hold that stands now: who opened it, since when and why (hold_open.lua's
    ``holders`` line; the drain's from meta), and its deadline. Times are queue-clock ms."""

    hold_id: str
    holder: str
    since_ms: int | None
    held_ms: int | None  # how long it has stood when read
    reason: str
    deadline_ms: int | None
    remaining_ms: int | None
    garbage: tuple[str, ...] = ()
    partition: str = ""


@dataclass(frozen=True)
class ReapedView:
    """One line of the ``reaped`` stream: a worker the queue gave up on (silent past worker_timeout,
    or a close cut short), when (``age_ms`` ago, by the server's clock), its last heartbeat (queue
    clock; 0 for a worker that had begun closing), what that reaping call requeued and dead-lettered
    and the entry IDs it held, and (on the line that finished it) its last reported progress."""

    reaped_id: str
    age_ms: int | None
    worker_id: str
    heartbeat_ms: int | None
    terminal: str
    reason: str
    requeued: int
    dead: int
    entry_ids: tuple[str, ...]
    done: bool
    progress: WorkerProgress | None = None
    garbage: tuple[str, ...] = ()
    partition: str = ""


@dataclass(frozen=True)
class AttemptView:
    """One executing attempt from the PEL: its entry, the worker running it, how long since it was
    reserved (the PEL's idle time, reset only by a delivery), and its attempt number."""

    entry_id: str
    worker_id: str
    age_ms: int
    attempt: int
    #: the partition (queue name) holding it, on a partitioned queue
    partition: str = ""


@dataclass(frozen=True)
class DeadLetterView:
    """A dead letter for people (``dlq list``, ``dlq show``): the letter, when it died and every
    attempt. ``died_ms``: the server's time of death (its dlq stream ID); ``age_ms``: how long ago,
    by the server's clock; ``attempts``: the attempts it carries, each ``ago_ms`` before now by the
    queue clock (None when unreadable); ``last``: the last of them, whose reason is usually what to fix."""

    letter: DeadLetter
    died_ms: int
    age_ms: int
    counted_failures: int
    attempts: tuple[Attempt, ...]
    ago_ms: tuple[int | None, ...]
    partition: str = ""
    garbage: tuple[str, ...] = ()

    @property
    def last(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None


@dataclass(frozen=True)
class AtRiskView:
    """An entry not settled whose counted failures leave it ``left`` more before it is dead-lettered
    (max_attempts - failures), with its last attempt's terminal and reason."""

    entry_id: str
    counted_failures: int
    left: int
    last_terminal: str
    last_reason: str
    partition: str = ""


@dataclass(frozen=True)
class LeaseView:
    """An active lease; ``remaining_ms`` is the time to its deadline. ``due_ms`` (its ``leases``
    score) is when the reaper rolls it back: the deadline, or trainer_silence_s after its holder's
    last beat (``beat_ms``; None: it never beat, an older client or ``beat=False``), whichever is
    first (lua/include/lease_due.lua). A number that is None could not be read (``garbage`` names it)."""

    lease_id: str
    trainer: str
    deadline_ms: int | None
    remaining_ms: int | None
    groups: int
    version: int | None
    created_ms: int | None
    state: str
    garbage: tuple[str, ...] = ()
    #: the partition (queue name) holding it: a lease of a partitioned queue is one member per partition
    partition: str = ""
    #: the queue time of its holder's last beat (None: never beat), and ms since it (server clock)
    beat_ms: int | None = None
    silent_ms: int | None = None
    #: when the reaper takes it (its index score) and ms until then (< 0: due now, the reaper rolls it back)
    due_ms: int | None = None
    due_in_ms: int | None = None
    #: the queue's trainer_silence_s in ms (None: off, a beating holder's silence is not judged)
    silence_bound_ms: int | None = None

    @property
    def holder_silent(self) -> bool:
        """Its holder beat, then missed two beats in a row (a beat comes every trainer_silence_s / 4):
        likely dead or paused, and rolled back at ``due_ms`` unless a beat comes first."""
        return (self.silent_ms is not None and self.silence_bound_ms is not None
                and self.silent_ms > 2 * self.silence_bound_ms // BEATS_PER_SILENCE)

    @property
    def overdue(self) -> bool:
        """Due for the reaper now (past its deadline, or its holder silent past the bound)."""
        return (self.due_in_ms is not None and self.due_in_ms < 0) or (
            self.remaining_ms is not None and self.remaining_ms < 0)


@dataclass(frozen=True)
class PelSummary:
    """The PEL read in pages: entries by attempt number and by state; executing attempts' ages (ms
    since their delivery). ``truncated`` when the PEL held more than the views' limit."""

    attempts: Mapping[int, int]
    states: Mapping[str, int]
    executing_ages_ms: tuple[int, ...]
    sampled: int
    truncated: bool
    #: state -> ms since the longest-waiting entry of that state was handed to its PEL owner (ready:
    #: requeued; completed: buffered; leased: leased; executing: reserved)
    oldest_ms: Mapping[str, int] = field(default_factory=dict)
    #: worker -> ms since its oldest executing attempt was reserved
    oldest_by_worker: Mapping[str, int] = field(default_factory=dict)
    #: PEL owner (worker, @ready, @done, @lease:<id>) -> entries it holds among those read
    pending_by_owner: Mapping[str, int] = field(default_factory=dict)
    #: PEL owner -> ms since its newest entry was handed to it (a worker: its latest reserve)
    newest_by_owner: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DrainStatus:
    """The operator drain hold (`rollout-queue drain`) and what it still waits for."""

    active: bool
    deadline_ms: int | None
    reason: str
    since_ms: int | None
    executing_groups: int
    other_holds: int
    server_ms: int
    garbage: tuple[str, ...] = ()


#: top's stall rule (docs/OPERATIONS.md, "Is the trainer stalled?"): a trainer is called stalled once
#: completed groups wait and its last commit is older than STALL_STEPS of its own recent steps (the
#: median gap between its last STEP_SAMPLE + 1 commits), and never before STALL_FLOOR_MS; until
#: STEP_SAMPLE_MIN gaps are known, after STALL_UNKNOWN_MS. Commits less than STEP_MERGE_MS apart are
#: one step's (a stream that acks several leases at once, a composite lease's partitions).
STALL_STEPS, STALL_FLOOR_MS, STALL_UNKNOWN_MS = 10, 60_000, 600_000
STEP_SAMPLE, STEP_SAMPLE_MIN, STEP_MERGE_MS = 20, 3, 1_000


def step_ms(commit_ms: Sequence[int]) -> int | None:
    """The run's own step time: the median gap between consecutive commits (``commit_ms``: when
    each recent commit happened, in any order), gaps under STEP_MERGE_MS left out; None with fewer
    than STEP_SAMPLE_MIN gaps."""
    times = sorted(commit_ms)
    gaps = sorted(b - a for a, b in zip(times, times[1:]) if b - a >= STEP_MERGE_MS)
    if len(gaps) < STEP_SAMPLE_MIN:
        return None
    mid = len(gaps) // 2
    return gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) // 2


def stall_after_ms(step: int | None) -> int:
    """How long after the last commit a trainer with completed groups waiting is called stalled."""
    return STALL_UNKNOWN_MS if step is None else max(STALL_STEPS * step, STALL_FLOOR_MS)


@dataclass(frozen=True)
class Snapshot:
    """Everything `stats`, `top` and the exporter show, read in one pass."""

    stats: Any  # QueueStats
    pel: PelSummary
    workers: tuple[WorkerView, ...]
    leases: tuple[LeaseView, ...]
    drain: DrainStatus
    #: (staleness in policy versions, buffered groups) pairs, freshest first
    buffer_staleness: tuple[tuple[int, int], ...] = field(default=())
    #: ms since the oldest backlog entry was submitted (server clock; None: no backlog)
    backlog_oldest_ms: int | None = None
    holds: tuple[HoldView, ...] = field(default=())
    #: the last weights push round (on the lead partition of a partitioned queue); None: never pushed
    push: PushView | None = None
    #: a partitioned queue's partitions, each (name, its own snapshot or None when it did not answer);
    #: the fields above are then their sum (merge_snapshots). Empty for a plain queue.
    partitions: tuple[tuple[str, "Snapshot | None"], ...] = field(default=())
    #: the run's step time from its recent commits (step_ms; None: too few commits yet)
    step_ms: int | None = None

    @property
    def stall_after_ms(self) -> int:
        """How long without a commit, while completed groups wait, top calls the trainer stalled."""
        return stall_after_ms(self.step_ms)

    def oldest_ms(self, state: str) -> int | None:
        """How long the longest-waiting group of ``state`` (backlog, ready, completed, leased,
        executing) has waited, or None when none is in it."""
        return self.backlog_oldest_ms if state == "backlog" else self.pel.oldest_ms.get(state)

    @property
    def sample_tokens(self) -> SampleDistribution:
        """Sample lengths (tokens after the prompt) over the registered workers' last heartbeats (a
        worker leaves the sum when it closes or is reaped); on a partitioned queue the lead
        partition holds each worker's report, so every worker counts once."""
        return SampleDistribution.of(TOKEN_BUCKETS, [w.progress.sample_tokens for w in self.workers if w.progress])

    @property
    def sample_seconds(self) -> SampleDistribution:
        """Sample durations (first request to end, seconds), as sample_tokens."""
        return SampleDistribution.of(SECOND_BUCKETS, [w.progress.sample_seconds for w in self.workers if w.progress])

    @property
    def unreachable(self) -> tuple[str, ...]:
        """The partitions left out of this snapshot because they did not answer."""
        return tuple(name for name, part in self.partitions if part is None)


# -- verify (ops/verify.py) ---------------------------------------------------------------------------

#: The settlements a ledger line may name (lua/include/ledger_settled.lua).
SETTLEMENTS = ("committed", "filtered", "dead")


@dataclass(frozen=True)
class Problem:
    """One way the records break the promise: how many groups, what it means and what to do, and
    some of the entry IDs (``partition/ID`` on a partitioned queue)."""

    kind: str
    groups: int
    what: str
    examples: tuple[str, ...] = ()


#: kind -> the sentence a problem of that kind says (after its count).
WHAT = {
    "lost": "LOST: submitted, but neither settled, owned in the PEL nor in the backlog",
    "committed_twice": "committed more than once (in several commits lines, not explained by a restore)",
    "settled_owned": "settled in the ledger but still owned in the PEL",
    "committed_without_line": "settled committed in the ledger but in no commits line (the stream was not trimmed)",
    "commit_not_settled": "named by a commits line but neither settled committed nor restored",
    "garbage": "with an ids row or a ledger line that no script writes",
    "not_settled": "not settled yet (--final: once a run is over every group is committed, filtered or dead)",
}


@dataclass
class VerifyReport:
    """What ``verify`` found. ``states``: the submitted groups by state (STATES, plus ``lost``);
    ``ok`` when ``problems`` is empty. ``commits`` (entry ID -> commits lines naming it) is kept for
    callers that compare it with their own record (the demo's trainer); it is not shown."""

    queue: str
    final: bool
    submitted: int = 0
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES + ("lost",), 0))
    commit_lines: int = 0
    commit_lines_trimmed: int = 0
    committed_twice: int = 0
    committed_unlisted: int = 0
    recommitted_after_restore: int = 0
    unmapped_commits: int = 0
    problems: list[Problem] = field(default_factory=list)
    commits: Counter[str] = field(default_factory=Counter, repr=False)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unsettled(self) -> int:
        """Groups owned or waiting: neither settled nor lost."""
        return sum(n for state, n in self.states.items() if state not in SETTLEMENTS + ("lost",))

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "ok": self.ok, "verdict": "PASS" if self.ok else "FAIL", "final": self.final,
                "submitted": self.submitted, "states": dict(self.states), "commit_lines": self.commit_lines,
                "commit_lines_trimmed": self.commit_lines_trimmed, "committed_twice": self.committed_twice,
                "committed_unlisted": self.committed_unlisted,
                "recommitted_after_restore": self.recommitted_after_restore,
                "unmapped_commits": self.unmapped_commits,
                "problems": [{"kind": x.kind, "groups": x.groups, "what": x.what, "examples": list(x.examples)}
                             for x in self.problems]}
