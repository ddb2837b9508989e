"""``Worker.owned()`` works under the worker's ACL role: the reconciliation of the worker runtime
(workers/reconcile.py) reads the PEL with a plain XPENDING, which the role allows because its own
scripts read the src stream's PEL; this test fails if a change of the rules or of the scripts
takes that away."""

from __future__ import annotations

import redis

from rollout_queue import RolloutQueue, SourceGroup
from tests.ops.test_acl import Urls, urls  # noqa: F401  # the ACL users fixture, used by name


def test_the_worker_role_reads_its_own_pel_and_aborts_an_orphan(urls: Urls, queue_name: str,  # noqa: F811
                                                                r: redis.Redis) -> None:
    producer = RolloutQueue.from_url(urls["producer"], queue_name)
    worker_q = RolloutQueue.from_url(urls["worker"], queue_name)
    try:
        [eid] = producer.submit([SourceGroup("acl-owned", "prompt", 2)])
        w = worker_q.worker("acl-w1")
        [granted] = w.reserve(1)
        assert granted.entry_id == eid
        assert [(a.receipt, a.idle_ms >= 0) for a in w.owned(min_idle_ms=0)] == [(granted.receipt, True)]
        assert w.owned(min_idle_ms=3_600_000) == []  # the IDLE form is allowed too
        assert w.abort(granted.receipt, "orphaned") == "ready"
        assert w.owned() == []
    finally:
        producer.close()
        worker_q.close()
