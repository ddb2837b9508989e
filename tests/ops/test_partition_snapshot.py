"""The merged snapshot of a partitioned queue counts each PEL owner's entries over every partition
(ops/partition_views.merge_snapshots), as the plain snapshot does for one."""

from __future__ import annotations

from rollout_queue import QueueConfig, RolloutQueue, SourceGroup
from rollout_queue.ops import partition_views


def test_the_merged_pel_counts_each_owner_over_the_partitions(redis_url: str, queue_name: str) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_executing_samples=1000), partitions=3)
    try:
        q.submit([SourceGroup(f"s{i}", f"prompt {i}", 2) for i in range(12)])
        held = q.worker("w-merge").reserve(max_groups=12)
        assert len(held) == 12
        per_partition = [q.run(partition_views.views.snapshot(keys)).pel.pending_by_owner.get("w-merge", 0)
                         for keys in q.layout.keys]
        assert sum(per_partition) == 12 and sum(1 for n in per_partition if n) >= 2  # spread, not in one
        pel = q.run(partition_views.snapshot(q.layout)).pel
        assert pel.pending_by_owner["w-merge"] == 12
        assert pel.newest_by_owner["w-merge"] >= 0 and pel.states.get("executing") == 12
    finally:
        q.close()
