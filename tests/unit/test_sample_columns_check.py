"""check_sample_columns is check_sample_fields over whole columns: same values, same errors.

The column check has a fast path in C for what the codec decodes and falls back to the per-sample
rule for anything else; hypothesis draws columns mixing well-formed values with every kind of bad one
(bools for ints, NaN and infinite rewards, ints for rewards, over-long or non-UTF-8 finish reasons,
versions outside 0..2^21-1, version lists with non-int32 items or of the wrong type) and checks the
two agree on the value returned or the exact error raised.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import MAX_SLOT, check_sample_columns, check_sample_fields

slots = st.one_of(st.integers(0, MAX_SLOT), st.integers(-3, MAX_SLOT + 3), st.booleans(), st.floats(0, 3))
rewards = st.one_of(st.none(), st.floats(-1e3, 1e3), st.floats(allow_nan=True, allow_infinity=True),
                    st.integers(-5, 5), st.booleans(), st.text(max_size=2), st.just(1e308))
versions = st.one_of(st.integers(0, 2**21 - 1), st.integers(-2, 2**21 + 2), st.booleans(), st.floats(0, 2))
reasons = st.one_of(st.sampled_from(["stop", "length", "abort"]), st.text(max_size=40),
                    st.just("\ud800"), st.integers(0, 3))
version_lists = st.one_of(st.lists(st.integers(0, 2**21), max_size=4),
                          st.lists(st.integers(-2**31 - 1, 2**31), max_size=3).map(tuple),
                          st.lists(st.one_of(st.integers(0, 9), st.booleans(), st.floats(0, 1)), max_size=3),
                          st.just("12"), st.just(b"\x01"), st.just(None), st.just({1: 2}))
rows = st.lists(st.tuples(slots, rewards, versions, reasons, version_lists), max_size=8)


def _per_sample(columns: list[tuple[Any, ...]]) -> Any:
    try:
        checked = [check_sample_fields(*row) for row in columns]
    except (InvalidInput, TypeError) as exc:
        return type(exc), str(exc)
    return tuple(r for r, _ in checked), tuple(v for _, v in checked)


@settings(max_examples=400, deadline=None)
@given(rows)
def test_the_column_check_equals_the_sample_check(columns: list[tuple[Any, ...]]) -> None:
    want = _per_sample(columns)
    cols = tuple(zip(*columns)) if columns else ((), (), (), (), ())
    try:
        got: Any = check_sample_columns(*cols)
    except (InvalidInput, TypeError) as exc:
        got = type(exc), str(exc)
    assert got == want


def test_the_common_case_takes_the_fast_path_and_keeps_its_values() -> None:
    out = check_sample_columns((0, 1), (0.5, None), (3, 4), ("stop", "length"), ([3], [3, 4]))
    assert out == ((0.5, None), ((3,), (3, 4)))
