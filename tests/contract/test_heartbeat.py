"""Contract of heartbeat.lua: refresh a worker's liveness; read the policy version and admission state.

Header outcome: {'ok', version, version_published, weights_uri, held, server_ms}. Invariant: the
worker's score in `workers` is the server time of its last heartbeat, and the reaper treats it as
lost only after worker_timeout without one (DESIGN: Failure handling; rule 6, server time).
"""

from __future__ import annotations

import pytest
import redis

from rollout_queue import HeartbeatInfo, InvalidInput, Progress, QueueConfig, RolloutQueue, ScriptError
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS
from rollout_queue.ops import partition_views, views
from rollout_queue.ops.view_models import WorkerProgress
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


# -- progress: the worker's own counts, and its sample histograms -----------------------------------

LENGTHS = tuple(range(len(TOKEN_BUCKETS) + 1))                          # 0,1,...,12 samples per bucket
DURATIONS = (0,) * len(SECOND_BUCKETS) + (2**53 - 1,)                   # everything above the last edge


def _line(raw: redis.Redis, queue_name: str, worker_id: str) -> str:
    return raw.hget(keys(queue_name)["progress"], worker_id).decode()


def test_heartbeat_stores_the_sample_histograms_with_the_progress(open_queue, raw: redis.Redis,
                                                                   queue_name: str) -> None:
    """``groups|tokens|uptime_ms|reported_ms|sample_tokens|sample_seconds``, the counts comma-joined,
    read back by the operator views exactly as reported."""
    q = open_queue(CFG)
    info = q.worker("hb").heartbeat(Progress(3, 700, 9000, LENGTHS, DURATIONS))
    assert _line(raw, queue_name, "hb") == (f"3|700|9000|{info.server_ms}|{','.join(map(str, LENGTHS))}|"
                                            f"{','.join(map(str, DURATIONS))}")
    (w,) = views.QueueView(raw, queue_name).run(views.workers(keys(queue_name)))
    assert w.progress == WorkerProgress(3, 700, 9000, info.server_ms, LENGTHS, DURATIONS) and not w.garbage
    # One histogram alone, and a report without any: the line keeps the older four-field form.
    q.worker("hb").heartbeat(Progress(4, 800, 9500, sample_seconds=DURATIONS))
    assert _line(raw, queue_name, "hb").endswith(f"|9500|{raw.zscore(keys(queue_name)['workers'], 'hb'):.0f}||"
                                                 + ",".join(map(str, DURATIONS)))
    info = q.worker("hb").heartbeat(Progress(5, 900, 9900))
    assert _line(raw, queue_name, "hb") == f"5|900|9900|{info.server_ms}"
    # A beat without progress leaves the last report alone.
    q.worker("hb").heartbeat()
    assert _line(raw, queue_name, "hb") == f"5|900|9900|{info.server_ms}"


def test_a_progress_line_of_the_older_form_and_garbage_histograms_read_leniently(open_queue, raw: redis.Redis,
                                                                                  queue_name: str) -> None:
    """A four-field line (an older worker) has no histograms; a histogram no heartbeat writes loses
    only itself (a GARBAGE note), not the worker's other counts."""
    q = open_queue(CFG)
    for wid in ("old", "bad-len", "bad-count"):
        q.worker(wid).heartbeat()
    k = keys(queue_name)["progress"]
    raw.hset(k, mapping={"old": "1|2|3|4", "bad-len": "1|2|3|4|1,2|", "bad-count": "1|2|3|4||" + "x," * 12 + "1"})
    found = {w.worker_id: w for w in views.QueueView(raw, queue_name).run(views.workers(keys(queue_name)))}
    assert found["old"].progress == WorkerProgress(1, 2, 3, 4) and not found["old"].garbage
    for wid in ("bad-len", "bad-count"):
        assert found[wid].progress == WorkerProgress(1, 2, 3, 4), wid
        assert len(found[wid].garbage) == 1 and "progress sample_" in found[wid].garbage[0], wid


@pytest.mark.parametrize("counts, what", [
    ((1,) * len(TOKEN_BUCKETS), "13 counts"), ((-1,) + (0,) * len(TOKEN_BUCKETS), ">= 0"),
    ((1.0,) + (0,) * len(TOKEN_BUCKETS), "integer"), ((True,) + (0,) * len(TOKEN_BUCKETS), "integer"),
    ("1,2", "list"), (None, "list"),
])
def test_a_bad_histogram_is_refused_before_any_call(counts: object, what: str) -> None:
    with pytest.raises(InvalidInput, match="sample_tokens"):
        Progress(1, 1, 1, sample_tokens=counts)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="sample_seconds"):
        Progress(1, 1, 1, sample_seconds=counts)  # type: ignore[arg-type]
    assert Progress(1, 1, 1, [0] * (len(TOKEN_BUCKETS) + 1)).sample_tokens == (0,) * (len(TOKEN_BUCKETS) + 1)


OK_ARGV = {"worker_id": "raw", "groups": 1, "tokens": 2, "uptime_ms": 3, "sample_tokens": "", "sample_seconds": ""}


@pytest.mark.parametrize("argv, message", [
    ({"sample_tokens": "1,,2"}, "not comma-joined"), ({"sample_tokens": "1,2,"}, "not comma-joined"),
    ({"sample_tokens": ",1"}, "not comma-joined"), ({"sample_seconds": "1, 2"}, "not comma-joined"),
    ({"sample_seconds": "-1"}, "not comma-joined"), ({"sample_tokens": "1e3"}, "not comma-joined"),
    ({"sample_tokens": "1," * 64 + "1"}, "more than 64 counts"),
    ({"sample_tokens": "1" * 2000}, "too long"), ({"sample_seconds": "9" * 17}, "sample_seconds"),
    ({"sample_seconds": "9007199254740992"}, "sample_seconds"),
    ({"groups": "", "sample_tokens": "1"}, "counts without groups"),
    ({"groups": "1.5"}, "groups: 1.5"), ({"tokens": "inf"}, "tokens: inf"),
    ({"uptime_ms": "-3"}, "uptime_ms: -3"),
])
def test_the_script_refuses_garbage_progress_with_a_typed_error(open_queue, raw: redis.Redis, queue_name: str,
                                                                argv: dict, message: str) -> None:
    """A raw call (no client checks) with garbage in the counts: ScriptError, nothing written."""
    q = open_queue(CFG)
    with pytest.raises(ScriptError, match=f"ROLLOUTQ bad progress.*{message}"):
        call(q, "heartbeat", **{**OK_ARGV, **argv})
    assert raw.hget(keys(queue_name)["progress"], "raw") is None
    assert call(q, "heartbeat", **OK_ARGV)[0] == "ok"
    assert _line(raw, queue_name, "raw").startswith("1|2|3|")


def test_the_progress_of_a_partitioned_queue_lives_in_its_lead_partition(redis_url: str, queue_name: str,
                                                                         raw: redis.Redis) -> None:
    """A partitioned worker's beat goes to every partition but its report to the first only, so the
    views' sum over the partitions counts each worker's samples once."""
    q = RolloutQueue.from_url(redis_url, queue_name, CFG, partitions=3)
    try:
        q.worker("pw").heartbeat(Progress(2, 40, 1000, LENGTHS, DURATIONS))
        lead, *others = q.layout.keys
        assert raw.hget(lead["progress"], "pw").decode().endswith("|" + ",".join(map(str, DURATIONS)))
        assert all(raw.hget(k["progress"], "pw") is None for k in others)
        snap = q.run(partition_views.snapshot(q.layout))
        assert len([w for w in snap.workers if w.worker_id == "pw"]) == 3  # registered in each partition
        assert snap.sample_tokens.counts == LENGTHS and snap.sample_seconds.counts == DURATIONS
        assert snap.sample_tokens.workers == 1 and snap.sample_tokens.count == sum(LENGTHS)
    finally:
        q.close()
