"""The worker runtime: reserve -> generate -> reward -> filter -> complete, on one asyncio loop.

What it owns (DESIGN: Submission scheduler, Failure handling, Weight updates and admission holds):

1. The attempt. Each reservation becomes ``n`` concurrent ``engine.generate`` calls, one per parent
   slot (request id ``<entry_id>/<attempt>/<slot>``, prefixed by the receipt's queue and partition
   when it has them), then rewards, the filter, and exactly one
   settlement by receipt (``attempt.Settler`` with a ``verdicts.Verdict``). Completions of attempts
   that finish together share one ``complete_many`` call (``completions.BatchingWorker``).
2. Reserving, through ``ServedQueues`` (served.py: one queue, or several by weight, each of one
   partition or P; the runtime never sees which). Only ``SubmissionScheduler.request()`` decides how much to ask for; ``reserve``
   blocks (``block_ms``) when nothing is granted (empty queue, admission hold, backpressure), so
   the worker never spins. Nothing is reserved while weights load or once the worker stops.
3. Liveness (``heartbeat.py``), policy versions (``versions.py``) and reconciliation
   (``reconcile.py``) run beside it; this module only starts and stops them.
4. The life cycle (``states.py``): STARTING -> RUNNING -> DRAINING or FAILING -> CLOSING ->
   STOPPED or FAILED, every change through ``_advance``, which also wakes the loops that care.
   Drain (``request_drain()``, SIGTERM): stop reserving, let in-flight attempts finish until the
   drain deadline, abort the rest, ``close()``, deregister. Fatal error (``EngineError``, any other
   exception from the engine, a weight load that failed while applying, Redis unreachable past
   the retry window, or ``EnvironmentsHung``; weights refused before anything was applied are not,
   at start as later): stop reserving, count the failure against the one attempt it is
   attributed to (the attempt whose own engine request raised it first: settled ``failed``, so a
   prompt that kills engines still ends in the dead letters), cancel every attempt that still needs
   the engine (those already settling get ``abort_grace_s``), ``close()`` so every other owned
   attempt returns to ready exactly and uncounted (``aborted``: not their fault), and only then
   ``run()`` raises ``WorkerFailed``.
5. Reporting: every fact is a typed event (``events.py``), logged once and handed to ``on_event``.

It must not: settle an attempt twice, hold a reservation it is not executing, heartbeat after
deregistering, know a Redis key, or decide anything the queue's scripts decide (capacity, holds,
staleness).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

from rollout_queue import Durability, Progress, Receipt, Reservation
from rollout_queue.api.queue import default_process_id
from rollout_queue.core.errors import QueueNotFound
from rollout_queue.ops.logs import fields
from rollout_queue.workers.attempt import Attempt, Phase, RuntimeStats, Settler
from rollout_queue.workers.engines.base import Engine
from rollout_queue.workers.events import (
    CloseFailed,
    DrainDeadline,
    DrainHurried,
    DrainRequested,
    EngineCloseFailed,
    Event,
    FatalError,
    Observer,
    Reserved,
    StateChanged,
    WaitingForQueue,
    WorkerClosed,
    WorkerStarted,
    log_event,
)
from rollout_queue.workers.execution import AttemptExecutor
from rollout_queue.workers.saves import ProgressSaver
from rollout_queue.workers.heartbeat import HeartbeatThread, PushNotice, VersionNotice
from rollout_queue.workers.reconcile import Reconciler, RuntimeView, interval_for
from rollout_queue.workers.options import WorkerFailed, WorkerOptions
from rollout_queue.workers.environments import EnvironmentHost
from rollout_queue.workers.rewards import Scorer
from rollout_queue.workers.trajectory import TrajectoryLimits, TrajectoryRunner
from rollout_queue.workers.scheduler import SubmissionScheduler
from rollout_queue.workers.served import ServedQueues, ServedQueuesRefused, check_follower, parse_queue_spec
from rollout_queue.workers.states import Lifecycle, RuntimeState
from rollout_queue.workers.tasks import cancel, first_of, wait_tasks
from rollout_queue.workers.verdicts import Abort, Fail
from rollout_queue.workers.pushes import PushFollower
from rollout_queue.workers.versions import PolicyVersions

__all__ = ["WorkerFailed", "WorkerOptions", "WorkerRuntime"]  # the options live in options.py

log = logging.getLogger("rollout_queue.workers.runtime")
S = RuntimeState
#: Seconds between two looks for a queue that does not exist yet (one connection and one read each).
QUEUE_POLL_S = 1.0


class WorkerRuntime:
    """One worker with one engine on one queue, or on several by weight. ``await run()`` serves
    until drained or failed."""

    def __init__(self, url: str, queue: str | Mapping[str, float], engine: Engine,
                 options: WorkerOptions | None = None, *, worker_id: str | None = None, scorer: Scorer | None = None,
                 durability: Durability | None = None, on_event: Observer | None = None, partitions: int = 1,
                 create: bool = True, environment: EnvironmentHost | None = None,
                 trajectory: TrajectoryLimits | None = None) -> None:
        """``queue``: a name, or several by weight (``"run-a:3,run-b:1"`` or a mapping; served.py:
        the policy versions follow the first). ``partitions``: the queues' partition count;
        ``create=False``: QueueNotFound for a missing queue instead of creating it (the shipped
        worker). ``durability``: durable mode for the worker's queue clients (the heartbeat
        threads' own clients stay plain: a lost beat only ages the worker). ``on_event``: called on
        the loop with every event, after it is logged (events.py: it must be quick and must not raise).
        ``environment``: run every sample as a multi-turn trajectory against it, within ``trajectory``
        limits (trajectory.py)."""
        self.weights = parse_queue_spec(queue)  # ValueError for a malformed spec, before anything starts
        self.queue_names = list(self.weights)
        self.url, self.queue_name, self.engine = url, ",".join(self.queue_names), engine
        self.partitions, self.create = partitions, create
        self.durability = durability
        self.options = options or WorkerOptions()
        self.worker_id = worker_id or default_process_id()
        self.scorer = scorer or Scorer()
        self.environment, self.trajectory = environment, trajectory
        self.stats = RuntimeStats()
        self._started = time.monotonic()
        self.scheduler: SubmissionScheduler | None = None
        self.heartbeat: HeartbeatThread | None = None  # the first queue's (the one whose versions count)
        self.heartbeats: list[HeartbeatThread] = []  # one per queue served
        self.versions = PolicyVersions(engine, self.options.weights_mode, self.stats, self._emit)
        self.pushes: PushFollower | None = None  # set at start when the engine can receive pushes
        self._on_event = on_event
        self._lifecycle = Lifecycle()
        self._attempts: dict[Receipt, Attempt] = {}
        self._reserving_since: float | None = None  # monotonic start of the reserve call in flight
        self._fatal: BaseException | None = None
        self._drain_deadline: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: ServedQueues | None = None
        self._executor: AttemptExecutor  # set by run()
        # Wake-ups for the loops, set by _advance (and the hurry by request_drain), never cleared
        # except slot_freed, which the reserve loop clears before it asks the scheduler again.
        self._stopping = asyncio.Event()  # reserve nothing more
        self._failing = asyncio.Event()  # a drain in progress ends now
        self._hurry = asyncio.Event()  # a second drain request: skip the rest of the drain timeout
        self._slot_freed = asyncio.Event()

    @property
    def state(self) -> RuntimeState:
        return self._lifecycle.state

    @property
    def loaded_version(self) -> int:
        return self.versions.loaded

    @property
    def held(self) -> bool | None:
        return self.versions.held

    # -- control --------------------------------------------------------------------------------

    def request_drain(self) -> None:
        """Begin a drain (SIGTERM); a second request skips the rest of the drain timeout. Ignored
        once the worker is failing or closing: it is already returning its work."""
        if self.state is S.DRAINING:
            self._emit(DrainHurried())
            self._hurry.set()
            return
        if self.state.is_stopping:
            return
        self._drain_deadline = time.monotonic() + self.options.drain_timeout_s
        self._emit(DrainRequested(self.options.drain_timeout_s))
        self._advance(S.DRAINING)

    def drain_threadsafe(self) -> None:
        """``request_drain`` from another thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.request_drain)

    def _fail(self, exc: BaseException) -> None:
        """Stop on a fatal error. The first one is kept (``run()`` raises it as the cause); those
        after it are its consequences and are dropped."""
        if self._fatal is not None or self.state.is_terminal:
            return
        self._fatal = exc
        self._emit(FatalError(exc))
        if self.state is not S.CLOSING:  # closing already: close() sees _fatal and returns work as lost
            self._advance(S.FAILING)

    def _advance(self, to: RuntimeState) -> None:
        """The one place the state changes (IllegalTransition: a runtime bug), and what it wakes."""
        previous = self._lifecycle.advance(to)
        self._emit(StateChanged(previous, to))
        if to.is_stopping:
            self._stopping.set()
            self._slot_freed.set()  # the reserve loop may be waiting for a slot: let it see the stop
        if to is S.FAILING:
            self._failing.set()

    def _emit(self, event: Event) -> None:
        log_event(event, {"queue": self.queue_name, "worker": self.worker_id})
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # an observer's bug must not change what the worker does: logged here
                log.exception("event observer failed", extra=self._fields(event=type(event).__name__))

    def _fields(self, receipt: Receipt | None = None, **more: Any) -> dict[str, Any]:
        ids = {} if receipt is None else {"entry": receipt.entry_id, "attempt": receipt.attempt}
        return fields(queue=self.queue_name, worker=self.worker_id, **ids, **more)

    # -- life cycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until drained (returns) or failed (raises WorkerFailed after requeueing)."""
        self._loop = asyncio.get_running_loop()
        clean = False
        try:
            await self._open_and_serve()
            clean = self._fatal is None
        finally:
            self.scorer.close()
            await self._close_engine()  # idempotent: _serve already closed it after deregistering
            # From CLOSING, or (engine or queue never opened) from STARTING or an early DRAINING.
            self._advance(S.STOPPED if clean else S.FAILED)
        if self._fatal is not None:
            raise WorkerFailed(f"worker {self.worker_id} stopped: {self._fatal!r}") from self._fatal

    async def _open_and_serve(self) -> None:
        # The queues first: a mistyped --queue (QueueNotFound) must not wait for an engine's start-up.
        # Opening registers nothing, so an engine that fails to start leaves nothing to return.
        self._worker = await self._open_queues()
        try:
            try:
                await self.engine.start()
            except Exception as exc:  # nothing is owned yet: there is nothing to return
                raise WorkerFailed(f"engine failed to start: {exc}") from exc
            # Attempts of one queue finishing together complete in one complete_many (completions.py).
            settler = Settler(self._worker, self.scorer, self.engine.decode, self.stats, self._emit)
            runner = (None if self.environment is None
                      else TrajectoryRunner(self.engine, self.environment, self.versions, self.trajectory))
            saver = ProgressSaver(self.engine, self._worker, self._emit, self.options.save_progress_every_s)
            self._executor = AttemptExecutor(self.engine, self.options.sampling, self.versions, settler,
                                             self._sample_done, runner, saver)
            await self._serve()
        finally:
            await self._worker.aclose()

    async def _open_queues(self) -> ServedQueues:
        """Open the queues served. One that does not exist yet (a trainer not started, or still
        creating its partitions) is waited for, up to ``options.queue_wait_s``, logged once, asked
        again every QUEUE_POLL_S; then, or at a drain request meanwhile, QueueNotFound as before."""
        deadline = time.monotonic() + self.options.queue_wait_s
        waiting = False
        while True:
            try:
                return await ServedQueues.open(self.url, self.weights, self.worker_id, partitions=self.partitions,
                                               create=self.create, durability=self.durability)
            except QueueNotFound as exc:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    raise
                if not waiting:
                    self._emit(WaitingForQueue(exc.queue, self.options.queue_wait_s))
                    waiting = True
                try:
                    await asyncio.wait_for(self._stopping.wait(), min(QUEUE_POLL_S, left))
                except asyncio.TimeoutError:
                    pass

    async def _serve(self) -> None:
        assert self._worker is not None
        tasks: list[asyncio.Task[None]] = []
        try:
            await self.versions.adopt(await self._worker.heartbeat(), load=self.options.load_initial_weights)
            if self.options.weights_push and getattr(self.engine, "supports_push", False):
                self.pushes = PushFollower(self.engine, self._worker.join_push, lambda: self.versions.loaded,
                                           self.stats, self._emit)
            self.scheduler = self.options.scheduler(self.engine.max_concurrency, self.engine.prefills_per_step)
            interval = self.options.heartbeat_interval_s or self._worker.worker_timeout_s / 4
            for name in self.queue_names:  # liveness on every queue; versions from the first only
                lead = name == self.queue_names[0]
                beat = HeartbeatThread(self.url, name, self.worker_id, interval,
                                       self._notice_threadsafe if lead else self._follower_notice(name),
                                       subscribe=lead and self.options.subscribe_versions,
                                       partitions=self.partitions, progress=self._progress if lead else None)
                self.heartbeats.append(beat)
                beat.start()
            self.heartbeat = self.heartbeats[0]
            self._emit(WorkerStarted(self.options.policy, self.versions.loaded))
            if self.state is S.STARTING:  # a drain requested during start-up stays a drain
                self._advance(S.RUNNING)
            tasks = [asyncio.create_task(self._guarded(self._reserve_loop())),
                     asyncio.create_task(self._guarded(self.versions.follow(self._abort_generating)))]
            if self.pushes is not None:
                tasks.append(asyncio.create_task(self._guarded(self.pushes.run()), name=f"pushes:{self.worker_id}"))
            reconciler = self._make_reconciler(self._worker.worker_timeout_s)
            if reconciler is not None:
                tasks.append(asyncio.create_task(reconciler.run(), name=f"reconcile:{self.worker_id}"))
            await self._stopping.wait()
            await asyncio.wait([tasks[0]])  # the reserve in flight returns within block_ms
            if self.state is S.DRAINING:
                await self._drain()
            await self._abandon()
        except Exception as exc:  # e.g. the initial weights failed while applying: still give work back
            self._fail(exc)
            await self._abandon()
        finally:
            self._advance(S.CLOSING)
            await cancel(tasks)
            for beat in self.heartbeats:
                beat.stop()  # before close: a late beat would re-register the worker
            await self._close_worker()
            await self._close_engine()

    async def _guarded(self, loop: Awaitable[None]) -> None:
        """Run one of the runtime's loops; an exception out of it is fatal for the worker."""
        try:
            await loop
        except Exception as exc:  # EngineError, a failed weight load, Redis lost past the retry window, a bug
            self._fail(exc)

    def _make_reconciler(self, worker_timeout_s: float) -> Reconciler | None:
        interval = interval_for(self.options.reconcile_interval_s, worker_timeout_s)
        if interval <= 0:
            return None
        assert self._worker is not None
        view = RuntimeView(lambda: list(self._attempts), lambda: self._reserving_since, self._stopping, self._fail)
        return Reconciler(self._worker, view, interval, self.options.reconcile_grace_s, self.stats, self._fields)

    async def _drain(self) -> None:
        deadline = self._drain_deadline or time.monotonic()
        pending = await self._wait_attempts(deadline - time.monotonic(), self._hurry, self._failing)
        if pending and self.state is S.DRAINING:
            self._emit(DrainDeadline(len(pending)))
            await self._executor.abort(list(self._attempts.values()), "worker drained")
            await self._wait_attempts(self.options.abort_grace_s, self._failing)

    async def _abandon(self) -> None:
        """Cancel what is left; after a fatal error, attempts already settling (they no longer need
        the engine) get ``abort_grace_s`` to finish. close() then requeues whatever is still owned."""
        if self.state is S.FAILING:
            await cancel([a.task for a in self._attempts.values() if a.phase is not Phase.SETTLING])
            await self._wait_attempts(self.options.abort_grace_s)
        await cancel([a.task for a in self._attempts.values()])

    async def _wait_attempts(self, timeout_s: float, *interrupts: asyncio.Event) -> set[asyncio.Task[None]]:
        return await wait_tasks([a.task for a in self._attempts.values() if a.task is not None], timeout_s,
                                *interrupts)

    async def _close_worker(self) -> None:
        """Return every attempt still owned, uncounted: after a drain, and after a fatal error too,
        whose one attributable attempt ``_blame`` already counted (the others are not at fault)."""
        assert self._worker is not None
        terminal = "aborted"
        reason = "worker drained" if self._fatal is None else f"fatal worker error: {self._fatal!r}"[:500]
        try:
            requeued, dead = await self._worker.close(terminal, reason)
        except Exception as exc:  # Redis gone: the reaper requeues our work after worker_timeout_s
            self._emit(CloseFailed(exc))
            self._fatal = self._fatal or exc
            return
        self._emit(WorkerClosed(terminal, requeued, dead, self.stats.reconciled, tuple(self.stats.settled.items()),
                                tuple(self.stats.generated.items())))

    async def _close_engine(self) -> None:
        try:
            await self.engine.close()
        except Exception as exc:  # the worker is already deregistered; just report it
            self._emit(EngineCloseFailed(exc))

    # -- reserving ------------------------------------------------------------------------------

    async def _reserve_loop(self) -> None:
        assert self._worker is not None and self.scheduler is not None
        while not self._stopping.is_set():
            await first_of(self.versions.ready, self._stopping)
            self._slot_freed.clear()
            if self._stopping.is_set():
                return
            ask = self.scheduler.request()
            if ask is None:
                await self._slot_freed.wait()
                continue
            # Until its grants are held (or handed back), the reconciler must not take them
            # for orphans: it skips whatever was delivered after this instant.
            self._reserving_since = time.monotonic()
            # The engines queue requests beyond their concurrency, so a sample-policy worker takes
            # a group larger than its free slots when it is the oldest (overcommit): one such
            # group never freezes a fleet whose slots are all smaller than it (issue 12 item 2).
            got = await self._worker.reserve(ask.max_groups, block_ms=self.options.block_ms,
                                             max_samples=ask.max_samples, overcommit=ask.overcommit)
            self.stats.reserves.append((time.monotonic(), len(got)))
            if self._stopping.is_set():
                for r in got:  # never hold work we will not execute: back to ready, not counted
                    await self._executor.settler.settle(Attempt(r), Abort("worker stopping"))
                return
            for r in got:
                self._start(r)
            self._reserving_since = None

    def _start(self, r: Reservation) -> None:
        assert self.scheduler is not None
        self.scheduler.on_reserved(r.receipt, r.group.n)
        attempt = Attempt(r)
        self._attempts[r.receipt] = attempt
        attempt.task = asyncio.create_task(self._run_attempt(attempt), name=f"attempt:{r.entry_id}/{r.receipt.attempt}")
        self._emit(Reserved(r.receipt, r.group.n, r.version))

    # -- one attempt ----------------------------------------------------------------------------

    async def _run_attempt(self, a: Attempt) -> None:
        try:
            await self._execute(a)
        except Exception as exc:  # fatal for the worker: an engine failure, Redis lost past the retry window, a bug
            attributed = self._fatal is None and a.engine_error is exc  # its own request raised it, first
            self._fail(exc)
            if attributed and self._fatal is exc:
                await self._blame(a, exc)
        finally:
            self._attempts.pop(a.receipt, None)
            if self.scheduler is not None:
                self.scheduler.on_group_terminal(a.receipt)
            self._slot_freed.set()

    async def _execute(self, a: Attempt) -> None:
        await self.versions.ready.wait()
        if self.state is S.FAILING:
            return  # the engine is unusable; close() returns this attempt, uncounted
        await self._executor.execute(a)

    async def _blame(self, a: Attempt, exc: BaseException) -> None:
        """Count a fatal engine error against the attempt whose request raised it, and only it: settled
        ``failed`` with the error as the reason (rule 4: a prompt that kills engines must not loop for
        ever). The requests that fail after it share the dead engine's fate, not its blame: close()
        returns their attempts uncounted. When the engine dies under all its requests at once, the
        first to report it is the one counted."""
        a.phase = Phase.SETTLING  # _abandon leaves it abort_grace_s to settle
        try:
            await self._executor.settler.settle(a, Fail(f"the engine failed under this group's request: {exc!r}"))
        except Exception:  # Redis unreachable past the retry window: close() returns it, or the reaper does
            return

    def _sample_done(self, a: Attempt) -> None:
        if self.scheduler is not None and self.scheduler.on_sample_done(a.receipt):
            self._slot_freed.set()

    # -- policy versions ------------------------------------------------------------------------

    def _progress(self) -> Progress:
        """Read by the heartbeat thread at each beat (plain int reads of counters the loop writes)."""
        return Progress(self.stats.settled["completed"], self.stats.tokens,
                        int((time.monotonic() - self._started) * 1000),
                        tuple(self.stats.sample_tokens), tuple(self.stats.sample_seconds))

    def _notice_threadsafe(self, notice: VersionNotice | PushNotice) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                if isinstance(notice, PushNotice):
                    if self.pushes is not None:
                        loop.call_soon_threadsafe(self.pushes.notice, notice)
                else:
                    loop.call_soon_threadsafe(self.versions.notice, notice)
            except RuntimeError:
                return  # the loop closed between the check and the call: the worker is gone

    def _follower_notice(self, name: str) -> Callable[[VersionNotice | PushNotice], None]:
        """A follower queue's heartbeat news: only checked (served.py), never followed."""

        def on_notice(notice: VersionNotice | PushNotice) -> None:
            if isinstance(notice, PushNotice):
                return  # not subscribed: a follower's beats carry versions only
            try:
                check_follower(name, self.queue_names[0], notice)
            except ServedQueuesRefused as exc:
                loop = self._loop
                if loop is not None and not loop.is_closed():
                    try:
                        loop.call_soon_threadsafe(self._fail, exc)
                    except RuntimeError:
                        return

        return on_notice

    async def _abort_generating(self, reason: str) -> None:
        await self._executor.abort([a for a in self._attempts.values() if a.phase is Phase.GENERATING], reason)
