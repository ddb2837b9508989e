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


def test_sample_policy_backfills_as_soon_as_n_slots_are_free() -> None:
    s = SubmissionScheduler("sample", max_samples=8)
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


def test_group_terminal_releases_the_unfinished_samples_of_an_aborted_group() -> None:
    s = SubmissionScheduler("sample", max_samples=4)
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


@pytest.mark.parametrize("policy", ["group", "sample"])
def test_random_event_sequences_keep_the_accounting_exact(policy: str) -> None:
    rng = random.Random(7)
    s = SubmissionScheduler(policy, max_samples=12 if policy == "sample" else None,  # type: ignore[arg-type]
                            max_groups=3 if policy == "group" else None)
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
    s = SubmissionScheduler("sample", max_samples=2)
    s.on_reserved("a", 1)
    with pytest.raises(ValueError):
        s.on_reserved("a", 1)
    with pytest.raises(ValueError):
        s.on_sample_done("zzz")


def test_sample_policy_overcommits_one_oversized_group_and_then_waits_for_its_samples() -> None:
    """Issue 12 item 2: a group larger than the free slots may be granted (the engine queues the
    extra samples); nothing more is asked until the slots it overran are free again."""
    s = SubmissionScheduler("sample", max_samples=4)
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


def test_group_policy_never_overcommits() -> None:
    g = SubmissionScheduler("group", max_groups=2, max_samples=4)
    assert g.request() == ReserveRequest(max_groups=2, max_samples=4, overcommit=False)
