"""A hypothesis rule-based machine that drives one real queue on a real server against a model.

Each example opens a new queue (a uuid name) on the test's private server (redis and valkey), drives
random producer, worker, trainer, operator and crash steps (worker_steps.py, trainer_steps.py;
progress records of partial rollouts too: save_partial, abort with progress, continuation), and
after EVERY step checks DESIGN's invariants from Redis truth (invariants.py, redis_truth.py),
compared with the in-memory model (ledger_model.py) wherever the model is exact. Calls that must
change nothing (a stale receipt, a replayed settlement, a refused lease or restore) are checked key
by key. This module owns the setup, the one rule and the action table; it must not share a queue
between examples (each gets a new name, and its keys are deleted at teardown).

One rule, ``step``, picks the next action from a weighted table of the actions whose precondition
holds. Separate hypothesis rules would be cleaner to read, but hypothesis' swarm testing disables a
random subset of rules in each example, and this ledger needs a five-step chain (submit, reserve,
complete, lease, commit) before most of its states exist: with one rule per action, fewer than one
example in ten reached a commit. The failing program still prints as one ``step`` per action, with
each draw labelled.

Time passes for real only in ``short_lease_expires`` (a 20 ms lease, then the reaper) and before a
reap in an example with a 1 ms settled_retention_s (2 ms, so every earlier settlement is due); a silent
worker is made deterministic by moving its last heartbeat into the past, since a tiny
worker_timeout_s would let every reserve reap whichever worker was slowest, at random. It is 300 s:
after a server restart nothing expires for two worker timeouts (the model's in_grace, which lasts the
rest of the example), and an example on a loaded 2-core machine outlived a 120 s grace.
"""

from __future__ import annotations

import uuid
from typing import Callable

import redis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from rollout_queue import Hold, QueueConfig, RetryPolicy, RolloutQueue

from .invariants import check_commits, check_partials, check_states, check_stats
from .ledger_model import LedgerModel
from .model_entries import BACKLOG, COMPLETED, DEAD, EXECUTING, LEASED, READY
from .redis_truth import observe
from .trainer_steps import TrainerSteps
from .worker_steps import PAYLOAD_LIMIT, WorkerSteps


class LedgerMachine(WorkerSteps, TrainerSteps, RuleBasedStateMachine):
    """Drives one queue; ``server`` is bound by the test function (one private server per test)."""

    def __init__(self) -> None:
        super().__init__()
        self.q: RolloutQueue | None = None
        self.raw: redis.Redis | None = None
        self.holds: dict[str, Hold] = {}  # the client's handle of each hold the model knows
        self.restarts = 0
        self.no_reaper = False
        self.head_attempts: dict[str, int] = {}  # the highest progress head attempt seen per entry

    @initialize(order=st.sampled_from(["fifo", "lifo"]), max_completed=st.integers(2, 4),
                max_staleness=st.sampled_from([1, 1, 1, 0, None]),
                max_exec=st.sampled_from([4, 4, 6, 9, 2]), max_retained=st.integers(3, 8),
                batch=st.sampled_from([None, None, 1, 2, 3]), max_attempts=st.integers(2, 3),
                retention=st.sampled_from([0.001, 0.001, None, 86_400.0]), no_reaper=st.booleans(),
                max_partial=st.sampled_from([PAYLOAD_LIMIT] * 6 + [200, 0]),
                staleness_mode=st.sampled_from(["drop", "drop", "continue", "pace"]),
                stale_evictions=st.sampled_from([1, 1, 2, 0]))
    def open_queue(self, order: str, max_completed: int, max_staleness: int | None, max_exec: int,
                   max_retained: int, batch: int | None, max_attempts: int, retention: float | None,
                   no_reaper: bool, max_partial: int, staleness_mode: str, stale_evictions: int) -> None:
        """max_exec=2 with n up to 3 makes some submits refused whole (GroupTooLarge: could never run).
        retention 1 ms: every reap prunes what earlier steps settled (steps_base.reap_pass); a day:
        settlements are recorded, never due; None: nothing is recorded. max_partial 200 refuses the
        larger progress records (PartialTooLarge), 0 every one. 'pace' needs admission control: a
        pace queue drawn without a batch gets 2."""
        if staleness_mode == "pace" and batch is None:
            batch = 2
        cfg = QueueConfig(max_executing_samples=max_exec, max_retained_groups=max_retained,
                          max_completed_groups=max_completed, max_staleness=max_staleness, batch_groups=batch,
                          buffer_order=order, max_attempts=max_attempts, lease_timeout_s=600.0,
                          worker_timeout_s=300.0, max_payload_bytes=PAYLOAD_LIMIT, settled_retention_s=retention,
                          max_partial_bytes=max_partial, staleness_mode=staleness_mode,  # type: ignore[arg-type]
                          max_stale_evictions=stale_evictions)
        self.raw = redis.Redis.from_url(self.server.url)
        self.q = RolloutQueue.from_url(self.server.url, f"sm-{uuid.uuid4().hex[:12]}", cfg,
                                       retry=RetryPolicy(window_s=20.0))
        self.model = LedgerModel(cfg)
        self.no_reaper = no_reaper  # the final drain runs with inline reaping only

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        table = [name for name, weight, ready in ACTIONS if ready(self) for _ in range(weight)]
        action = data.draw(st.sampled_from(table), label="action")
        getattr(self, action)(data)

    @invariant()
    def ledger_matches_redis(self) -> None:
        if self.q is None:
            return
        # The model settles a worker's dead letter or filter whole; Redis parks it (the worker role
        # holds no XACK) until settle_parked, which the reaper runs each pass: run it first. Parked
        # groups themselves are checked by redis_truth (their owner, record and ledger line) and the
        # contract tests (test_settle_parked.py).
        self.q.settle_parked()
        truth = observe(self.raw, self.keys)
        states = check_states(truth, self.model)
        check_commits(truth, self.model, states)
        stats = self.q.stats()
        check_stats(truth, stats, self.model, states)
        check_partials(truth, stats, self.model, states, self.head_attempts)

    def teardown(self) -> None:
        if not self.server.is_running():  # the example ended inside server_restart: bring it back
            self.server.restart()
        if self.q is not None:
            try:
                self.drain_to_settlement(self.no_reaper, rounds=20 + 2 * len(self.model.entries))
            finally:
                self.q.close()
        if self.raw is not None and self.q is not None:
            doomed = list(self.raw.scan_iter(match=self.q.keys.pattern, count=1000))
            if doomed:
                self.raw.unlink(*doomed)
            self.raw.close()


def _has(*states: str) -> Callable[[LedgerMachine], bool]:
    return lambda m: bool(m.model.in_state(*states))


# (action, weight, precondition): the weights keep the submit -> ... -> commit chain busy while
# every perturbation still runs in most examples.
ACTIONS: list[tuple[str, int, Callable[[LedgerMachine], bool]]] = [
    ("submit", 2, lambda m: len(m.model.in_state(BACKLOG, READY)) < 3),
    ("reserve", 1, lambda m: True),  # also when nothing can be granted: every refusal is checked
    ("reserve", 4, lambda m: bool(m.model.in_state(BACKLOG, READY))
     and m.model.executing_samples() < m.model.cfg.max_executing_samples),
    ("settle_attempt", 8, _has(EXECUTING)),
    ("lease", 5, _has(COMPLETED)),
    ("lease_beside_marked", 3, lambda m: sum(1 for e in m.model.buffer() if e.marks) >= 2),
    ("errored_pair", 2, lambda m: m.model.count(COMPLETED) >= 2),
    ("commit", 4, lambda m: bool(m.model.active_leases())),
    ("rollback", 2, lambda m: bool(m.model.active_leases())),
    ("extend", 1, lambda m: bool(m.model.active_leases())),
    ("hostile_claim", 1, lambda m: bool(m.model.active_leases())),
    ("closed_lease_call", 1, lambda m: bool(m.model.closed_leases())),
    ("late_settlement", 2, lambda m: bool(m.model.old_receipts())),
    ("save_partial", 3, _has(EXECUTING)),  # mostly the owner; sometimes an attempt that is over
    ("close_worker", 1, _has(EXECUTING)),
    ("lost_reply", 1, lambda m: True),
    ("requeue_dead_letter", 1, _has(DEAD)),
    ("worker_goes_silent", 1, lambda m: bool(m.model.workers)),
    ("heartbeat", 1, lambda m: m.model.published),
    ("short_lease_expires", 1, _has(COMPLETED)),
    ("reap", 1, lambda m: m.model.published),
    ("reap", 2, lambda m: any(e.min_version < (m.model.stale_floor() or 0) for e in m.model.buffer())),
    ("publish_version", 1, lambda m: True),
    ("hold_open", 1, lambda m: not m.model.holds and bool(m.model.in_state(EXECUTING))),
    ("hold_wait_or_release", 8, lambda m: bool(m.model.holds)),
    ("checkpoint", 1, lambda m: m.model.step > 0),
    ("restore", 1, lambda m: m.model.step > 0),
    ("trainer_restore", 2, lambda m: m.model.step > 0),
    ("resumed_trainer_next", 2, lambda m: bool(m.model.in_state(COMPLETED, LEASED))),
    ("server_restart", 1, lambda m: bool(m.model.entries) and m.restarts < 2),
    ("long_outage", 1, lambda m: bool(m.model.in_state(COMPLETED)) and m.restarts < 2),
    ("interrupted_op", 2, lambda m: bool(m.model.active_leases() or m.model.in_state(EXECUTING))
     or m.model.step > 0),
]
