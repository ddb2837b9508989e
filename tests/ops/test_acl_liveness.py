"""The trainer's credential reads what WorkersGone shows (core/liveness.py: ZREVRANGE workers,
XREVRANGE reaped, HGET clock) with no rule of its own: the lease script reaps inline, so the role
already has those commands on those keys. A trainer under its ACL user names the dead workers too."""

from __future__ import annotations

import pytest

from rollout_queue import RolloutQueue, SourceGroup, WorkersGone
from tests.helpers import wait_until
from tests.ops.test_acl import Urls, urls  # noqa: F401  (the fixture)


def test_a_trainer_credential_names_the_workers_that_are_gone(urls: Urls, queue_name: str) -> None:  # noqa: F811
    RolloutQueue.from_url(urls["producer"], queue_name).submit([SourceGroup(f"s{i}", "p", 2) for i in range(3)])
    RolloutQueue.from_url(urls["worker"], queue_name).worker("gpu-3").reserve(1)  # then silent, as if killed
    trainer = RolloutQueue.from_url(urls["trainer"], queue_name)
    assert trainer.lease(1, block_ms=50) is None  # a live worker seen: the watch is armed
    with pytest.raises(WorkersGone, match=r"gpu-3 \(last heartbeat \d+ s ago"):
        wait_until(lambda: trainer.lease(1, block_ms=100), timeout=30, message="WorkersGone")
