"""A rule-based machine over a partitioned queue (P = 3 partitions on one private server).

Issue 12's "the suite finds these next time" for scale-out: random group sizes n against random
`max_samples` (with and without overcommit), silent workers, crashes of the trainer between lease and
commit, and reaps, on a logical queue whose bounds are split over its partitions. After every step:
the logical bounds hold (retained, executing samples, completed), nothing valid is dead-lettered, and
every submitted source group is in exactly one place. At the end of each example, workers and a
trainer keep calling (half the examples with no reaper) until every group is committed, exactly once
over all partitions' commits streams: no group is lost, trained twice or stuck.

The full ledger machine (ledger_machine.py) models one partition exactly; this one checks the
logical invariants of many, where a per-entry model would only repeat that one.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from rollout_queue import (
    LeaseUnsatisfiable,
    PartitionedQueue,
    QueueConfig,
    RetryPolicy,
    Sample,
    SourceGroup,
    StaleReceipt,
    Worker,
)
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.scale.layout import Selector

P = 3
WORKERS = ("gpu-a", "gpu-b", "gpu-c")


class PartitionedMachine(RuleBasedStateMachine):
    server: LocalServer

    def __init__(self) -> None:
        super().__init__()
        self.q: PartitionedQueue | None = None
        self.raw: redis.Redis | None = None
        self.names = list(WORKERS)  # the live worker ids (a silent one is replaced by a new id)
        self.held: dict[str, list] = {w: [] for w in WORKERS}  # reservations each worker executes
        self.silenced = 0
        self.submitted: set[str] = set()
        self.leases: list = []
        self.no_reaper = False

    @initialize(max_exec=st.sampled_from([9, 12, 18]), max_retained=st.integers(6, 12),
                max_completed=st.integers(3, 6), no_reaper=st.booleans())
    def open_queue(self, max_exec: int, max_retained: int, max_completed: int, no_reaper: bool) -> None:
        self.cfg = QueueConfig(max_executing_samples=max_exec, max_retained_groups=max_retained,
                               max_completed_groups=max_completed, max_attempts=10, worker_timeout_s=60.0)
        self.raw = redis.Redis.from_url(self.server.url)
        self.q = PartitionedQueue.from_url(self.server.url, f"pm-{uuid.uuid4().hex[:10]}", P, self.cfg,
                                           retry=RetryPolicy(window_s=10.0))
        self.largest = max_exec // P  # the smallest partition share: the largest group it can run
        self.no_reaper = no_reaper
        deterministic(self.q.selector)
        self.workers: dict[str, Worker] = {}

    def worker(self, name: str) -> Worker:
        """One handle per worker id, its partition order seeded: a replayed example makes the same
        choices (hypothesis's shrinking needs that), where a live worker would pick at random."""
        if name not in self.workers:
            self.workers[name] = self.q.worker(name)
            deterministic(self.workers[name].selector)
        return self.workers[name]

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        groups = [SourceGroup(f"s-{data.draw(st.integers(0, 40), label='source')}", "prompt",
                              data.draw(st.integers(1, self.largest), label="n"))
                  for _ in range(data.draw(st.integers(1, 3), label="groups"))]
        self.q.submit(groups)
        self.submitted |= {g.source_id for g in groups}

    @rule(data=st.data())
    def reserve(self, data: st.DataObject) -> None:
        worker = self.names[data.draw(st.integers(0, len(WORKERS) - 1), label="worker")]
        max_samples = data.draw(st.sampled_from([0, 1, 2, 3]), label="max_samples")
        overcommit = max_samples > 0 and data.draw(st.booleans(), label="overcommit")
        got = self.worker(worker).reserve(data.draw(st.integers(1, 3), label="groups"), max_samples=max_samples,
                                            overcommit=overcommit)
        if max_samples and not overcommit:
            assert sum(r.group.n for r in got) <= max_samples, "a strict caller got more samples than it asked"
        if max_samples and overcommit and len(got) > 1:
            assert sum(r.group.n for r in got[1:]) <= max_samples, "more than one group beyond the cap"
        self.held[worker] += got

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        # Every draw is made whatever the state, so that a replay draws the same (the partition a
        # grant comes from is the selector's choice, not the test's).
        worker = self.names[data.draw(st.integers(0, len(WORKERS) - 1), label="worker")]
        which = data.draw(st.integers(0, 8), label="which")
        if not self.held[worker]:
            return
        r = self.held[worker].pop(which % len(self.held[worker]))
        try:
            self.worker(worker).complete(r.receipt, samples(r.group.n))
        except StaleReceipt:
            pass  # the worker was reaped meanwhile: its group is back in ready

    @precondition(lambda self: self.silenced < 6)
    @rule(data=st.data())
    def worker_goes_silent(self, data: st.DataObject) -> None:
        """The worker process dies: its id goes silent for good (a restarted process has a new id).
        At most 6 deaths, under max_attempts=10: each costs a group at most one attempt, so no
        valid group can be dead-lettered for lost attempts (that would be the queue's rule, not a bug)."""
        i = data.draw(st.integers(0, len(WORKERS) - 1), label="worker")
        worker = self.names[i]
        for name in self.q.layout.names:
            key = f"rollout:{{{name}}}:workers"
            if self.raw.zscore(key, worker) is not None:
                self.raw.zadd(key, {worker: 0})  # silent since the epoch: the next reap or reserve reaps it
        del self.held[worker]
        self.silenced += 1
        self.names[i] = f"{WORKERS[i]}-r{self.silenced}"
        self.held[self.names[i]] = []

    @rule(data=st.data())
    def lease(self, data: st.DataObject) -> None:
        try:
            lease = self.q.lease(data.draw(st.integers(1, 3), label="groups"), partial=True)
        except LeaseUnsatisfiable:
            return
        if lease is None:
            return
        how = data.draw(st.sampled_from(["commit", "commit", "rollback", "crash"]), label="then")
        if how == "commit":
            lease.commit()
        elif how == "rollback":
            lease.rollback()
        else:
            self.leases.append(lease)  # the trainer died holding it: it expires (lease_timeout) or is drained

    @rule()
    def reap(self) -> None:
        self.q.reap()

    @invariant()
    def bounds_hold_and_nothing_valid_dies(self) -> None:
        if self.q is None:
            return
        s = self.q.stats()
        assert s.retained <= self.cfg.max_retained_groups, f"retained over the logical bound: {s}"
        assert s.executing_samples <= self.cfg.max_executing_samples, f"executing over the logical bound: {s}"
        assert s.completed <= self.cfg.max_completed_groups, f"buffer over the logical bound: {s}"
        assert s.dead == 0, f"a valid group was dead-lettered: {self.q.dead_letters()}"
        assert s.backlog + s.retained + s.committed == len(self.submitted), f"a group is lost or doubled: {s}"

    def teardown(self) -> None:
        if self.q is None:
            return
        try:
            self.drain()
        finally:
            self.q.close()
            doomed = [k for name in self.q.layout.names + (self.q.name,)
                      for k in self.raw.scan_iter(match=f"rollout:{{{name}}}:*", count=1000)]
            if doomed:
                self.raw.unlink(*doomed)
            self.raw.close()

    def drain(self) -> None:
        """Liveness: every group committed within a bounded number of rounds, exactly once."""
        for lease in self.leases:
            lease.commit()  # the crashed trainer's leases are still active (600 s): commit them as its restart would
        for worker, held in self.held.items():
            for r in held:
                try:
                    self.worker(worker).complete(r.receipt, samples(r.group.n))
                except StaleReceipt:
                    pass
        for _ in range(20 + 2 * len(self.submitted)):
            s = self.q.stats()
            if s.committed == len(self.submitted):
                break
            for j, worker in enumerate(self.names):
                w = self.worker(worker)
                for r in w.reserve(4, max_samples=(0, 2, 1)[j], overcommit=j == 2):
                    w.complete(r.receipt, samples(r.group.n))
            lease = self.q.lease(self.cfg.max_completed_groups, partial=True)
            if lease is not None:
                lease.commit()
            if not self.no_reaper:
                self.q.reap()
        s = self.q.stats()
        assert s.committed == len(self.submitted), f"not every group committed (liveness): {s}"
        counts: Counter[str] = Counter()
        for name in self.q.layout.names:
            for _, line in self.raw.xrange(f"rollout:{{{name}}}:commits"):
                counts.update(f"{name}/{i}" for i in line[b"ids"].decode().split(",") if i)
        assert len(counts) == len(self.submitted) and all(v == 1 for v in counts.values()), "a group trained twice or lost"


def deterministic(selector: Selector) -> None:
    selector.random.seed(0)
    selector.rotation = 0


def samples(n: int) -> list[Sample]:
    return [Sample(slot=i, token_ids=(1, i), logprobs=(-0.5, -0.5), reward=float(i)) for i in range(n)]


SETTINGS = settings(max_examples=40, stateful_step_count=40, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.timeout(600)
def test_partitioned_machine(fresh_server: LocalServer) -> None:
    run_state_machine_as_test(type("PartitionedMachineOnServer", (PartitionedMachine,), {"server": fresh_server}),
                              settings=SETTINGS)
