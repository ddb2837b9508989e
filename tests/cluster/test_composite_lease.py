"""A trainer that dies between two partition commits of one composite lease.

The committed member's groups stay committed (once); the other members expire and are requeued by
the reaper, generated again and trained in a later lease (once). With ``commit(step)`` and a
checkpoint, ``restore`` also puts the committed member back, so data consumption matches the model
the trainer resumed from. Either way each group is in exactly one committed lease.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Generator

from rollout_queue import QueueConfig
from rollout_queue.core import flows
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.protocol import Command
from tests.cluster.test_partitioned import generate, groups
from tests.helpers import wait_until

CFG = QueueConfig(max_staleness=4, max_completed_groups=600, lease_timeout_s=0.5)


def die_after_first_commit(q: Any, lease: Any, step: int | None) -> None:
    """What a trainer process does before it is killed: commit only the first member."""
    keys, lease_id, token = lease.members[0]
    q.run(flows.commit(keys, lease_id, token, step))


def read_commits(keys: QueueKeys) -> Generator[Command, Any, Any]:
    return (yield Command(("XRANGE", keys["commits"], "-", "+")))


def commit_ledger(q: Any) -> Counter[str]:
    """entry IDs (qualified by partition) -> how many commits lines name them: Redis's own record."""
    seen: Counter[str] = Counter()
    for name, keys in zip(q.partitions, q.layout.keys):
        for _, kv in q.run(read_commits(keys)):
            fields = dict(zip(kv[::2], kv[1::2]))
            seen.update(f"{name}/{entry_id}" for entry_id in fields[b"ids"].decode().split(",") if entry_id)
    return seen


def reap_until_requeued(q: Any, count: int) -> None:
    expired: list[int] = []
    wait_until(lambda: expired.append(q.reap().expired) or sum(expired) >= count, timeout=10,
               message=f"the reaper to roll back {count} groups of the dead trainer's leases")


def test_trainer_dies_between_partition_commits(open_pq: Any) -> None:
    q = open_pq(CFG)
    q.submit(groups(24))
    generate(q, "w-a", 24)
    lease = q.lease(groups=24)
    assert len(lease.members) > 1
    first = len(lease.parts[0].groups)
    die_after_first_commit(q, lease, step=None)
    reap_until_requeued(q, 24 - first)
    s = q.stats()
    assert (s.committed, s.ready, s.leased) == (first, 24 - first, 0)

    generate(q, "w-b", 24 - first)  # the uncommitted groups are generated again ...
    again = q.lease(groups=24 - first)
    trained = Counter(g.group.source_id for g in lease.parts[0].groups)
    trained.update(g.group.source_id for g in again.groups)
    again.commit()
    # ... and every group is trained exactly once: by the trainer's view and by the commits streams.
    assert set(trained) == {f"s{i}" for i in range(24)} and set(trained.values()) == {1}
    ledger = commit_ledger(q)
    assert len(ledger) == 24 and set(ledger.values()) == {1}


def test_restore_after_a_partial_commit_retrains_from_the_checkpoint(open_pq: Any) -> None:
    q = open_pq(CFG.replace(lease_timeout_s=0.5))
    q.submit(groups(24))
    generate(q, "w-a", 12)
    q.lease(groups=12).commit(step=1)
    q.checkpoint(1)  # the model at step 1 is saved: its data is consumed for good
    generate(q, "w-a", 12)
    lease = q.lease(groups=12)
    die_after_first_commit(q, lease, step=2)  # dies during step 2, before its checkpoint
    first = len(lease.parts[0].groups)
    reap_until_requeued(q, 12 - first)
    # The trainer resumes from checkpoint 1: everything committed after it is requeued as well.
    assert q.restore(1) == first
    s = q.stats()
    assert (s.committed, s.ready, s.kept) == (12, 12, 0)
    generate(q, "w-b", 12)
    q.lease(groups=12).commit(step=2)
    assert q.stats().committed == 24
