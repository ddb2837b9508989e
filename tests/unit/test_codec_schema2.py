"""Completion schema 2 (3-byte token ids) beside schema 1, and the bulk checks of decoding.

Rules under test: a completion whose ids all lie in 0..2^24-1 is stored as RQC2 with 3-byte little-endian
ids, anything else as the schema-1 layout (4-byte ids) that older writers stored too; the decoder reads
both, and every malformed blob of either schema raises CodecError saying what is wrong. Decoding checks
the logprobs of the whole blob at once and must refuse exactly what the Sample constructor refuses.
"""

from __future__ import annotations

import math
import random
import struct
from array import array

import orjson
import pytest

from rollout_queue import InvalidInput, Sample
from rollout_queue.core.codec import (
    COMPLETION_SCHEMA,
    COMPLETION_SCHEMA_WIDE,
    CodecError,
    decode_completion,
    encode_completion,
)

MAX24 = 2**24 - 1
ROW = [0, 2, 1, None, 0, "stop", []]


def _head(magic: bytes, header: object) -> bytes:
    head = orjson.dumps(header)
    return magic + struct.pack("<I", len(head)) + head


def _schema1(samples: list[Sample]) -> bytes:
    """A schema-1 blob exactly as the codec before schema 2 wrote it (for any ids, 4 bytes each)."""
    rows = [[s.slot, len(s.token_ids), 1 if s.logprobs else 0, s.reward, s.version, s.finish_reason,
             list(s.versions)] for s in samples]
    ids = b"".join(struct.pack(f"<{len(s.token_ids)}i", *s.token_ids) for s in samples)
    lps = b"".join(struct.pack(f"<{len(s.logprobs)}f", *s.logprobs) for s in samples)
    return _head(b"RQC1", {"v": 1, "s": rows}) + ids + lps


def _split(blob: bytes) -> tuple[bytes, dict, bytes]:
    (hlen,) = struct.unpack_from("<I", blob, 4)
    return blob[:4], orjson.loads(blob[8:8 + hlen]), blob[8 + hlen:]


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


# -- which schema is written, and its layout --------------------------------------------------------


def test_ids_up_to_2_pow_24_minus_1_are_stored_in_3_bytes() -> None:
    samples = [Sample(0, (0, 1, MAX24, 0x123456), (-0.5, -0.25, 0.0, -1.0), 1.0, 3, "stop", (3, 4)),
               Sample(1, (), (), None, 0, "length"),
               Sample(2, (MAX24,), (), -2.5, 2**21 - 1)]
    blob = encode_completion(samples)
    magic, header, body = _split(blob)
    assert magic == b"RQC2"
    assert header == {"v": COMPLETION_SCHEMA, "s": [[0, 4, 1, 1.0, 3, "stop", [3, 4]], [1, 0, 0, None, 0, "length", []],
                                                    [2, 1, 0, -2.5, 2**21 - 1, "stop", []]]}
    assert body[:15] == b"\0\0\0" b"\x01\0\0" b"\xff\xff\xff" b"\x56\x34\x12" b"\xff\xff\xff"
    assert body[15:] == struct.pack("<4f", -0.5, -0.25, 0.0, -1.0)
    assert decode_completion(blob) == tuple(samples)


@pytest.mark.parametrize("wide_id", [2**24, 2**31 - 1, -1, -(2**31)])
def test_one_id_outside_24_bits_stores_the_whole_completion_with_4_byte_ids(wide_id: int) -> None:
    samples = [Sample(0, (1, 2, MAX24), (-0.5, -0.25, -1.0)), Sample(1, (3, wide_id), ())]
    blob = encode_completion(samples)
    magic, header, body = _split(blob)
    assert (magic, header["v"]) == (b"RQC1", COMPLETION_SCHEMA_WIDE)
    assert body[:20] == struct.pack("<5i", 1, 2, MAX24, 3, wide_id)
    assert blob == _schema1(samples)  # exactly the layout older writers stored
    assert decode_completion(blob) == tuple(samples)


def test_the_empty_completion_round_trips() -> None:
    assert encode_completion([]) == _head(b"RQC2", {"v": 2, "s": []})
    assert decode_completion(encode_completion([])) == ()


def test_an_8x512_group_is_stored_in_about_7_bytes_per_token() -> None:
    rnd = random.Random(7)
    samples = [Sample(i, tuple(rnd.randrange(152_000) for _ in range(512)),
                      tuple(-rnd.random() * 5 for _ in range(512)), 1.0) for i in range(8)]
    blob = encode_completion(samples)
    assert blob[:4] == b"RQC2"
    assert len(blob) - len(_split(blob)[0]) - 4 - len(orjson.dumps(_split(blob)[1])) == 7 * 8 * 512
    assert len(blob) / (8 * 512) < 7.1


# -- decoding both schemas --------------------------------------------------------------------------


def test_schema_1_blobs_of_small_ids_stored_before_the_upgrade_still_decode() -> None:
    samples = [Sample(0, (1, 2, 3), (-0.5, -0.25, 0.0), 1.0, 3, "stop", (3, 3, 4)), Sample(1, (MAX24, 0), (), None)]
    old = _schema1(samples)
    assert old[:4] == b"RQC1" and old != encode_completion(samples)
    assert decode_completion(old) == tuple(samples)


def test_random_completions_round_trip_in_both_schemas() -> None:
    rnd = random.Random(2024)
    for case in range(300):
        high = rnd.choice([2, 256, 65536, MAX24 + 1, 2**24 + 5, 2**31])
        low = 0 if rnd.random() < 0.8 else -(2**31)
        samples = []
        for slot in range(rnd.randrange(5)):
            n = rnd.randrange(12)
            ids = tuple(rnd.randrange(low, high) for _ in range(n))
            lps = tuple(_f32(-rnd.random() * 30) for _ in range(n)) if rnd.random() < 0.6 else ()
            samples.append(Sample(slot, ids, lps, rnd.choice([None, 0.5, -3.0]), rnd.randrange(5), "stop",
                                  tuple(rnd.randrange(5) for _ in range(rnd.randrange(3)))))
        blob = encode_completion(samples)
        in_24 = all(0 <= t <= MAX24 for s in samples for t in s.token_ids)
        assert blob[:4] == (b"RQC2" if in_24 else b"RQC1"), case
        assert decode_completion(blob) == tuple(samples), case
        assert decode_completion(_schema1(samples)) == tuple(samples), case


def test_decoding_accepts_a_bytearray_or_a_memoryview() -> None:
    blob = encode_completion([Sample(0, (5, 6), (-1.0, -2.0))])
    assert decode_completion(bytearray(blob)) == decode_completion(memoryview(blob)) == decode_completion(blob)


def test_decoded_values_have_the_documented_types() -> None:
    [s] = decode_completion(encode_completion([Sample(0, (5, MAX24), (-1.0, 0.0), 2, 1, "stop", [1, 2])]))
    assert type(s.token_ids) is tuple and all(type(t) is int for t in s.token_ids)
    assert type(s.logprobs) is tuple and all(type(x) is float for x in s.logprobs)
    assert type(s.versions) is tuple and s.versions == (1, 2)
    assert type(s.reward) is float and s.reward == 2.0


# -- the bulk logprob check: the byte fast path and the exact fallback agree with Sample ---------------


@pytest.mark.parametrize("value", [-0.0, 0.0, -math.inf, -1e-45, -3.0e38, -1.0, -(2.0**-126)])
def test_every_logprob_sample_accepts_decodes(value: float) -> None:
    value = _f32(value)  # what float32 storage keeps: -1e-45 is the denormal -1.4e-45
    samples = [Sample(0, (1, 2), (-0.5, value)), Sample(1, (3,), (value,))]
    back = decode_completion(encode_completion(samples))
    assert back == tuple(samples)
    assert str(back[0].logprobs[1]) == str(value)  # -0.0 stays -0.0


@pytest.mark.parametrize("bits", [0x3F000000, 0x00000001, 0x7F800000, 0x7FC00000, 0xFFC00000, 0xFF800001,
                                  0x7F7FFFFF])
def test_a_logprob_sample_refuses_is_refused_when_decoding(bits: int) -> None:
    """0.5, the smallest positive denormal, +inf, NaN, -NaN, a signalling -NaN, the largest float32."""
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    with pytest.raises(InvalidInput):
        Sample(0, (1,), (value,))
    for magic, width in ((b"RQC2", 3), (b"RQC1", 4)):
        body = b"\1" * 2 * width + struct.pack("<f", -0.5) + struct.pack("<I", bits)
        with pytest.raises(CodecError, match="logprobs must be <= 0 and not NaN"):
            decode_completion(_head(magic, {"v": 2 if width == 3 else 1, "s": [ROW]}) + body)


# -- malformed schema-2 blobs: one per error path ---------------------------------------------------


GOOD_BODY = b"\1\0\0\2\0\0" + struct.pack("<2f", -0.5, -0.25)


def test_the_fixture_blob_is_good() -> None:
    assert decode_completion(_head(b"RQC2", {"v": 2, "s": [ROW]}) + GOOD_BODY) == (Sample(0, (1, 2), (-0.5, -0.25)),)


#: (blob, what the CodecError says): one per error path; test_codec_columns.py runs them on decode_columns too.
MALFORMED = [
    (b"RQC2", "bad magic"),                                                      # shorter than magic + length
    (b"RQC2\x01\x00\x00", "bad magic"),
    (b"RQC5" + b"\0" * 8, "bad magic"),
    (b"RQC2\xff\xff\xff\x7f{}", "runs past the end"),                           # header length past the end
    (b"RQC2\x05\x00\x00\x00{nope" + GOOD_BODY, "not JSON"),
    (_head(b"RQC2", {"v": 1, "s": [ROW]}) + GOOD_BODY, "unknown completion schema 1"),  # magic and v disagree
    (_head(b"RQC1", {"v": 2, "s": [ROW]}) + GOOD_BODY, "unknown completion schema 2"),
    (_head(b"RQC2", {"v": 3, "s": [ROW]}) + GOOD_BODY, "unknown completion schema 3"),
    (_head(b"RQC2", [2, [ROW]]) + GOOD_BODY, "unknown completion schema"),
    (_head(b"RQC2", {"v": 2}) + GOOD_BODY, "no sample list"),
    (_head(b"RQC2", {"v": 2, "s": {"0": ROW}}) + GOOD_BODY, "no sample list"),
    (_head(b"RQC2", {"v": 2, "s": [ROW]}) + GOOD_BODY[:-1], "body is 13 bytes, header says 14"),  # truncated
    (_head(b"RQC2", {"v": 2, "s": [ROW]}) + GOOD_BODY[:5], "body is 5 bytes"),
    (_head(b"RQC2", {"v": 2, "s": [ROW]}) + GOOD_BODY + b"\0", "body is 15 bytes"),             # too long
    (_head(b"RQC2", {"v": 2, "s": [ROW]}) + b"\1\0\0\0\2\0\0\0" + GOOD_BODY[6:], "body is 16 bytes"),  # 4-byte ids
    (_head(b"RQC2", {"v": 2, "s": [{"slot": 0}]}) + GOOD_BODY, "list of 7 fields"),
    (_head(b"RQC2", {"v": 2, "s": [ROW[:6]]}) + GOOD_BODY, "list of 7 fields"),
    (_head(b"RQC2", {"v": 2, "s": [ROW + [0]]}) + GOOD_BODY, "list of 7 fields"),
    (_head(b"RQC2", {"v": 2, "s": ["0213abc"]}) + GOOD_BODY, "list of 7 fields"),
    (_head(b"RQC2", {"v": 2, "s": [[0, -2, 1, None, 0, "stop", []], [1, 4, 1, None, 0, "stop", []]]}) + GOOD_BODY,
     "token count must be an integer >= 0"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2.0, 1, None, 0, "stop", []]]}) + GOOD_BODY, "token count"),
    (_head(b"RQC2", {"v": 2, "s": [[0, "2", 1, None, 0, "stop", []]]}) + GOOD_BODY, "token count"),
    (_head(b"RQC2", {"v": 2, "s": [[0, True, 1, None, 0, "stop", []]]}) + GOOD_BODY, "token count"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 2, None, 0, "stop", []]]}) + GOOD_BODY, "has_logprobs must be 0 or 1"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, "1", None, 0, "stop", []]]}) + GOOD_BODY, "has_logprobs"),
    (_head(b"RQC2", {"v": 2, "s": [[-1, 2, 1, None, 0, "stop", []]]}) + GOOD_BODY, "slot must be"),
    (_head(b"RQC2", {"v": 2, "s": [[True, 2, 1, None, 0, "stop", []]]}) + GOOD_BODY, "slot must be"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, "1", 0, "stop", []]]}) + GOOD_BODY, "reward must be"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 2**21, "stop", []]]}) + GOOD_BODY, "version must be"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 1.0, "stop", []]]}) + GOOD_BODY, "version must be"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 0, "x" * 33, []]]}) + GOOD_BODY, "finish_reason"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 0, 7, []]]}) + GOOD_BODY, "finish_reason"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 0, "stop", 5]]}) + GOOD_BODY, "bad sample in completion"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 0, "stop", None]]}) + GOOD_BODY, "bad sample in completion"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 0, "stop", [2**31]]]}) + GOOD_BODY, "versions must be"),
    (_head(b"RQC2", {"v": 2, "s": [[0, 2, 1, None, 0, "stop", ["1"]]]}) + GOOD_BODY, "versions must be"),
]


@pytest.mark.parametrize(("blob", "message"), MALFORMED, ids=lambda x: x if isinstance(x, str) else None)
def test_a_malformed_schema_2_blob_raises_codec_error_saying_what(blob: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_completion(blob)


def test_every_truncation_of_a_good_blob_raises_codec_error() -> None:
    blob = encode_completion([Sample(0, (1, MAX24, 3), (-0.5, -0.25, -1.0), 1.0), Sample(1, (4,), ())])
    for cut in range(len(blob)):
        with pytest.raises(CodecError):
            decode_completion(blob[:cut])


# -- Sample construction after the speed-ups keeps its rules ----------------------------------------


class _Float(float):
    """A float subclass (numpy.float64 is one): stored as a plain float."""


@pytest.mark.parametrize("logprobs", [(-1.0, 0.0), [-1.0, 0.0], (-1, 0), [-1, 0.0], (_Float(-1.0), 0.0),
                                      array("d", [-1.0, 0.0]), array("f", [-1.0, 0.0]), iter([-1.0, 0.0])])
def test_logprobs_of_any_numeric_sequence_become_a_tuple_of_floats(logprobs: object) -> None:
    s = Sample(0, [1, 2], logprobs)  # type: ignore[arg-type]
    assert s.logprobs == (-1.0, 0.0)
    assert type(s.logprobs) is tuple and all(type(x) is float for x in s.logprobs)


@pytest.mark.parametrize("logprobs", [("a", -1.0), [None], (-1.0, math.nan), [0.0, math.inf], (-math.inf, 1e-300),
                                      [-1.0, -2.0, -3.0]])
def test_bad_logprobs_are_refused_from_a_tuple_or_a_list(logprobs: object) -> None:
    with pytest.raises(InvalidInput):
        Sample(0, [1, 2], logprobs)  # type: ignore[arg-type]


def test_a_float_tuple_is_kept_as_it_is() -> None:
    lps = (-1.0, -0.5)
    assert Sample(0, (1, 2), lps).logprobs is lps
