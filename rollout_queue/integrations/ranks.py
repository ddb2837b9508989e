"""A data-parallel trainer (torch.distributed, W ranks) on one lease per step, committed once.

::

    ranked = RankedStream(queue, groups_per_step=8)          # every rank; dist.init_process_group first
    ranked.restore(resumed_step)
    for step in range(resumed_step + 1, last + 1):
        with ranked.step(step) as share:                      # this rank's groups of the step's lease
            loss(share.groups).backward(); optimizer.step()   # DDP all-reduces the gradients
        if step % save_every == 0:
            ranked.checkpoint(step, save)

How exactly-once holds across ranks:
1. Rank 0 alone leases and commits. It sends the lease's groups to every rank as one bytes packet
   (the lease's policy version, then core/codec.py ``encode_completed``: orjson + packed arrays, no
   pickle) over the process group;
   rank r takes groups r, r + W, r + 2W, ... of it: disjoint, deterministic, together the lease.
2. After the step every rank votes (an all-reduce MIN of 2 = done, 1 = raised, 0 = stopped).
   Rank 0 commits only on a unanimous 2, and then tells every rank the commit held; otherwise it
   rolls back (errored, with the reason the lowest raising rank broadcasts, when no rank stopped:
   DESIGN rule 4 counts it) and every rank raises RankFailed. A rank that dies mid-step (SIGKILL) breaks the collective: the
   survivors' call fails (gloo/NCCL report the lost peer, or the group's timeout fires), rank 0
   rolls the lease back, and nothing is committed. If rank 0 itself dies, the lease goes back at
   its deadline (the reaper). A step is committed whole or not at all.
3. Checkpoints: every rank runs ``save(step)`` (the framework decides who writes what), a barrier
   waits for all, then rank 0 lets the queue drop the data.

The collectives run on CPU tensors, so use a gloo group (or pass ``group=`` a gloo group created
beside the NCCL one: ``dist.new_group(backend="gloo")``).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rollout_queue.api.lease import error_reason
from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.codec import decode_completed, encode_completed
from rollout_queue.core.errors import IntegrationConfigError, RankFailed, RolloutQueueError
from rollout_queue.core.models import CompletedGroup
from rollout_queue.integrations.stream import TrainingStream
from rollout_queue.ops.logs import fields

log = logging.getLogger("rollout_queue.integrations.ranks")

__all__ = ["RankShare", "RankedStream"]

_FAILED = -1  # the packet length rank 0 sends when it could not lease (its error follows on rank 0)
_VERSION = struct.Struct("<q")  # the packet starts with the lease's policy version, then the groups


@dataclass(frozen=True)
class RankShare:
    """This rank's part of a step's lease."""

    step: int
    rank: int
    world: int
    groups: tuple[CompletedGroup, ...]
    lease_groups: int  # groups in the whole lease (every rank's shares together)
    version: int       # the lease's policy version


class RankedStream:
    """One TrainingStream shared by the ranks of ``group`` (default: the world), module docstring."""

    def __init__(self, queue: RolloutQueue, *, groups_per_step: int, group: Any = None, wait_s: float = 600.0,
                 lease_timeout_s: float | None = None, trainer_id: str | None = None,
                 exhausted: Callable[[], bool] | None = None, publish_every: int | None = 1,
                 fleet_grace_s: float | None = None) -> None:
        """``publish_every``: steps between published policy versions, for admission control
        (TrainingStream's item 5: rank 0's stream derives it); None: the caller sizes it.
        ``fleet_grace_s``: TrainingStream's (item 4: WorkersGone once no worker is live)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise IntegrationConfigError("RankedStream needs torch.distributed: call init_process_group first")
        self.dist, self.group = dist, group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if groups_per_step % self.world:
            raise IntegrationConfigError(f"groups_per_step {groups_per_step} must be a multiple of the {self.world} "
                                         "ranks, so every rank gets an equal share")
        self.groups_per_step = groups_per_step
        self.queue = queue
        self.stream = TrainingStream(queue, groups_per_step=groups_per_step, wait_s=wait_s,
                                     lease_timeout_s=lease_timeout_s, trainer_id=trainer_id,
                                     exhausted=exhausted, publish_every=publish_every,
                                     fleet_grace_s=fleet_grace_s) if self.rank == 0 else None

    # -- collectives (CPU tensors) ----------------------------------------------------------------

    def _broadcast(self, packet: bytes | None, src: int = 0) -> bytes | None:
        """Group rank ``src``'s packet (None there: it failed) to every rank; the others pass None."""
        import torch

        size = torch.tensor([len(packet) if packet is not None else _FAILED], dtype=torch.int64)
        self.dist.broadcast(size, src=self._global(src), group=self.group)
        if int(size) == _FAILED:
            return None
        data = (torch.frombuffer(bytearray(packet), dtype=torch.uint8) if packet
                else torch.empty(int(size), dtype=torch.uint8))  # frombuffer refuses an empty buffer
        self.dist.broadcast(data, src=self._global(src), group=self.group)
        return packet if packet is not None else data.numpy().tobytes()

    def _global(self, rank: int) -> int:
        """The global rank of this group's ``rank`` (broadcasts name global ranks)."""
        return self.dist.get_global_rank(self.group, rank) if self.group is not None else rank

    def _all(self, flag: bool) -> bool:
        """True when every rank passed True."""
        import torch

        vote = torch.tensor([1 if flag else 0], dtype=torch.int64)
        self.dist.all_reduce(vote, op=self.dist.ReduceOp.MIN, group=self.group)
        return bool(int(vote))

    def _vote(self, done: bool, reason: str | None) -> tuple[bool, str | None]:
        """(every rank done; if not, the reason of an errored rollback, or None for a plain one).

        One all-reduce MIN of [state, rank]: state 2 done, 1 failed with an error the data may have
        caused (``reason``), 0 stopped without one (interrupted, or the collective's own trouble); the
        lowest rank that failed with an error then broadcasts its reason. A stop anywhere makes the
        rollback plain: a trainer shutting down is not the data's fault (DESIGN rule 4)."""
        import torch

        state = 2 if done else (1 if reason is not None else 0)
        vote = torch.tensor([state, self.rank if state == 1 else self.world], dtype=torch.int64)
        self.dist.all_reduce(vote, op=self.dist.ReduceOp.MIN, group=self.group)
        state, first = int(vote[0]), int(vote[1])
        if state != 1:
            return state == 2, None
        text = self._broadcast(reason.encode("utf-8", "backslashreplace") if self.rank == first and reason else None,
                               first)
        return False, f"rank {first}: {(text or b'').decode('utf-8', 'replace')}"

    # -- the contract, across ranks ------------------------------------------------------------

    def next(self, step: int) -> RankShare:
        """Every rank: this rank's share of the next lease. Rank 0 raises the stream's error
        (StreamStarved, WorkersGone, ...); the others raise RankFailed with its message, which rank 0
        broadcasts as text (no pickle), so every rank's log says why (which workers are gone)."""
        packet, error = None, None
        if self.stream is not None:
            try:
                lease = self.stream.next()
                packet = _VERSION.pack(lease.version) + encode_completed(lease.groups)
            except BaseException as exc:
                error = exc
        got = self._broadcast(packet)
        if got is None:  # every rank: rank 0's error, as text
            why = self._broadcast(f"{type(error).__name__}: {error}".encode("utf-8", "backslashreplace")
                                  if self.stream is not None else None)
            if error is not None:
                raise error
            raise RankFailed(f"step {step}: rank 0 could not lease a batch: "
                             f"{(why or b'').decode('utf-8', 'replace')}")
        (version,) = _VERSION.unpack_from(got)
        groups = decode_completed(got[_VERSION.size:])
        return RankShare(step, self.rank, self.world, tuple(groups[self.rank::self.world]), len(groups), version)

    def ack(self, step: int, done: bool = True, reason: str | None = None) -> None:
        """Every rank, after its part of the step: commit once if every rank is done, else roll back:
        errored (counted, DESIGN rule 4) with the reason of the lowest rank that failed with one
        (``reason``: ``error_reason`` of its exception), plain if a rank stopped or died.
        Raises RankFailed on every rank when some rank failed or the commit did not hold."""
        try:
            unanimous, why = self._vote(done, reason)
        except Exception as exc:  # a peer died: the collective is broken
            self._rollback(step, f"a rank is gone ({exc})")
            raise RankFailed(f"step {step}: a rank did not finish (lost peer); the lease was rolled back") from exc
        committed, error = False, None
        if self.stream is not None:
            if unanimous:
                try:
                    self.stream.ack(step)
                    committed = True
                except RolloutQueueError as exc:  # LeaseLost: the groups went back while the ranks trained
                    error = exc
            else:
                self._rollback(step, "a rank failed its part", why)
        try:
            held = self._all(committed) if self.rank == 0 else self._all(True)
        except Exception as exc:
            raise RankFailed(f"step {step}: a rank was lost after the vote") from exc
        if not held:
            raise RankFailed(f"step {step}: not committed on every rank ({'a rank failed' if not unanimous else error})")
        if error is not None:
            raise error

    def _rollback(self, step: int, why: str, error: str | None = None) -> None:
        """Rank 0: hand the step's lease back; with ``error`` an errored rollback (counted)."""
        if self.stream is not None and self.stream.open:
            back = self.stream.rollback(None if error is None else f"step {step}, {error}")
            log.warning("rolled back the step's lease", extra=fields(queue=self.queue.name, step=step,
                                                                      requeued=back, reason=error or why))

    @contextmanager
    def step(self, step: int) -> Iterator[RankShare]:
        """``next`` before the block, ``ack`` after it: done when the block returned, failed when
        it raised (every rank then raises RankFailed, or the block's error on the rank that failed)."""
        share = self.next(step)
        try:
            yield share
        except BaseException as exc:
            try:
                self.ack(step, done=False, reason=error_reason(exc))
            except RankFailed:
                pass
            except Exception as inner:  # the collective itself is broken: rank 0 already rolled back
                log.warning("vote after a failed step failed", exc_info=inner)
            if self.stream is not None and self.stream.open:
                self.stream.rollback()  # the vote broke before it could: the trainer's death, plain
            raise RankFailed(f"step {step} failed on rank {self.rank}: {exc!r}") from exc
        self.ack(step)

    def checkpoint(self, step: int, save: Callable[[int], Any] | None = None) -> int:
        """Every rank: ``save(step)`` here, a barrier, then rank 0 drops the data the checkpoint covers.
        Returns the payloads dropped (0 on the other ranks)."""
        if save is not None:
            save(step)
        self.dist.barrier(group=self.group)
        dropped = self.stream.checkpoint(step) if self.stream is not None else 0
        self.dist.barrier(group=self.group)
        return dropped

    def restore(self, step: int) -> int:
        """Every rank, at start: rank 0 requeues what was committed after checkpoint ``step`` (0: a
        run that starts from scratch, or resumes one that crashed before its first checkpoint, so
        everything that run committed is trained again). Returns the groups requeued (0 on the
        other ranks)."""
        back = self.stream.restore(step) if self.stream is not None else 0
        self.dist.barrier(group=self.group)
        return back
