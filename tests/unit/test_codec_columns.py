"""codec.decode_columns, SampleColumns and the lazy CompletedGroup (P7), with no Redis.

Rules under test: decode_columns refuses exactly what decode_completion refuses, with the same
CodecError (every malformed case of test_codec.py and test_codec_schema2.py is run against both), so
an undecodable payload is still found at lease time; the columns hold the same values as the
Samples; a group's lazily built samples equal an eager decode; SampleColumns, like Sample, cannot be
built malformed; CompletedGroup stays immutable, comparable and constructible from Samples.
"""

from __future__ import annotations

import copy
import math
import random
import re
import struct
from array import array
from dataclasses import FrozenInstanceError

import pytest

from rollout_queue import CompletedGroup, InvalidInput, Sample, SourceGroup
from rollout_queue.core.codec import CodecError, decode_columns, decode_completion, encode_completion
from rollout_queue.core.columns import SampleColumns
from tests.unit.test_codec import GARBAGE
from tests.unit.test_codec_schema2 import GOOD_BODY, MALFORMED, MAX24, ROW, _f32, _head, _schema1

GROUP = SourceGroup("s-1", "prompt", 3)


def _random_samples(rnd: random.Random) -> list[Sample]:
    """A few samples of random shape: ids in or out of 24 bits, logprobs (float32-exact) or none."""
    high = rnd.choice([2, 65536, MAX24 + 1, 2**31])
    out = []
    for slot in range(rnd.randrange(5)):
        n = rnd.randrange(12)
        ids = tuple(rnd.randrange(0 if rnd.random() < 0.8 else -(2**31), high) for _ in range(n))
        lps = tuple(_f32(-rnd.random() * 30) for _ in range(n)) if rnd.random() < 0.6 else ()
        out.append(Sample(slot, ids, lps, rnd.choice([None, 0.5, -3]), rnd.randrange(5), rnd.choice(["stop", "length"]),
                          tuple(rnd.randrange(5) for _ in range(rnd.randrange(3)))))
    return out


def _assert_columns_hold(cols: SampleColumns, samples: tuple[Sample, ...] | list[Sample]) -> None:
    """Every column value equals the matching Sample's value."""
    assert len(cols.slots) == len(samples)
    assert cols.token_ids.typecode == "i" and cols.logprobs.typecode == "f"
    for i, s in enumerate(samples):
        start, n = cols.offsets[i], cols.counts[i]
        assert tuple(cols.token_ids[start:start + n]) == s.token_ids
        assert cols.has_logprobs[i] is bool(s.logprobs)
        if s.logprobs:
            lp = cols.logprob_offsets[i]
            assert tuple(cols.logprobs[lp:lp + n]) == s.logprobs
        assert (cols.slots[i], cols.rewards[i], cols.versions[i], cols.finish_reasons[i], cols.version_lists[i]) == (
            s.slot, s.reward, s.version, s.finish_reason, s.versions)


def _error_of(decode, blob: bytes) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(CodecError) as exc:
        decode(blob)
    return str(exc.value)


# -- the same refusals as decode_completion -------------------------------------------------------


@pytest.mark.parametrize(("blob", "message"), MALFORMED, ids=lambda x: x if isinstance(x, str) else None)
def test_every_malformed_schema_2_blob_is_refused_with_the_same_error(blob: bytes, message: str) -> None:
    said = _error_of(decode_columns, blob)
    assert re.search(message, said), said  # as pytest.raises(match=) reads it
    assert said == _error_of(decode_completion, blob)


@pytest.mark.parametrize("blob", GARBAGE)
def test_every_garbage_completion_is_refused_with_the_same_error(blob: bytes) -> None:
    assert _error_of(decode_columns, blob) == _error_of(decode_completion, blob)


@pytest.mark.parametrize("bits", [0x3F000000, 0x00000001, 0x7F800000, 0x7FC00000, 0xFFC00000, 0xFF800001,
                                  0x7F7FFFFF])
def test_a_logprob_sample_refuses_is_refused_by_the_columns(bits: int) -> None:
    for magic, width in ((b"RQC2", 3), (b"RQC1", 4)):
        body = b"\1" * 2 * width + struct.pack("<f", -0.5) + struct.pack("<I", bits)
        blob = _head(magic, {"v": 2 if width == 3 else 1, "s": [ROW]}) + body
        assert "logprobs must be <= 0 and not NaN" in _error_of(decode_columns, blob)
        assert _error_of(decode_columns, blob) == _error_of(decode_completion, blob)


def test_every_truncation_is_refused_with_the_same_error() -> None:
    blob = encode_completion([Sample(0, (1, MAX24, 3), (-0.5, -0.25, -1.0), 1.0), Sample(1, (4,), ())])
    for cut in range(len(blob)):
        assert _error_of(decode_columns, blob[:cut]) == _error_of(decode_completion, blob[:cut])


@pytest.mark.parametrize("value", [-0.0, 0.0, -math.inf, -1e-45, -3.0e38, -1.0, -(2.0**-126)])
def test_every_logprob_sample_accepts_is_kept_in_the_columns(value: float) -> None:
    value = _f32(value)
    samples = [Sample(0, (1, 2), (-0.5, value)), Sample(1, (3,), (value,))]
    cols = decode_columns(encode_completion(samples))
    assert [str(x) for x in cols.logprobs] == [str(x) for x in (-0.5, value, value)]  # -0.0 stays -0.0


# -- the same values as the Samples -----------------------------------------------------------------


def test_the_fixture_blob_decodes_to_columns() -> None:
    cols = decode_columns(_head(b"RQC2", {"v": 2, "s": [ROW]}) + GOOD_BODY)
    assert (cols.token_ids, cols.logprobs) == (array("i", [1, 2]), array("f", [-0.5, -0.25]))
    assert (cols.slots, cols.counts, cols.offsets, cols.has_logprobs) == ((0,), (2,), (0,), (True,))


def test_columns_and_lazy_samples_equal_the_samples_in_both_schemas() -> None:
    rnd = random.Random(77)
    for case in range(300):
        samples = _random_samples(rnd)
        for blob in (encode_completion(samples), _schema1(samples)):
            cols = decode_columns(blob)
            _assert_columns_hold(cols, samples)
            assert cols.samples() == decode_completion(blob) == tuple(samples), case
            assert SampleColumns.of(samples) == cols, case


def test_columns_of_a_mixed_completion_say_where_each_sample_is() -> None:
    """Samples without logprobs take no room in ``logprobs``: logprob_offsets say where each starts."""
    samples = [Sample(0, (1, 2), (-1.0, -2.0)), Sample(1, (3, 4, 5), ()), Sample(2, (6,), (-3.0,), 1.0, 2)]
    cols = decode_columns(encode_completion(samples))
    assert (cols.offsets, cols.counts, cols.logprob_offsets) == ((0, 2, 5), (2, 3, 1), (0, 2, 2))
    assert (cols.has_logprobs, list(cols.logprobs)) == ((True, False, True), [-1.0, -2.0, -3.0])
    _assert_columns_hold(cols, samples)


def test_the_samples_built_from_columns_have_the_documented_types() -> None:
    [s] = decode_columns(encode_completion([Sample(0, (5, MAX24), (-1.0, 0.0), 2, 1, "stop", [1, 2])])).samples()
    assert type(s.token_ids) is tuple and all(type(t) is int for t in s.token_ids)
    assert type(s.logprobs) is tuple and all(type(x) is float for x in s.logprobs)
    assert type(s.versions) is tuple and s.versions == (1, 2)
    assert type(s.reward) is float and s.reward == 2.0


def test_the_empty_completion_has_empty_columns() -> None:
    cols = decode_columns(encode_completion([]))
    assert (len(cols.token_ids), len(cols.logprobs), cols.slots, cols.samples()) == (0, 0, (), ())


def test_torch_reads_the_columns_without_a_copy() -> None:
    torch = pytest.importorskip("torch")
    samples = [Sample(0, (7, 8, MAX24), (-0.5, -0.25, -1.0)), Sample(1, (9,), (-2.0,))]
    cols = CompletedGroup.from_columns("1-0", GROUP, decode_columns(encode_completion(samples)), 1, 0).columns()
    ids = torch.frombuffer(cols.token_ids, dtype=torch.int32)
    lps = torch.frombuffer(cols.logprobs, dtype=torch.float32)
    assert ids.tolist() == [7, 8, MAX24, 9] and lps.tolist() == [-0.5, -0.25, -1.0, -2.0]
    assert ids.data_ptr() == cols.token_ids.buffer_info()[0], "shares the array's memory"


# -- SampleColumns cannot be built malformed -------------------------------------------------------


def _columns(**change: object) -> SampleColumns:
    values: dict[str, object] = {
        "token_ids": array("i", [1, 2, 3]), "logprobs": array("f", [-1.0, -2.0]), "slots": (0, 1),
        "counts": (2, 1), "has_logprobs": (True, False), "rewards": (1.0, None), "versions": (0, 1),
        "finish_reasons": ("stop", "length"), "version_lists": ((), (1,)),
    }
    values.update(change)
    return SampleColumns(**values)  # type: ignore[arg-type]


def test_the_reference_columns_are_good() -> None:
    assert _columns().samples() == (Sample(0, (1, 2), (-1.0, -2.0), 1.0), Sample(1, (3,), (), None, 1, "length", (1,)))


@pytest.mark.parametrize(("change", "message"), [
    ({"token_ids": array("l", [1, 2, 3])}, "array\\('i'\\)"),
    ({"token_ids": [1, 2, 3]}, "array\\('i'\\)"),
    ({"logprobs": array("d", [-1.0, -2.0])}, "array\\('f'\\)"),
    ({"slots": (0,)}, "one value per sample"),
    ({"version_lists": ((),)}, "one value per sample"),
    ({"counts": (2, 2)}, "counts cover 4 ids"),
    ({"counts": (3, 0)}, "3 logprobs"),
    ({"counts": (2, -1)}, "token count"),
    ({"counts": (2.0, 1)}, "token count"),
    ({"logprobs": array("f", [-1.0, 0.5])}, "logprobs must be"),
    ({"logprobs": array("f", [-1.0, math.nan])}, "logprobs must be"),
    ({"rewards": (math.nan, None)}, "reward must be"),
    ({"slots": (0, -1)}, "slot must be"),
    ({"versions": (0, 2**21)}, "version must be"),
    ({"finish_reasons": ("stop", "x" * 33)}, "finish_reason"),
    ({"version_lists": ((), ("1",))}, "versions must be"),
], ids=repr)
def test_malformed_columns_cannot_exist(change: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        _columns(**change)


def test_versions_that_are_not_a_sequence_are_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="versions must be a sequence"):  # was a TypeError (issue 12 item 12)
        _columns(version_lists=((), 5))


# -- CompletedGroup: lazy, immutable, comparable ----------------------------------------------------


def _pair(samples: list[Sample]) -> tuple[CompletedGroup, CompletedGroup]:
    """The same group decoded lazily from a blob, and built eagerly from the decoded Samples."""
    blob = encode_completion(samples)
    return (CompletedGroup.from_columns("1-0", GROUP, decode_columns(blob), 2, 1),
            CompletedGroup("1-0", GROUP, decode_completion(blob), 2, 1))


def test_lazy_samples_are_built_once_and_equal_an_eager_decode() -> None:
    samples = [Sample(0, (1, 2), (-0.5, -0.25), 1.0, 1), Sample(1, (3,), (), 0.0, 2, "length", (2,))]
    lazy, eager = _pair(samples)
    assert lazy == eager and eager == lazy and hash(lazy) == hash(eager)
    first = lazy.samples
    assert first is lazy.samples, "built on first access, then cached"
    assert first == eager.samples == tuple(samples)
    assert lazy.columns() == eager.columns(), "an eager group builds the same columns on demand"
    assert eager.columns() is eager.columns()


def test_equality_compares_every_field() -> None:
    lazy, _ = _pair([Sample(0, (1,), (-1.0,))])
    cols = decode_columns(encode_completion([Sample(0, (1,), (-1.0,))]))
    for other in (CompletedGroup.from_columns("2-0", GROUP, cols, 2, 1), CompletedGroup.from_columns("1-0", GROUP, cols, 3, 1),
                  CompletedGroup.from_columns("1-0", GROUP, cols, 2, 0),
                  CompletedGroup.from_columns("1-0", SourceGroup("s-2", "prompt", 3), cols, 2, 1),
                  CompletedGroup("1-0", GROUP, (Sample(0, (2,), (-1.0,)),), 2, 1)):
        assert lazy != other
    assert lazy != "1-0"


def test_a_completed_group_is_immutable_and_copies_to_an_equal_one() -> None:
    lazy, eager = _pair([Sample(0, (1, 2), (-0.5, -0.25))])
    for g in (lazy, eager):
        with pytest.raises(FrozenInstanceError):
            g.entry_id = "2-0"  # type: ignore[misc]
        with pytest.raises(FrozenInstanceError):
            g.samples = ()  # type: ignore[misc]
        with pytest.raises(FrozenInstanceError):
            del g.attempt
        assert copy.copy(g) == g and copy.deepcopy(g) == g
    assert repr(lazy) == repr(eager) and "entry_id='1-0'" in repr(lazy) and "Sample(slot=0" in repr(lazy)


def test_keyword_construction_still_works() -> None:
    g = CompletedGroup(entry_id="1-0", group=GROUP, samples=[Sample(0, (1,))], attempt=1, min_version=0)
    assert g.samples == (Sample(0, (1,)),) and type(g.samples) is tuple
    assert g.columns().token_ids == array("i", [1])
