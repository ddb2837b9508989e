"""The shared ground of every flow: the Flow type, the injected clock, ids, bounds and the wake wait.

A flow yields ``Call`` / ``Command`` values and receives their raw replies; it returns the
operation's result or raises a typed error. Flows never touch a socket, a clock or a sleep of their
own: the driver passes replies in, and ``clock`` is injected, so tests can drive any flow by hand.
Replies are read by the parsers of core/protocol.py, never indexed here.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable, Generator, TypeVar

from rollout_queue.core import protocol as p


T = TypeVar("T")
Flow = Generator[p.Op | p.Probe, Any, T]
Clock = Callable[[], float]

#: Largest policy version: versions are < 2^21 (the bufver score packs them above 32 bits of arrival).
MAX_VERSION = 2**21 - 1
#: Most entries one reap pass handles per script call: each call must stay a few milliseconds.
MAX_REAP_BUDGET = 1024
#: Longest trainer id and weights URI kept in Redis.
MAX_NAME, MAX_URI = 200, 8192

#: Longest single XREAD BLOCK, so a blocked call notices a dead connection within this many ms.
MAX_BLOCK_CHUNK_MS = 2000
#: Entries per call of the bounded loops (reaper, close, rollback, checkpoint): a batched requeue
#: costs ~10 µs of script time per entry with a short attempt history and ~50-100 µs with a full one
#: (32 attempts: decoding and re-encoding it dominates), so 32 keeps a call near 0.35 ms typically
#: and under ~3 ms at worst, well inside a 5 ms bound (scripts/bench_reaper.py, benchmarks/README.md).
BATCH = 32


def new_id() -> str:
    return secrets.token_hex(8)


def _wait(key: str, wake_id: str, deadline: float, clock: Clock) -> Flow[bool]:
    """Block until the wake stream moves past ``wake_id`` or the deadline passes; False on timeout."""
    remaining_ms = int((deadline - clock()) * 1000)
    if remaining_ms <= 0:
        return False
    yield p.Command(("XREAD", "BLOCK", min(remaining_ms, MAX_BLOCK_CHUNK_MS), "COUNT", 1, "STREAMS", key, wake_id or "$"))
    return True
