"""SampleColumns: a completion's samples as flat arrays, the form a trainer turns into tensors.

Owns the columnar view of a completion (what codec.decode_columns returns and CompletedGroup.columns
hands out) and the rule that makes it safe to build Samples from it without checking each token:
every value is checked once, on construction, at C speed over the whole arrays. No I/O.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, Sequence

from rollout_queue.core.errors import InvalidInput
from rollout_queue.core.models import (
    Sample,
    Turn,
    check_sample_columns,
    check_segments,
    check_trajectory,
    logprobs_ok,
    token_versions,
)

_LITTLE = sys.byteorder == "little"
#: The high byte of a float32 that is negative (sign bit set) and not NaN or infinite (its exponent is
#: not all ones): 0x80..0xFE. An array whose floats all have such a high byte passes the logprob rule
#: with no pass over the floats in Python; any other byte (0.0, -inf, huge negatives, and every bad
#: value) falls back to the exact check.
_NEGATIVE_FINITE_HIGH = bytes(range(0x80, 0xFF))


@dataclass(frozen=True)
class SampleColumns:
    """Every sample of a completion as flat columns: tensors without a Python object per token.

    ``token_ids`` (``array('i')``) holds the samples' ids back to back, sample ``i`` at
    ``token_ids[offsets[i]:offsets[i] + counts[i]]``. ``logprobs`` (``array('f')``, float32 as
    stored) holds the logprobs of the samples whose ``has_logprobs`` is True, back to back, sample
    ``i``'s at ``logprobs[logprob_offsets[i]:logprob_offsets[i] + counts[i]]``; when every sample
    has logprobs (what workers send), the two arrays line up index for index. Both export the buffer
    protocol, so ``torch.frombuffer(cols.token_ids, dtype=torch.int32)`` shares their memory: treat
    them as read-only (a CompletedGroup caches its columns, and its samples are built from them).
    The other columns hold one value per sample, each Sample field of the same name: ``slots``,
    ``counts``, ``has_logprobs``, ``rewards``, ``versions`` (Sample.version), ``finish_reasons``,
    ``version_lists`` (Sample.versions); for trajectories, ``turn_lists`` (Sample.turns) and
    ``metadata`` (Sample.metadata), and ``segment_lists`` (Sample.segments), each empty when no
    sample of the completion has any (the single-turn, single-version case, which then costs
    nothing). ``loss_mask()`` is the per-token mask a trainer multiplies its loss by and
    ``token_versions()`` the policy version of each token, both aligned with ``token_ids``.

    Checked on construction as Sample checks its values (logprobs <= 0 and not NaN over the whole
    array at C speed, then each sample's fields), so a malformed column set cannot exist and the
    Samples built from it need no check of their own. Raises InvalidInput (TypeError: versions that
    are not a sequence).
    """

    token_ids: "array[int]"
    logprobs: "array[float]"
    slots: tuple[int, ...]
    counts: tuple[int, ...]
    has_logprobs: tuple[bool, ...]
    rewards: tuple[float | None, ...]
    versions: tuple[int, ...]
    finish_reasons: tuple[str, ...]
    version_lists: tuple[tuple[int, ...], ...]
    turn_lists: tuple[tuple[Turn, ...], ...] = ()
    metadata: tuple[Any, ...] = ()
    segment_lists: tuple[Any, ...] = ()
    offsets: tuple[int, ...] = field(init=False)
    logprob_offsets: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.token_ids, array) or self.token_ids.typecode != "i":
            raise InvalidInput("token_ids must be an array('i')")
        if not isinstance(self.logprobs, array) or self.logprobs.typecode != "f":
            raise InvalidInput("logprobs must be an array('f')")
        per_sample: list[tuple[Any, ...]] = [tuple(c) for c in (self.slots, self.counts, self.has_logprobs, self.rewards, self.versions,
                                         self.finish_reasons, self.version_lists)]
        if len({len(c) for c in per_sample}) > 1:
            raise InvalidInput("every per-sample column needs one value per sample")
        slots, counts, has_logprobs, rewards, versions, finish_reasons, version_lists = per_sample
        offsets, logprob_offsets = self._spans(counts, has_logprobs)
        if not logprobs_ok_f32(self.logprobs):
            raise InvalidInput("logprobs must be <= 0 and not NaN")
        checked_rewards, checked_lists = check_sample_columns(slots, rewards, versions, finish_reasons, version_lists)
        for name, value in (("slots", slots), ("counts", counts), ("has_logprobs", tuple(map(bool, has_logprobs))),
                            ("rewards", checked_rewards), ("versions", versions),
                            ("finish_reasons", finish_reasons), ("version_lists", checked_lists),
                            ("offsets", offsets), ("logprob_offsets", logprob_offsets)):
            object.__setattr__(self, name, value)
        if self.turn_lists or self.metadata:
            self._check_trajectories(counts, versions)
        if self.segment_lists:
            self._check_segments(counts, versions, checked_lists)

    def _check_trajectories(self, counts: tuple[int, ...], versions: tuple[int, ...]) -> None:
        """Each sample's turns and metadata, by Sample's rule (an empty column: none has any)."""
        n = len(counts)
        turn_lists = tuple(self.turn_lists) or ((),) * n
        metadata = tuple(self.metadata) or (None,) * n
        if len(turn_lists) != n or len(metadata) != n:
            raise InvalidInput("turn_lists and metadata need one value per sample (or none at all)")
        checked = [check_trajectory(t, m, c, v) for t, m, c, v in zip(turn_lists, metadata, counts, versions)]
        object.__setattr__(self, "turn_lists", tuple(t for t, _ in checked) if self.turn_lists else ())
        object.__setattr__(self, "metadata", tuple(m for _, m in checked) if self.metadata else ())

    def _check_segments(self, counts: tuple[int, ...], versions: tuple[int, ...],
                        version_lists: tuple[tuple[int, ...], ...]) -> None:
        """Each sample's segments, by Sample's rule (checked after the turns they must agree with)."""
        n = len(counts)
        segment_lists = tuple(self.segment_lists)
        if len(segment_lists) != n:
            raise InvalidInput("segment_lists needs one value per sample (or none at all)")
        turn_lists = self.turn_lists or ((),) * n
        checked = tuple(check_segments(g, c, v, vs, t) for g, c, v, vs, t in zip(
            segment_lists, counts, versions, version_lists, turn_lists))
        object.__setattr__(self, "segment_lists", checked if any(checked) else ())

    def _spans(self, counts: tuple[Any, ...], has_logprobs: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Each sample's start in token_ids and in logprobs; InvalidInput unless the counts cover both exactly."""
        offsets, logprob_offsets = [], []
        t = lp = 0
        for count, has in zip(counts, has_logprobs):
            if type(count) is not int or count < 0:
                raise InvalidInput(f"token count must be an integer >= 0, got {count!r}")
            offsets.append(t)
            logprob_offsets.append(lp)
            t += count
            lp += count if has else 0
        if t != len(self.token_ids) or lp != len(self.logprobs):
            raise InvalidInput(f"counts cover {t} ids and {lp} logprobs, the arrays hold "
                               f"{len(self.token_ids)} and {len(self.logprobs)}")
        return tuple(offsets), tuple(logprob_offsets)

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> "SampleColumns":
        """The columns of ``samples`` (logprobs narrowed to float32, as the codec stores them)."""
        ids, lps = array("i"), array("f")
        for s in samples:
            ids += array("i", s.token_ids)
            if s.logprobs:
                lps += array("f", s.logprobs)
        turns = tuple(s.turns for s in samples) if any(s.turns for s in samples) else ()
        metadata = tuple(s.metadata for s in samples) if any(s.metadata is not None for s in samples) else ()
        segments = tuple(s.segments for s in samples) if any(s.segments for s in samples) else ()
        return cls(ids, lps, tuple(s.slot for s in samples), tuple(len(s.token_ids) for s in samples),
                   tuple(bool(s.logprobs) for s in samples), tuple(s.reward for s in samples),
                   tuple(s.version for s in samples), tuple(s.finish_reason for s in samples),
                   tuple(s.versions for s in samples), turns, metadata, segments)

    @property
    def multi_turn(self) -> bool:
        """True when some sample is a trajectory (has turns)."""
        return any(self.turn_lists)

    def loss_mask(self) -> bytearray:
        """One byte per token, aligned with ``token_ids``: 1 on the model's tokens, 0 on observations'
        (``torch.frombuffer(cols.loss_mask(), dtype=torch.uint8)``). All ones for single-turn samples."""
        if not self.turn_lists:
            return bytearray(b"\x01") * len(self.token_ids)
        parts = []
        for count, turns in zip(self.counts, self.turn_lists):
            if not turns:
                parts.append(b"\x01" * count)
            else:
                parts += [(b"\x01" if t.trained else b"\x00") * t.n_tokens for t in turns]
        return bytearray(b"".join(parts))

    def token_versions(self) -> "array[int]":
        """One policy version per token (array('i')), aligned with ``token_ids``: each sample's
        segments expanded (models.token_versions: without them, its turns' versions or its
        ``version``) (``torch.frombuffer(cols.token_versions(), dtype=torch.int32)``)."""
        n = len(self.counts)
        out = array("i")
        for segments, count, version, turns in zip(self.segment_lists or ((),) * n, self.counts, self.versions,
                                                   self.turn_lists or ((),) * n):
            out += token_versions(segments, count, version, turns)
        return out

    def samples(self) -> tuple[Sample, ...]:
        """One Sample per sample, its ids and logprobs as tuples of Python ints and floats."""
        ids, lps = self.token_ids.tolist(), self.logprobs.tolist()
        n = len(self.counts)
        turn_lists = self.turn_lists or ((),) * n
        metadata = self.metadata or (None,) * n
        segment_lists = self.segment_lists or ((),) * n
        return tuple(
            Sample._trusted(slot, tuple(ids[t:t + n]), tuple(lps[lp:lp + n]) if has else (), reward, version,
                            finish, vs, turns, md, segments)
            for slot, n, t, lp, has, reward, version, finish, vs, turns, md, segments in zip(
                self.slots, self.counts, self.offsets, self.logprob_offsets, self.has_logprobs, self.rewards,
                self.versions, self.finish_reasons, self.version_lists, turn_lists, metadata, segment_lists))


def logprobs_ok_f32(values: "array[float]") -> bool:
    """logprobs_ok for an array('f') at C speed: one byte test over the high bytes, and the exact check
    only when some value is 0.0, -inf or very negative (or bad)."""
    # tobytes() first: a strided slice of bytes is a C loop, of a memoryview a generic per-item one (10x).
    high = values.tobytes()[3 if _LITTLE else 0::4]
    return not high.translate(None, _NEGATIVE_FINITE_HIGH) or logprobs_ok(values)
