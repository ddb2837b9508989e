"""Per-token policy versions (Sample.segments, issue 30) in the value types, the codec and the columns.

The rules: segments are (start offset, version) run lengths, offsets rising strictly from 0 below the
token count, versions non-decreasing, the first the sample's version (its oldest), each one of the
versions it ran under, and a trajectory's model turn starting at its own version; a completion with
segments is stored as schema 3 (3-byte ids) or 4 (int32 ids), one without as schema 2 or 1 byte for
byte as before, so blobs stored before the upgrade decode unchanged and an older reader refuses the
new schemas by their magic instead of dropping per-token versions. (Generated round trips:
tests/fuzz/test_codec_fuzz.py.)
"""

from __future__ import annotations

import struct

import orjson
import pytest

from rollout_queue import CompletedGroup, InvalidInput, Sample, SourceGroup, Turn
from rollout_queue.core.codec import (
    COMPLETION_SCHEMA_SEGMENTS,
    COMPLETION_SCHEMA_SEGMENTS_WIDE,
    CodecError,
    decode_columns,
    decode_completed,
    decode_completion,
    encode_completed,
    encode_completion,
)
from rollout_queue.core.columns import SampleColumns

#: Five tokens: two at version 3, two at 4 (an update landed after token 2), one at 6.
SPANNING = dict(slot=0, token_ids=(1, 2, 3, 4, 5), logprobs=(-0.5, -0.25, -1.0, -2.0, -0.125), reward=1.0,
                version=3, versions=(3, 4, 6), segments=((0, 3), (2, 4), (4, 6)))


def spanning(**changes: object) -> Sample:
    return Sample(**{**SPANNING, **changes})  # type: ignore[arg-type]


def _split(blob: bytes) -> tuple[bytes, dict, bytes]:
    (hlen,) = struct.unpack_from("<I", blob, 4)
    return blob[:4], orjson.loads(blob[8:8 + hlen]), blob[8 + hlen:]


def _head(magic: bytes, header: object) -> bytes:
    head = orjson.dumps(header)
    return magic + struct.pack("<I", len(head)) + head


# -- the value ------------------------------------------------------------------------------------


def test_token_versions_expand_the_run_lengths() -> None:
    assert spanning().token_versions == (3, 3, 4, 4, 6)
    assert Sample(0, (1, 2, 3), version=7).token_versions == (7, 7, 7)  # none: every token at version
    assert Sample(0, (), version=7).token_versions == ()
    assert spanning(segments=[[0, 3], [4, 6]]).segments == ((0, 3), (4, 6))  # lists become int pairs


@pytest.mark.parametrize(("segments", "message"), [
    (((1, 3),), "must rise strictly from 0"),
    (((0, 3), (0, 4)), "must rise strictly from 0"),
    (((0, 3), (3, 4), (2, 6)), "must rise strictly from 0"),
    (((0, 3), (5, 4)), "below the sample's 5 tokens"),
    (((0, 3), (2, 2)), "must not decrease"),
    (((0, 4),), "must be the sample's version 3"),
    (((0, 3), (2, 5)), r"versions \[5\] that are not among"),
    (((0, 3), (2, 2**21)), "must not decrease and stay in 0..2097151"),
    (((0, 3, 1),), "pair of integers"),
    (((0, True),), "pair of integers"),
    (((0, 3.0),), "pair of integers"),
    ((0, 3), "pair of integers"),
    ("03", "sequence of"),
    ({0: 3}, "sequence of"),
    (7, "sequence of"),
])
def test_malformed_segments_are_refused_with_what_is_wrong(segments: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        spanning(segments=segments)


def test_a_sample_without_tokens_has_no_segments_and_without_versions_any_rising_ones_do() -> None:
    with pytest.raises(InvalidInput):
        Sample(0, (), version=3, segments=((0, 3),))
    assert spanning(versions=(), segments=((0, 3), (1, 9))).token_versions == (3, 9, 9, 9, 9)


def test_a_trajectorys_model_turns_start_at_their_own_version() -> None:
    turns = (Turn("model", 2, 3), Turn("observation", 1), Turn("model", 2, 4))
    ok = spanning(turns=turns, segments=((0, 3), (3, 4)), logprobs=(-0.5, -0.25, 0.0, -2.0, -0.125))
    assert ok.token_versions == (3, 3, 3, 4, 4)  # the observation carries the version of the turn before it
    assert spanning(turns=turns, segments=((0, 3), (2, 4))).token_versions == (3, 3, 4, 4, 4)
    assert spanning(turns=turns, segments=((0, 3), (1, 4), (3, 4))).segments == ((0, 3), (1, 4), (3, 4))
    with pytest.raises(InvalidInput, match="the model turn at token 3 has version 4, its segments say 3"):
        spanning(turns=turns, segments=((0, 3), (4, 4)))


def test_a_trajectory_without_segments_has_its_turns_versions_per_token() -> None:
    """Its turns already say each model turn's (oldest) version: an observation carries the version of
    the turn before it, a leading observation the sample's."""
    turns = (Turn("observation", 1), Turn("model", 2, 3), Turn("observation", 1), Turn("model", 1, 4))
    s = spanning(turns=turns, segments=(), logprobs=())
    assert s.token_versions == (3, 3, 3, 3, 4)
    assert decode_columns(encode_completion([s, Sample(1, (9,), version=2)])).token_versions().tolist() == \
        [3, 3, 3, 3, 4, 2]


# -- the codec: schemas 3 and 4, and everything stored before them ---------------------------------


def test_a_completion_with_segments_is_schema_3_and_round_trips() -> None:
    samples = [spanning(), Sample(1, (7, 8), (-0.5, -0.5), 0.0, 4)]
    blob = encode_completion(samples)
    magic, header, _ = _split(blob)
    assert (magic, header["v"]) == (b"RQC3", COMPLETION_SCHEMA_SEGMENTS)
    assert header["s"][0][7:] == [[], None, [0, 3, 2, 4, 4, 6]]  # run lengths: a few integers, not one per token
    assert len(header["s"][1]) == 7  # the sample without segments keeps its 7-field row
    assert decode_completion(blob) == tuple(samples)
    cols = decode_columns(blob)
    assert cols.token_versions().tolist() == [3, 3, 4, 4, 6, 4, 4]
    assert cols.segment_lists == (((0, 3), (2, 4), (4, 6)), ())
    assert SampleColumns.of(samples) == cols
    assert decode_completed(encode_completed([CompletedGroup("1-0", SourceGroup("s", "p", 2), samples, 1, 3)]))[0] \
        .samples == tuple(samples)


def test_wide_ids_with_segments_are_schema_4() -> None:
    blob = encode_completion([spanning(token_ids=(1, 2, 3, 4, 2**24))])
    assert _split(blob)[0] == b"RQC4" and _split(blob)[1]["v"] == COMPLETION_SCHEMA_SEGMENTS_WIDE
    assert decode_completion(blob) == (spanning(token_ids=(1, 2, 3, 4, 2**24)),)


def test_a_completion_without_segments_is_stored_byte_for_byte_as_before() -> None:
    """What a reader without schema 3 reads: rows of 7 (or 9) fields under RQC2 / RQC1."""
    plain = [Sample(0, (1, 2), (-0.5, -0.25), 1.0, 3, "stop", (3, 4)), Sample(1, (5,), (), None, 2)]
    assert encode_completion(plain) == _head(b"RQC2", {"v": 2, "s": [[0, 2, 1, 1.0, 3, "stop", [3, 4]],
                                                                    [1, 1, 0, None, 2, "stop", []]]}) \
        + b"\1\0\0\2\0\0\5\0\0" + struct.pack("<2f", -0.5, -0.25)
    assert decode_columns(encode_completion(plain)).segment_lists == ()


def test_blobs_stored_before_segments_decode_with_every_token_at_the_samples_version() -> None:
    old = [_head(b"RQC2", {"v": 2, "s": [[0, 2, 0, 1.0, 3, "stop", [3, 4]]]}) + b"\1\0\0\2\0\0",
           _head(b"RQC1", {"v": 1, "s": [[0, 2, 0, 1.0, 3, "stop", [3, 4]]]}) + struct.pack("<2i", 1, 2),
           _head(b"RQC2", {"v": 2, "s": [[0, 2, 0, 1.0, 3, "stop", [3, 4], [1, 2, 3], None]]}) + b"\1\0\0\2\0\0"]
    for blob in old:
        [s] = decode_completion(blob)
        assert s.segments == () and s.token_versions == (3, 3) and s.versions == (3, 4)


@pytest.mark.parametrize(("blob", "message"), [
    # segments exist only in schemas 3 and 4: a 10-field row of schema 2 or 1 is malformed
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 0, None, 3, "stop", [], [], None, [0, 3]]]}) + bytes(6), "list of 7 fields"),
    (_head(b"RQC1", {"v": 1, "s": [[0, 2, 0, None, 3, "stop", [], [], None, [0, 3]]]}) + bytes(8), "list of 7 fields"),
    (_head(b"RQC3", {"v": 2, "s": []}), "unknown completion schema 2"),  # magic and v disagree
    (_head(b"RQC4", {"v": 3, "s": []}), "unknown completion schema 3"),
    (_head(b"RQC3", {"v": 3, "s": [[0, 2, 0, None, 3, "stop", [], [], None, [0, 3, 1]]]}) + bytes(6), "pairs"),
    (_head(b"RQC3", {"v": 3, "s": [[0, 2, 0, None, 3, "stop", [], [], None, {"0": 3}]]}) + bytes(6), "pairs"),
    (_head(b"RQC3", {"v": 3, "s": [[0, 2, 0, None, 3, "stop", [], [], None, [0, 3, 2, 4]]]}) + bytes(6),
     "below the sample's 2 tokens"),
    (_head(b"RQC3", {"v": 3, "s": [[0, 2, 0, None, 3, "stop", [], [], None, [0, 2]]]}) + bytes(6),
     "the sample's version 3"),
    (_head(b"RQC3", {"v": 3, "s": [[0, 2, 0, None, 3, "stop", [3], [], None, [0, 3, 1, 4]]]}) + bytes(6),
     r"versions \[4\] that are not among"),
    (_head(b"RQC3", {"v": 3, "s": [[0, 2, 0, None, 3, "stop", [], [], None, [0, "3"]]]}) + bytes(6), "integers"),
])
def test_garbage_segments_are_a_codec_error(blob: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_completion(blob)
    with pytest.raises(CodecError, match=message):
        decode_columns(blob)


def test_columns_refuse_segments_sample_would_refuse() -> None:
    cols = SampleColumns.of([spanning()])
    with pytest.raises(InvalidInput, match="must rise strictly"):
        SampleColumns(cols.token_ids, cols.logprobs, cols.slots, cols.counts, cols.has_logprobs, cols.rewards,
                      cols.versions, cols.finish_reasons, cols.version_lists, (), (), (((0, 3), (0, 4)),))
    with pytest.raises(InvalidInput, match="one value per sample"):
        SampleColumns(cols.token_ids, cols.logprobs, cols.slots, cols.counts, cols.has_logprobs, cols.rewards,
                      cols.versions, cols.finish_reasons, cols.version_lists, (), (), ((), ()))
