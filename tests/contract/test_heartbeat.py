"""Contract of heartbeat.lua: refresh a worker's liveness; read the policy version and admission state.

Header outcome: {'ok', version, version_published, weights_uri, held, server_ms}. Invariant: the
worker's score in `workers` is the server time of its last heartbeat, and the reaper treats it as
lost only after worker_timeout without one (DESIGN: Failure handling; rule 6, server time).
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import HeartbeatInfo, InvalidInput, QueueConfig
from tests.contract.worker_support import call, group, keys, pel
from tests.helpers import wait_until

# Short enough to wait out, long enough that a loaded machine does not reap a worker between two calls.
CFG = QueueConfig(worker_timeout_s=0.4)


def _server_ms(raw: redis.Redis) -> int:
    seconds, micros = raw.time()
    return seconds * 1000 + micros // 1000


def test_heartbeat_registers_the_worker_at_server_time(open_queue, raw: redis.Redis, queue_name: str) -> None:
    q = open_queue(CFG)
    low = _server_ms(raw)
    info = q.worker("hb-1").heartbeat()
    high = _server_ms(raw)
    assert info == HeartbeatInfo(version=0, version_published=False, weights_uri=None, held=False,
                                 server_ms=info.server_ms)
    assert low <= info.server_ms <= high
    assert raw.zscore(keys(queue_name)["workers"], "hb-1") == info.server_ms


def test_heartbeat_reports_the_published_version_and_weights(open_queue) -> None:
    q = open_queue(CFG)
    q.publish_version(0)
    info = q.worker("hb").heartbeat()
    assert (info.version, info.version_published, info.weights_uri) == (0, True, None)
    q.publish_version(3, "s3://weights/3")
    info = q.worker("hb").heartbeat()
    assert (info.version, info.version_published, info.weights_uri) == (3, True, "s3://weights/3")


def test_heartbeat_reports_an_active_hold(open_queue) -> None:
    q = open_queue(CFG)
    hold = q.hold()
    assert q.worker("hb").heartbeat().held is True
    hold.release()
    assert q.worker("hb").heartbeat().held is False


def test_a_heartbeat_keeps_the_worker_alive_until_it_goes_silent(open_queue, raw: redis.Redis,
                                                                 queue_name: str) -> None:
    q = open_queue(CFG)
    [eid] = q.submit([group("alive")])
    w = q.worker("w1")
    w.reserve(1)
    info = w.heartbeat()
    reply = call(q, "reap_worker", worker_id="w1", count=10)
    assert reply[0] == "alive" and int(reply[1]) == info.server_ms  # judged by the script: nothing written
    assert pel(raw, queue_name) == {eid: ("w1", 1)}
    wait_until(lambda: q.reap().lost, timeout=5.0, message="the silent worker to be reaped")
    assert pel(raw, queue_name) == {eid: ("@ready", 1)}
    assert raw.zscore(keys(queue_name)["workers"], "w1") is None


@pytest.mark.parametrize("worker_id", ["@ready", "@done", "has space", "a|b", "x" * 201])
def test_a_bad_worker_id_is_refused_before_any_call(open_queue, worker_id: str) -> None:
    q = open_queue(CFG)
    with pytest.raises(InvalidInput):
        q.worker(worker_id).heartbeat()
