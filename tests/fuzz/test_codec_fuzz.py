"""The completion codec under generated input, no Redis: round trips of any valid completion in every
schema (per-token versions, Sample.segments, included), and garbage (mutated blobs, arbitrary headers and bodies) that must end in CodecError.

Rule under test: decode_completion(encode_completion(s)) == s for every valid list of samples (logprobs
as float32 keeps them), and no byte string makes decode_completion raise anything but CodecError or
return anything but a tuple of valid Samples.
"""

from __future__ import annotations

import struct

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_queue import Sample
from rollout_queue.core.models import MODEL, OBSERVATION, Turn
from rollout_queue.core.codec import CodecError, decode_completion, encode_completion

from .support import EXAMPLES

SETTINGS = settings(max_examples=max(EXAMPLES, 200), deadline=None)
MAX24 = 2**24 - 1


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


IDS = st.one_of(st.integers(0, MAX24), st.integers(MAX24 - 2, MAX24 + 2), st.integers(-(2**31), 2**31 - 1))
LOGPROB = st.one_of(st.floats(max_value=0.0, allow_nan=False, width=32), st.sampled_from([0.0, -0.0, -float("inf")]))


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    ids = draw(st.lists(IDS, max_size=24))
    lps = tuple(map(_f32, draw(st.lists(LOGPROB, min_size=len(ids), max_size=len(ids))))) if draw(st.booleans()) else ()
    version = draw(st.integers(0, 2**21 - 1))
    turns, metadata = draw(trajectory(len(ids), version)) if draw(st.booleans()) else ((), None)
    segs = draw(segments(len(ids), version, turns))
    versions = tuple(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3)))
    if segs:  # every version a segment names is one the sample ran under
        versions = tuple(sorted({v for _, v in segs})) + versions
    return Sample(draw(st.integers(0, 65_535)), ids, lps,  # slots are < n <= 65536
                  draw(st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))),
                  version, draw(st.text(max_size=8).filter(_utf8)), versions, turns, metadata, segs)


@st.composite
def segments(draw: st.DrawFn, n_tokens: int, version: int, turns: tuple[Turn, ...]) -> tuple[tuple[int, int], ...]:
    """Valid per-token versions (or none): run lengths from offset 0 at ``version``, versions rising,
    each of a trajectory's model turns starting at its own version (() when its turns' versions fall)."""
    if not n_tokens or not draw(st.booleans()):
        return ()
    forced = {0: version}
    at = 0
    for turn in turns:
        if turn.trained and turn.n_tokens:
            if forced.setdefault(at, turn.version) != turn.version:
                return ()  # a turn at token 0 newer than the sample's version (an empty model turn's)
        at += turn.n_tokens
    starts = sorted(set(forced) | set(draw(st.lists(st.integers(0, n_tokens - 1), max_size=4))))
    out: list[tuple[int, int]] = []
    for i, start in enumerate(starts):
        last = out[-1][1] if out else version
        later = [forced[s] for s in starts[i + 1:] if s in forced]
        if start in forced:
            at = forced[start]
        else:
            at = draw(st.integers(last, min(later, default=2**21 - 1))) if min(later, default=last) >= last else -1
        if at < last:
            return ()
        out.append((start, at))
    return tuple(out)


@st.composite
def trajectory(draw: st.DrawFn, n_tokens: int, version: int) -> tuple[tuple[Turn, ...], dict | None]:
    """Turns covering ``n_tokens`` (model turns at ``version`` or later, the first at ``version``) and
    a metadata record or None."""
    cuts = sorted(draw(st.lists(st.integers(0, n_tokens), max_size=4)))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, n_tokens])]
    roles = [draw(st.sampled_from([MODEL, OBSERVATION])) for _ in sizes]
    roles[draw(st.integers(0, len(sizes) - 1))] = MODEL
    turns = []
    first = True
    for role, size in zip(roles, sizes):
        if role == MODEL:
            turns.append(Turn(MODEL, size, version if first else draw(st.integers(version, 2**21 - 1))))
            first = False
        else:
            turns.append(Turn(OBSERVATION, size))
    metadata = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=5).filter(_utf8),
                                                        st.one_of(st.integers(-99, 99), st.text(max_size=5).filter(_utf8)),
                                                        max_size=3)))
    return tuple(turns), metadata


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


COMPLETIONS = st.lists(samples(), max_size=5)


@SETTINGS
@given(completion=COMPLETIONS)
def test_every_valid_completion_round_trips(completion: list[Sample]) -> None:
    blob = encode_completion(completion)
    in_24 = all(0 <= t <= MAX24 for s in completion for t in s.token_ids)
    if any(s.segments for s in completion):  # schemas 3 and 4 only when some sample has per-token versions
        assert blob[:4] == (b"RQC3" if in_24 else b"RQC4")
    else:
        assert blob[:4] == (b"RQC2" if in_24 else b"RQC1")
    decoded = decode_completion(blob)
    assert decoded == tuple(completion)
    assert [s.token_versions for s in decoded] == [s.token_versions for s in completion]


def _decodes_or_codec_error(blob: bytes) -> None:
    try:
        out = decode_completion(blob)
    except CodecError:
        return
    assert isinstance(out, tuple) and all(isinstance(s, Sample) for s in out)
    for s in out:  # what decoding built skipping per-token checks must pass them
        assert Sample(s.slot, s.token_ids, s.logprobs, s.reward, s.version, s.finish_reason, s.versions, s.turns,
                      s.metadata, s.segments) == s


@SETTINGS
@given(completion=COMPLETIONS, data=st.data())
def test_a_mutated_blob_decodes_to_valid_samples_or_raises_codec_error(completion: list[Sample],
                                                                      data: st.DataObject) -> None:
    blob = bytearray(encode_completion(completion))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(len(blob) - 1, 0)))
        if op == "flip" and blob:
            blob[at] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del blob[at:]
        elif op == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=4))
        elif blob:
            del blob[at]
    _decodes_or_codec_error(bytes(blob))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=24)
ROWS = st.lists(st.lists(JSON, min_size=7, max_size=7) | st.lists(JSON, min_size=9, max_size=10) | JSON, max_size=4)


@SETTINGS
@given(magic=st.sampled_from([b"RQC1", b"RQC2", b"RQC3", b"RQC4"]), v=st.one_of(st.sampled_from([1, 2, 3, 4]), JSON),
       rows=ROWS, body=st.binary(max_size=64))
def test_arbitrary_headers_and_bodies_raise_only_codec_error(magic: bytes, v: object, rows: object,
                                                              body: bytes) -> None:
    try:
        head = orjson.dumps({"v": v, "s": rows})
    except (TypeError, orjson.JSONEncodeError):  # NaN is fine; a big int or a surrogate is not JSON
        return
    _decodes_or_codec_error(magic + struct.pack("<I", len(head)) + head + body)
