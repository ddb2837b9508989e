"""Every public operation as a generator of calls: written once, driven by the sync and async drivers.

A flow yields ``Call`` / ``Command`` values and receives their raw replies, which it hands to the
parsers of core/protocol.py; it returns the operation's result or raises a typed error. Flows never
touch a socket, a clock or a sleep of their own: the driver passes replies in, and ``clock`` is
injected, so tests can drive any flow by hand. Operations that need several round trips (blocking
waits, reaper sweeps, bounded batch loops) loop here; each script they call is one atomic transition,
and every loop is safe to interrupt and rerun.

One module per role:

- ``base``: Flow, T, Clock, new_id, the wake wait and the bounds every role shares (BATCH, ...);
- ``queue``: open, submit, policy versions, checkpoint and restore, stats, dead letters;
- ``worker``: reserve, complete, complete_many, fail, abort, filter, reject, save_partial, heartbeat, close;
- ``trainer``: lease, commit, rollback, extend, beat;
- ``hold``: admission holds;
- ``reaper``: the reaper's pass (and prune, finish_interrupted);
- ``owned``: what the PEL gives one worker (reconciliation);
- ``producer``: the producer's cursor and its cursor-guarded enqueue;
- ``push``: rounds of a torch.distributed weights push (open, join, seal, close).

Every name is re-exported here: ``flows.reserve(...)`` and ``from rollout_queue.core.flows import X``
work as they did when this was one module. Setting a name on the package (a test's
``flows.BATCH = 1``, ``monkeypatch.setattr(flows, "PRUNE_CALLS_PER_PASS", 2)``) sets it in every
module of the package that has it, so the flows see it as they did.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from rollout_queue.core.flows import base, hold, owned, producer, push, queue, reaper, trainer, worker
from rollout_queue.core.flows.base import (
    BATCH,
    MAX_BLOCK_CHUNK_MS,
    MAX_NAME,
    MAX_REAP_BUDGET,
    MAX_URI,
    MAX_VERSION,
    Clock,
    Flow,
    T,
    _wait,
    new_id,
)
from rollout_queue.core.flows.hold import hold_open, hold_release, hold_wait
from rollout_queue.core.flows.trainer import _hand_back, beat, commit, extend, lease, rollback
from rollout_queue.core.flows.owned import OWNED_LIMIT, PAGE, owned_attempts, owned_command
from rollout_queue.core.flows.producer import check_producer_name, encode_groups, produce, read_cursor
from rollout_queue.core.flows.push import push_close, push_join, push_open, push_seal
from rollout_queue.core.flows.queue import (
    SUBMIT_BATCH,
    SUBMIT_BATCH_BYTES,
    checkpoint,
    dead_letters,
    derive_admission,
    encode_source,
    open_queue,
    publish_version,
    requeue_dead_letter,
    restore,
    stats,
    submit,
    version,
)
from rollout_queue.core.flows.reaper import (
    PRUNE_CALLS_PER_PASS,
    REINDEX_BATCH,
    _batches,
    _reap_worker,
    finish_interrupted,
    prune,
    reap,
    settle_parked,
)
from rollout_queue.core.flows.worker import (
    COMPLETE_BATCH,
    COMPLETE_BATCH_BYTES,
    _complete_chunk,
    _completion_args,
    abort,
    close_worker,
    complete,
    complete_many,
    fail,
    filter_group,
    heartbeat,
    progress_args,
    reject,
    reservations,
    reserve,
    save_partial,
)

#: The role modules, in the order a name set on the package is passed on to them.
ROLES = (base, queue, worker, trainer, hold, reaper, owned, producer, push)

__all__ = [
    "BATCH", "COMPLETE_BATCH", "COMPLETE_BATCH_BYTES", "MAX_BLOCK_CHUNK_MS", "MAX_NAME", "MAX_REAP_BUDGET",
    "MAX_URI", "MAX_VERSION", "OWNED_LIMIT", "PAGE", "PRUNE_CALLS_PER_PASS", "REINDEX_BATCH", "SUBMIT_BATCH",
    "SUBMIT_BATCH_BYTES", "Clock", "Flow", "T", "abort", "beat", "check_producer_name",
    "checkpoint", "close_worker", "commit", "complete", "complete_many", "dead_letters", "derive_admission",
    "encode_groups", "encode_source", "extend", "fail", "filter_group", "finish_interrupted", "heartbeat", "hold_open",
    "hold_release", "hold_wait", "lease", "new_id", "open_queue", "owned_attempts", "owned_command",
    "produce", "prune", "publish_version", "push_close", "push_join", "push_open", "push_seal", "read_cursor", "reap", "reject", "requeue_dead_letter", "reserve",
    "progress_args", "reservations", "save_partial",
    "restore", "rollback", "settle_parked", "stats", "submit", "version",
]


class _Flows(types.ModuleType):
    """The package as a module: a name set on it is set in each role module that defines or imports
    it too, so tuning a bound (``flows.BATCH = 1``) or replacing a flow reaches the code that uses it."""

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name.startswith("__") or name not in _SHARED:
            return
        for module in ROLES:
            if name in vars(module) and not isinstance(vars(module)[name], types.ModuleType):
                setattr(module, name, value)


#: Names a role module holds that may be set through the package (not the role modules themselves).
_SHARED = frozenset(n for m in ROLES for n in vars(m) if not n.startswith("__")) - {m.__name__.rsplit(".", 1)[1]
                                                                                  for m in ROLES}
sys.modules[__name__].__class__ = _Flows
