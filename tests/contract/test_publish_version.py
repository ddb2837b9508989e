"""publish_version.lua: record a new policy version, against real servers over both transports.

Proves the header's outcomes ('published', 'replay', 'version_regression', 'hold_lost', the last
two with every key byte-identical) and DESIGN: versions only grow, the versions channel announces
each new one, and q.version, stats and heartbeats read it.
"""

from __future__ import annotations

import pytest

from rollout_queue import HoldLost, InvalidInput, ScriptError, VersionRegression
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import check_header, keys, meta
from tests.contract.worker_support import call
from tests.helpers import wait_until


def test_header_matches_builder() -> None:
    check_header("publish_version", ["meta", "holds", "wake_work", "wake_done"],
                 ["version", "weights_uri", "hold_id"])


def test_versions_only_grow(open_queue, raw, queue_name) -> None:
    q = open_queue()
    assert q.version == 0
    s = q.stats()
    assert (s.version, s.version_published) == (0, False)
    assert q.publish_version(0, "s3://w/0") is True, "the first version may be 0"
    assert q.stats().version_published is True
    assert q.publish_version(3, "s3://w/3") is True
    assert q.version == 3
    m = meta(raw, queue_name)
    assert (m["version"], m["weights_uri"]) == ("3", "s3://w/3")
    before = snapshot(raw, queue_name)
    for version, uri in ((2, "s3://w/2"), (3, "s3://w/other"), (0, "s3://w/0")):
        with pytest.raises(VersionRegression) as err:
            q.publish_version(version, uri)
        assert (err.value.version, err.value.current) == (version, 3)
    assert snapshot(raw, queue_name) == before
    assert q.version == 3


def test_same_version_and_uri_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue()
    assert q.publish_version(5, "s3://w/5") is True
    before = snapshot(raw, queue_name)
    assert q.publish_version(5, "s3://w/5") is False
    assert snapshot(raw, queue_name) == before
    assert q.publish_version(6) is True
    assert q.publish_version(6) is False


def test_the_versions_channel_announces_it(open_queue, raw, queue_name) -> None:
    q = open_queue()
    sub = raw.pubsub()
    sub.subscribe(keys(queue_name).versions_channel)
    try:
        wait_until(lambda: sub.get_message(timeout=0.05), timeout=5)  # the subscribe confirmation
        q.publish_version(7, "s3://w/7")
        msg = wait_until(lambda: sub.get_message(timeout=0.05), timeout=5)
        assert msg["type"] == "message" and msg["data"] == b"7|s3://w/7"
        q.publish_version(7, "s3://w/7")  # a replay announces nothing
        q.publish_version(8)
        msg = wait_until(lambda: sub.get_message(timeout=0.05), timeout=5)
        assert msg["data"] == b"8|"
    finally:
        sub.close()


def test_workers_learn_the_version_from_heartbeats(open_queue) -> None:
    q = open_queue()
    w = q.worker("w-a")
    info = w.heartbeat()
    assert (info.version, info.version_published, info.weights_uri) == (0, False, None)
    q.publish_version(2, "s3://w/2")
    info = w.heartbeat()
    assert (info.version, info.version_published, info.weights_uri) == (2, True, "s3://w/2")


def test_through_a_released_hold_is_hold_lost(open_queue, raw, queue_name) -> None:
    q = open_queue()
    hold = q.hold()
    hold.release()
    before = snapshot(raw, queue_name)
    with pytest.raises(HoldLost):
        hold.record_weight_update(1, "s3://w/1")
    assert snapshot(raw, queue_name) == before
    assert q.version == 0


def test_out_of_range_versions_are_refused(open_queue) -> None:
    q = open_queue()
    for bad in (2**21, -1, 1.5, True):  # the client refuses them before sending (issue 12 item 12) ...
        with pytest.raises(InvalidInput, match="version"):
            q.publish_version(bad)
    for bad in (2**21, -1, 1.5):  # ... and the script still does, for a raw call
        with pytest.raises(ScriptError, match="ROLLOUTQ bad version"):
            call(q, "publish_version", version=bad, weights_uri="", hold_id="")
    assert q.version == 0
