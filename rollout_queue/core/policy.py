"""What a caller asks of the transport: how long to retry, and how many replicas must acknowledge.

Plain values, no I/O: the scale-out layer (scale/layout.py) builds its probe policy from them
without importing a driver, and the drivers (drivers/transport.py) read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollout_queue.core.errors import InvalidInput


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep resending a call while Redis is unreachable or refuses it (and, in durable
    mode, how long to keep waiting for replicas)."""

    window_s: float = 30.0
    first_backoff_s: float = 0.05
    max_backoff_s: float = 1.0

    def backoff(self, tries: int) -> float:
        return min(self.max_backoff_s, self.first_backoff_s * 2 ** max(0, tries - 1))


@dataclass(frozen=True)
class Durability:
    """Durable mode: a state-changing call answers only once ``replicas`` replicas acknowledged it
    (``WAIT replicas timeout_ms`` on the call's own connection, repeated within the retry window),
    else raises NotReplicated. ``timeout_ms`` must stay below the client's socket timeout (10 s by
    default). What it protects against, and what it does not: docs/OPERATIONS.md, "Replicas"."""

    replicas: int
    timeout_ms: int = 1000

    def __post_init__(self) -> None:
        for name, value, low in (("replicas", self.replicas, 1), ("timeout_ms", self.timeout_ms, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInput(f"Durability.{name} must be an integer >= {low}, not {value!r}")
