"""Helpers shared by every test directory.

This module owns waiting without fixed sleeps. It must not start servers or touch Redis keys;
that is conftest.py's job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout: float = 5.0, interval: float = 0.01, message: str = "",
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that value.

    Tests wait for a state, never for a duration: a fixed sleep is either too short on a loaded
    CI machine or wasted time everywhere else. The predicate runs one last time at the deadline,
    so a slow poll never turns a success into a failure.

    Raises:
        AssertionError: the deadline passed; the message includes ``message`` and the last value.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", repr(predicate))
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")
        time.sleep(interval)  # polling interval inside a deadline-bound wait


Q = TypeVar("Q")


def after_settling(q: Q) -> Q:
    """``q`` after settling what workers parked (the reaper's pass does it; a test that reads dead
    letters or filtered groups right after a worker's call settles them first). Returns ``q``."""
    q.settle_parked()  # type: ignore[attr-defined]
    return q
