"""The error types of rollout-queue: one root, grouped by what the caller can do.

Each error carries structured fields and a message that says what to do next. The status-word to
exception table lives in protocol.py, not here.
"""

from __future__ import annotations

from typing import Any


class RolloutQueueError(Exception):
    """Root of every error this package raises on purpose."""


# -- lost ownership: the caller no longer holds what it named; drop its work, do not retry -------


class OwnershipLost(RolloutQueueError):
    """The receipt, lease or hold named no longer owns its work."""


class StaleReceipt(OwnershipLost):
    """The attempt named by a receipt is no longer the one executing (the reaper gave it away)."""

    def __init__(self, entry_id: str, attempt: int, worker_id: str, owner: str, delivery_count: int) -> None:
        self.entry_id, self.attempt, self.worker_id = entry_id, attempt, worker_id
        self.owner, self.delivery_count = owner, delivery_count
        super().__init__(
            f"receipt {entry_id} attempt {attempt} of worker {worker_id!r} is stale: the entry is now "
            f"owned by {owner or 'nobody'!r} at delivery count {delivery_count}. Drop this result; the "
            "group was requeued (check the worker's heartbeat interval against worker_timeout_s)."
        )


class LeaseLost(OwnershipLost):
    """The lease is not active any more (expired, rolled back, unknown, or a wrong token)."""

    def __init__(self, lease_id: str, state: str) -> None:
        self.lease_id, self.state = lease_id, state
        super().__init__(
            f"lease {lease_id} is lost ({state}): its groups went (or go) back to ready and will be "
            "generated again. Do not apply this step's update as trained data; extend() leases whose "
            "step outlasts lease_timeout_s."
        )


class HoldLost(OwnershipLost):
    """The admission hold expired or was released before the call."""

    def __init__(self, hold_id: str) -> None:
        self.hold_id = hold_id
        super().__init__(
            f"admission hold {hold_id} expired or was released: open a new hold (raise hold_timeout_s "
            "if weight updates take longer)."
        )


# -- bad input: fix the caller; nothing was lost ------------------------------------------------


class InvalidInput(RolloutQueueError, ValueError):
    """The caller sent something malformed; queue state is intact."""


class MalformedCompletion(InvalidInput):
    """A completion did not cover its group's parent slots; the attempt ended malformed (requeued)."""

    def __init__(self, entry_id: str, detail: str, requeued_to: str = "ready") -> None:
        self.entry_id, self.detail, self.requeued_to = entry_id, detail, requeued_to
        super().__init__(
            f"completion for {entry_id} is malformed: {detail}. The attempt ended 'malformed' and the "
            f"group went to {requeued_to}; every output must name a slot 0..n-1 and every slot needs one."
        )


class PayloadTooLarge(InvalidInput):
    """A payload exceeds the queue's max_payload_bytes; nothing was written, ownership is kept."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what, self.size, self.limit = what, size, limit
        super().__init__(
            f"{what} is {size} bytes, over the queue's max_payload_bytes={limit}. Nothing was written "
            "and the reservation is still yours: shorten it, fail() it, or raise the limit."
        )


class PartialTooLarge(PayloadTooLarge):
    """A progress record (partial rollouts) exceeds the queue's max_partial_bytes; nothing was written.

    The attempt is still yours: abort it without progress (the next attempt starts from the prompt),
    or raise the bound with ``rollout-queue config set max_partial_bytes=N``."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.what, self.size, self.limit = what, size, limit
        InvalidInput.__init__(
            self,
            f"{what} is {size} bytes, over the queue's max_partial_bytes={limit} (0: partial rollouts off). "
            "Nothing was written and the reservation is still yours: abort it without progress (the next "
            "attempt starts from the prompt), or raise the bound with `rollout-queue config set "
            "max_partial_bytes=N`.")


class MalformedReservation(InvalidInput):
    """A source group given to submit() is not well formed."""


class GroupTooLarge(MalformedReservation):
    """A source group has more samples than the queue can ever execute at once; submit() refused the
    whole call before sending anything (such a group would be dead-lettered at its first reserve).

    ``limit`` is the largest ``n`` the queue runs: ``max_executing_samples`` on a plain queue, the
    smallest partition's share of it on a partitioned one (a group runs in the one partition its
    source_id hashes to, whichever that is)."""

    def __init__(self, source_id: str, n: int, limit: int, partitions: int = 1, logical: int | None = None) -> None:
        self.source_id, self.n, self.limit, self.partitions = source_id, n, limit, partitions
        self.logical = limit if logical is None else logical
        if partitions == 1:
            where = f"this queue executes at most max_executing_samples={limit} samples at once"
            fix = f"raise max_executing_samples to >= {n} or submit smaller groups"
        else:
            where = (f"a group runs whole in the one partition its source_id hashes to, and the smallest of "
                     f"this queue's {partitions} partitions' shares of max_executing_samples={self.logical} "
                     f"is {limit}")
            fix = (f"raise max_executing_samples to >= {n * partitions} (n x partitions) or use fewer "
                   "partitions")
        super().__init__(
            f"source group {source_id!r} has n={n} samples, but {where}: it could never run. Nothing was "
            f"submitted; {fix}."
        )


# -- state conflicts -----------------------------------------------------------------------------


class StateConflict(RolloutQueueError):
    """The queue's state forbids the request (not a bug, not a lost connection)."""


class ConfigMismatch(StateConflict):
    """A client's config or script library version differs from the queue's stored one."""

    def __init__(self, queue: str, field: str, stored: str, given: str) -> None:
        self.queue, self.field, self.stored, self.given = queue, field, stored, given
        super().__init__(
            f"queue {queue!r} stores {field}={stored!r} but this client has {given!r}. Open it with "
            "config=None to adopt the stored config, or change it with `rollout-queue config set` "
            "(library mismatches mean two versions of rollout-queue share one queue: upgrade all)."
        )


class LayoutMigrationRefused(ConfigMismatch):
    """The queue was created by the previous data layout (counters kept in ``meta``) and this
    credential may not write ``meta``, so it cannot migrate it (open.lua). The first process of this
    version that opens it as the trainer or admin migrates it in one script; a worker or producer
    started first must wait for that (or be started after it)."""

    def __init__(self, queue: str, stored: str, given: str) -> None:
        ConfigMismatch.__init__(self, queue, "library", stored, given)
        self.args = (
            f"queue {queue!r} was created by data layout {stored.split('.')[0]} (library {stored!r}); this "
            f"version ({given!r}) keeps the counters outside meta and migrates the queue when the trainer or "
            "admin opens it first (`rollout-queue stats` as admin, or start the trainer), after every process "
            "of the old version has stopped. This credential may only read meta, so it cannot migrate it.",)


class VersionRegression(StateConflict):
    """publish_version was given a version at or below the current one."""

    def __init__(self, version: int, current: int) -> None:
        self.version, self.current = version, current
        super().__init__(f"policy version {version} is not above the current {current}; versions only grow.")


class WorkerNotLive(StateConflict):
    """A call only a live worker may make (joining a weights push round) came from an id that is not
    one: never registered, or silent past worker_timeout_s, closed or reaped."""

    def __init__(self, worker_id: str, what: str = "join a weights push round") -> None:
        self.worker_id = worker_id
        super().__init__(
            f"worker {worker_id!r} is not a live worker of this queue (no heartbeat within worker_timeout_s: "
            f"never registered, silent, closed or reaped), so it may not {what}. Heartbeat first "
            "(Worker.heartbeat); a worker that stays silent is not waited for."
        )


class LeaseUnsatisfiable(StateConflict):
    """A lease asked for more groups than the queue's bounds can ever have completed at once."""

    HINTS = {
        "max_completed_groups": "raise max_completed_groups (`rollout-queue config set`) or lease fewer groups",
        "max_retained_groups": "raise max_retained_groups or lease fewer groups",
        "batch_groups": "admission control admits at most (version + max_staleness + 1) * batch_groups groups "
                        "minus those committed, until the next publish_version: lease at most batch_groups per "
                        "step (or partial=True), publish a version first, or raise batch_groups or max_staleness",
    }

    def __init__(self, groups: int, bound: str, limit: int) -> None:
        self.groups, self.bound, self.limit = groups, bound, limit
        super().__init__(
            f"a lease of {groups} group(s) can never be satisfied: {bound} allows at most {max(limit, 0)} completed "
            f"group(s) at once. {self.HINTS.get(bound, 'raise ' + bound)}."
        )


class CheckpointPruned(StateConflict):
    """restore(step) asked to go below a checkpoint whose data was already dropped."""

    def __init__(self, step: int, checkpoint: int) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(
            f"cannot restore to step {step}: checkpoint {checkpoint} already dropped the data committed "
            "before it. Resume from a checkpoint at or after it."
        )


class CheckpointRegression(StateConflict):
    """checkpoint(step) named a step below the queue's last checkpoint."""

    def __init__(self, step: int, checkpoint: int) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(
            f"checkpoint {step} is below the queue's last checkpoint {checkpoint}: checkpoints only move forward "
            "(the data committed before it is already dropped). Checkpoint the current step instead."
        )


class LeasesOpen(StateConflict):
    """checkpoint(step) was refused because groups are still leased: the saved weights may include a
    batch whose lease later expires, and that batch would then be trained twice after a resume."""

    def __init__(self, step: int, leased: int) -> None:
        self.step, self.leased = step, leased
        super().__init__(
            f"checkpoint {step} refused: {leased} group(s) are still leased. Commit (or roll back) every lease "
            "before checkpointing, so the checkpoint never covers a batch that may still go back to ready."
        )


class RestoreInProgress(StateConflict):
    """A restore(step) was interrupted and has not finished: finish it before committing or checkpointing."""

    def __init__(self, step: int, what: str) -> None:
        self.step, self.what = step, what
        super().__init__(
            f"{what} refused: restore({step}) was interrupted and is not finished. Call restore({step}) again "
            "(or let the reaper finish it); a commit now could be requeued by the rest of that restore."
        )


class ProducerConflict(StateConflict):
    """A producer's cursor moved under it (a second instance runs under the same name), or the name
    was used before with another plan (other dataset, order, n or prompt)."""

    def __init__(self, producer: str, detail: str) -> None:
        self.producer, self.detail = producer, detail
        super().__init__(
            f"producer {producer!r}: {detail}. Run one instance per producer name; to enqueue a different "
            "dataset or order, use a new --name (the groups already enqueued stay where they are)."
        )


class NotFound(StateConflict):
    """The named dead letter (or other record) does not exist."""


class QueueNotFound(NotFound):
    """A process that must not create the queue was started on one that does not exist: most often
    a mistyped ``--queue`` (or the wrong ``--url`` / ``--partitions``), which would otherwise wait
    forever on an empty queue."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"queue {queue!r} does not exist on this server: check --queue, --url and --partitions "
                         "(a typo?), or create it first (the trainer creates it; other processes take --create)")


class QueueCreateRefused(QueueNotFound):
    """The queue does not exist and this credential's ACL role may only read ``meta`` (producer,
    worker), so it cannot create it: the queue's config and policy version are what every other
    process trusts, so only the trainer, reaper or admin role writes them."""

    def __init__(self, queue: str) -> None:
        QueueNotFound.__init__(self, queue)
        self.args = (f"queue {queue!r} does not exist and this credential may not create it (its ACL role "
                     "only reads the queue's config): create it as the trainer or admin first; a worker "
                     "started without --create waits for it (--wait-for-queue)",)


# -- transport -----------------------------------------------------------------------------------


class OutcomeUnknown(RolloutQueueError):
    """The connection failed and the call could not be safely retried: it may or may not have run."""


class ServerUnavailable(OutcomeUnknown):
    """Redis answered every try within the retry window with a refusal after which a command never
    runs (BUSY, LOADING, READONLY, MASTERDOWN, NOREPLICAS, MISCONF, TRYAGAIN, CLUSTERDOWN, MOVED/ASK,
    UNBLOCKED): the call did NOT run. A subclass of OutcomeUnknown so that every handler of transport
    trouble handles it too, but unlike its parent the outcome is known; calling again is always safe.
    ``refusal`` is the last refusal's code word."""

    def __init__(self, what: str, refusal: str, detail: str, elapsed_s: float) -> None:
        self.what, self.refusal, self.detail, self.elapsed_s = what, refusal, detail, elapsed_s
        super().__init__(
            f"{what}: Redis refused the call for {elapsed_s:.1f}s ({refusal}: {detail}); it did not run. "
            + _REFUSAL_HINTS.get(refusal, "Call again once the server is back (it is safe).")
        )


_REFUSAL_HINTS = {
    "BUSY": "A long script (or a stuck EVAL) holds the server: find it with SLOWLOG / SCRIPT KILL, then call again.",
    "LOADING": "The server is loading its data after a restart: call again when it is done.",
    "READONLY": "This server is a replica (after a failover the old primary came back as one): point the client "
                "at the current primary (Sentinel, or a new URL) and call again.",
    "MASTERDOWN": "This replica lost its primary: point the client at the current primary and call again.",
    "NOREPLICAS": "min-replicas-to-write is not met: bring a replica back (or lower the setting) and call again.",
    "MISCONF": "The server refuses writes after a failed RDB/AOF write: fix its disk and call again.",
}


class NotReplicated(OutcomeUnknown):
    """Durable mode: the call RAN on the primary, but fewer than the requested replicas acknowledged it
    within the retry window (WAIT), so a failover now may lose it. Repeating the call is safe: every
    transition replays (by receipt, lease id, request id or source_id)."""

    def __init__(self, what: str, acked: int, wanted: int, elapsed_s: float, detail: str = "") -> None:
        self.what, self.acked, self.wanted, self.elapsed_s, self.detail = what, acked, wanted, elapsed_s, detail
        why = f"the wait for replicas failed ({detail})" if detail else f"only {acked} of {wanted} replicas acknowledged it"
        super().__init__(
            f"{what}: ran on the primary, but {why} within {elapsed_s:.1f}s, so a failover now may lose it. "
            "Repeating the call is safe (every transition replays); if this persists, check the replicas "
            "(INFO replication: link status, lag)."
        )


class ScriptError(RolloutQueueError):
    """A script reported a bug or corrupt state (Redis error prefixed ROLLOUTQ); please report it."""


class ProtocolError(ScriptError):
    """A script reply did not have the documented shape (an unknown status word, say)."""


class GaveUp(RolloutQueueError, TimeoutError):
    """Internal to the worker: ``workers.tasks.abandonable`` stopped waiting for user code at its
    timeout (told apart from a TimeoutError the user code raised itself). Callers turn it into the
    attempt's failure reason; it never leaves the worker."""


class IncludeError(RolloutQueueError):
    """The Lua library cannot be assembled: an ``-- @include`` names a missing helper or closes a cycle.

    Raised at import (scripts.load_library), before any script reaches a server. ``chain`` is the
    include path from the script to the offending name; ``kind`` is 'missing' or 'cycle'.
    """

    def __init__(self, kind: str, chain: tuple[str, ...]) -> None:
        self.kind, self.chain = kind, chain
        path = " -> ".join(chain)
        if kind == "cycle":
            hint = f"the helpers include each other ({path}): move what both need into a helper of its own"
        else:
            hint = f"{chain[-1]} is not in lua/include/ ({path}): add lua/include/{chain[-1]}.lua or fix the name"
        super().__init__(f"Lua include {kind}: {hint}.")


class PartitionsUnreachable(OutcomeUnknown):
    """An operation over the partitions of a logical queue reached some partitions but not others.

    ``done`` names the partitions where it ran, ``failed`` those where its outcome is unknown. Every
    such operation is idempotent per partition (submit by source_id, publish by version, holds by
    id, close by worker), so calling it again finishes the job once the partitions are back.
    """

    def __init__(self, what: str, done: tuple[str, ...], failed: tuple[str, ...]) -> None:
        self.what, self.done, self.failed = what, done, failed
        super().__init__(
            f"{what}: partitions {', '.join(failed)} could not be reached (their outcome is unknown); "
            f"it ran on {', '.join(done) or 'none'}. Repeat the call when they are back: it is idempotent."
        )


# -- bytes that do not decode (core/codec.py) ---------------------------------------------------


class CodecError(InvalidInput):
    """Bytes that do not decode as the documented format."""


# -- the generation worker (rollout_queue.workers) ----------------------------------------------


class EngineError(RolloutQueueError, RuntimeError):
    """The engine failed as a whole and cannot serve any more requests.

    The runtime must stop reserving, return every owned reservation to ``ready`` and exit non-zero;
    retrying on the same engine is not safe (its weights or state may be half-updated).
    """


class RequestFailed(RolloutQueueError):
    """One request failed; the engine is healthy and keeps serving the others.

    Raised for a request the engine refuses (empty prompt, token id outside the vocabulary, prompt
    longer than the context, duplicate request id) and for a request-level error inside the engine.
    The runtime fails this attempt: it counts toward ``max_attempts``, so a prompt that can never be
    served ends in the dead-letter stream instead of looping.
    """


class ScoringError(RolloutQueueError):
    """A reward or filter failed for this group; the attempt ends ``failed`` with this message."""


class EnvironmentFailed(RolloutQueueError):
    """A trajectory's environment raised, returned garbage or missed its step deadline; the attempt
    ends ``failed`` with this message (counted toward max_attempts: it is the environment's fault)."""


class TrajectoryAborted(RolloutQueueError):
    """Inside a worker only: the queue's own reason (a weight update, a drain) ended a trajectory while
    it waited on the engine or its environment; it settles aborted, never counted."""


class EnvironmentsHung(RolloutQueueError, RuntimeError):
    """Inside a worker only: too many of its synchronous environment calls still run past their
    deadline, each on a thread nothing can kill. Fatal for the worker, never for a group: it returns
    its work uncounted and exits, and a restart frees the threads. Give the tool calls timeouts of their
    own, or raise ``--env-max-hung``."""


class WorkerFailed(RolloutQueueError, RuntimeError):
    """The worker stopped on a fatal error after returning its owned work (see ``__cause__``)."""


class IllegalTransition(RolloutQueueError, RuntimeError):
    """A bug in the worker runtime: it tried a change of state its transition table does not allow."""

    def __init__(self, current: Any, wanted: Any, allowed: str) -> None:
        """``current``/``wanted``: the runtime's states (enums; their values are shown)."""
        now, to = getattr(current, "value", current), getattr(wanted, "value", wanted)
        super().__init__(f"worker runtime cannot go from {now} to {to} (allowed from {now}: {allowed})")
        self.current, self.wanted = current, wanted


# -- trainer integrations (rollout_queue.integrations) ------------------------------------------


class StreamStarved(RolloutQueueError, TimeoutError):
    """A trainer waited ``waited_s`` for a batch of ``groups`` completed groups and none came.

    ``stats`` is the queue's state when it gave up: it says whether the generation side is behind
    (groups executing, workers alive), idle (no workers) or out of data (nothing left to generate).
    """

    def __init__(self, queue: str, groups: int, waited_s: float, stats: Any, exhausted: bool = False) -> None:
        self.queue, self.groups, self.waited_s, self.stats, self.exhausted = queue, groups, waited_s, stats, exhausted
        state = (f"backlog {stats.backlog}, ready {stats.ready}, executing {stats.executing_groups}, "
                 f"completed {stats.completed}, leased {stats.leased}, workers alive {stats.workers_alive}") if stats is not None else "?"
        if exhausted:
            hint = ("the producer has enqueued its whole plan and fewer groups than a batch are left: "
                    "train fewer steps, or feed more data (more epochs or a new producer name)")
        elif stats is not None and not stats.workers_alive:
            hint = "no worker is alive: start `rollout-queue worker` processes on this queue"
        elif stats is not None and not (stats.backlog or stats.ready or stats.executing_groups):
            hint = "nothing is queued: start the producer (`rollout-queue produce`) or submit groups"
        else:
            hint = "generation is behind: add workers, lower the batch, or raise the wait"
        super().__init__(f"queue {queue!r}: no batch of {groups} groups after {waited_s:.0f} s ({state}); {hint}")


class WorkersGone(StreamStarved):
    """A blocking lease found no live worker for ``down_s`` seconds, past its grace, while groups wait
    to be generated: every worker died or stopped (SIGKILL, SIGSTOP, a lost host, a drain), so no
    batch can come until one is back. Raised by every trainer-side wait (TrainingStream, RankedStream,
    the TRL adapters, ``RolloutQueue.lease`` with ``block_ms``) by one rule (core/liveness.py), within
    ``worker_timeout_s + grace_s`` plus two waits of the last heartbeat, instead of after ``wait_s`` or
    never. A StreamStarved, so a handler of starvation handles it too.

    ``workers``: the last workers seen (core/liveness.py WorkerSeen: id, seconds since their last
    heartbeat, registered-but-silent or reaped), newest first; ``stats``: the queue when it gave up
    (queued, ready, executing, buffered)."""

    def __init__(self, queue: str, groups: int, down_s: float, stats: Any, workers: tuple[Any, ...],
                 worker_timeout_s: float, grace_s: float) -> None:
        self.queue, self.groups, self.waited_s, self.stats, self.exhausted = queue, groups, down_s, stats, False
        self.down_s, self.workers, self.worker_timeout_s, self.grace_s = down_s, workers, worker_timeout_s, grace_s
        seen = "; ".join(str(w) for w in workers) or "none registered or reaped (closed, or never started)"
        RolloutQueueError.__init__(
            self,
            f"queue {queue!r}: no worker has been alive for at least {down_s:.1f} s (none heartbeat within worker_timeout_s="
            f"{worker_timeout_s:g}; grace {grace_s:g} s) while {stats.backlog} group(s) are queued, {stats.ready} "
            f"ready to retry, {stats.executing_groups} executing and {stats.completed} buffered (a batch needs "
            f"{groups}). Last workers seen: {seen}. No batch can come: restart `rollout-queue worker` processes on "
            "this queue (a new lease call goes on once one heartbeats), or raise the grace (fleet_grace_s) if "
            "workers take longer to come back.")


class IntegrationConfigError(InvalidInput):
    """A trainer framework was configured in a way the queue cannot keep exactly-once under (a lease
    that would span a checkpoint, several ranks without the rank-aware stream, ...); the message
    names the setting to change."""


class RankFailed(RolloutQueueError):
    """A data-parallel rank did not finish the step (it died, or raised): the step's lease was rolled
    back on every rank, never half committed. Restart the ranks from the last checkpoint."""


# -- policy weights on storage (rollout_queue.weights) ------------------------------------------


class WeightsError(RolloutQueueError):
    """A published weights folder cannot be used: missing, not complete, or not the chain its
    manifest names (a delta whose base was pruned, a folder of another model). Nothing was applied:
    the engine keeps the weights it had. Publish a full version (``transport="folder"``), or raise
    ``keep`` so that no folder a worker may still need is pruned."""


class DeadlinePassed(RolloutQueueError, TimeoutError):
    """Blocking torch.distributed work (a push round's store, group or broadcast) was still running
    at its deadline and was abandoned in its thread (weights/watchdog.py); inside that work, a step
    refused to begin after it. The trainer's round records it as its error; a member's receive
    raises WeightsError for it. Nothing was staged or acked: the version loads from its folder."""


# -- development servers (rollout_queue.devtools) -----------------------------------------------


class LocalServerError(RolloutQueueError, RuntimeError):
    """A private test server (devtools/local_server.py) could not be found or started."""


class ServerNotFound(LocalServerError):
    """No usable server binary of the requested kind; the message says how to install one."""


class ServerStartError(LocalServerError):
    """The server process did not answer PING before its deadline, or exited while starting.

    ``log_tail`` holds the last lines of the server's console output and log file, which is
    where Redis explains a bad config line or a port already in use.
    """

    def __init__(self, message: str, *, kind: str, port: int, log_tail: str) -> None:
        super().__init__(f"{message}\n--- server output (tail) ---\n{log_tail}")
        self.kind = kind
        self.port = port
        self.log_tail = log_tail
