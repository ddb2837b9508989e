"""rollout-queue: a Redis-backed ownership ledger between RL trainers and generation workers.

Every source group is trained exactly once (in exactly one committed lease) or dead-lettered with a
reason; no sample is trained on weights staler than the bound; operators see who owns what with
redis-cli. This module exports the public API of DESIGN.md and nothing else.

Names load on first use (PEP 562), so importing the sans-IO core (``rollout_queue.core``) needs
neither redis nor a driver (tests/unit/test_layout.py checks it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_WHERE = {
    "AsyncFleetReserver": "rollout_queue.api.aio",
    "AsyncHold": "rollout_queue.api.aio",
    "AsyncLease": "rollout_queue.api.aio",
    "AsyncPartitionedQueue": "rollout_queue.api.aio",
    "AsyncRolloutQueue": "rollout_queue.api.aio",
    "AsyncWorker": "rollout_queue.api.aio",
    "CheckpointPruned": "rollout_queue.core.errors",
    "CheckpointRegression": "rollout_queue.core.errors",
    "CompletedGroup": "rollout_queue.core.models",
    "ConfigMismatch": "rollout_queue.core.errors",
    "DeadLetter": "rollout_queue.core.models",
    "Durability": "rollout_queue.core.policy",
    "FleetReserver": "rollout_queue.api.fleet",
    "GroupTooLarge": "rollout_queue.core.errors",
    "HeartbeatInfo": "rollout_queue.core.models",
    "Progress": "rollout_queue.core.models",
    "Hold": "rollout_queue.api.lease",
    "HoldLost": "rollout_queue.core.errors",
    "InvalidInput": "rollout_queue.core.errors",
    "Lease": "rollout_queue.api.lease",
    "LeaseLost": "rollout_queue.core.errors",
    "LeaseUnsatisfiable": "rollout_queue.core.errors",
    "LeasesOpen": "rollout_queue.core.errors",
    "MalformedCompletion": "rollout_queue.core.errors",
    "MalformedReservation": "rollout_queue.core.errors",
    "NotFound": "rollout_queue.core.errors",
    "NotReplicated": "rollout_queue.core.errors",
    "OutcomeUnknown": "rollout_queue.core.errors",
    "OwnedAttempt": "rollout_queue.core.models",
    "OwnershipLost": "rollout_queue.core.errors",
    "PartialTooLarge": "rollout_queue.core.errors",
    "PartitionedQueue": "rollout_queue.api.queue",
    "PartitionsUnreachable": "rollout_queue.core.errors",
    "PayloadTooLarge": "rollout_queue.core.errors",
    "ProtocolError": "rollout_queue.core.errors",
    "QueueConfig": "rollout_queue.core.config",
    "QueueNotFound": "rollout_queue.core.errors",
    "QueueStats": "rollout_queue.core.models",
    "ReapReport": "rollout_queue.core.models",
    "Receipt": "rollout_queue.core.models",
    "Reservation": "rollout_queue.core.models",
    "RestoreInProgress": "rollout_queue.core.errors",
    "RetryPolicy": "rollout_queue.core.policy",
    "RolloutQueue": "rollout_queue.api.queue",
    "RolloutQueueError": "rollout_queue.core.errors",
    "Sample": "rollout_queue.core.models",
    "ScriptError": "rollout_queue.core.errors",
    "ServerUnavailable": "rollout_queue.core.errors",
    "SourceGroup": "rollout_queue.core.models",
    "StaleReceipt": "rollout_queue.core.errors",
    "StateConflict": "rollout_queue.core.errors",
    "Turn": "rollout_queue.core.models",
    "VersionRegression": "rollout_queue.core.errors",
    "Worker": "rollout_queue.api.worker",
    "WorkerNotLive": "rollout_queue.core.errors",
    "WorkersGone": "rollout_queue.core.errors",
}
__all__ = sorted(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'rollout_queue' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from rollout_queue.api.fleet import FleetReserver
    from rollout_queue.api.lease import Hold, Lease
    from rollout_queue.api.aio import AsyncFleetReserver, AsyncHold, AsyncLease, AsyncPartitionedQueue, AsyncRolloutQueue, AsyncWorker
    from rollout_queue.api.queue import PartitionedQueue, RolloutQueue
    from rollout_queue.api.worker import Worker
    from rollout_queue.core.config import QueueConfig
    from rollout_queue.core.errors import CheckpointPruned, CheckpointRegression, ConfigMismatch, GroupTooLarge, HoldLost, InvalidInput, LeaseLost, LeaseUnsatisfiable, LeasesOpen, MalformedCompletion, MalformedReservation, NotFound, NotReplicated, OutcomeUnknown, OwnershipLost, PartialTooLarge, PartitionsUnreachable, PayloadTooLarge, ProtocolError, QueueNotFound, RestoreInProgress, RolloutQueueError, ScriptError, ServerUnavailable, StaleReceipt, StateConflict, VersionRegression, WorkerNotLive, WorkersGone
    from rollout_queue.core.models import CompletedGroup, DeadLetter, HeartbeatInfo, QueueStats, ReapReport, Receipt, Reservation, Sample, SourceGroup
    from rollout_queue.core.models import OwnedAttempt, Progress, Turn
    from rollout_queue.core.policy import Durability, RetryPolicy
