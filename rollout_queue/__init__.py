"""rollout-queue: a Redis-backed ownership ledger between RL trainers and generation workers.

Every source group is trained exactly once (in exactly one committed lease) or dead-lettered with a
reason; no sample is trained on weights staler than the bound; operators see who owns what with
redis-cli. This module exports the public API of DESIGN.md and nothing else.
"""

from .aio import AsyncHold, AsyncLease, AsyncRolloutQueue, AsyncWorker
from .aio_partitioned import AsyncPartitionedQueue
from .client import Hold, Lease, RolloutQueue, Worker
from .config import QueueConfig
from .errors import (
    CheckpointPruned,
    CheckpointRegression,
    ConfigMismatch,
    HoldLost,
    InvalidInput,
    LeaseLost,
    LeasesOpen,
    LeaseUnsatisfiable,
    MalformedCompletion,
    MalformedReservation,
    NotFound,
    NotReplicated,
    OutcomeUnknown,
    OwnershipLost,
    PartitionsUnreachable,
    PayloadTooLarge,
    ProtocolError,
    RestoreInProgress,
    RolloutQueueError,
    ScriptError,
    ServerUnavailable,
    StaleReceipt,
    StateConflict,
    VersionRegression,
)
from .fleet import AsyncFleetReserver, FleetReserver
from .models import (
    CompletedGroup,
    DeadLetter,
    HeartbeatInfo,
    QueueStats,
    ReapReport,
    Receipt,
    Reservation,
    Sample,
    SourceGroup,
)
from .owned import OwnedAttempt
from .partitioned import PartitionedQueue
from .transport import Durability, RetryPolicy

__all__ = [
    "AsyncFleetReserver", "AsyncHold", "AsyncLease", "AsyncPartitionedQueue", "AsyncRolloutQueue",
    "AsyncWorker", "CheckpointPruned", "CheckpointRegression", "CompletedGroup", "ConfigMismatch", "DeadLetter",
    "Durability", "FleetReserver", "HeartbeatInfo", "Hold", "HoldLost", "InvalidInput", "Lease", "LeaseLost",
    "LeaseUnsatisfiable", "LeasesOpen", "MalformedCompletion", "MalformedReservation", "NotFound", "NotReplicated",
    "OutcomeUnknown", "OwnedAttempt", "OwnershipLost", "PartitionedQueue", "PartitionsUnreachable", "PayloadTooLarge",
    "ProtocolError", "QueueConfig", "QueueStats", "ReapReport", "Receipt", "Reservation", "RestoreInProgress",
    "RetryPolicy", "RolloutQueue", "RolloutQueueError", "Sample", "ScriptError", "ServerUnavailable", "SourceGroup",
    "StaleReceipt", "StateConflict", "VersionRegression", "Worker",
]
__version__ = "0.1.0"
