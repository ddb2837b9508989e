"""hold_open.lua, hold_poll.lua, hold_release.lua: admission holds around a weight update.

Proves each header outcome against real servers over both transports: an open hold closes
admission (reserve answers 'held', lease answers 'held') and counts the executing attempts (opening
the same id again is a replay); polling reaches 0 once they are terminal and answers 'hold_lost'
after release; release is idempotent and reopens admission only when the last hold goes; an expired
hold stops blocking on its own and the reaper removes it; record_weight_update publishes through a
live hold only.
"""

from __future__ import annotations

import pytest

from rollout_queue import HoldLost
from rollout_queue.core import protocol as p
from rollout_queue import QueueConfig
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import (
    check_header,
    execute,
    fill_buffer,
    keys,
    reserve_all,
    samples_for,
    submit,
    wait_past,
)


def test_headers_match_builders() -> None:
    check_header("hold_open", ["meta", "holds", "holders"], ["hold_id", "timeout_ms", "holder", "reason"])
    check_header("hold_poll", ["meta", "holds", "wake_work"], ["hold_id"])
    check_header("hold_release", ["meta", "holds", "holders", "wake_work", "wake_done"], ["hold_id"])


def _reserve_status(q, worker_id: str = "w-probe") -> str:
    reply = execute(q, p.build(q.keys, "reserve", worker_id=worker_id, max_groups=1, max_samples=0, request_id="", overcommit=0))
    return p.s(reply[0])


def test_hold_closes_admission_and_counts_executing_attempts(open_queue, raw, queue_name) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    ids = submit(q, 3)
    w = q.worker("w-busy")
    reserve_all(w, 2)
    hold = q.hold()
    assert hold.waiting == 2
    # No new reservations, no new leases, though a group waits in the backlog and one in the buffer.
    assert _reserve_status(q) == "held"
    assert q.worker("w-other").reserve(1) == []
    assert q.lease(1) is None
    assert q.stats().active_holds == 1
    assert q.worker("w-other").heartbeat().held is True
    hold.release()
    assert q.worker("w-other").heartbeat().held is False
    [late] = q.worker("w-other").reserve(1)
    assert late.entry_id == ids[2]
    assert len(q.lease(1).groups) == 1


def test_opening_the_same_hold_again_is_a_replay(open_queue, raw, queue_name) -> None:
    q = open_queue()
    call = p.build(q.keys, "hold_open", hold_id="h-retry", timeout_ms=0, holder="trainer-0", reason="weight update")
    first = execute(q, call)
    assert p.s(first[0]) == "ok"
    before = snapshot(raw, queue_name)
    second = execute(q, call)
    assert int(second[2]) == int(first[2]), "a replay keeps the first deadline"
    assert snapshot(raw, queue_name) == before
    assert raw.zcard(keys(queue_name)["holds"]) == 1


@pytest.mark.parametrize("terminal", ["complete", "fail", "abort"])
def test_wait_terminal(open_queue, terminal) -> None:
    q = open_queue()
    submit(q, 1)
    w = q.worker("w-busy")
    [res] = w.reserve(1)
    hold = q.hold()
    assert hold.waiting == 1
    assert hold.wait_terminal(0.05) is False
    if terminal == "complete":
        w.complete(res.receipt, samples_for(res))
    elif terminal == "fail":
        w.fail(res.receipt, "engine error")
    else:
        w.abort(res.receipt, "weight update")
    assert hold.wait_terminal(5) is True
    hold.release()


def test_wait_terminal_with_nothing_executing_returns_at_once(open_queue) -> None:
    q = open_queue()
    hold = q.hold()
    assert hold.waiting == 0
    assert hold.wait_terminal(0) is True


def test_wait_terminal_after_release_is_hold_lost(open_queue) -> None:
    q = open_queue()
    hold = q.hold()
    hold.release()
    with pytest.raises(HoldLost):
        hold.wait_terminal(1)


def test_record_weight_update_publishes_through_the_hold(open_queue, raw, queue_name) -> None:
    q = open_queue()
    hold = q.hold()
    assert hold.record_weight_update(1, "s3://w/1") is True
    assert q.version == 1
    assert raw.hget(keys(queue_name)["meta"], "weights_uri") == b"s3://w/1"
    assert hold.release() == 0
    before = snapshot(raw, queue_name)
    with pytest.raises(HoldLost) as err:
        hold.record_weight_update(2, "s3://w/2")
    assert err.value.hold_id == hold.hold_id
    assert snapshot(raw, queue_name) == before
    assert q.version == 1


def test_admission_reopens_only_when_the_last_hold_goes(open_queue) -> None:
    q = open_queue()
    submit(q, 1)
    first, second = q.hold(), q.hold()
    assert first.release() == 1
    assert first.release() == 1, "release is idempotent"
    assert _reserve_status(q) == "held"
    assert second.release() == 0
    assert len(q.worker("w-a").reserve(1)) == 1


def test_an_expired_hold_stops_blocking_and_is_reaped(open_queue, raw, queue_name) -> None:
    q = open_queue()
    submit(q, 1)
    fill_buffer(q, 1)
    w = q.worker("w-busy")
    [res] = w.reserve(1)  # the group submitted first is executing while the hold is open
    hold = q.hold(timeout_s=0.05)
    assert hold.waiting == 1
    deadline = raw.zscore(keys(queue_name)["holds"], hold.hold_id)
    wait_past(raw, int(deadline))
    assert q.stats().active_holds == 0
    assert len(q.lease(1).groups) == 1, "an expired hold no longer blocks admission"
    with pytest.raises(HoldLost):
        hold.record_weight_update(1)
    with pytest.raises(HoldLost):
        hold.wait_terminal(1)
    report = q.reap()
    assert report.holds_expired == 1
    assert raw.zcard(keys(queue_name)["holds"]) == 0
    assert q.reap().holds_expired == 0
    w.complete(res.receipt, samples_for(res))


def test_blocked_admission_wakes_on_release(open_queue, redis_url, queue_name) -> None:
    import threading
    import time

    from rollout_queue import RolloutQueue

    q = open_queue()
    submit(q, 1)
    other = RolloutQueue.from_url(redis_url, queue_name)
    hold = other.hold()
    try:
        import redis as _redis

        probe = _redis.Redis.from_url(redis_url)

        def release_once_blocked() -> None:
            from tests.helpers import wait_until

            wait_until(lambda: any("b" in c.get("flags", "") for c in probe.client_list()), timeout=5)
            hold.release()

        t = threading.Thread(target=release_once_blocked)
        t.start()
        start = time.monotonic()
        got = q.worker("w-a").reserve(1, block_ms=8000)
        t.join()
        probe.close()
        assert len(got) == 1 and time.monotonic() - start < 4.0
    finally:
        other.close()
