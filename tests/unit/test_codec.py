"""codec.py and the value types, with no Redis: round trips, the packed layout, and garbage.

Rule under test: a payload from Redis is data; decoding garbage raises CodecError with what is
wrong, never another exception (a worker or trainer must not crash on bytes someone wrote by hand).
Value types refuse to exist when malformed (InvalidInput).
"""

from __future__ import annotations

import math
import struct

import orjson
import pytest

from rollout_queue import InvalidInput, Receipt, Sample, SourceGroup, Turn
from rollout_queue.core.codec import (
    COMPLETION_SCHEMA_WIDE,
    SCHEMA_VERSION,
    CodecError,
    decode_completion,
    decode_group,
    decode_partial,
    encode_completion,
    encode_group,
    encode_partial,
)
from rollout_queue.core.models import check_entry_id, check_reason, check_worker_id


def _fields(group: SourceGroup) -> dict[bytes, bytes]:
    parents, body = encode_group(group)
    return {b"v": str(SCHEMA_VERSION).encode(), b"sid": group.source_id.encode(), b"n": str(group.n).encode(),
            b"p": parents, b"g": body}


def _blob(header: object, body: bytes = b"") -> bytes:
    head = orjson.dumps(header)
    return b"RQC1" + struct.pack("<I", len(head)) + head + body


# -- source groups -------------------------------------------------------------------------------


@pytest.mark.parametrize("group", [
    SourceGroup("g-1", "hello", 1),
    SourceGroup("g-2", "", 4, {"lang": "en", "nested": {"a": [1, 2]}}, (1, 2, 3)),
    SourceGroup("ünï/cödé", "prompt ✓", 65536, {}, ()),
    SourceGroup("edges", "p", 2, {}, (-(2**31), 2**31 - 1)),
])
def test_a_group_round_trips(group: SourceGroup) -> None:
    assert decode_group(_fields(group)) == group


def test_parents_name_every_slot_with_a_unique_uid() -> None:
    parents, body = encode_group(SourceGroup("s", "p", 3, {"k": 1}, (7,)))
    assert orjson.loads(parents) == [{"slot": 0, "uid": "s/0"}, {"slot": 1, "uid": "s/1"}, {"slot": 2, "uid": "s/2"}]
    assert orjson.loads(body) == {"prompt": "p", "metadata": {"k": 1}, "prompt_token_ids": [7]}
    assert "prompt_token_ids" not in orjson.loads(encode_group(SourceGroup("s", "p", 1))[1])


def test_metadata_that_is_not_json_is_refused_at_encoding() -> None:
    with pytest.raises(InvalidInput, match="not JSON-serialisable"):
        encode_group(SourceGroup("s", "p", 1, {"x": object()}))


@pytest.mark.parametrize("change", [
    {b"sid": None}, {b"n": None}, {b"g": None}, {b"n": b"two"}, {b"g": b"{not json"}, {b"g": b"\xff"},
    {b"sid": b"\xff\xfe"}, {b"g": b"[1, 2]"}, {b"g": b'{"prompt": 7}'}, {b"g": b'{"metadata": {}}'},
    {b"g": b'{"prompt": "p", "metadata": [1]}'}, {b"g": b'{"prompt": "p", "prompt_token_ids": 5}'},
    {b"g": b'{"prompt": "p", "prompt_token_ids": ["a"]}'}, {b"g": b'{"prompt": "p", "prompt_token_ids": [4294967296]}'},
    {b"n": b"0"}, {b"sid": b""}, {b"sid": b"a|b"},
], ids=lambda c: repr(c))
def test_a_garbage_reservation_raises_codec_error(change: dict[bytes, bytes | None]) -> None:
    fields = _fields(SourceGroup("s", "p", 2))
    for key, value in change.items():
        if value is None:
            del fields[key]
        else:
            fields[key] = value
    with pytest.raises(CodecError, match="^malformed_reservation"):
        decode_group(fields)


# -- completions ---------------------------------------------------------------------------------


SAMPLES = [
    Sample(0, (1, 2, 3), (-0.5, -0.25, 0.0), 1.0, 3, "stop", (3, 3, 4)),
    Sample(0, (), (), None, 0, "length"),
    Sample(1, (2**31 - 1, -(2**31)), (), -2.5, 2**21 - 1),
]


def test_a_completion_round_trips() -> None:
    assert decode_completion(encode_completion(SAMPLES)) == tuple(SAMPLES)
    assert decode_completion(encode_completion([])) == ()


def test_tokens_and_logprobs_are_packed_little_endian_after_the_header() -> None:
    blob = encode_completion(SAMPLES)  # ids outside 0..2^24-1: schema 1, 4-byte ids (test_codec_schema2.py)
    assert blob[:4] == b"RQC1"
    (hlen,) = struct.unpack_from("<I", blob, 4)
    header = orjson.loads(blob[8:8 + hlen])
    assert header == {"v": COMPLETION_SCHEMA_WIDE, "s": [[0, 3, 1, 1.0, 3, "stop", [3, 3, 4]], [0, 0, 0, None, 0, "length", []],
                                                 [1, 2, 0, -2.5, 2**21 - 1, "stop", []]]}
    body = blob[8 + hlen:]
    assert body[:20] == struct.pack("<5i", 1, 2, 3, 2**31 - 1, -(2**31))
    assert body[20:] == struct.pack("<3f", -0.5, -0.25, 0.0)


def test_logprobs_are_stored_as_float32() -> None:
    [back] = decode_completion(encode_completion([Sample(0, (1,), (-0.1,))]))
    assert back.logprobs == (struct.unpack("<f", struct.pack("<f", -0.1))[0],)


GOOD_ROW = [0, 1, 0, None, 0, "stop", []]


#: Garbage completions, each refused with CodecError (test_codec_columns.py runs them on decode_columns too).
GARBAGE = [
    b"", b"RQC", b"RQC2" + b"\0" * 8, b"RQC1\x05\x00\x00\x00{nope",
    _blob({"v": 2, "s": []}), _blob([1, 2]), _blob({"v": 1}), _blob({"v": 1, "s": "rows"}),
    _blob({"v": 1, "s": [GOOD_ROW]}),                                       # body shorter than the header says
    _blob({"v": 1, "s": [GOOD_ROW]}, b"\0" * 8),                            # ... or longer
    _blob({"v": 1, "s": [[0, 1, 0]]}, b"\0" * 4),                           # a short row
    _blob({"v": 1, "s": [[0]]}), _blob({"v": 1, "s": [5]}), _blob({"v": 1, "s": [[0, "x", 0]]}),
    _blob({"v": 1, "s": [[0, 1, 0, None, 0, "stop", 5]]}, b"\0" * 4),       # versions is not a list
    _blob({"v": 1, "s": [[0, 1, 0, "r", 0, "stop", []]]}, b"\0" * 4),       # reward is not a number
    _blob({"v": 1, "s": [[-1, 1, 0, None, 0, "stop", []]]}, b"\0" * 4),     # negative slot
    _blob({"v": 1, "s": [[0, 1, 1, None, 0, "stop", []]]}, b"\0\0\0\0" + struct.pack("<f", 0.5)),  # logprob > 0
    _blob({"v": 1, "s": [[0, -1, 0, None, 0, "stop", []], [1, 1, 0, None, 0, "stop", []]]}),  # negative count
]


@pytest.mark.parametrize("blob", GARBAGE)
def test_a_garbage_completion_raises_codec_error(blob: bytes) -> None:
    with pytest.raises(CodecError):
        decode_completion(blob)


# -- value types ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"reward": math.nan}, {"reward": math.inf}, {"reward": True}, {"reward": "1"},
    {"token_ids": (2**31,)}, {"token_ids": (-(2**31) - 1,)}, {"token_ids": (1.5,)}, {"token_ids": ("1",)},
    {"logprobs": (math.nan,)}, {"logprobs": (0.1,)}, {"logprobs": (-0.1, -0.2)},
    {"slot": -1}, {"slot": True}, {"slot": 1.0}, {"version": -1}, {"version": 2**21}, {"version": False},
    {"finish_reason": "x" * 33}, {"finish_reason": None}, {"versions": (2**31,)},
], ids=repr)
def test_a_malformed_sample_cannot_exist(kwargs: dict) -> None:
    base = {"slot": 0, "token_ids": (1,), "logprobs": (-0.5,), "reward": 0.0, "version": 0}
    with pytest.raises(InvalidInput):
        Sample(**{**base, **kwargs})


def test_a_sample_normalises_its_values() -> None:
    s = Sample(0, [1, 2], [-1, 0], reward=1, version=2**21 - 1)
    assert (s.token_ids, s.logprobs, s.reward) == ((1, 2), (-1.0, 0.0), 1.0)
    assert isinstance(s.reward, float)


@pytest.mark.parametrize("args", [
    ("", "p", 1), ("a|b", "p", 1), (7, "p", 1), ("s", None, 1), ("s", "p", 0), ("s", "p", 65537), ("s", "p", True),
    ("s", "p", 1.0), ("s", "p", 1, [("k", "v")]), ("s", "p", 1, {}, (2**31,)), ("s", "p", 1, {}, ("x",)),
], ids=repr)
def test_a_malformed_source_group_cannot_exist(args: tuple) -> None:
    with pytest.raises(InvalidInput):
        SourceGroup(*args)


@pytest.mark.parametrize("args", [
    ("1-0", 0, "w"), ("1-0", True, "w"), ("1-0", "1", "w"), ("1", 1, "w"), ("a-b", 1, "w"), ("1-0", 1, "@ready"),
    ("1-0", 1, "@lease:x"), ("1-0", 1, "a|b"), ("1-0", 1, "has space"), ("1-0", 1, ""), ("1-0", 1, "x" * 201),
], ids=repr)
def test_a_malformed_receipt_cannot_exist(args: tuple) -> None:
    with pytest.raises(InvalidInput):
        Receipt(*args)


def test_well_formed_ids_pass_their_checks() -> None:
    assert Receipt("1700000000000-12", 3, "host-a:gpu0/rank@1+x").attempt == 3
    assert check_entry_id("0-0") == "0-0"
    assert check_worker_id("w" * 200) == "w" * 200
    # Reasons are free text: kept as given (capped at 2,000 characters, lone surrogates escaped).
    for text in ("zero_std.v2:a-b", "", "a b", "a|b", "ü", "line\nbreak"):
        assert check_reason(text) == text
    assert check_reason("x" * 5000) == "x" * 2000 and check_reason("\udcff") == "\\udcff"
    for bad in (None, 3, b"zero_std"):
        with pytest.raises(InvalidInput):
            check_reason(bad)


def test_a_trajectory_checkpoint_round_trips_as_a_progress_record() -> None:
    """A trajectory cut short keeps its turns and its environment's snapshot (DESIGN: Partial
    rollouts, trajectories): the record reads back with both; a slot out of the group still fails."""
    turns = (Turn("model", 2, 0), Turn("observation", 1), Turn("model", 1, 1))
    sample = Sample(slot=1, token_ids=(5, 6, 7, 8), logprobs=(-0.5, -0.25, 0.0, -1.0), version=0, versions=(0, 1),
                    finish_reason="abort", turns=turns,
                    metadata={"step_rewards": [0.25, 0.5], "env": {"memory": ["a", 1]}})
    [back] = decode_partial(encode_partial([sample]), 2).values()
    assert (back.turns, back.metadata, back.token_ids, back.versions) == (turns, sample.metadata, (5, 6, 7, 8), (0, 1))
    with pytest.raises(CodecError):
        decode_partial(encode_partial([sample]), 1)
