"""Slow: a producer, three workers, a reaper and a trainer on P = 6 partitions of a 3-master cluster
while masters are SIGKILLed and restarted in turn; at the end every group is trained exactly once.

Run with ``pytest -m slow tests/cluster``. Each role is a thread with its own client and behaves as
the real processes must: an idempotent call whose outcome is unknown is repeated (submit, complete,
commit), a lost lease is rolled back and its groups are generated again.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any, Callable

import pytest

from rollout_queue import (
    LeaseLost,
    OutcomeUnknown,
    PartitionedQueue,
    QueueConfig,
    RetryPolicy,
    Sample,
    SourceGroup,
    StaleReceipt,
)
from rollout_queue.devtools.local_cluster import LocalCluster
from tests.cluster.conftest import P, spread_name
from tests.helpers import wait_until

GROUPS = 600
CFG = QueueConfig(max_completed_groups=300, worker_timeout_s=5.0, lease_timeout_s=10.0, max_attempts=50)


def until_known(call: Callable[[], Any], stop: threading.Event) -> Any:
    """Repeat an idempotent call until its outcome is known (the node it needs is back)."""
    while not stop.is_set():
        try:
            return call()
        except OutcomeUnknown:
            continue  # the call is idempotent: sending it again is how its outcome becomes known
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_masters_die_and_come_back_while_the_queue_runs(request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("cluster chaos belongs to the slow suite: pytest -m slow tests/cluster")
    with LocalCluster(masters=3) as cluster:
        run(cluster)


def run(cluster: LocalCluster) -> None:
    name = spread_name(cluster)
    opened: list[PartitionedQueue] = []

    def queue() -> PartitionedQueue:
        q = PartitionedQueue.from_url(cluster.url, name, P, CFG, retry=RetryPolicy(window_s=5.0))
        opened.append(q)
        return q

    stop, trained, errors = threading.Event(), Counter[str](), []
    q0 = queue()

    def guard(role: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                role()
            except BaseException as exc:  # reported by the main thread's assertion below
                errors.append(exc)
                stop.set()
        return body

    def producer() -> None:
        q = queue()
        batch = [SourceGroup(f"s{i}", "p", 2) for i in range(GROUPS)]
        for start in range(0, GROUPS, 50):
            until_known(lambda: q.submit(batch[start:start + 50]), stop)

    def worker(index: int) -> None:
        q = queue()
        w = q.worker(f"w{index}")
        while not stop.is_set():
            try:
                got = w.reserve(max_groups=4, block_ms=200)
            except OutcomeUnknown:
                continue  # a reserve whose outcome is unknown is replayed on the next call
            for r in got:
                out = [Sample(slot=i, token_ids=[1], version=r.version) for i in range(r.group.n)]
                try:
                    until_known(lambda: w.complete(r.receipt, out), stop)
                except StaleReceipt:
                    continue  # the reaper gave it away while its node was down: someone else has it

    def reaper() -> None:
        q = queue()
        while not stop.is_set():
            q.reap()
            stop.wait(0.5)

    def trainer() -> None:
        q = queue()
        while not stop.is_set():
            try:
                lease = q.lease(groups=16, partial=True, block_ms=300)
            except OutcomeUnknown:
                continue
            if lease is None:
                continue
            try:
                until_known(lease.commit, stop)
            except LeaseLost:
                until_known(lease.rollback, stop)  # the step is dropped; the groups are generated again
                continue
            trained.update(g.group.source_id for g in lease.groups)

    threads = [threading.Thread(target=guard(fn), daemon=True)
               for fn in (producer, reaper, trainer, *(lambda i=i: worker(i) for i in range(3)))]
    for t in threads:
        t.start()
    rnd = random.Random(7)
    for _ in range(3):
        time.sleep(2.0)  # the nemesis' own rhythm: let the queue run between crashes
        victim = rnd.randrange(len(cluster.nodes))
        cluster.kill(victim)
        time.sleep(2.0)
        cluster.restart(victim)
    try:
        wait_until(lambda: sum(trained.values()) >= GROUPS or errors, timeout=240, interval=0.2,
                   message="every group to be trained")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert set(trained) == {f"s{i}" for i in range(GROUPS)} and set(trained.values()) == {1}
    final = q0.stats()
    assert (final.committed, final.dead, final.retained, final.backlog) == (GROUPS, 0, 0, 0)
    for q in opened:
        q.close()
