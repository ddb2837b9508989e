"""Blocking torch.distributed work held to a deadline: it runs in a thread of its own, and its
caller stops waiting for it at the deadline (weights/push.py, both sides of a round).

Why no timeout we pass is enough: gloo's and the store's timeouts bound one call, not a round.
``ProcessGroupGloo``'s constructor waits for each peer's address in rank order, each wait with the
whole timeout, so a peer that shows up just in time restarts the clock for the next one (a 5 s
round took 8.3 s in a chaos run: rank 1 SIGSTOPped and resumed in time, then rank 3, unreachable,
was waited for in full); a store client that cannot connect tries twice, each time with the whole
timeout; a hung peer or driver is bounded by nothing. So the caller bounds the sum.

What an abandoned thread may still do, and why that is safe (the rules for a ``work``):

1. It touches only what is its own: its own store client (a blocked store call holds its client's
   lock, so a client shared with the caller would block the caller too), its own group and
   buffers, and store keys under its round's prefix (``push/<epoch>/``), which no later round
   reads. gloo's own timeouts end it, later than the deadline but for certain.
2. What must not happen once the caller gave up runs inside ``step``: a step does not begin after
   the caller gave up, and the caller gives up only between steps. So the trainer reads the live
   weights only in a step (an abandoned thread never sends bytes of a later version under this
   one's name), and a member acks and hands its tensors over in one step (a member the trainer
   counts as having received a version holds it staged).
3. It is not a daemon: an interpreter that exits while a thread is inside gloo aborts
   (``std::terminate``, exit -6), so exit waits until gloo's timeouts end it.

This module knows nothing about pushes: it runs a callable under these rules.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from rollout_queue.core.errors import DeadlinePassed

T = TypeVar("T")

log = logging.getLogger("rollout_queue.weights.watchdog")


class Watchdog(Generic[T]):
    """``work(watchdog)`` in a thread of its own, started at once; ``result`` waits for it until a
    deadline. ``stage``: what the work is doing (set by the work; named when it is abandoned)."""

    def __init__(self, name: str, work: Callable[["Watchdog[T]"], T]) -> None:
        self.name, self.stage = name, "starting"
        self._work = work
        # Reentrant: hand_over is called inside a step (a member's ack and hand-over are one step).
        self._lock = threading.RLock()
        self._settled = threading.Event()
        self._abandoned = False
        self._outcome: tuple[T] | BaseException | None = None  # (its value,) or what it raised
        self._thread = threading.Thread(target=self._run, name=name, daemon=False)  # rule 3
        self._thread.start()

    def _run(self) -> None:
        try:
            value = self._work(self)
        except BaseException as exc:  # handed to the caller, unless it was handed something already
            if not self._settle(exc) and not self._abandoned:
                log.debug("%s failed after its result was handed over or abandoned", self.name, exc_info=exc)
        else:
            self._settle((value,))

    def _settle(self, outcome: tuple[T] | BaseException) -> bool:
        with self._lock:
            if self._settled.is_set():
                return False
            self._outcome = outcome
            self._settled.set()
            return True

    @contextmanager
    def step(self, stage: str) -> Iterator[None]:
        """Run the block as one step (rule 2): not begun once the caller gave up (raises inside
        the work then), and the caller does not give up while it runs."""
        with self._lock:
            if self._abandoned:  # the work unwinds (its cleanup runs); nobody reads this error
                raise DeadlinePassed(f"{self.name}: abandoned before {stage}")
            self.stage = stage
            yield

    def hand_over(self, value: T) -> None:
        """Give the caller ``value`` now; what the work does after is cleanup nobody waits for.
        Raises inside the work if the caller gave up already."""
        with self._lock:
            if self._abandoned:
                raise DeadlinePassed(f"{self.name}: abandoned before handing over")
            self._settle((value,))

    def result(self, timeout_s: float) -> T:
        """What the work returned or handed over, or what it raised; ``DeadlinePassed`` if it has
        not within ``timeout_s`` (then it is abandoned: it ends on its own, under the rules)."""
        if not self._settled.wait(max(0.0, timeout_s)):
            # The lock waits for a step in progress: a bucket's copy, or an ack under the store's
            # timeout, which was set to the time left (both end by the deadline, or just after).
            with self._lock:
                if not self._settled.is_set():
                    self._abandoned = True
                    raise DeadlinePassed(f"still {self.stage} at the deadline (abandoned in its thread)")
        outcome = self._outcome
        if isinstance(outcome, tuple):
            return outcome[0]
        raise outcome if outcome is not None else RuntimeError(f"{self.name} settled with no outcome")
