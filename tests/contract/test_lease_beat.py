"""lease_beat.lua: a lease's holder beats while it lives, against real servers over both transports.

Proves the header's outcomes ('ok' with the deadline, the due time and the stored bound; 'lease_lost'
for an unknown, wrong-token, committed, rolled-back or expired lease, with every key byte-identical),
and the invariant issue 32 item 7 asks for: a lease whose holder stopped beating is rolled back by the
reaper trainer_silence_s after its last beat, well before lease_timeout_s, while one that keeps
beating is not; a lease that never beat keeps the deadline rule; and a paused (SIGSTOP) trainer that
resumes after the reaper took its lease back gets LeaseLost on commit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from rollout_queue import LeaseLost, QueueConfig, RolloutQueue
from rollout_queue.core import flows
from tests.contract.conftest import snapshot
from tests.contract.lifecycle import check_header, fill_buffer, keys, owners, server_ms, wait_past, zmembers
from tests.helpers import wait_until

SILENCE_S = 1.0


def test_header_matches_builder() -> None:
    check_header("lease_beat", ["meta", "leases"], ["lease_id", "token"])


def test_a_lease_beats_once_before_it_is_handed_out(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(trainer_silence_s=30))
    fill_buffer(q, 1)
    before = server_ms(raw)
    lease = q.lease(1)
    record = keys(queue_name).lease(lease.lease_id)
    beat = int(raw.hget(record, "beat_ms"))
    assert before <= beat <= server_ms(raw)
    # Due 30 s after the beat, long before its 600 s deadline; the deadline itself stays as it was.
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) == beat + 30_000
    assert int(raw.hget(record, "deadline")) == lease.deadline_ms > beat + 500_000
    deadline, due, silence = q.run(flows.beat(q.keys, lease.lease_id, lease.token))
    assert deadline == lease.deadline_ms and silence == 30_000 and due == int(raw.hget(record, "beat_ms")) + 30_000
    lease.commit()


def test_a_lease_that_never_beat_keeps_the_deadline_rule(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(trainer_silence_s=SILENCE_S))
    [entry_id] = fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=30, beat=False)
    assert raw.hget(keys(queue_name).lease(lease.lease_id), "beat_ms") is None
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) == lease.deadline_ms
    wait_past(raw, server_ms(raw) + 3 * int(SILENCE_S * 1000), timeout=10)
    assert q.reap().expired == 0, "silence is judged only for a lease that beat"
    assert owners(raw, queue_name, [entry_id]) == [f"@lease:{lease.lease_id}"]
    lease.commit()


def test_extend_keeps_a_beating_lease_due_at_its_silence(open_queue, raw, queue_name) -> None:
    q = open_queue(QueueConfig(trainer_silence_s=30))
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=60)
    lease.extend(3600)
    beat = int(raw.hget(keys(queue_name).lease(lease.lease_id), "beat_ms"))
    assert raw.zscore(keys(queue_name)["leases"], lease.lease_id) == beat + 30_000
    lease.commit()


@pytest.mark.parametrize("field,value,state", [("lease_id", "no-such-lease", "unknown"),
                                               ("token", "wrong-token", "token")])
def test_a_beat_with_an_unknown_lease_or_a_wrong_token_is_lost(open_queue, raw, queue_name, field, value,
                                                               state) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, beat=False)
    lease_id, token = (value, lease.token) if field == "lease_id" else (lease.lease_id, value)
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        q.run(flows.beat(q.keys, lease_id, token))
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before


@pytest.mark.parametrize("settle,state", [("commit", "committed"), ("rollback", "rolled_back"),
                                          ("expire", "expired")])
def test_a_beat_on_a_closed_lease_is_lost_and_writes_nothing(open_queue, raw, queue_name, settle, state) -> None:
    q = open_queue()
    fill_buffer(q, 1)
    lease = q.lease(1, timeout_s=0.2 if settle == "expire" else None)
    if settle == "expire":
        wait_past(raw, lease.deadline_ms)  # its next background beat learns it, below by hand
    else:
        getattr(lease, settle)()
        assert lease.lease_id not in [held.lease_id for held in q.beats.leases.values()], "no longer beaten"
    before = snapshot(raw, queue_name)
    with pytest.raises(LeaseLost) as err:
        q.run(flows.beat(q.keys, lease.lease_id, lease.token))
    assert err.value.state == state
    assert snapshot(raw, queue_name) == before


def test_a_silent_holder_is_reaped_after_the_bound_and_a_beating_one_is_not(open_queue, raw, queue_name) -> None:
    config = QueueConfig(trainer_silence_s=SILENCE_S)
    q = open_queue(config)
    dead_q = open_queue(config)
    live_ids = fill_buffer(q, 1)
    live = q.lease(1)
    dead_ids = fill_buffer(q, 2)
    dead = dead_q.lease(2, trainer_id="dead-trainer")
    dead_q.close()  # the process is gone: its beats stop; the live holder's go on
    start = server_ms(raw)
    expired = []

    def reaped() -> bool:
        expired.append(q.reap().expired)
        return sum(expired) >= 2

    wait_until(reaped, timeout=20, interval=0.05, message="the silent holder's lease reaped")
    took = server_ms(raw) - start
    assert took < 15_000 < config.lease_timeout_s * 1000, "taken back at the silence bound, not the deadline"
    assert owners(raw, queue_name, dead_ids) == ["@ready", "@ready"] and sum(expired) == 2
    assert raw.hget(keys(queue_name).lease(dead.lease_id), "expired_by") == b"silence"
    # The beating holder's lease outlived several bounds and commits.
    assert owners(raw, queue_name, live_ids) == [f"@lease:{live.lease_id}"]
    assert zmembers(raw, queue_name, "leases") == [live.lease_id]
    live.commit()


TRAINER = textwrap.dedent("""
    import sys
    from rollout_queue import LeaseLost, RolloutQueue
    q = RolloutQueue.from_url(sys.argv[1], sys.argv[2])
    lease = q.lease(1, block_ms=10_000, trainer_id="paused-trainer")
    print(lease.lease_id, flush=True)
    sys.stdin.readline()  # the optimizer step; the test SIGSTOPs the process here
    try:
        lease.commit(step=1)
        print("committed", flush=True)
    except LeaseLost as exc:
        print("LeaseLost", exc.state, flush=True)
""")


def test_a_paused_trainer_that_resumes_after_its_lease_was_reaped_gets_lease_lost(redis_url, raw,
                                                                                  queue_name) -> None:
    q = RolloutQueue.from_url(redis_url, queue_name, QueueConfig(trainer_silence_s=SILENCE_S))
    try:
        [entry_id] = fill_buffer(q, 1)
        proc = subprocess.Popen([sys.executable, "-c", TRAINER, redis_url, queue_name], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            lease_id = proc.stdout.readline().strip()
            assert lease_id and raw.hget(keys(queue_name).lease(lease_id), "beat_ms") is not None
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until(lambda: q.reap().expired, timeout=20, interval=0.05, message="the paused holder's lease reaped")
            assert owners(raw, queue_name, [entry_id]) == ["@ready"]
            os.kill(proc.pid, signal.SIGCONT)
            out, _ = proc.communicate("go\n", timeout=30)
        finally:
            os.kill(proc.pid, signal.SIGCONT) if proc.poll() is None else None
            proc.kill()
        assert out.strip() == "LeaseLost expired", out
        assert owners(raw, queue_name, [entry_id]) == ["@ready"], "nothing it trained was committed"
        assert q.stats().committed == 0
    finally:
        q.close()
