"""Test helpers for code that drives engines: an event loop on a thread and a polling wait.

Engines are bound to the event loop they started on and are expensive to start, so tests share
one engine across many test functions by running every coroutine on one long-lived loop
(``LoopRunner``) rather than a fresh ``asyncio.run`` each time; no asyncio pytest plugin needed.
``wait_until`` replaces fixed sleeps: it polls a condition with a deadline. Nothing here imports
torch or vLLM.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopRunner:
    """An asyncio loop on a daemon thread; ``run`` executes a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="engine-test-loop", daemon=True
        )
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        """Run ``coro`` on the loop thread; raise what it raises, TimeoutError after ``timeout``."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 30.0,
    what: str = "condition",
) -> None:
    """Poll ``predicate`` until it holds. Raises AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.005)
