"""Value types of the public API: frozen, validated on construction, free of I/O.

A malformed receipt or sample cannot exist: constructors raise ValueError (InvalidInput) with what is
wrong. Token ids and logprobs are tuples, so values can be shared between threads safely.
"""

from __future__ import annotations

import dataclasses

import math
import re
import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from rollout_queue.core.checks import check_int, check_items, check_json, check_number, describe, packer
from rollout_queue.core.errors import GroupTooLarge, InvalidInput
from rollout_queue.core.histograms import SECOND_BUCKETS, TOKEN_BUCKETS, bucket_count

if TYPE_CHECKING:
    from rollout_queue.core.columns import SampleColumns

_ENTRY_ID = re.compile(r"^\d+-\d+$")
_WORKER_ID = re.compile(r"^[A-Za-z0-9_.:/\-][A-Za-z0-9_.:/\-@+]{0,199}$")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: A receipt's attempt is a PEL delivery count: a Lua number, exact up to 2^53.
MAX_ATTEMPT = 2**53 - 1
#: Slots are 0..n-1 and n <= 65536 (SourceGroup).
MAX_SLOT = 65535
#: Longest reason (of a failure, an abort, a filter) kept in the ledger and history.
MAX_REASON = 2000


def check_entry_id(entry_id: str) -> str:
    if not isinstance(entry_id, str) or not _ENTRY_ID.match(entry_id):
        raise InvalidInput(f"bad entry id {describe(entry_id)}: expected a stream ID like '1700000000000-0'")
    return entry_id


def check_worker_id(worker_id: str) -> str:
    """Worker ids are PEL consumer names; '@' starts the queue's own owners (@ready, @done, @lease:)."""
    if not isinstance(worker_id, str) or not _WORKER_ID.match(worker_id):
        raise InvalidInput(
            f"bad worker id {describe(worker_id)}: 1-200 characters from letters, digits and _ . : / - @ +, "
            "not starting with '@' (reserved for the queue's own PEL owners)"
        )
    return worker_id


def reason_text(reason: object) -> str:
    """A reason as storable text: capped at MAX_REASON characters, and never failing the settlement
    it explains (a lone surrogate from an engine's error message is escaped rather than raising in
    the encoder; a value whose str() raises, such as an int past Python's 4,300-digit limit, is
    named by its type). Control characters are kept: readers escape them (cli/render.py)."""
    try:
        text = str(reason)
    except Exception:  # noqa: BLE001 - any str() failure: the settlement must still go through
        text = f"<{type(reason).__name__} not shown: its str() failed>"
    return text[:MAX_REASON].encode("utf-8", "backslashreplace").decode("utf-8")


def check_reason(reason: str, what: str = "reason") -> str:
    """A reason given as text (a filter's "all rewards equal", an operator's note): any str, returned
    as reason_text stores it. The counters a reason feeds are bounded inside the script (filter.lua
    normalises it to a token), so no reason can grow them without bound."""
    if not isinstance(reason, str):
        raise InvalidInput(f"{what} must be a string, got {type(reason).__name__}")
    return reason_text(reason)


@dataclass(frozen=True)
class SourceGroup:
    """One prompt with ``n`` parent slots: what a producer submits and a worker reserves.

    ``source_id`` is the producer's own key: submitting it twice stores it once. Each parent slot
    ``i`` has the identity ``f"{source_id}/{i}"`` (its ``uid``).
    """

    source_id: str
    prompt: str
    n: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
    prompt_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source_id, str) or not self.source_id or "|" in self.source_id:
            raise InvalidInput(f"source_id must be a non-empty string without '|', got {describe(self.source_id)}")
        if not isinstance(self.prompt, str):
            raise InvalidInput(f"prompt must be a string, got {type(self.prompt).__name__}")
        check_text(self.source_id, "source_id")
        check_text(self.prompt, "prompt")
        if not isinstance(self.n, int) or isinstance(self.n, bool) or not 1 <= self.n <= 65536:
            raise InvalidInput(f"n must be an integer in 1..65536, got {describe(self.n)}")
        if not isinstance(self.metadata, Mapping):
            raise InvalidInput("metadata must be a mapping")
        check_json(self.metadata, f"metadata of {self.source_id!r}")
        if self.prompt_token_ids is not None:
            ids = _int32_tuple(self.prompt_token_ids, "prompt_token_ids")
            object.__setattr__(self, "prompt_token_ids", ids)

    def parent_uid(self, slot: int) -> str:
        return f"{self.source_id}/{slot}"


@dataclass(frozen=True)
class Receipt:
    """The exact identity of an attempt: (entry_id, attempt, worker_id); attempt = PEL delivery count."""

    entry_id: str
    attempt: int
    worker_id: str

    def __post_init__(self) -> None:
        check_entry_id(self.entry_id)
        check_worker_id(self.worker_id)
        if type(self.attempt) is not int or not 1 <= self.attempt <= MAX_ATTEMPT:  # the common case skips the call
            object.__setattr__(self, "attempt", check_int(self.attempt, "attempt", 1, MAX_ATTEMPT))


def check_receipt(receipt: Any, worker_id: str | None = None) -> "Receipt":
    """``receipt`` is a Receipt (of ``worker_id``'s, when given): a settlement of another worker's
    attempt is refused before anything is sent, whichever client or flow it goes through."""
    if not isinstance(receipt, Receipt):
        raise InvalidInput(f"expected a Receipt (reservation.receipt), got {type(receipt).__name__}")
    if worker_id is not None and receipt.worker_id != worker_id:
        raise InvalidInput(f"receipt belongs to worker {receipt.worker_id!r}, not {worker_id!r}")
    return receipt


def check_completions(items: Any, worker_id: str) -> list[tuple["Receipt", list["Sample"]]]:
    """complete_many's items: (receipt of ``worker_id``, samples) pairs, as a list of lists."""
    out = []
    for i, item in enumerate(check_items(items, object, "items")):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidInput(f"items[{i}] must be a (receipt, samples) pair, got {type(item).__name__}")
        out.append((check_receipt(item[0], worker_id), check_items(item[1], Sample, f"items[{i}] samples")))
    return out


@dataclass(frozen=True)
class Reservation:
    """A reserved source group: the receipt to settle it with, the pristine group, and the policy
    version current when it was reserved (0 before the first publish).

    ``progress``: what an earlier, unfinished attempt of this group left (partial rollouts: the
    samples so far, by slot, with their behaviour logprobs and segments; DESIGN: Partial rollouts).
    The next attempt continues each from its tokens instead of starting over; a slot not in it starts
    from the prompt. Empty when there is none (or it did not decode)."""

    receipt: Receipt
    group: SourceGroup
    version: int
    progress: tuple["Sample", ...] = ()

    @property
    def entry_id(self) -> str:
        return self.receipt.entry_id


#: Turn roles: a model turn's tokens are trained (loss mask 1), an observation's are not (mask 0).
MODEL, OBSERVATION = "model", "observation"
_ROLES = (MODEL, OBSERVATION)
#: Largest sample metadata record (tool calls, per-step rewards), as orjson bytes: it rides in the
#: completion blob of every sample, so it stays a record, not a transcript.
MAX_SAMPLE_METADATA = 16384


@dataclass(frozen=True, slots=True)
class Turn:
    """One span of a trajectory's tokens, in order: the model's (``role="model"``, trained) or an
    environment's observation (``role="observation"``, never trained). ``version`` is the policy
    version a model turn was generated with (its oldest, if an update landed during it); 0 for an
    observation."""

    role: str
    n_tokens: int
    version: int = 0

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise InvalidInput(f"turn role must be {MODEL!r} or {OBSERVATION!r}, got {describe(self.role)}")
        if isinstance(self.n_tokens, bool) or not isinstance(self.n_tokens, int) or not 0 <= self.n_tokens <= INT32_MAX:
            raise InvalidInput(f"a turn's n_tokens must be an integer >= 0, got {describe(self.n_tokens)}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or not 0 <= self.version < 2**21:
            raise InvalidInput(f"a turn's version must be an integer in 0..2^21-1, got {describe(self.version)}")
        if self.role == OBSERVATION and self.version:
            raise InvalidInput("an observation turn has no policy version (give 0)")

    @property
    def trained(self) -> bool:
        return self.role == MODEL


@dataclass(frozen=True)
class Sample:
    """One generated output for a parent slot. ``version`` is the oldest policy version the sample was
    generated with; ``logprobs`` are the behaviour policy's logprobs of ``token_ids`` (may be empty).

    A multi-turn sample (a trajectory) also has ``turns``: the spans of ``token_ids`` in order, model
    turns and environment observations, covering every token; its loss mask is 1 on the model's
    tokens and 0 on the observations' (``loss_mask``), its logprobs are 0.0 on observation tokens,
    and ``version`` is its oldest model turn's. ``metadata`` is a small JSON record (tool calls,
    per-step rewards), at most MAX_SAMPLE_METADATA bytes. A single-turn sample has neither
    (``turns == ()``: all of ``token_ids`` is one model turn) and costs nothing extra to store.

    ``segments`` says which policy version generated each token, as run lengths: ``(start offset,
    version)`` pairs, offsets strictly increasing from 0 and below ``len(token_ids)``, versions
    non-decreasing, the first one ``version`` (the oldest) and each one of ``versions`` when those
    are given (``check_segments``). A sample whose generation spanned weight updates (a continued
    attempt, ``--weights-mode continue``) has one segment per version; ``()`` means every token is at
    ``version`` (a trajectory's at its model turn's, ``Turn.version``). ``token_versions`` expands them, so a trainer can correct or mask each token by its
    own staleness (rl/trainer.py ``grpo_loss``). In a trajectory, offsets index ``token_ids`` and an
    observation's tokens carry the version of the turn before them (they are never trained).
    """

    slot: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    reward: float | None = None
    version: int = 0
    finish_reason: str = "stop"
    versions: tuple[int, ...] = ()
    turns: tuple[Turn, ...] = ()
    metadata: Mapping[str, Any] | None = field(default=None, hash=False)
    segments: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        ids = _int32_tuple(self.token_ids, "token_ids")
        object.__setattr__(self, "token_ids", ids)
        lps = _float_tuple(self.logprobs)
        if lps and len(lps) != len(ids):
            raise InvalidInput(f"{len(lps)} logprobs for {len(ids)} tokens: give one per token or none")
        if not logprobs_ok(lps):
            raise InvalidInput("logprobs must be <= 0 and not NaN")
        object.__setattr__(self, "logprobs", lps)
        self._check_fields()

    @classmethod
    def _trusted(cls, slot: int, token_ids: tuple[int, ...], logprobs: tuple[float, ...], reward: float | None,
                 version: int, finish_reason: str, versions: tuple[int, ...], turns: tuple[Turn, ...] = (),
                 metadata: Mapping[str, Any] | None = None,
                 segments: tuple[tuple[int, int], ...] = ()) -> "Sample":
        """A sample built from values SampleColumns has already checked, with no check of its own.

        For SampleColumns.samples only: the columns checked every value on construction (the
        per-token values at C speed over whole arrays), and re-checking per sample cost about as much
        as the decode itself.
        """
        sample = cls.__new__(cls)
        for name, value in (("slot", slot), ("token_ids", token_ids), ("logprobs", logprobs), ("reward", reward),
                            ("version", version), ("finish_reason", finish_reason), ("versions", versions),
                            ("turns", turns), ("metadata", metadata), ("segments", segments)):
            object.__setattr__(sample, name, value)
        return sample

    def _check_fields(self) -> None:
        """Everything but the per-token values: slot, reward, version, finish reason, versions, turns,
        metadata, segments."""
        reward, versions = check_sample_fields(self.slot, self.reward, self.version, self.finish_reason,
                                               self.versions)
        object.__setattr__(self, "reward", reward)
        object.__setattr__(self, "versions", versions)
        turns, metadata = check_trajectory(self.turns, self.metadata, len(self.token_ids), self.version)
        object.__setattr__(self, "turns", turns)
        object.__setattr__(self, "metadata", metadata)
        segments = check_segments(self.segments, len(self.token_ids), self.version, versions, turns)
        object.__setattr__(self, "segments", segments)

    @property
    def token_versions(self) -> tuple[int, ...]:
        """The policy version that generated each token, aligned with ``token_ids`` (``segments``
        expanded; without them, a trajectory's model turn's version on its tokens and every other
        sample's ``version`` on all of them)."""
        return tuple(token_versions(self.segments, len(self.token_ids), self.version, self.turns))

    @property
    def newest_version(self) -> int:
        """The policy version of the sample's newest tokens (its last segment's; a trajectory's newest
        model turn's): what staleness_mode 'continue' judges a sample by."""
        return newest_version(self.segments, self.version, self.turns)

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """1 for each token the trainer trains on (the model's), 0 for each observation token."""
        if not self.turns:
            return (1,) * len(self.token_ids)
        return tuple(bit for t in self.turns for bit in ((1 if t.trained else 0),) * t.n_tokens)

    @property
    def model_tokens(self) -> int:
        """How many of the tokens are the model's (the ones trained)."""
        return sum(t.n_tokens for t in self.turns if t.trained) if self.turns else len(self.token_ids)


def check_trajectory(turns: Any, metadata: Any, n_tokens: int,
                     version: int) -> tuple[tuple[Turn, ...], Mapping[str, Any] | None]:
    """Check a sample's turns and metadata against its token count and version; returns them as stored.

    The turns must cover the tokens exactly, hold at least one model turn, and the oldest model turn
    must be the sample's ``version`` (staleness is measured from it). One rule for Sample and
    SampleColumns. Raises InvalidInput.
    """
    if type(turns) is not tuple:
        turns = tuple(check_items(turns, Turn, "turns"))
    elif any(type(t) is not Turn for t in turns):
        raise InvalidInput("turns must be a sequence of Turn")
    if turns:
        covered = sum(t.n_tokens for t in turns)
        if covered != n_tokens:
            raise InvalidInput(f"the turns cover {covered} tokens, the sample has {n_tokens}")
        model = [t.version for t in turns if t.trained]
        if not model:
            raise InvalidInput("a trajectory needs at least one model turn")
        if min(model) != version:
            raise InvalidInput(f"the sample's version {version} must be its oldest model turn's ({min(model)})")
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise InvalidInput(f"sample metadata must be a mapping, got {type(metadata).__name__}")
        check_json(metadata, "sample metadata")
        try:
            size = len(orjson.dumps(metadata))
        except TypeError as exc:
            raise InvalidInput(f"sample metadata is not JSON-serialisable: {exc}") from exc
        if size > MAX_SAMPLE_METADATA:
            raise InvalidInput(f"sample metadata is {size} bytes of JSON, the limit is {MAX_SAMPLE_METADATA}: "
                               "keep a record (tool names, per-step rewards), not a transcript")
        metadata = dict(metadata)
    return turns, metadata


#: Largest policy version a sample, a turn or a segment may name (the buffer's scores pack it in 21 bits).
MAX_VERSION = 2**21 - 1


def check_segments(segments: Any, n_tokens: int, version: int, versions: tuple[int, ...],
                   turns: tuple[Turn, ...] = ()) -> tuple[tuple[int, int], ...]:
    """Check a sample's per-token versions (``Sample.segments``); returns them as a tuple of int pairs.

    The rule, one for Sample and SampleColumns (so the codec accepts exactly what Sample does):
    ``(offset, version)`` pairs, offsets strictly increasing from 0 and below ``n_tokens``, versions
    in 0..MAX_VERSION and non-decreasing; the first version is the sample's ``version`` (its oldest,
    which staleness counts from), every version is one of ``versions`` when those are given (every
    version the sample ran under), and a trajectory's model turn starts at its own ``Turn.version``
    (its oldest). Costs one pass over the segments and the turns, nothing per token. Raises
    InvalidInput.
    """
    if type(segments) is tuple and not segments:
        return ()
    if isinstance(segments, (str, bytes, bytearray, Mapping)):
        raise InvalidInput(f"segments must be a sequence of (token offset, version) pairs, got {describe(segments)}")
    try:
        items = tuple(segments)
    except TypeError:
        raise InvalidInput(f"segments must be a sequence of (token offset, version) pairs, "
                           f"got {describe(segments)}") from None
    out: list[tuple[int, int]] = []
    for i, pair in enumerate(items):
        if (type(pair) not in (tuple, list) or len(pair) != 2
                or any(isinstance(x, bool) or not isinstance(x, int) for x in pair)):
            raise InvalidInput(f"segments[{i}] must be a (token offset, version) pair of integers, got {describe(pair)}")
        offset, at = int(pair[0]), int(pair[1])
        if (offset != 0) if not out else not out[-1][0] < offset < n_tokens:
            raise InvalidInput(f"segments[{i}] starts at token {offset}: offsets must rise strictly from 0 and stay "
                               f"below the sample's {n_tokens} tokens")
        if not (out[-1][1] if out else 0) <= at <= MAX_VERSION:
            raise InvalidInput(f"segments[{i}] has version {at}: versions must not decrease and stay in "
                               f"0..{MAX_VERSION}")
        out.append((offset, at))
    if out and n_tokens == 0:
        raise InvalidInput("a sample without tokens has no segments")
    if out and out[0][1] != version:
        raise InvalidInput(f"the first segment's version {out[0][1]} must be the sample's version {version} "
                           "(its oldest)")
    if versions and not {v for _, v in out} <= set(versions):
        raise InvalidInput(f"segments name versions {sorted({v for _, v in out} - set(versions))} that are not "
                           f"among the sample's versions {list(versions)}")
    if turns and out:
        _check_turn_starts(out, turns)
    return tuple(out)


def _check_turn_starts(segments: list[tuple[int, int]], turns: tuple[Turn, ...]) -> None:
    """Each model turn's first token is at that turn's version (its oldest): one walk of both lists."""
    at, k = 0, 0
    for turn in turns:
        while k + 1 < len(segments) and segments[k + 1][0] <= at:
            k += 1
        if turn.trained and turn.n_tokens and segments[k][1] != turn.version:
            raise InvalidInput(f"the model turn at token {at} has version {turn.version}, its segments say "
                               f"{segments[k][1]}: a turn's version is its first (oldest) token's")
        at += turn.n_tokens


def newest_version(segments: Sequence[tuple[int, int]], version: int, turns: Sequence[Turn] = ()) -> int:
    """The version of a sample's newest tokens: its last segment's, else its newest model turn's, else
    ``version`` (every token at it). Versions never decrease along a sample, so this is its largest."""
    if segments:
        return segments[-1][1]
    return max((t.version for t in turns if t.trained), default=version)


def token_versions(segments: Sequence[tuple[int, int]], n_tokens: int, version: int,
                   turns: Sequence[Turn] = ()) -> "array[int]":
    """``segments`` expanded to one version per token (``n_tokens`` of them) as an array('i'). Without
    segments, a trajectory's tokens are at their model turn's version (an observation at the turn's
    before it, a leading one at ``version``) and any other sample's at ``version``. The one expansion
    Sample and SampleColumns use."""
    if not segments:
        if not turns:
            return array("i", [version]) * n_tokens
        out, last = array("i"), version
        for turn in turns:
            last = turn.version if turn.trained else last
            out += array("i", [last]) * turn.n_tokens
        return out
    out = array("i")
    for (start, at), (end, _) in zip(segments, [*segments[1:], (n_tokens, 0)]):
        out += array("i", [at]) * (end - start)
    return out


def check_sample_fields(slot: Any, reward: Any, version: Any, finish_reason: Any,
                        versions: Any) -> tuple[float | None, tuple[int, ...]]:
    """Check a sample's fields other than its tokens; returns (reward as float or None, versions).

    One rule for Sample and SampleColumns, so a blob the codec accepts as columns is exactly one whose
    Samples would construct. Raises InvalidInput (a ValueError).
    """
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot <= MAX_SLOT:
        raise InvalidInput(f"slot must be an integer in 0..{MAX_SLOT}, got {describe(slot)}")
    if reward is not None:
        if type(reward) is not float or not math.isfinite(reward):  # the common case: one C call
            reward = check_number(reward, "reward")
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 2**21:
        raise InvalidInput(f"version must be an integer in 0..2^21-1, got {describe(version)}")
    if not isinstance(finish_reason, str) or len(finish_reason) > 32:
        raise InvalidInput("finish_reason must be a short string")
    check_text(finish_reason, "finish_reason")
    vs = _int32_tuple(versions, "versions")
    return reward, vs


_INT_ONLY = {int}
_REWARD_TYPES = {float, type(None)}
_VERSION_LIST_TYPES = {list, tuple}


def check_sample_columns(slots: tuple[Any, ...], rewards: tuple[Any, ...], versions: tuple[Any, ...],
                         finish_reasons: tuple[Any, ...],
                         version_lists: tuple[Any, ...]) -> tuple[tuple[float | None, ...], tuple[tuple[int, ...], ...]]:
    """check_sample_fields over whole columns (one value per sample each): (rewards, version lists).

    The common case (what the codec decodes: exact ints, floats or None, short UTF-8 strings, lists of
    int32s) is checked a column at a time in C (~1 us for 8 samples against ~8 for one call per
    sample, on every leased group); anything else goes through check_sample_fields sample by sample,
    so the accepted values and every error are exactly its own. Raises InvalidInput.
    """
    try:
        fast = (set(map(type, slots)) <= _INT_ONLY and set(map(type, versions)) <= _INT_ONLY
                and set(map(type, rewards)) <= _REWARD_TYPES and set(map(type, finish_reasons)) <= {str}
                and set(map(type, version_lists)) <= _VERSION_LIST_TYPES)
        if fast and slots:
            fast = (0 <= min(slots) and max(slots) <= MAX_SLOT and 0 <= min(versions) and max(versions) < 2**21
                    and max(map(len, finish_reasons)) <= 32
                    and math.isfinite(math.fsum(r for r in rewards if r is not None)))
            "".join(finish_reasons).encode("utf-8")
            flat = [v for vs in version_lists for v in vs]
            packer("i", len(flat)).pack(*flat)  # type and int32 range of every version, in C
    except (TypeError, ValueError, OverflowError, struct.error):  # UnicodeEncodeError is a ValueError
        fast = False
    if fast:
        return tuple(rewards), tuple(map(tuple, version_lists))
    checked = [check_sample_fields(*f) for f in zip(slots, rewards, versions, finish_reasons, version_lists)]
    return tuple(r for r, _ in checked), tuple(v for _, v in checked)


class CompletedGroup:
    """A completed group inside a lease: the pristine group and its samples.

    ``CompletedGroup(entry_id, group, samples, attempt, min_version)`` builds one from Samples (tests,
    users); a lease builds it from the decoded columns (``from_columns``) and makes ``samples`` only
    on first access: a trainer that reads ``columns()`` into tensors never pays for 4,096 Python
    objects per group. Either way each view is built once and cached, and both hold the same values.
    Immutable like a frozen dataclass (the columns' arrays are shared: treat them as read-only);
    equality compares entry_id, group, samples, attempt and min_version.
    """

    __slots__ = ("entry_id", "group", "attempt", "min_version", "_samples", "_columns")
    entry_id: str
    group: SourceGroup
    attempt: int
    min_version: int
    _samples: tuple[Sample, ...] | None  # one of the two is set at construction; the other is built on demand
    _columns: "SampleColumns | None"

    def __init__(self, entry_id: str, group: SourceGroup, samples: Sequence[Sample], attempt: int,
                 min_version: int) -> None:
        self._set(entry_id, group, tuple(samples), None, attempt, min_version)

    @classmethod
    def from_columns(cls, entry_id: str, group: SourceGroup, columns: SampleColumns, attempt: int,
                     min_version: int) -> "CompletedGroup":
        """A group whose samples are built from ``columns`` when first read (the lease path)."""
        out = cls.__new__(cls)
        out._set(entry_id, group, None, columns, attempt, min_version)
        return out

    def _set(self, entry_id: str, group: SourceGroup, samples: tuple[Sample, ...] | None,
             columns: SampleColumns | None, attempt: int, min_version: int) -> None:
        for name, value in (("entry_id", entry_id), ("group", group), ("_samples", samples), ("_columns", columns),
                            ("attempt", attempt), ("min_version", min_version)):
            object.__setattr__(self, name, value)

    @property
    def samples(self) -> tuple[Sample, ...]:
        """The samples, slot order as completed (built from the columns on first access, then cached)."""
        samples = self._samples
        if samples is None:
            assert self._columns is not None  # _set's callers give one of the two
            # Two threads racing here build equal tuples; either may be kept.
            samples = self._columns.samples()
            object.__setattr__(self, "_samples", samples)
        return samples

    def columns(self) -> SampleColumns:
        """Every sample's tokens, logprobs and fields as flat columns (see SampleColumns), zero-copy
        for a leased group: ``torch.frombuffer(g.columns().token_ids, dtype=torch.int32)``."""
        columns = self._columns
        if columns is None:
            from rollout_queue.core.columns import SampleColumns

            assert self._samples is not None  # _set's callers give one of the two
            columns = SampleColumns.of(self._samples)
            object.__setattr__(self, "_columns", columns)
        return columns

    def _values(self) -> tuple[Any, ...]:
        return (self.entry_id, self.group, self.samples, self.attempt, self.min_version)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((self.entry_id, self.attempt, self.min_version))

    def __repr__(self) -> str:
        return ("CompletedGroup(entry_id={!r}, group={!r}, samples={!r}, attempt={!r}, min_version={!r})"
                .format(*self._values()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # copy.copy / deepcopy rebuild it through the constructor (slot-state restore would hit __setattr__).
        return (CompletedGroup, (self.entry_id, self.group, self.samples, self.attempt, self.min_version))


@dataclass(frozen=True)
class Progress:
    """What a worker process says of itself in each heartbeat: groups completed and tokens generated
    since it started, and for how long it has run. Operators read rates from it (`rollout-queue
    workers`, `top`, the exporter's per-worker counters): the queue stores the last one per worker.

    ``sample_tokens`` and ``sample_seconds``: how many of its samples fell in each bucket of
    core/histograms.py's TOKEN_BUCKETS and SECOND_BUCKETS (one count per edge plus one above the
    last; not cumulative), since it started; ``()`` when it reports none. `rollout-queue stats` and
    the exporter add them over the workers."""

    groups: int
    tokens: int
    uptime_ms: int
    sample_tokens: tuple[int, ...] = ()
    sample_seconds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("groups", "tokens", "uptime_ms"):
            check_int(getattr(self, name), f"progress {name}")
        for name, edges in (("sample_tokens", TOKEN_BUCKETS), ("sample_seconds", SECOND_BUCKETS)):
            items = check_items(getattr(self, name), object, f"progress {name}")
            counts = tuple(check_int(c, f"progress {name}[{i}]") for i, c in enumerate(items))
            if counts and len(counts) != bucket_count(edges):
                raise InvalidInput(f"progress {name} must have {bucket_count(edges)} counts (one per bucket of "
                                   f"core/histograms.py) or none, got {len(counts)}")
            object.__setattr__(self, name, counts)


@dataclass(frozen=True)
class HeartbeatInfo:
    """What a heartbeat learns: the policy version to generate with and whether admission is held."""

    version: int
    version_published: bool
    weights_uri: str | None
    held: bool
    server_ms: int


@dataclass(frozen=True)
class PushTicket:
    """A worker's place in one round of a weights push (push_join.lua): its rank (the trainer is 0),
    the version pushed and the folder URI it will be recorded with, where to rendezvous, and how
    long the round has left (ms, from the server's clock)."""

    epoch: int
    rank: int
    version: int
    uri: str
    addr: str
    backend: str
    remaining_ms: int


@dataclass(frozen=True)
class PushSeal:
    """The fixed membership of a sealed round (push_seal.lua): ``world`` counts the trainer (rank 0);
    ``members`` maps each worker id to its rank."""

    epoch: int
    world: int
    members: dict[str, int]


#: Why an adopted completion's tokens were thrown away, each counted in counters.tokens_<reason> by the
#: drop that deletes its payload (lua/include/payloads.lua): evicted stale or by overflow, its lease rolled
#: back or expired (the group is generated again), handed back after a trainer error, dead-lettered;
#: a group its worker filtered (filter.lua) and an attempt aborted keeping no progress (abort.lua): the
#: tokens the worker says it generated for them.
DISCARD_REASONS = ("stale", "overflow", "rolled_back", "expired", "trainer_error", "dead", "filtered", "aborted")


@dataclass(frozen=True)
class TokenWaste:
    """Where the queue's generated tokens went (DESIGN: Token accounting): ``generated`` counts the
    tokens of every completion the buffer adopted (and of every group its worker filtered or aborted
    keeping no progress, with the count it gave), ``trained`` those of committed leases,
    ``discarded`` those thrown away by reason (DISCARD_REASONS), ``continued`` those taken over from
    progress records instead of generated again (partial rollouts). Generated tokens not yet trained
    nor discarded are held by buffered or leased groups. Why: a queue that throws generated tokens
    away (stale evictions, no admission control, rollbacks) is paying GPUs for nothing, and this is
    the number that says so."""

    generated: int
    trained: int
    discarded: Mapping[str, int]
    continued: int

    @classmethod
    def from_counters(cls, counters: Mapping[str, int]) -> TokenWaste:
        return cls(generated=counters.get("tokens_generated", 0), trained=counters.get("tokens_trained", 0),
                   discarded={k: counters.get(f"tokens_{k}", 0) for k in DISCARD_REASONS},
                   continued=counters.get("partial_continued", 0))

    @property
    def discarded_total(self) -> int:
        return sum(self.discarded.values())

    @property
    def per_trained(self) -> float | None:
        """Tokens generated per token trained (1.0 wastes nothing); None before anything was trained."""
        return self.generated / self.trained if self.trained else None


@dataclass(frozen=True)
class QueueStats:
    """One consistent snapshot of a queue (DESIGN: stats). Group counts by state, then totals."""

    backlog: int
    ready: int
    executing_groups: int
    executing_samples: int
    completed: int
    leased: int
    retained: int
    committed: int
    filtered: int
    dead: int
    version: int
    version_published: bool
    submitted: int
    kept: int
    workers_alive: int
    workers_silent: int
    active_leases: int
    active_holds: int
    staleness_max: int | None
    staleness_mean: float | None
    evictions: Mapping[str, int]
    terminals: Mapping[str, int]
    filtered_by_reason: Mapping[str, int]
    counters: Mapping[str, int]
    # Bookkeeping kept after settlement: one ledger line per entry and one ids field per source_id,
    # each removed settled_retention_s after the group settled (the reaper prunes them).
    ledger_lines: int = 0
    #: Redis restarts or failovers the queue clock noticed (their downtime did not count: now_ms.lua).
    outages: int = 0
    source_ids: int = 0
    #: Milliseconds since a trainer last committed, on the queue clock (Redis downtime does not
    #: count); None before the first commit. A growing value with groups completed means the trainer
    #: is stalled.
    since_commit_ms: int | None = None
    #: The buffer by the version each group is judged by (its oldest sample version; in
    #: staleness_mode 'continue' its samples' newest, DESIGN: Staleness modes): (version, completed
    #: groups) pairs, oldest first
    #: (stats.lua lists at most 64 distinct versions; newer groups are counted at the 65th).
    buffer_versions: tuple[tuple[int, int], ...] = ()
    #: Progress records of unfinished attempts (partial rollouts) now kept; their bytes are
    #: ``counters['partial_bytes']``, the tokens handed to a next attempt instead of generated again
    #: ``counters['partial_continued']`` and those dropped as already stale ``counters['partial_stale']``.
    partial_records: int = 0
    #: The queue's ``QueueConfig.staleness_mode`` (``drop``, ``continue`` or ``pace``; a stored value
    #: that is none of them as stored, '' when none is stored). Reserves admission control turned
    #: away are ``counters['admission_waits']``, groups the fairness rule widened the bound of are
    #: not counted apart (their evictions are ``evictions['stale']``).
    staleness_mode: str = "continue"

    @property
    def waste(self) -> TokenWaste:
        """The token accounting of the counters: generated, trained, discarded by reason, continued."""
        return TokenWaste.from_counters(self.counters)

    @property
    def admission_batch(self) -> int | None:
        """The queue's admission control batch (``QueueConfig.batch_groups``, the stored value the
        counters carry; the logical one on a partitioned queue); None while admission control is
        off or left to a trainer that has not derived it yet: generation may then run ahead of
        training without bound."""
        value = self.counters.get("batch_groups", 0)
        return value if value > 0 else None


@dataclass(frozen=True)
class ReapReport:
    """What one reap pass did. ``pruned``: settled groups whose ledger line (and source_id mapping)
    outlived ``settled_retention_s`` and were deleted. ``finished``: entries a restore or checkpoint
    whose caller died between batches still had to move (requeued or dropped). ``reindexed``:
    owned entries an index had lost (re-indexed or requeued). ``settled``: groups a worker's script
    parked (dead or filtered: the worker role holds no XACK) that the pass settled."""

    lost: int = 0
    expired: int = 0
    stale: int = 0
    dead: int = 0
    holds_expired: int = 0
    orphans: int = 0
    pruned: int = 0
    finished: int = 0
    reindexed: int = 0
    settled: int = 0

    def __add__(self, other: "ReapReport") -> "ReapReport":
        return ReapReport(*(a + b for a, b in zip(_astuple(self), _astuple(other))))

    @property
    def total(self) -> int:
        return sum(_astuple(self))


@dataclass(frozen=True)
class DeadLetter:
    """A reservation settled dead: why, every attempt's reason, and the pristine group if decodable."""

    dlq_id: str
    entry_id: str
    source_id: str
    reason: str
    attempt: int
    worker_id: str
    history: tuple[Mapping[str, Any], ...]
    group: SourceGroup | None
    fields: Mapping[bytes, bytes]  # the pristine reservation's fields, as stored
    #: the queue (partition) whose dead-letter stream holds it: requeue it there
    queue: str = ""


@dataclass(frozen=True)
class OwnedAttempt:
    """One PEL entry owned by a worker: the exact receipt that settles it (attempt = the delivery
    count) and ``idle_ms``, the ms since its delivery (the grant by ``reserve``; a replayed reserve
    reply does not reset it, a new grant does)."""

    receipt: Receipt
    idle_ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.idle_ms, int) or isinstance(self.idle_ms, bool) or self.idle_ms < 0:
            raise InvalidInput(f"idle_ms must be an integer >= 0, got {self.idle_ms!r}")

    @property
    def entry_id(self) -> str:
        return self.receipt.entry_id


@dataclass(frozen=True)
class Produced:
    """What one produce call did. ``status``: 'ok' (enqueued), 'replay' (this batch was already
    enqueued: a resent call) or 'backlog_full' (nothing written; wait and retry)."""

    status: str
    cursor: int
    new: int
    backlog: int


def _astuple(r: ReapReport) -> tuple[int, ...]:
    return tuple(getattr(r, f.name) for f in dataclasses.fields(r))


def check_text(text: str, what: str) -> str:
    """Text stored in Redis must be valid UTF-8: a lone surrogate (e.g. from surrogateescape
    decoding) would otherwise fail deep in the encoder with an untyped error."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} is not valid UTF-8 text: {exc}") from exc
    return text


def check_group_sizes(groups: Sequence[SourceGroup], limit: int, partitions: int = 1,
                      logical: int | None = None) -> None:
    """Refuse a batch (GroupTooLarge, before anything is sent) if one of its groups has more samples
    than ``limit``, the largest group the queue can ever execute. Stored, such a group could only be
    dead-lettered at its first reserve, and a group valid for the queue must never be."""
    for g in groups:
        if g.n > limit:
            raise GroupTooLarge(g.source_id, g.n, limit, partitions, logical)


def logprobs_ok(values: Sequence[float]) -> bool:
    """True when every logprob is <= 0 and none is NaN (an empty sequence is fine).

    C-speed checks (a per-token Python loop cost ~0.3 ms per 8x512 group, the trainer's top profile
    entry): a NaN anywhere makes the sum NaN, and max finds any positive value.
    """
    if not values:
        return True
    total = sum(values)
    return total == total and max(values) <= 0.0



_FLOAT_ONLY = {float}
_PLAIN_SEQUENCES = (tuple, list)


def _float_tuple(values: Sequence[float]) -> tuple[float, ...]:
    """Logprobs as a tuple of floats, converted in C (array('d') refuses non-numbers).

    A tuple or list whose items are all exact floats (what a worker usually passes, and what decoding
    makes) is kept or copied as it is: checking the item types in C costs half of converting them.
    """
    if type(values) in _PLAIN_SEQUENCES and (not values or set(map(type, values)) == _FLOAT_ONLY):
        return tuple(values)
    if isinstance(values, (str, bytes, bytearray, Mapping)):  # array('d', bytes) reads raw doubles
        raise InvalidInput(f"logprobs must be a sequence of numbers, got {type(values).__name__}")
    try:
        return tuple(array("d", values))
    except (TypeError, OverflowError) as exc:  # OverflowError: an int too large for a double
        raise InvalidInput(f"logprobs must be numbers: {exc}") from exc


def _int32_tuple(values: Any, what: str) -> tuple[int, ...]:
    """``values`` as a tuple of int32s; a str, bytes (a tuple of byte values!) or non-iterable is refused."""
    if type(values) is not tuple:
        if isinstance(values, (str, bytes, bytearray, Mapping)):
            raise InvalidInput(f"{what} must be a sequence of integers, got {type(values).__name__}")
        try:
            values = tuple(values)
        except TypeError:
            raise InvalidInput(f"{what} must be a sequence of integers, got {type(values).__name__}") from None
    _check_int32s(values, what)
    return values


def _check_int32s(values: Sequence[int], what: str) -> None:
    # struct checks type and range in C (a per-element Python loop costs milliseconds per group), and
    # faster than array('i', values) does.
    try:
        packer("i", len(values)).pack(*values)
    except (TypeError, OverflowError, struct.error) as exc:
        raise InvalidInput(f"{what} must be int32 integers: {exc}") from exc
