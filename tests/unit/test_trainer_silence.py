"""Issue 32 item 7 without Redis: the trainer_silence_s field, when a view calls a lease's holder
silent, and top's stall rule from the run's own step times."""

from __future__ import annotations

import pytest

from rollout_queue import InvalidInput, QueueConfig
from rollout_queue.ops.view_models import LeaseView, stall_after_ms, step_ms


def test_trainer_silence_is_stored_in_ms_and_none_is_off() -> None:
    assert QueueConfig().trainer_silence_s == 60.0 and QueueConfig().beat_interval_s == 15.0
    assert QueueConfig(trainer_silence_s=2.5).to_meta()["trainer_silence_ms"] == "2500"
    off = QueueConfig(trainer_silence_s=None)
    assert off.to_meta()["trainer_silence_ms"] == "0" and off.beat_interval_s is None
    for config in (QueueConfig(trainer_silence_s=2.5), off):
        assert QueueConfig.from_meta({**QueueConfig().to_meta(), **config.to_meta()}) == config


@pytest.mark.parametrize("bad", [0.5, 0, -1, float("nan"), True, "60"])
def test_trainer_silence_below_a_second_or_not_seconds_is_refused(bad: object) -> None:
    with pytest.raises(InvalidInput, match="trainer_silence_s"):
        QueueConfig(trainer_silence_s=bad)  # type: ignore[arg-type]


def _lease(silent_ms: int | None, bound: int | None = 60_000, due_in: int = 1_000) -> LeaseView:
    return LeaseView("l1", "t", 0, 500_000, 1, 1, 0, "active", silent_ms=silent_ms, due_in_ms=due_in,
                     silence_bound_ms=bound)


def test_a_holder_is_silent_after_two_missed_beats() -> None:
    assert not _lease(None).holder_silent, "never beat: the deadline alone decides"
    assert not _lease(29_000).holder_silent and _lease(31_000).holder_silent  # beats every 15 s
    assert not _lease(31_000, bound=None).holder_silent, "silence not judged"
    assert _lease(61_000, due_in=-1_000).overdue and not _lease(31_000).overdue


def test_step_time_is_the_median_gap_and_one_steps_commits_count_once() -> None:
    assert step_ms([]) is None and step_ms([0, 5_000, 10_000]) is None  # two gaps: too few
    assert step_ms([15_000, 0, 5_000, 10_000]) == 5_000
    # A stream that acks two leases per step: the 10 ms gaps are one step's commits.
    assert step_ms([0, 10, 6_010, 6_020, 12_020, 12_030, 18_030, 18_040]) == 6_000
    assert step_ms([0, 4_000, 10_000, 16_000, 30_000]) == 6_000  # the median of 4, 6, 6 and 14 s
    assert stall_after_ms(None) == 600_000 and stall_after_ms(5_000) == 60_000 and stall_after_ms(120_000) == 1_200_000
