"""LeaseBeat: a queue's open leases beat while their holder lives (lease_beat.lua).

Why: a lease's deadline (``lease_timeout_s``, 600 s by default) must outlast the longest optimizer
step, so a trainer that dies holding a lease used to hold its groups for up to that long, and
nothing told it apart from a slow one. A beating lease is taken back by the reaper
``trainer_silence_s`` after its last beat instead (DESIGN: Failure handling), and the views say how
long its holder has been silent.

One LeaseBeat per queue object: ``RolloutQueue.lease`` beats a new lease once before handing it out
(so the bound holds from the first instant), then adds it here; commit, rollback and LeaseLost
remove it. Every ``trainer_silence_s / BEATS_PER_SILENCE`` one pass beats every open member lease,
one lease_beat call each (the interval follows the stored bound each beat answers, so a
``config set trainer_silence_s`` reaches running trainers at their next beat).

The pass is one flow, written once; only what runs it differs: a daemon thread on a sync queue
(redis-py's connection pool is thread-safe, and a thread beats while the trainer's own thread is
inside a long step), a task on the running loop of an asyncio queue (redis.asyncio connections
belong to their loop). An asyncio trainer that blocks its loop for longer than trainer_silence_s
looks dead: run the step off the loop (``asyncio.to_thread``) or lease with ``beat=False``.

Rules: a beat never raises into the trainer (a failed beat is logged and retried at the next, and
the bound allows three to fail); a lease the script calls lost is dropped and never beaten again;
nothing here settles or moves a group.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Awaitable, cast

from redis.exceptions import RedisError

from rollout_queue.core import flows
from rollout_queue.core.config import BEATS_PER_SILENCE
from rollout_queue.core.errors import LeaseLost, RolloutQueueError
from rollout_queue.core.flows import Flow

if TYPE_CHECKING:
    from rollout_queue.api.lease import Lease
    from rollout_queue.api.queue import RolloutQueue

log = logging.getLogger("rollout_queue.api.beat")


def beat_lease(lease: "Lease") -> Flow[float | None]:
    """Beat every member of ``lease`` not committed yet. Returns the beat interval the stored bound
    asks for (seconds; None: the queue judges no silence, so no further beat is needed). Raises
    LeaseLost when a member is gone."""
    interval: float | None = None
    for k, (keys, lease_id, token) in enumerate(lease.members):
        if k in lease.committed:
            continue
        _, _, silence_ms = yield from flows.beat(keys, lease_id, token)
        if silence_ms > 0:
            every = silence_ms / 1000 / BEATS_PER_SILENCE
            interval = every if interval is None else min(interval, every)
    return interval


class LeaseBeat:
    """The open leases of one queue object and the thread or task that beats them."""

    def __init__(self, queue: "RolloutQueue") -> None:
        self.queue = queue
        self.leases: dict[int, "Lease"] = {}
        self.interval_s = 15.0  # replaced by each pass's answer (trainer_silence_s / BEATS_PER_SILENCE)
        self.beats = 0  # passes that beat every lease they held
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._runner: threading.Thread | asyncio.Task[None] | None = None

    def add(self, lease: "Lease", interval_s: float) -> None:
        """Beat ``lease`` from now on, every ``interval_s`` (or what a later beat answers)."""
        with self._lock:
            self.leases[id(lease)] = lease
            self.interval_s = min(self.interval_s, interval_s) if self._runner else interval_s
            if self._runner is not None:
                return
            # Each runner has its own stop: one stopped by close() never beats beside a later one.
            self._stop = stop = threading.Event()
            if self.queue.driver.is_async:
                self._runner = asyncio.get_running_loop().create_task(self._run_async(stop))
            else:
                self._runner = threading.Thread(target=self._run, args=(stop,), name=f"lease-beat:{self.queue.name}",
                                                daemon=True)
                self._runner.start()

    def discard(self, lease: "Lease") -> None:
        """Stop beating ``lease`` (it was committed, rolled back or lost); the runner ends with the last."""
        with self._lock:
            self.leases.pop(id(lease), None)

    def stop(self) -> None:
        """End the runner (the queue closes): no beat is sent after this returns, bar one in flight."""
        with self._lock:
            self.leases.clear()
            runner, self._runner = self._runner, None
        self._stop.set()
        if isinstance(runner, asyncio.Task):
            runner.cancel()
        elif runner is not None and runner is not threading.current_thread():
            runner.join(timeout=1.0)

    def _open(self, stop: threading.Event) -> list["Lease"] | None:
        """The leases to beat now; None (and the runner forgotten) once there is none or it was stopped."""
        with self._lock:
            if stop.is_set():
                return None
            if not self.leases:
                self._runner = None
                return None
            return list(self.leases.values())

    def _pass(self, leases: list["Lease"]) -> Flow[None]:
        """One beat of each lease; a lost one is dropped (its holder learns it at commit)."""
        for lease in leases:
            try:
                interval = yield from beat_lease(lease)
            except LeaseLost as exc:
                log.info("lease %s is %s: no longer beaten", exc.lease_id, exc.state)
                self.discard(lease)
                continue
            if interval is not None:
                self.interval_s = interval
        self.beats += 1

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            leases = self._open(stop)
            if leases is None:
                return
            try:
                self.queue.run(self._pass(leases))
            except (RolloutQueueError, RedisError, OSError) as exc:
                self._warn(exc)

    async def _run_async(self, stop: threading.Event) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            leases = self._open(stop)
            if leases is None:
                return
            try:
                await cast(Awaitable[None], self.queue.run(self._pass(leases)))  # an asyncio queue's
            except (RolloutQueueError, RedisError, OSError) as exc:
                self._warn(exc)

    def _warn(self, exc: BaseException) -> None:
        log.warning("lease beat failed; retrying at the next beat (%d lease(s) held): %s", len(self.leases), exc,
                    extra={"queue": self.queue.name})

    def __repr__(self) -> str:
        return f"<LeaseBeat {self.queue.name!r} leases={len(self.leases)} every {self.interval_s:.1f}s>"
