"""Three asyncio helpers the worker runtime's modules share: cancel tasks, wait for the first of
several events, wait for tasks until a deadline or an interrupt.

Why a module: each is a few lines that are easy to get subtly wrong (a waiter task left running, a
cancelled task never awaited), so they are written once. No queue or engine knowledge here.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Collection, Iterable


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
