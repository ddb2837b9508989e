"""Asyncio helpers the worker runtime's modules share: cancel tasks, wait for the first of several
events, wait for tasks until a deadline or an interrupt; and the two ways user code (rewards,
environments) is run so that it can never hold the worker: ``Lane`` and ``abandonable``.

Why a module: each is a few lines that are easy to get subtly wrong (a waiter task left running, a
cancelled task never awaited, a pool thread that a hung call keeps for ever, an executor that the
interpreter joins at exit), so they are written once. No queue or engine knowledge here.

User code may never return, and a thread cannot be killed. So a synchronous call runs on a
``Lane``: a daemon thread of its own caller (one environment instance, or the reward function), never
a slot of a shared pool, so a call that hangs holds only its own lane, never anyone else's work, and
never the process's exit (the interpreter does not join daemon threads). And user code is awaited
through ``abandonable``: the waiter can always stop waiting (a deadline, a drain, a cancellation)
without waiting for the code itself, even a coroutine that swallows its cancellation.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Awaitable, Callable, Collection, Iterable, TypeVar

from rollout_queue.core.errors import GaveUp

T = TypeVar("T")


async def cancel(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel the live tasks of ``tasks`` and wait until each has ended (their errors are dropped:
    a cancelled task's outcome is of no interest to whoever cancelled it)."""
    live = [t for t in tasks if t is not None and not t.done()]
    for t in live:
        t.cancel()
    await asyncio.gather(*live, return_exceptions=True)


async def first_of(*events: asyncio.Event) -> None:
    """Return once any of ``events`` is set."""
    if any(e.is_set() for e in events):
        return
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel(waiters)


async def wait_tasks(tasks: Collection[asyncio.Task[Any]], timeout_s: float,
                     *interrupts: asyncio.Event) -> set[asyncio.Task[Any]]:
    """Wait until ``tasks`` are done, ``timeout_s`` passed or an interrupt is set; returns the
    tasks still pending."""
    pending = set(tasks)
    waiters = [asyncio.create_task(event.wait()) for event in interrupts]
    deadline = time.monotonic() + timeout_s
    try:
        while pending and not any(w.done() for w in waiters) and time.monotonic() < deadline:
            done, _ = await asyncio.wait(pending | set(waiters), timeout=deadline - time.monotonic(),
                                         return_when=asyncio.FIRST_COMPLETED)
            pending -= done
        return pending
    finally:
        await cancel(waiters)


async def abandonable(work: Awaitable[T], timeout_s: float | None = None) -> T:
    """``await work`` for at most ``timeout_s`` (GaveUp past it), and cancellable at any time,
    without ever waiting for ``work`` to acknowledge a cancellation: it is cancelled and left
    behind. For user code (a coroutine that swallows CancelledError must not hold a drain)."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        raise GaveUp
    return task.result()


class Lane:
    """One daemon thread that runs synchronous calls one at a time, in the order submitted (so the
    code it serves is never called from two threads at once). Started on the first ``submit``;
    ``stop`` lets it end once the calls already submitted have run. A call whose caller stopped
    waiting for it (a deadline, an abort) and that is still running makes the lane ``hung``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._current: Future[Any] | None = None  # the call running now (written by the lane's thread)
        self._started = 0.0  # when it started (monotonic)
        self._given_up: set[Future[Any]] = set()  # calls whose caller stopped waiting, until they end

    @property
    def busy(self) -> bool:
        """A call is running now."""
        return self._current is not None

    @property
    def hung(self) -> bool:
        """A call its caller gave up on is still running."""
        current = self._current
        return current is not None and current in self._given_up

    @property
    def running_s(self) -> float:
        """Seconds the call running now has run (0 when none)."""
        return 0.0 if self._current is None else time.monotonic() - self._started

    def submit(self, fn: Callable[[], T]) -> "Future[T]":
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return future

    async def call(self, fn: Callable[[], T], timeout_s: float | None = None) -> T:
        """``fn()`` on this lane, awaited as ``abandonable`` awaits: past ``timeout_s`` (GaveUp)
        or when the waiter is cancelled, the call is left to run on (a call not started yet is
        dropped)."""
        future = self.submit(fn)
        try:
            return await abandonable(asyncio.wrap_future(future), timeout_s)
        except BaseException:
            if not future.done() and not future.cancel():  # running: given up on, hung until it returns
                self._given_up.add(future)
                future.add_done_callback(self._given_up.discard)
            raise

    def stop(self) -> None:
        """End the thread once what was submitted has run (a hung call first, if it ever returns)."""
        if self._thread is not None:
            self._jobs.put(None)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            self._started, self._current = time.monotonic(), future
            try:
                result = fn()
            except BaseException as exc:  # handed to the caller, who judges it
                self._current = None
                future.set_exception(exc)
            else:
                self._current = None
                future.set_result(result)
