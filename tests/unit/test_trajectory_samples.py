"""Trajectory samples (Sample.turns, Sample.metadata) in the value types, the codec and the columns.

The rules: turns cover the tokens exactly, hold a model turn, and the oldest model turn is the
sample's version; metadata is a small JSON record; a single-turn sample is stored byte for byte as
before trajectories existed; a trajectory's row costs three integers per turn, never a byte per token.
"""

from __future__ import annotations

import orjson
import pytest

from rollout_queue import CompletedGroup, InvalidInput, Sample, SourceGroup, Turn
from rollout_queue.core.codec import CodecError, decode_columns, decode_completion, encode_completion
from rollout_queue.core.columns import SampleColumns
from rollout_queue.core.models import MAX_SAMPLE_METADATA

TURNS = (Turn("model", 2, 4), Turn("observation", 3), Turn("model", 1, 5))


def trajectory(**changes: object) -> Sample:
    fields: dict[str, object] = dict(slot=0, token_ids=(1, 2, 3, 4, 5, 6), logprobs=(-0.5, -0.25, 0.0, 0.0, 0.0, -1.0),
                                     reward=1.0, version=4, versions=(4, 5), turns=TURNS,
                                     metadata={"step_rewards": [0.0, 1.0], "steps": [{"tool": "calc"}]})
    fields.update(changes)
    return Sample(**fields)  # type: ignore[arg-type]


def test_loss_mask_and_model_tokens_follow_the_turns() -> None:
    s = trajectory()
    assert s.loss_mask == (1, 1, 0, 0, 0, 1) and s.model_tokens == 3
    plain = Sample(0, (1, 2, 3))
    assert plain.loss_mask == (1, 1, 1) and plain.model_tokens == 3 and plain.turns == () and plain.metadata is None


@pytest.mark.parametrize(("changes", "message"), [
    ({"turns": (Turn("model", 2, 4),)}, "the turns cover 2 tokens, the sample has 6"),
    ({"turns": (Turn("observation", 6),)}, "at least one model turn"),
    ({"version": 5}, r"must be its oldest model turn's \(4\)"),
    ({"turns": [(1, 2, 3)]}, r"turns\[0\] must be a Turn"),
    ({"metadata": {"x": float("nan")}}, "NaN"),
    ({"metadata": ["not", "a", "mapping"]}, "must be a mapping"),
    ({"metadata": {"big": "x" * MAX_SAMPLE_METADATA}}, "keep a record"),
    ({"metadata": {"obj": object()}}, "not JSON-serialisable"),
])
def test_a_malformed_trajectory_is_refused_with_what_is_wrong(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        trajectory(**changes)


@pytest.mark.parametrize(("args", "message"), [
    (("tool", 1, 0), "role must be"),
    (("model", -1, 0), "n_tokens must be"),
    (("model", 1, -1), "version must be"),
    (("observation", 1, 3), "no policy version"),
])
def test_a_bad_turn_is_refused(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Turn(*args)  # type: ignore[arg-type]


def test_trajectories_round_trip_through_blobs_columns_and_packets() -> None:
    samples = [trajectory(), Sample(1, (7, 8), (-0.5, -0.5), 0.0, 4), trajectory(slot=2, metadata=None)]
    blob = encode_completion(samples)
    assert decode_completion(blob) == tuple(samples)
    cols = decode_columns(blob)
    assert cols.multi_turn and cols.turn_lists[1] == () and cols.metadata[2] is None
    assert list(cols.loss_mask()) == [1, 1, 0, 0, 0, 1] + [1, 1] + [1, 1, 0, 0, 0, 1]
    assert SampleColumns.of(samples) == cols
    g = CompletedGroup.from_columns("1-0", SourceGroup("s", "p", 3), cols, 1, 4)
    assert g.samples == tuple(samples)


def test_a_single_turn_sample_costs_what_it_did_before_trajectories() -> None:
    plain = [Sample(i, tuple(range(512)), tuple(-0.5 for _ in range(512)), 1.0, 3, "stop", (3,)) for i in range(8)]
    blob = encode_completion(plain)
    header = orjson.loads(blob[8:8 + int.from_bytes(blob[4:8], "little")])
    assert all(len(row) == 7 for row in header["s"])  # no trajectory fields at all
    assert not decode_columns(blob).turn_lists and not decode_columns(blob).metadata
    # A trajectory pays 3 small integers per turn in its header row, not a byte per token.
    long = trajectory(token_ids=tuple(range(4096)), logprobs=(), turns=(Turn("model", 2048, 4), Turn("observation", 2048)),
                      metadata=None, versions=())
    single = Sample(0, tuple(range(4096)), (), 1.0, 4)
    assert len(encode_completion([long])) - len(encode_completion([single])) < 40


@pytest.mark.parametrize(("row_tail", "message"), [
    ([[1, 2], None], "triples"),
    ([[7, 2, 4], None], "role must be 1"),
    ([[1, 3, 4], None], "cover 3 tokens"),
    ([[1, 2, 4], "not a mapping"], "must be a mapping"),
    ([[0, 2, 0], None], "at least one model turn"),
])
def test_a_garbage_trajectory_row_is_a_codec_error(row_tail: list[object], message: str) -> None:
    header = orjson.dumps({"v": 2, "s": [[0, 2, 0, 1.0, 4, "stop", [], *row_tail]]})
    blob = b"RQC2" + len(header).to_bytes(4, "little") + header + bytes(6)
    with pytest.raises(CodecError, match=message):
        decode_completion(blob)
