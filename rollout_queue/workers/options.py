"""How a worker runs (``WorkerOptions``) and how it reports a fatal stop (``WorkerFailed``).

Why apart from ``runtime.py``: the CLI and the tests build options without reading the loop, and
the options are validated on construction (a malformed option cannot reach the runtime). It owns
no behaviour beyond turning the options into a ``SubmissionScheduler``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rollout_queue.core.errors import WorkerFailed  # noqa: F401 (importable with the options, as before)
from rollout_queue.workers.engines.base import SamplingConfig
from rollout_queue.workers.reconcile import DEFAULT_GRACE_S
from rollout_queue.workers.scheduler import Policy, SubmissionScheduler, check_max_waiting
from rollout_queue.workers.versions import WeightsMode

#: Seconds a worker waits for a queue that does not exist yet (``--wait-for-queue``): long enough for
#: a trainer that loads a large model before it creates the queue, short enough that a mistyped
#: --queue still ends, with exit 4, within minutes.
DEFAULT_QUEUE_WAIT_S = 300.0

#: Seconds between progress saves of an attempt still generating (``--save-progress-every-s``,
#: saves.py): a worker killed mid-attempt loses at most this much generation, at the cost of one
#: save_partial (a record of the group's tokens so far) per interval of each long attempt.
DEFAULT_SAVE_PROGRESS_EVERY_S = 30.0


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs. ``max_samples=None``: the engine's ``max_concurrency`` (sample policy);
    ``max_groups=None``: 4 groups (group policy), no group cap (sample policy);
    ``reconcile_interval_s=None``: max(worker_timeout_s, 5 s), 0 disables reconciliation;
    ``reconcile_grace_s``: an attempt is handed back only once delivered this long ago (reconcile.py)."""

    policy: Policy = "sample"
    max_samples: int | None = None
    max_groups: int | None = None
    max_batch: int = 64
    #: sample policy: samples beyond max_samples the engine may hold waiting for a slot. None: two
    #: groups less one sample when max_samples is the engine's concurrency (the next group is reserved
    #: while n - 1 still wait, so no slot idles for a reservation), else 0: below it, samples handed
    #: over would run, not wait; and on an engine that prefills per step (torch), a group admitted a
    #: few samples at a time prefills its prompt again each time. 0: only into free slots
    max_waiting: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    #: at a new policy version: "continue" (default) keeps the requests in flight, so no generated
    #: token is thrown away (their samples record every version; staleness counts from the oldest);
    #: "abort" requeues them (uncounted), "keep-kv" continues over the KV already computed (versions.py)
    weights_mode: WeightsMode = "continue"
    drain_timeout_s: float = 30.0
    abort_grace_s: float = 5.0
    block_ms: int = 1000
    heartbeat_interval_s: float | None = None  # None: worker_timeout_s / 4
    subscribe_versions: bool = True
    load_initial_weights: bool = True
    #: join the rounds of torch.distributed weights pushes (weights/push.py) when the engine can receive them
    weights_push: bool = True
    reconcile_interval_s: float | None = None
    reconcile_grace_s: float = DEFAULT_GRACE_S
    #: a worker that may not create its queue (``create=False``) and finds it missing waits this long
    #: for its trainer to create it (pods and Slurm arrays start in any order), then gives up; 0: at once
    queue_wait_s: float = DEFAULT_QUEUE_WAIT_S
    #: an attempt still generating after this many seconds saves its samples so far (save_partial),
    #: and again every as many, so a worker killed mid-attempt loses at most one interval (saves.py); 0: off
    save_progress_every_s: float = DEFAULT_SAVE_PROGRESS_EVERY_S

    def __post_init__(self) -> None:
        if self.weights_mode not in ("abort", "continue", "keep-kv"):
            raise ValueError(f"weights_mode must be 'abort', 'continue' or 'keep-kv', got {self.weights_mode!r}")
        if self.drain_timeout_s < 0 or self.abort_grace_s < 0 or self.block_ms < 1:
            raise ValueError("drain_timeout_s and abort_grace_s must be >= 0 and block_ms >= 1")
        check_max_waiting(self.policy, self.max_waiting)
        if not 0 <= self.queue_wait_s < math.inf:  # also refuses NaN: the wait must end
            raise ValueError(f"queue_wait_s must be a number of seconds >= 0, got {self.queue_wait_s!r}")
        if not 0 <= self.save_progress_every_s < math.inf:
            raise ValueError(f"save_progress_every_s must be a number of seconds >= 0 (0: off), "
                             f"got {self.save_progress_every_s!r}")
        interval = 0.0 if self.reconcile_interval_s is None else self.reconcile_interval_s
        if not (interval >= 0 and self.reconcile_grace_s >= 0):  # also refuses NaN
            raise ValueError("reconcile_interval_s (None: default, 0: off) and reconcile_grace_s must be >= 0")

    def scheduler(self, max_concurrency: int, prefills_per_step: bool = False) -> SubmissionScheduler:
        """The scheduler of these options; ``max_concurrency``: the engine's (the sample policy's
        default); ``prefills_per_step``: the engine's (``Engine.prefills_per_step``)."""
        if self.policy == "group":
            return SubmissionScheduler("group", max_groups=self.max_groups or 4, max_samples=self.max_samples,
                                       max_batch=self.max_batch)
        max_samples = self.max_samples or max_concurrency
        waiting = self.max_waiting
        if waiting is None and (max_samples < max_concurrency or prefills_per_step):
            waiting = 0  # the engine would run what it was handed beyond max_samples, or prefill a split group again
        return SubmissionScheduler("sample", max_samples=max_samples, max_groups=self.max_groups,
                                   max_batch=self.max_batch, max_waiting=waiting)
