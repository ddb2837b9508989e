"""QueueConfig: the per-queue bounds and policies, stored once in the queue's meta hash.

The scripts read these from Redis on every call (never from ARGV), so this module only validates
values and converts them to and from their stored form. It does no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal, Mapping

BufferOrder = Literal["fifo", "lifo"]


@dataclass(frozen=True)
class QueueConfig:
    """Bounds and policies of one queue (DESIGN: Capacity, Buffer and staleness, Failure handling).

    ``max_staleness=None`` is strictly on-policy: a completion generated before the current policy
    version is requeued at lease time. ``batch_groups=None`` disables admission control.
    ``settled_retention_s`` is how long a settled group's ledger line and source_id mapping are
    kept (the window in which a repeated settlement replays and a resubmitted source_id is
    deduplicated); the reaper prunes them after it. ``None`` keeps them for the queue's life.
    """

    max_executing_samples: int = 4096
    max_retained_groups: int = 100_000
    max_completed_groups: int = 1024
    max_staleness: int | None = None
    batch_groups: int | None = None
    buffer_order: BufferOrder = "fifo"
    lease_timeout_s: float = 600.0
    worker_timeout_s: float = 60.0
    max_attempts: int = 3
    max_payload_bytes: int = 64 * 2**20
    hold_timeout_s: float = 600.0
    commits_maxlen: int = 100_000
    lease_record_ttl_s: float = 86_400.0
    settled_retention_s: float | None = 86_400.0

    def __post_init__(self) -> None:
        for name in ("max_executing_samples", "max_retained_groups", "max_completed_groups", "max_attempts",
                     "max_payload_bytes", "commits_maxlen"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"QueueConfig.{name} must be a positive integer, got {value!r}")
        for name in ("lease_timeout_s", "worker_timeout_s", "hold_timeout_s", "lease_record_ttl_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"QueueConfig.{name} must be a positive number of seconds, got {value!r}")
        retention = self.settled_retention_s
        if retention is not None and (not isinstance(retention, (int, float)) or isinstance(retention, bool)
                                      or not retention > 0 or retention == float("inf")):
            raise ValueError("QueueConfig.settled_retention_s must be None (keep forever) or a positive, finite "
                             f"number of seconds, got {retention!r}")
        if self.max_staleness is not None and (not isinstance(self.max_staleness, int) or self.max_staleness < 0):
            raise ValueError(f"QueueConfig.max_staleness must be None or an integer >= 0, got {self.max_staleness!r}")
        if self.batch_groups is not None and (not isinstance(self.batch_groups, int) or self.batch_groups < 1):
            raise ValueError(f"QueueConfig.batch_groups must be None or an integer >= 1, got {self.batch_groups!r}")
        if self.buffer_order not in ("fifo", "lifo"):
            raise ValueError(f"QueueConfig.buffer_order must be 'fifo' or 'lifo', got {self.buffer_order!r}")

    def to_meta(self) -> dict[str, str]:
        """The stored form: what the scripts read from the meta hash (ms, -1 / 0 for None)."""
        return {
            "max_executing_samples": str(self.max_executing_samples),
            "max_retained_groups": str(self.max_retained_groups),
            "max_completed_groups": str(self.max_completed_groups),
            "max_staleness": str(-1 if self.max_staleness is None else self.max_staleness),
            "batch_groups": str(0 if self.batch_groups is None else self.batch_groups),
            "buffer_order": self.buffer_order,
            "lease_timeout_ms": str(_ms(self.lease_timeout_s)),
            "worker_timeout_ms": str(_ms(self.worker_timeout_s)),
            "max_attempts": str(self.max_attempts),
            "max_payload_bytes": str(self.max_payload_bytes),
            "hold_timeout_ms": str(_ms(self.hold_timeout_s)),
            "commits_maxlen": str(self.commits_maxlen),
            "lease_record_ttl_ms": str(_ms(self.lease_record_ttl_s)),
            "settled_retention_ms": str(0 if self.settled_retention_s is None else _ms(self.settled_retention_s)),
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, str]) -> "QueueConfig":
        """Rebuild a config from the stored form (the inverse of to_meta)."""
        staleness = int(meta["max_staleness"])
        batch = int(meta["batch_groups"])
        retention = int(meta["settled_retention_ms"])
        return cls(
            max_executing_samples=int(meta["max_executing_samples"]),
            max_retained_groups=int(meta["max_retained_groups"]),
            max_completed_groups=int(meta["max_completed_groups"]),
            max_staleness=None if staleness < 0 else staleness,
            batch_groups=None if batch == 0 else batch,
            buffer_order=meta["buffer_order"],  # type: ignore[arg-type]  # validated in __post_init__
            lease_timeout_s=int(meta["lease_timeout_ms"]) / 1000,
            worker_timeout_s=int(meta["worker_timeout_ms"]) / 1000,
            max_attempts=int(meta["max_attempts"]),
            max_payload_bytes=int(meta["max_payload_bytes"]),
            hold_timeout_s=int(meta["hold_timeout_ms"]) / 1000,
            commits_maxlen=int(meta["commits_maxlen"]),
            lease_record_ttl_s=int(meta["lease_record_ttl_ms"]) / 1000,
            settled_retention_s=None if retention == 0 else retention / 1000,
        )

    def replace(self, **changes: object) -> "QueueConfig":
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown QueueConfig fields: {sorted(unknown)}")
        return type(self)(**{**asdict(self), **changes})  # type: ignore[arg-type]


def _ms(seconds: float) -> int:
    return max(1, int(round(seconds * 1000)))
