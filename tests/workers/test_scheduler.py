"""SubmissionScheduler with no Redis and no engine: the group and sample policies, driven by hand."""

from __future__ import annotations

import random

import pytest

from rollout_queue.workers.scheduler import ReserveRequest, SubmissionScheduler


def test_group_policy_reserves_only_when_a_group_is_terminal() -> None:
    s = SubmissionScheduler("group", max_groups=2)
    assert s.request() == ReserveRequest(max_groups=2, max_samples=0)  # batching: both at once
    s.on_reserved("a", 4)
    s.on_reserved("b", 4)
    assert s.request() is None
    for _ in range(3):
        assert s.on_sample_done("a") is False  # finished samples free nothing under this policy
    assert s.request() is None
    s.on_sample_done("a")
    assert s.request() is None  # every sample done, but the group is not terminal yet
    s.on_group_terminal("a")
    assert s.request() == ReserveRequest(max_groups=1, max_samples=0)
    s.check()


def test_sample_policy_with_no_waiting_backfills_as_soon_as_n_slots_are_free() -> None:
    s = SubmissionScheduler("sample", max_samples=8, max_waiting=0)
    assert s.request() == ReserveRequest(max_groups=8, max_samples=8, overcommit=True)
    s.on_reserved("a", 4)
    s.on_reserved("b", 4)
    assert s.request() is None
    for _ in range(3):
        assert s.on_sample_done("a") is True
    assert s.request() is None  # 3 free slots < n = 4
    s.on_sample_done("b")
    assert s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.on_reserved("c", 4)  # a and b each still have a long-tailed sample running
    assert len(s.held) == 3 and s.busy_samples == 8
    s.check()


def test_sample_policy_reserves_the_next_group_while_n_minus_1_samples_still_wait() -> None:
    """The default: up to 2n - 1 samples wait inside the engine, so the next group is reserved
    while n - 1 still wait and its round trip ends before a slot frees with nothing waiting (waiting
    for n free slots keeps ~11% of S = 32 slots idle with n = 8; reserving only once a slot is free
    left 3 of them idle per step in the engine bench)."""
    s = SubmissionScheduler("sample", max_samples=8)
    s.on_reserved("a", 4)
    s.on_reserved("b", 4)
    assert s.waiting_allowed == 7
    assert s.request() == ReserveRequest(max_groups=7, max_samples=7, overcommit=True)  # every slot busy
    s.on_reserved("c", 4)  # all four of c wait in the engine
    assert s.busy_samples == 12 and not s.held["c"].oversized
    assert s.request() is None  # 3 more may wait: less than a group
    s.on_sample_done("a")  # one of c starts; three still wait
    assert s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.on_reserved("d", 4)
    assert s.busy_samples == 15 == 8 + 7 and s.request() is None  # the most that may ever wait
    s.check()
    for _ in range(3):
        s.on_sample_done("a")
    s.on_sample_done("b")
    assert s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.check()


def test_max_waiting_bounds_what_waits_in_the_engine() -> None:
    s = SubmissionScheduler("sample", max_samples=8, max_waiting=2)
    s.on_reserved("a", 4)
    s.on_reserved("b", 4)
    assert s.request() is None
    s.on_sample_done("a")
    assert s.request() is None  # room 1 + 2 < 4
    s.on_sample_done("a")
    assert s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.on_reserved("c", 4)
    assert s.busy_samples == 10
    s.check()


def test_the_default_waiting_follows_the_group_size_and_never_exceeds_the_slots() -> None:
    s = SubmissionScheduler("sample", max_samples=4)
    assert s.waiting_allowed == 0  # no group seen yet
    s.on_reserved("a", 2)
    assert s.waiting_allowed == 3  # 2n - 1
    s.on_reserved("big", 16)  # oversized: granted beyond the room
    assert s.held["big"].oversized and s.waiting_allowed == 7  # 2 min(16, 4 slots) - 1
    s.check()


def test_group_terminal_releases_the_unfinished_samples_of_an_aborted_group() -> None:
    s = SubmissionScheduler("sample", max_samples=4, max_waiting=0)
    s.on_reserved("a", 4)
    s.on_sample_done("a")
    s.on_group_terminal("a")  # aborted with three samples unfinished
    assert s.busy_samples == 0 and s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.on_group_terminal("a")  # reporting a terminal twice is harmless
    s.check()


def test_both_caps_apply_together() -> None:
    s = SubmissionScheduler("sample", max_samples=16, max_groups=3, max_batch=2)
    assert s.request() == ReserveRequest(max_groups=2, max_samples=16, overcommit=True)
    s.on_reserved("a", 2)
    s.on_reserved("b", 2)
    s.on_reserved("c", 2)
    assert s.request() is None  # the group cap, though 10 sample slots are free
    g = SubmissionScheduler("group", max_groups=4, max_samples=6)
    g.on_reserved("a", 4)
    assert g.request() is None  # 2 free samples < n
    g.on_group_terminal("a")
    assert g.request() == ReserveRequest(max_groups=4, max_samples=6)


@pytest.mark.parametrize(("policy", "max_waiting"), [("group", None), ("sample", None), ("sample", 0), ("sample", 5)])
def test_random_event_sequences_keep_the_accounting_exact(policy: str, max_waiting: int | None) -> None:
    rng = random.Random(7)
    s = SubmissionScheduler(policy, max_samples=12 if policy == "sample" else None,  # type: ignore[arg-type]
                            max_groups=3 if policy == "group" else None, max_waiting=max_waiting)
    running: dict[int, int] = {}
    next_key = 0
    for _ in range(2000):
        ask = s.request()
        roll = rng.random()
        if ask is not None and roll < 0.3:
            n = rng.randint(1, 4)
            if ask.max_samples and n > ask.max_samples:
                continue  # the reserve script would refuse it
            s.on_reserved(next_key, n)
            running[next_key] = n
            next_key += 1
        elif running and roll < 0.8:
            key = rng.choice([k for k, v in running.items() if v] or list(running))
            if running[key]:
                s.on_sample_done(key)
                running[key] -= 1
        elif running:
            key = rng.choice(list(running))
            s.on_group_terminal(key)
            del running[key]
        s.check()
    assert s.peak_groups >= 2


def test_invalid_configurations_are_refused() -> None:
    with pytest.raises(ValueError):
        SubmissionScheduler("group")
    with pytest.raises(ValueError):
        SubmissionScheduler("sample", max_samples=0)
    with pytest.raises(ValueError):
        SubmissionScheduler("fifo", max_samples=1)  # type: ignore[arg-type]
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError):
            SubmissionScheduler("sample", max_samples=2, max_waiting=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SubmissionScheduler("group", max_groups=2, max_waiting=1)
    s = SubmissionScheduler("sample", max_samples=2)
    s.on_reserved("a", 1)
    with pytest.raises(ValueError):
        s.on_reserved("a", 1)
    with pytest.raises(ValueError):
        s.on_sample_done("zzz")


def test_sample_policy_overcommits_one_oversized_group_and_then_waits_for_its_samples() -> None:
    """Issue 12 item 2: a group larger than the free slots may be granted (the engine queues the
    extra samples); nothing more is asked until the slots it overran are free again."""
    s = SubmissionScheduler("sample", max_samples=4, max_waiting=0)
    assert s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.on_reserved("big", 8)
    s.check()  # busy 8 > 4 is allowed while an oversized group is held
    assert s.request() is None
    for _ in range(7):
        s.on_sample_done("big")
        assert s.request() is None  # n_hint is 8 but capped at the 4 slots: wait until all are free
    s.on_sample_done("big")
    assert s.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    s.on_group_terminal("big")
    s.check()
    assert s.busy_samples == 0
    # By default 7 of its samples may wait (2 min(8, 4 slots) - 1): the next ask comes once the
    # room holds 4, after 1 of its 8 samples is done, not all 8.
    d = SubmissionScheduler("sample", max_samples=4)
    d.on_reserved("big", 8)
    assert d.request() is None
    d.on_sample_done("big")
    assert d.request() == ReserveRequest(max_groups=4, max_samples=4, overcommit=True)
    d.check()


def test_group_policy_never_overcommits() -> None:
    g = SubmissionScheduler("group", max_groups=2, max_samples=4)
    assert g.request() == ReserveRequest(max_groups=2, max_samples=4, overcommit=False)


def test_worker_options_let_samples_wait_only_where_the_engine_queues_them() -> None:
    from rollout_queue.workers.options import WorkerOptions

    assert WorkerOptions().scheduler(32).max_waiting is None  # the engine's concurrency: 2n - 1 may wait
    # Below the engine's concurrency a sample handed over would run, not wait: max_samples stays a cap.
    assert WorkerOptions(max_samples=8).scheduler(32).max_waiting == 0
    assert WorkerOptions(max_samples=8, max_waiting=2).scheduler(32).max_waiting == 2
    assert WorkerOptions(max_waiting=0).scheduler(32).max_waiting == 0
    # An engine that prefills a prompt once per step (torch) is handed whole groups unless told otherwise.
    assert WorkerOptions().scheduler(32, prefills_per_step=True).max_waiting == 0
    assert WorkerOptions(max_waiting=3).scheduler(32, prefills_per_step=True).max_waiting == 3
    for bad in ({"max_waiting": -1}, {"max_waiting": True}, {"policy": "group", "max_waiting": 1}):
        with pytest.raises(ValueError, match="max_waiting"):
            WorkerOptions(**bad)  # type: ignore[arg-type]
