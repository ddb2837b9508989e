"""What a worker credential may write cannot stop the queue or move its clock (issue 29 item 7).

The worker role writes the counters hash (its scripts count), so a credential can put anything
there; the chaos adversary's `HSET counters version {}` crash-looped every trainer (stats could not
parse a made-up field that shadowed meta's version), and a counter that is no integer failed every
script of every role. The queue clock (rollout:{q}:clock) decides every deadline: the worker role now
holds it read-only, and a clock written by hand that is no clock is ignored.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import redis

from rollout_queue import QueueConfig, RolloutQueue
from tests.contract.lifecycle import fill_buffer, keys, submit

CFG = QueueConfig(max_attempts=3, max_staleness=8)


@pytest.fixture
def q(redis_url: str, queue_name: str) -> Iterator[Any]:
    queue = RolloutQueue.from_url(redis_url, queue_name, CFG)
    yield queue
    queue.close()


def test_made_up_counter_fields_never_shadow_the_config(q, r, hostile, queue_name) -> None:
    fill_buffer(q, 2)
    q.publish_version(3)
    k = keys(queue_name)
    hostile.hset(k["counters"], mapping={"version": "{}", "state": "-1", "max_staleness": "x", "ms": "1"})
    s = q.stats()  # a ProtocolError crash loop for every trainer before
    assert (s.version, s.completed) == (3, 2)
    assert "state" not in s.counters and "ms" not in s.counters  # made up: not read
    assert s.counters["version"] == 3 and s.counters["max_staleness"] == 8  # meta's, not the shadows
    lease = q.lease(2)
    assert lease is not None and lease.commit()


def test_a_counter_that_is_no_integer_is_repaired_not_fatal(q, r, hostile, queue_name) -> None:
    fill_buffer(q, 2)
    k = keys(queue_name)
    hostile.hset(k["counters"], mapping={"retained": "nan", "committed": "1e400"})
    lease = q.lease(2)  # every script of every role refused ('corrupt counter') before
    assert lease is not None and lease.commit()
    counters = {key.decode(): v.decode() for key, v in r.hgetall(k["counters"]).items()}
    assert counters["committed"] == "2" and counters["retained"] == "-2"  # reset to 0, then moved
    assert counters["counters_repaired"] == "2"
    assert q.stats().committed == 2


def test_the_worker_role_cannot_write_the_queue_clock(q, r, hostile, queue_name) -> None:
    submit(q, 1)
    k = keys(queue_name)
    before = r.hgetall(k["clock"])
    for field, value in (("offset", "-3600000"), ("ms", "99999999999999"), ("resumed", "0")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            hostile.hset(k["clock"], field, value)
    assert r.hgetall(k["clock"]) == before
    # ... and a worker's own scripts still run (they read the clock and leave recording it to others).
    w = RolloutQueue.from_url(_url(hostile), queue_name)
    try:
        wk = w.worker("w-1")
        wk.heartbeat()
        assert len(wk.reserve(1)) == 1
    finally:
        w.close()


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['username']}:{kw['password']}@{kw['host']}:{kw['port']}/0"


@pytest.mark.parametrize("garbage", [{"offset": "nan"}, {"offset": "-5"}, {"ms": "1e400"},
                                     {"offset": "99999999999999999999"}, {"resumed": "x", "outages": "y"}])
def test_a_clock_that_is_no_clock_is_ignored(q, r, queue_name, garbage: dict[str, str]) -> None:
    fill_buffer(q, 1)
    r.hset(keys(queue_name)["clock"], mapping=garbage)  # by hand (an admin's typo)
    assert q.stats().completed == 1
    sec, _ = r.time()
    lease = q.lease(1, timeout_s=30)
    assert lease is not None
    assert abs(lease.deadline_ms - (sec * 1000 + 30_000)) < 10_000  # judged on a sane clock
    assert lease.commit()
