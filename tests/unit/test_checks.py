"""The argument checkers (checks.py) and the value types built on them, with no Redis (issue 12 items
11 and 12): every odd value is refused with InvalidInput or kept exactly, never another exception;
a QueueConfig that exists always stores a form every script reads back."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_queue import InvalidInput, QueueConfig, Receipt, Sample, SourceGroup
from rollout_queue.core.config import TEXT_FIELDS
from rollout_queue.core.checks import MAX_SAFE_INT, check_flag, check_int, check_json, check_seconds

ODD = st.one_of(
    st.booleans(), st.none(), st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**53 - 1, 2**53, 10**400, 10**5000, 1.5, 2.0, -0.0, 1e-300, 1e308, math.nan,
                     math.inf, -math.inf, "1", "", "fifo", "none", "pace", "continue", b"1"]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.builds(object), st.lists(st.integers()),
)
FIELDS = [f.name for f in fields(QueueConfig)]


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(FIELDS), value=ODD)
def test_a_config_field_is_refused_or_stored_in_a_form_the_scripts_read(name: str, value: Any) -> None:
    try:
        cfg = QueueConfig(**{name: value})
    except InvalidInput:
        return  # refused at construction (and a ValueError, for existing `except ValueError`)
    stored = cfg.to_meta()
    for field_name, text in stored.items():  # what load_config.lua accepts: decimal integers < 2^53
        if field_name in TEXT_FIELDS:  # text: one of its values, which load_config.lua checks by name
            assert text in TEXT_FIELDS[field_name], stored
        else:
            assert text.lstrip("-").isdecimal() and abs(int(text)) <= 2**53, stored
    assert QueueConfig.from_meta(stored) == cfg or name.endswith("_s")  # seconds round to whole ms
    assert not isinstance(getattr(cfg, name), bool)


@pytest.mark.parametrize("name", ["max_staleness", "batch_groups", "max_attempts", "max_executing_samples"])
@pytest.mark.parametrize("value", [True, False, 2.0, "3", math.nan, 2**53])
def test_bools_and_non_integers_are_refused(name: str, value: Any) -> None:
    with pytest.raises(InvalidInput, match=f"QueueConfig.{name}"):
        QueueConfig(**{name: value})


@pytest.mark.parametrize("name", ["lease_timeout_s", "worker_timeout_s", "hold_timeout_s", "lease_record_ttl_s",
                                  "settled_retention_s"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, 10**400, 0, -1, True, "60"])
def test_non_finite_or_out_of_range_seconds_are_refused(name: str, value: Any) -> None:
    with pytest.raises(InvalidInput, match=name):
        QueueConfig(**{name: value})


def test_from_meta_names_every_corrupt_field_and_stored_fields_reads_the_rest() -> None:
    meta = {**QueueConfig(max_staleness=2).to_meta(), "max_staleness": "True", "lease_timeout_ms": "-5",
            "batch_groups": "1.5"}
    with pytest.raises(InvalidInput, match="batch_groups.*lease_timeout_s.*max_staleness"):
        QueueConfig.from_meta(meta)
    values, corrupt = QueueConfig.stored_fields(meta)
    assert set(corrupt) == {"max_staleness", "lease_timeout_s", "batch_groups"}
    assert corrupt["max_staleness"] == "max_staleness='True'" and values["max_attempts"] == 3
    assert QueueConfig(**{**values, "max_staleness": None, "lease_timeout_s": 5, "batch_groups": None})


def test_checkers_return_exact_values() -> None:
    assert check_int(MAX_SAFE_INT, "x") == MAX_SAFE_INT and type(check_int(3, "x")) is int
    assert check_seconds(0, "t", allow_zero=True) == 0.0 and check_seconds(1e9, "t") == 1e9
    assert check_flag(False, "f") is False
    for bad in (True, 1.0, "1", None, MAX_SAFE_INT + 1, -1):
        with pytest.raises(InvalidInput):
            check_int(bad, "x")
    check_json({"a": [1.5, {"b": None}], "c": "d"}, "m")
    with pytest.raises(InvalidInput, match="NaN"):
        check_json({"a": [{"b": (1, math.nan)}]}, "m")


SAMPLE_FIELDS = ("slot", "token_ids", "logprobs", "reward", "version", "finish_reason", "versions")
GROUP_FIELDS = ("source_id", "prompt", "n", "metadata", "prompt_token_ids")


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(["sample", "group", "receipt"]), index=st.integers(0, 6), value=ODD)
def test_value_types_refuse_odd_values_with_invalid_input_only(kind: str, index: int, value: Any) -> None:
    try:
        if kind == "sample":
            Sample(**{"slot": 0, "token_ids": (1, 2), SAMPLE_FIELDS[index]: value})
        elif kind == "group":
            SourceGroup(**{"source_id": "s", "prompt": "p", "n": 2, GROUP_FIELDS[index % 5]: value})
        else:
            Receipt(*(["1-0", 1, "w1"][:index % 3] + [value] + ["1-0", 1, "w1"][index % 3 + 1:]))
    except InvalidInput:
        pass  # anything else (OverflowError, TypeError, ValueError from repr) fails the test


def test_a_reason_whose_str_fails_is_still_storable_text() -> None:
    """hypothesis found it (tests/contract/test_bad_values.py): str() of an int past Python's
    4,300-digit limit raises ValueError, which must not fail the settlement the reason explains."""
    from rollout_queue.core.models import MAX_REASON, reason_text

    class Broken:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert reason_text(10 ** 5000) == "<int not shown: its str() failed>"
    assert reason_text(Broken()) == "<Broken not shown: its str() failed>"
    assert len(reason_text("x" * (MAX_REASON + 10))) == MAX_REASON
