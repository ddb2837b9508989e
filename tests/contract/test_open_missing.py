"""Opening a queue that does not exist: only its creator may create it (issue 13 item 5).

A worker, producer or reaper started with a mistyped ``--queue`` used to create an empty queue and
wait on it forever; with ``create=False`` it gets QueueNotFound and nothing is written.
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import ConfigMismatch, QueueConfig, QueueNotFound, RolloutQueue


def keys_of(raw: redis.Redis, name: str) -> list[bytes]:
    return sorted(raw.scan_iter(match=f"rollout:{{{name}*", count=1000))


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_missing_queue_is_not_created_by_who_must_not_create_it(redis_url: str, raw: redis.Redis, queue_name: str,
                                                                   partitions: int) -> None:
    with pytest.raises(QueueNotFound, match=queue_name):
        RolloutQueue.from_url(redis_url, queue_name, partitions=partitions, create=False)
    assert keys_of(raw, queue_name) == [], "nothing written for a queue that was not created"
    RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_retained_groups=12), partitions=partitions).close()
    q = RolloutQueue.from_url(redis_url, queue_name, partitions=partitions, create=False)
    assert q.config.max_retained_groups == 12  # the creator's config, adopted
    q.close()


def test_the_wrong_partition_count_is_named_not_a_missing_queue(redis_url: str, queue_name: str) -> None:
    RolloutQueue.from_url(redis_url, queue_name).close()  # a plain queue
    with pytest.raises(ConfigMismatch):
        RolloutQueue.from_url(redis_url, queue_name, partitions=3, create=False)
    RolloutQueue.from_url(redis_url, queue_name + "-p", partitions=3).close()
    with pytest.raises(ConfigMismatch):
        RolloutQueue.from_url(redis_url, queue_name + "-p", create=False)


def test_create_must_be_a_bool(redis_url: str, queue_name: str) -> None:
    from rollout_queue import InvalidInput

    with pytest.raises(InvalidInput):
        RolloutQueue.from_url(redis_url, queue_name, create="no")  # type: ignore[arg-type]


def test_a_partitioned_queue_its_creator_is_still_opening_is_not_completed_by_another(
        redis_url: str, raw: redis.Redis, queue_name: str) -> None:
    from rollout_queue.scale.layout import Layout

    layout = Layout(queue_name, 3)
    raw.set(layout.record, 3)  # the creator recorded the count and is opening partition 0 next
    with pytest.raises(QueueNotFound):
        RolloutQueue.from_url(redis_url, queue_name, partitions=3, create=False)
    assert keys_of(raw, queue_name) == [layout.record.encode()], "no partition opened with the default config"
    RolloutQueue.from_url(redis_url, queue_name, QueueConfig(max_retained_groups=30), partitions=3).close()
    q = RolloutQueue.from_url(redis_url, queue_name, partitions=3, create=False)
    assert q.config.max_retained_groups == 30  # the creator's config, not the defaults
    q.close()
