"""Is the generation side gone? The one rule every trainer-side wait applies (issue 31, section 5).

A trainer waits for completed groups, and only workers make them. When every worker has died or
stopped (SIGKILL, SIGSTOP, a lost host, a drain nobody restarts), a wait that knows only a generic
timeout (``wait_s``: minutes) or none (``while q.lease(...) is None``) waits for nothing. The rule,
judged by ``FleetWatch`` over the stats snapshots a blocking lease reads after an empty wait, with
no I/O and no clock of its own:

- the fleet is *down* at a snapshot when no worker is live (none heartbeat within
  ``worker_timeout_s``: the queue's own judgement, stats.lua) while groups wait for one (queued,
  ready to retry, or executing: a dead worker's attempts count until they are requeued);
- it is *gone* once every snapshot for ``grace_s`` (default ``worker_timeout_s``) found it down, each
  after an empty blocking wait, and none more than ``worker_timeout_s`` plus that wait after the one
  before. Two snapshots ``worker_timeout_s`` apart, both down, prove that no worker was live between
  them (one live in between would have beaten after the first's cutoff, so it would still be live at
  the second), and the wait between them proves no batch came: a worker that came and went inside
  it produced nothing for this trainer. A longer gap (the trainer was busy in a step) proves
  nothing, so the count starts again;
- and only once the waiter has known a fleet: it saw a live worker, or got a batch (batches come
  from workers). A trainer started before its workers (a vLLM start-up takes minutes, and a worker
  registers only once its engine is up) is not one whose workers died: it waits for them up to
  ``wait_s`` as before, and StreamStarved then says that no worker is alive.

What it never fires on:

- workers alive but slow (a long rollout, a vLLM start-up): a worker's heartbeat runs on a thread
  of its own (workers/heartbeat.py), whatever its engine does;
- a restart shorter than ``worker_timeout_s + grace_s``: a dead worker counts as live for
  ``worker_timeout_s`` after its last beat, the grace covers the rest, and the new worker's first
  beat (registration) ends the count;
- a drained or exhausted queue: nothing waits for a worker, so that is StreamStarved's to say;
- a fleet still starting (above).

The bound (docs/integrations/trainers.md, "When the workers are gone"): a trainer waiting when its
last worker dies raises within ``worker_timeout_s + grace_s`` of that worker's last heartbeat, plus
two waits (``block_ms``: the look that starts the count comes up to one wait after the fleet went
down, the one that ends it up to one wait after the grace) and the round trips; one busy in a step
then raises within ``grace_s`` plus two waits of its next wait's start.

``last_workers`` reads what the error shows (which workers, how long since they beat): read-only
commands on one partition, sent only when the rule has fired.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_queue.core import protocol as p
from rollout_queue.core.errors import InvalidInput, ProtocolError
from rollout_queue.core.flows.base import Flow
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.models import QueueStats

#: Workers the error names per partition: the newest heartbeats, registered or reaped.
SHOWN = 8


def needs_workers(stats: QueueStats) -> bool:
    """Whether groups wait for a worker: queued, ready to retry, or executing (a dead worker's
    attempts count until they are requeued). A queue with none is drained or exhausted, not stuck."""
    return stats.backlog + stats.ready + stats.executing_groups > 0


class FleetWatch:
    """The rule of the module docstring over one waiter's successive snapshots.

    ``grace_s``: how long the fleet must stay down before it is gone (None: the queue's
    ``worker_timeout_s``; ``math.inf``: never, the watch is off). One watch per waiter: its state is
    whether it has known a fleet, when it first saw the fleet down and when it last looked."""

    def __init__(self, grace_s: float | None = None) -> None:
        if grace_s is not None and (isinstance(grace_s, bool) or not isinstance(grace_s, (int, float))
                                    or not grace_s >= 0):
            raise InvalidInput(f"the fleet's grace must be >= 0 seconds (math.inf: never give up on the "
                               f"workers) or None (the queue's worker_timeout_s), got {grace_s!r}")
        self.grace_s = grace_s
        #: this waiter saw a live worker or got a batch: a fleet existed, so one missing is gone
        self.armed = False
        self.down_since: float | None = None
        self.last_seen: float | None = None

    def grace(self, worker_timeout_s: float) -> float:
        """The grace in force on a queue whose worker_timeout_s is ``worker_timeout_s``."""
        return worker_timeout_s if self.grace_s is None else self.grace_s

    def note_batch(self) -> None:
        """The waiter got a batch: workers made it, so the fleet existed (and is not down now)."""
        self.armed = True
        self.down_since = self.last_seen = None

    def observe(self, stats: QueueStats, worker_timeout_s: float, now: float, waited_s: float = 0.0) -> float | None:
        """Record one snapshot taken at ``now`` (the caller's monotonic clock, seconds), just after a
        blocking wait of ``waited_s`` that brought no batch. Returns how long the fleet has been down
        once it is gone (>= the grace), else None."""
        self.armed = self.armed or stats.workers_alive > 0
        down = stats.workers_alive == 0 and needs_workers(stats)
        if not (down and self.armed):
            self.down_since = self.last_seen = None
            return None
        if self.down_since is None or self.last_seen is None or now - self.last_seen > worker_timeout_s + waited_s:
            self.down_since = now
        self.last_seen = now
        down_s = now - self.down_since
        return down_s if down_s >= self.grace(worker_timeout_s) else None


@dataclass(frozen=True)
class WorkerSeen:
    """One worker the queue last knew: still registered but silent past worker_timeout_s, or reaped
    (its attempts requeued: the ``reaped`` stream). ``silent_s``: seconds since its last heartbeat on
    the queue clock (None: not known, a worker reaped while it was closing)."""

    worker_id: str
    silent_s: float | None
    state: str
    partition: str = ""

    def __str__(self) -> str:
        when = "last heartbeat unknown" if self.silent_s is None else f"last heartbeat {self.silent_s:.0f} s ago"
        where = f" in {self.partition}" if self.partition else ""
        return f"{self.worker_id} ({when}, {self.state}{where})"


def last_workers(keys: QueueKeys, partition: str = "", limit: int = SHOWN) -> Flow[list[WorkerSeen]]:
    """The ``limit`` newest registered workers and the ``limit`` newest reaping lines, one entry per
    worker (its registration if it still has one), newest heartbeat first. Read-only commands, so a
    transition between them may show a mix of before and after; good enough for an error message."""
    now = p.parse_time((yield p.Command(("TIME",), route=keys["clock"])))
    offset = yield p.Command(("HGET", keys["clock"], "offset"))
    try:  # the queue clock (lua/include/now_ms.lua): server time minus the time the server was down
        now -= p.parse_count(offset, "HGET clock offset") if offset is not None else 0
    except ProtocolError:
        pass
    seen: dict[str, WorkerSeen] = {}
    for worker, score in p.scored((yield p.Command(("ZREVRANGE", keys["workers"], 0, limit - 1, "WITHSCORES")))):
        seen[worker] = WorkerSeen(worker, max(0.0, (now - score) / 1000), "registered, silent", partition)
    reply = yield p.Command(("XREVRANGE", keys["reaped"], "+", "-", "COUNT", limit))
    for _, kv in p.parse_stream_entries(reply, "XREVRANGE reaped"):
        line = {k: p.s(v) for k, v in p.field_map(kv).items()}
        worker, beat = line.get("worker", ""), line.get("heartbeat_ms", "")
        if worker and worker not in seen:
            known = beat.isdigit() and int(beat) > 0  # 0: it had begun closing
            seen[worker] = WorkerSeen(worker, max(0.0, (now - int(beat)) / 1000) if known else None, "reaped",
                                      partition)
    return sorted(seen.values(), key=lambda w: (w.silent_s is None, w.silent_s or 0.0))
