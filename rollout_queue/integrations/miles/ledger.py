"""One miles rollout process's side of the queue: its reservations, its leases, and when each lease
commits.

miles builds its data source (``--data-source-path``) and its fully-async buffer
(``--custom-async-data-buffer-path``) separately, inside its ``RolloutManager`` actor, and hands
neither to the other; both need the same worker identity (the receipts of the data source's
reservations are settled by the buffer's ``put``) and the same leases (the data source's ``save``
checkpoints the queue, which it must not do under a lease the buffer holds). So each process keeps one ``MilesLedger`` per queue
(``ledger_for``), opened from the environment like every other process of this project
(``REDIS_URL``, ``ROLLOUT_QUEUE``).

When a lease commits, read at radixark/miles@31f1ca96 (``train_async.py``,
``miles/rollout/fully_async_rollout.py``, ``miles/ray/rollout/rollout_manager.py``,
``miles/ray/placement_group.py``, ``miles/backends/megatron_utils/actor.py``):

1. Rollout ``k``'s batch is one ``_drain`` of the rollout function: ``rollout_batch_size`` calls of
   the buffer's ``get`` and then exactly one ``get_metrics``. The drains run in rollout order from
   ``args.start_rollout_id``, so the buffer counts them (``end_drain``).
2. A group's lease commits as ``get`` hands it out, as queue step ``rollout_id + 1`` (``hand_out``),
   before miles trains it. Why not once it is known trained: ``train_async.py`` (lines 96-103) saves
   the model (``save_training_model(actor_model, k)``) and only then calls
   ``rollout_manager.save(k)``, so a commit deferred to the data source's ``save(k)`` (or to a later
   drain) leaves rollouts trained into checkpoint ``k`` leased when the process dies between the
   two: they come back at their deadline and are trained twice. A commit at hand-out is exactly-once
   relative to checkpoints: checkpoint ``k`` covers rollouts up to ``k`` (generation of ``k + 1``,
   started before ``train(k)`` at line 81, is committed as step ``k + 2``, beyond it), and the
   resume from an earlier one requeues it. A kill between the lease and its commit leaves the lease
   to its deadline (nothing was trained). The commit runs without an ``await`` before ``get``
   returns, so a cancelled ``get`` never commits a group it does not return.
3. ``RolloutManager.save(k)`` runs after the model of rollout ``k`` is saved: the queue drops what
   the checkpoint covers (queue step ``k + 1``; deferred to a later save while a group is leased,
   since the queue's checkpoint refuses then: payloads are kept longer, nothing else). With
   ``--async-save`` miles' checkpoint ``k`` is only written when the next ``save_model`` finalises
   it (``actor.py`` ``save_model``: ``maybe_finalize_async_save(blocking=True)`` first), so a kill
   after ``save(k)`` resumes from the previous checkpoint: the queue then drops only what the
   previous save covers, never what a resume from it must requeue. ``load(k)``
   (``start_rollout_id - 1``, ``placement_group.py``) hands back what this process held and
   requeues every group committed after rollout ``k``.
4. Queue steps are rollout ids plus one, so a fresh start (miles' ``load(-1)``) restores step 0:
   every group a crashed earlier run committed is trained again, since its weights are gone.
5. A lease lives from ``get``'s lease to its commit (or its rollback, for a group stale at
   consumption): a lease that is never committed goes back, rolled back by ``load`` or by the
   reaper at its deadline when this process dies. While the process lives a thread heartbeats its
   reservations and extends its open leases, so neither times out.
6. Hang-to-error (issue 31, section 5): that heartbeat registers this process as a worker, so the
   queue's own fleet rule (core/liveness.py) would count it alive for as long as miles runs and a
   ``get`` waiting for groups from rollout-queue workers that all died would wait for ever. The
   buffer's blocking lease uses ``fleet`` instead: the same rule, with this process's own worker
   left out while it holds no reservation (miles' engines generate nothing for the queue then). It
   counts as alive only while its last heartbeat, timed from before the call, is younger than
   ``worker_timeout_s``, so a live worker elsewhere is never hidden. While it holds a reservation,
   miles' own engines are the fleet and nothing changes.

No decision spans round trips: each call is one queue operation; the class remembers only which
leases are its own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from rollout_queue.api.lease import Lease
from rollout_queue.api.queue import RolloutQueue, default_process_id
from rollout_queue.api.worker import Worker
from rollout_queue.core.errors import IntegrationConfigError, LeasesOpen, RolloutQueueError
from rollout_queue.core.liveness import FleetWatch
from rollout_queue.core.models import QueueStats
from rollout_queue.integrations.environment import queue_address
from rollout_queue.ops.logs import fields

log = logging.getLogger("rollout_queue.integrations.miles")

__all__ = ["MilesLedger", "OthersWatch", "ledger_for"]

_LEDGERS: dict[tuple[str, str], "MilesLedger"] = {}
_LEDGERS_LOCK = threading.Lock()


def ledger_for(args: Any, environ: Mapping[str, str] | None = None) -> "MilesLedger":
    """This process's ledger of the queue the environment names (``queue_address``; opened once).
    Raises IntegrationConfigError when it names none."""
    url, name = queue_address(needs="the miles integration", environ=environ)
    with _LEDGERS_LOCK:
        ledger = _LEDGERS.get((url, name))
        if ledger is None:
            ledger = _LEDGERS[(url, name)] = MilesLedger(RolloutQueue.from_url(url, name, create=False), args)
        return ledger


def forget_ledgers() -> None:
    """Close every ledger of this process (tests; miles' ``dispose``)."""
    with _LEDGERS_LOCK:
        ledgers = list(_LEDGERS.values())
        _LEDGERS.clear()
    for ledger in ledgers:
        ledger.close()


class OthersWatch(FleetWatch):
    """The queue's fleet rule over every worker but this process's own, while it holds nothing (rule 6)."""

    def __init__(self, ledger: "MilesLedger", grace_s: float | None = None) -> None:
        super().__init__(grace_s)
        self.ledger = ledger

    def observe(self, stats: QueueStats, worker_timeout_s: float, now: float, waited_s: float = 0.0) -> float | None:
        if not self.ledger.sources and self.ledger.beating(worker_timeout_s):
            stats = dataclasses.replace(stats, workers_alive=max(0, stats.workers_alive - 1))
        return super().observe(stats, worker_timeout_s, now, waited_s)


class MilesLedger:
    """The reservations and leases of one miles rollout process (module docstring, rules 1-6)."""

    def __init__(self, queue: RolloutQueue, args: Any, *, tick_s: float | None = None) -> None:
        if queue.driver.is_async:
            raise IntegrationConfigError("MilesLedger drives a sync queue (RolloutQueue.from_url)")
        self.queue, self.args = queue, args
        self.worker: Worker = queue.worker(default_process_id())
        self.lease_timeout_s = float(os.environ.get("ROLLOUT_MILES_LEASE_TIMEOUT_S") or queue.config.lease_timeout_s)
        #: leases taken by ``get`` and neither handed out (committed) nor given back yet (rule 5)
        self.open: list[Lease] = []
        #: the rollout whose drain the buffer's ``get`` serves (rule 1)
        self.rollout_id = int(getattr(args, "start_rollout_id", None) or 0)
        #: with ``--async-save``: the last rollout miles saved or resumed from; written once the next
        #: ``save_model`` has returned (rule 3)
        self.async_save = bool(getattr(args, "async_save", False))
        self.previous_save: int | None = None
        #: entry_id -> the prompt record its reservation carried, from reserve to put (what a stored
        #: sample need not repeat; codec rule 1)
        self.sources: dict[str, dict[str, Any]] = {}
        #: serialises leasing and hand-out against save's checkpoint (rule 3) and guards ``open``
        self.lock = threading.RLock()
        #: the buffer's view of whether the rollout-queue workers are gone (rule 6)
        self.fleet = OthersWatch(self)
        self._beat_at: float | None = None   # monotonic time just before the last heartbeat that succeeded
        self._stop = threading.Event()
        self._tick_s = tick_s or max(0.5, min(queue.config.worker_timeout_s, self.lease_timeout_s) / 4)
        self._thread = threading.Thread(target=self._keepalive, name=f"miles-ledger-{queue.name}", daemon=True)
        self._thread.start()

    # -- the buffer's side ------------------------------------------------------------------------

    def end_drain(self) -> None:
        """``get_metrics``: the drain of ``rollout_id`` is complete; the next get serves the next one."""
        with self.lock:
            self.rollout_id += 1

    def lease_one(self, block_ms: int) -> Lease | None:
        """One completed group, leased until ``hand_out`` or ``give_back`` (None when none came in ``block_ms``)."""
        with self.lock:
            lease = self.queue.lease(groups=1, timeout_s=self.lease_timeout_s, block_ms=0,
                                     trainer_id=self.worker.worker_id)
            if lease is not None:
                self.open.append(lease)
                return lease
        if block_ms:  # wait outside the lock (save must not wait behind an idle lease call), then try once more
            lease = self.queue.lease(groups=1, timeout_s=self.lease_timeout_s, block_ms=block_ms,
                                     trainer_id=self.worker.worker_id, fleet=self.fleet)  # WorkersGone: rule 6
            if lease is not None:
                with self.lock:
                    self.open.append(lease)
        return lease

    def _forget(self, lease: Lease) -> None:
        """``lease`` is no longer open (handed out or given back); call under ``lock``."""
        if lease in self.open:
            self.open.remove(lease)

    def hand_out(self, lease: Lease) -> int:
        """``get`` returns this group to miles: commit it now as queue step ``rollout_id + 1`` (rule 2).
        Returns the step. LeaseLost propagates: the group went back to the queue and must not be trained."""
        with self.lock:
            self._forget(lease)
            step = self.rollout_id + 1
            lease.commit(step=step)
            return step

    def give_back(self, lease: Lease) -> None:
        """A leased group miles will not train (stale at consumption, or its get was cancelled):
        requeued to be generated again (an uncounted rollback)."""
        with self.lock:
            self._forget(lease)
        lease.rollback()

    # -- the data source's side -------------------------------------------------------------------

    def save(self, rollout_id: int) -> int:
        """``DataSource.save``: rollout ``rollout_id``'s model is saved (rule 3). Returns how many
        payloads the queue dropped (0 when a lease deferred the checkpoint, or, with ``--async-save``,
        when no earlier checkpoint is known written)."""
        with self.lock:
            covered: int | None = rollout_id
            if self.async_save:  # checkpoint rollout_id may be unwritten yet; the one before it is written
                covered, self.previous_save = self.previous_save, rollout_id
            if covered is None:
                return 0
            try:
                return int(self.queue.checkpoint(covered + 1))
            except LeasesOpen as exc:  # leased meanwhile (another trainer, or a get between lease and hand-out):
                # nothing was written; the next save checkpoints further
                log.warning("queue checkpoint deferred: groups are leased", exc_info=exc,
                            extra=fields(queue=self.queue.name, rollout_id=rollout_id))
                return 0

    def load(self, rollout_id: int | None) -> int:
        """``DataSource.load``: miles resumed from rollout ``rollout_id`` (``-1``/None: from scratch).
        Returns how many groups were requeued."""
        with self.lock:
            for lease in self.open:
                lease.rollback()
            self.open.clear()
            self.rollout_id = (rollout_id if rollout_id is not None else -1) + 1
            # the checkpoint resumed from is written; with --async-save it is what the next save covers
            self.previous_save = rollout_id if rollout_id is not None and rollout_id >= 0 else None
            return int(self.queue.restore(max(0, self.rollout_id)))

    # -- liveness ---------------------------------------------------------------------------------

    def beating(self, worker_timeout_s: float) -> bool:
        """Whether the queue surely counts this process's worker alive: its last heartbeat, timed from
        before the call (so never younger than it is), is younger than ``worker_timeout_s``."""
        beat = self._beat_at
        return beat is not None and time.monotonic() - beat < worker_timeout_s

    def _keepalive(self) -> None:
        """Heartbeat the reservations and extend the open leases until close() (rule 5)."""
        while not self._stop.wait(self._tick_s):
            try:
                started = time.monotonic()
                self.worker.heartbeat()
                self._beat_at = started
                with self.lock:
                    leases = list(self.open)
                for lease in leases:
                    if lease.closed is None:
                        lease.extend(self.lease_timeout_s)
            except (RolloutQueueError, OSError) as exc:  # the next tick tries again; the deadlines are the bound
                log.warning("miles ledger keepalive failed; retrying", exc_info=exc,
                            extra=fields(queue=self.queue.name))

    def close(self) -> None:
        """Stop the keepalive and hand back this process's reservations (leases are left to load()
        or their deadline: they may already be trained)."""
        with _LEDGERS_LOCK:
            for key in [k for k, v in _LEDGERS.items() if v is self]:
                del _LEDGERS[key]
        self._stop.set()
        self._thread.join(timeout=self._tick_s + 5)
        try:
            self.worker.close()
        except (RolloutQueueError, OSError) as exc:  # the reaper requeues them after worker_timeout_s
            log.warning("could not hand back reservations at close", exc_info=exc, extra=fields(queue=self.queue.name))
        self.queue.close()
