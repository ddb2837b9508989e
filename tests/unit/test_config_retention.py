"""QueueConfig.settled_retention_s (no Redis): validated on construction, stored in ms with 0 for None,
read back exactly, and settable from the CLI as seconds or 'none'."""

from __future__ import annotations

import math

import pytest

from rollout_queue import QueueConfig
from rollout_queue.cli.admin import parse_setting


def test_default_is_a_day_and_round_trips_through_meta() -> None:
    cfg = QueueConfig()
    assert cfg.settled_retention_s == 86_400.0
    assert cfg.to_meta()["settled_retention_ms"] == "86400000"
    assert QueueConfig.from_meta(cfg.to_meta()) == cfg


@pytest.mark.parametrize("seconds, stored", [(None, "0"), (0.001, "1"), (2.5, "2500"), (3600, "3600000")])
def test_stored_in_ms_with_zero_for_keep_forever(seconds: float | None, stored: str) -> None:
    cfg = QueueConfig(settled_retention_s=seconds)
    assert cfg.to_meta()["settled_retention_ms"] == stored
    assert QueueConfig.from_meta(cfg.to_meta()).settled_retention_s == (None if seconds is None else seconds)


@pytest.mark.parametrize("bad", [0, -1, 0.0, math.inf, math.nan, True, "3600"])
def test_anything_but_none_or_a_positive_finite_number_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="settled_retention_s"):
        QueueConfig(settled_retention_s=bad)  # type: ignore[arg-type]  # the point of the test


def test_the_cli_takes_seconds_or_none() -> None:
    assert parse_setting("settled_retention_s=3600") == ("settled_retention_s", 3600.0)
    assert parse_setting("settled_retention_s=none") == ("settled_retention_s", None)
    assert QueueConfig().replace(settled_retention_s=None).settled_retention_s is None
