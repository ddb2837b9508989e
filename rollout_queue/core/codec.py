"""Payload encoding: orjson for structure, packed little-endian arrays for tokens and logprobs.

Owns the byte formats of the two payloads that live in Redis: a reservation's stream fields and a
completion blob. No pickle, ever: a payload from Redis is data, and decoding it must never run code.
Pure functions, no I/O. Decoding garbage raises CodecError with what is wrong.

Completion blob, schema 2 (written whenever every token id is in 0..2^24-1, i.e. any real vocabulary):
    b"RQC2" | u32 LE header length | orjson header | uint24 LE token ids | float32 LE logprobs
Completion blob, schema 1 (written when some id is negative or >= 2^24; also what older writers stored):
    b"RQC1" | u32 LE header length | orjson header | int32 LE token ids | float32 LE logprobs
header = {"v": <schema>, "s": [[slot, n_tokens, has_logprobs, reward|null, version, finish_reason,
                                [versions...]], ...]}
A trajectory's row has two more fields: [role, n, version, role, n, version, ...] (its turns as run
lengths, role 1 for the model and 0 for an observation: the loss mask costs three small integers per
turn, not a byte per token) and its metadata object or null. A single-turn sample's row stays 7 fields,
so it costs exactly what it did before trajectories existed; a reader older than 9-field rows refuses
them (readers first, as always).
Completion blob, schemas 3 and 4 (written only when some sample has per-token versions, Sample.segments):
    b"RQC3" | ... as schema 2 (uint24 LE ids)        b"RQC4" | ... as schema 1 (int32 LE ids)
their rows may have a 10th field, the sample's segments as run lengths [offset, version, offset,
version, ...] (a 10-field row fills the turns with [] and the metadata with null when it has none). A
completion without segments is still written as schema 2 or 1, byte for byte, so readers of those
read it; a reader older than schema 3 refuses schemas 3 and 4 by their magic, never drops the
per-token versions silently.
The magic and the header's "v" name the schema (and so the id width) twice; they must agree. The
decoder reads every schema, so blobs stored before an upgrade stay readable; readers (trainers) must be
upgraded before writers (workers), since an older reader refuses a newer schema. Logprobs stay float32
in all of them.

Progress record (partial rollouts, the `partial` hash): a completion blob, any schema, of the samples
an unfinished attempt had so far (one per slot that produced tokens, finish_reason "abort" for one
cut short, its own for one that had ended), with their segments: encode_partial / decode_partial.

Completed-groups packet (a lease's groups sent between trainer ranks; never stored in Redis):
    b"RQG1" | u32 LE header length | orjson header | per group: body bytes, then completion blob
header = [[entry_id, source_id, n, attempt, min_version, body length, blob length], ...]
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any, Mapping, Sequence

import orjson

from rollout_queue.core.checks import packer
from rollout_queue.core.errors import CodecError, InvalidInput
from rollout_queue.core.columns import SampleColumns
from rollout_queue.core.models import MODEL, OBSERVATION, CompletedGroup, Sample, SourceGroup, Turn

#: The schema of a reservation's stream fields (the ``v`` field that submit writes).
SCHEMA_VERSION = 1
#: The completion schema written when every token id fits 24 bits; COMPLETION_SCHEMA_WIDE otherwise.
COMPLETION_SCHEMA = 2
COMPLETION_SCHEMA_WIDE = 1
#: The same two when some sample has segments (per-token versions): rows may carry a 10th field.
COMPLETION_SCHEMA_SEGMENTS = 3
COMPLETION_SCHEMA_SEGMENTS_WIDE = 4
#: magic -> (schema, bytes per token id, row lengths it allows)
_SCHEMAS = {b"RQC2": (COMPLETION_SCHEMA, 3, (7, 9)), b"RQC1": (COMPLETION_SCHEMA_WIDE, 4, (7, 9)),
            b"RQC3": (COMPLETION_SCHEMA_SEGMENTS, 3, (7, 9, 10)),
            b"RQC4": (COMPLETION_SCHEMA_SEGMENTS_WIDE, 4, (7, 9, 10))}
_HEAD = struct.Struct("<I")
_LITTLE = sys.byteorder == "little"
_EMPTY_COLUMNS = SampleColumns(array("i"), array("f"), (), (), (), (), (), (), ())


def encode_group(group: SourceGroup) -> tuple[bytes, bytes]:
    """The parents field (JSON the scripts validate) and the body field (orjson) of a reservation."""
    parents = orjson.dumps([{"slot": i, "uid": group.parent_uid(i)} for i in range(group.n)])
    body: dict[str, Any] = {"prompt": group.prompt, "metadata": dict(group.metadata)}
    if group.prompt_token_ids is not None:
        body["prompt_token_ids"] = list(group.prompt_token_ids)
    try:
        encoded = orjson.dumps(body)
    except TypeError as exc:
        raise InvalidInput(f"metadata of {group.source_id!r} is not JSON-serialisable: {exc}") from exc
    return parents, encoded


def decode_group(fields: Mapping[bytes, bytes]) -> SourceGroup:
    """Rebuild the pristine SourceGroup from a stream entry's fields; CodecError if it is garbage."""
    try:
        sid = fields[b"sid"].decode()
        n = int(fields[b"n"])
        body = orjson.loads(fields[b"g"])
    except (KeyError, ValueError, UnicodeDecodeError, orjson.JSONDecodeError) as exc:
        raise CodecError(f"malformed_reservation: undecodable fields ({exc})") from exc
    if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
        raise CodecError("malformed_reservation: body has no string prompt")
    metadata = body.get("metadata") or {}
    ids = body.get("prompt_token_ids")
    try:
        return SourceGroup(sid, body["prompt"], n, metadata, None if ids is None else tuple(ids))
    except (InvalidInput, TypeError) as exc:  # TypeError: prompt_token_ids is not a list at all
        raise CodecError(f"malformed_reservation: {exc}") from exc


def encode_completion(samples: Sequence[Sample]) -> bytes:
    """One blob for all samples of a completion: schema 2 (3-byte ids) when every id is in 0..2^24-1.

    Packs each sample's ids and logprobs with one ``struct`` call each (``_pack``, checks.packer:
    ~2.5 us per 512 values, against ~6.5 us for ``array(code, tuple)``), then, for schema 2, drops the high byte of every
    little-endian int32 with three strided byte copies. ~55 us per 8 x 512 group with logprobs.
    """
    head = []
    tokens: list[bytes] = []
    logprobs: list[bytes] = []
    segmented = False
    for s in samples:
        row: list[Any] = [s.slot, len(s.token_ids), 1 if s.logprobs else 0, s.reward, s.version, s.finish_reason,
               list(s.versions)]
        if s.turns or s.metadata is not None or s.segments:
            row += [[x for t in s.turns for x in (1 if t.trained else 0, t.n_tokens, t.version)], s.metadata]
        if s.segments:
            row.append([x for pair in s.segments for x in pair])
            segmented = True
        head.append(row)
        tokens.append(_pack("i", s.token_ids))
        if s.logprobs:
            logprobs.append(_pack("f", s.logprobs))
    wide = b"".join(tokens)
    n = len(wide) // 4
    if wide[3::4].count(0) == n:  # every high byte is 0: all ids are in 0..2^24-1
        magic, schema = (b"RQC3", COMPLETION_SCHEMA_SEGMENTS) if segmented else (b"RQC2", COMPLETION_SCHEMA)
        packed = bytearray(3 * n)
        packed[0::3] = wide[0::4]
        packed[1::3] = wide[1::4]
        packed[2::3] = wide[2::4]
        ids = bytes(packed)
    else:
        magic, schema = (b"RQC4", COMPLETION_SCHEMA_SEGMENTS_WIDE) if segmented else (b"RQC1", COMPLETION_SCHEMA_WIDE)
        ids = wide
    header = orjson.dumps({"v": schema, "s": head})
    return b"".join((magic, _HEAD.pack(len(header)), header, ids, *logprobs))


def encode_partial(samples: Sequence[Sample]) -> bytes:
    """The progress record of an unfinished attempt: its samples so far as a completion blob.

    A trajectory's sample keeps its turns, and its metadata the environment's snapshot (DESIGN:
    Partial rollouts); a record without them reads as before. Raises InvalidInput for no samples, a
    sample without tokens or logprobs (a continuation keeps the prefix's behaviour logprobs; without
    them it could not be importance-corrected), or a slot named twice."""
    if not samples:
        raise InvalidInput("a progress record needs at least one sample with tokens")
    slots = [s.slot for s in samples]
    if len(set(slots)) != len(slots):
        raise InvalidInput(f"a progress record names a slot twice: {sorted(slots)}")
    for s in samples:
        if not s.token_ids or len(s.logprobs) != len(s.token_ids):
            raise InvalidInput(f"progress of slot {s.slot} needs tokens and one logprob per token")
    return encode_completion(samples)


def decode_partial(blob: bytes, n: int) -> dict[int, Sample]:
    """The samples of a progress record by slot; CodecError for anything ``encode_partial`` would not
    write for a group of ``n`` slots (the caller then starts from the prompt)."""
    samples = decode_completion(blob)
    out: dict[int, Sample] = {}
    for s in samples:
        if not 0 <= s.slot < n or s.slot in out:
            raise CodecError(f"progress record names slot {s.slot} twice or outside the group's {n}")
        if not s.token_ids or len(s.logprobs) != len(s.token_ids):
            raise CodecError(f"progress of slot {s.slot} has no tokens or no logprobs")
        out[s.slot] = s
    return out


def _pack(code: str, values: Sequence[Any]) -> bytes:
    """``values`` as little-endian int32 (``code`` "i") or float32 ("f") bytes, whatever the host's
    byte order. A Sample's values are already checked (int32 ids, logprobs <= 0 and not NaN); the one
    value struct refuses that array accepts is a finite logprob below float32's range, which array
    rounds to -inf as the codec always stored it, so that rare case goes through array."""
    try:
        return packer(code, len(values)).pack(*values)
    except (OverflowError, struct.error):
        packed = array(code, values)
        if not _LITTLE:
            packed.byteswap()
        return packed.tobytes()


def decode_completion(blob: bytes) -> tuple[Sample, ...]:
    """The samples of a completion blob (any schema, 1 to 4); CodecError for anything else.

    decode_columns, then one Sample per sample: the same checks, and the same errors, as the columns.
    """
    return decode_columns(blob).samples()


def decode_columns(blob: bytes) -> SampleColumns:
    """The samples of a completion blob (any schema, 1 to 4) as columns; CodecError for anything else.

    Checks the blob completely (header, lengths, every per-sample field, and the logprob rule over the
    whole float32 array at C speed), so an undecodable payload is found when it is leased, but
    builds no Python object per token: the ids are widened into one array('i') and the logprobs
    stay the blob's array('f') (SampleColumns says how to slice them).
    """
    if not isinstance(blob, bytes):
        blob = bytes(blob)
    if len(blob) < 8 or blob[:4] not in _SCHEMAS:
        raise CodecError("not a completion payload (bad magic)")
    schema, width, lengths = _SCHEMAS[blob[:4]]
    (hlen,) = _HEAD.unpack_from(blob, 4)
    start = 8 + hlen
    if start > len(blob):
        raise CodecError(f"completion header length {hlen} runs past the end of a {len(blob)}-byte blob")
    try:
        header = orjson.loads(blob[8:start])
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"completion header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or header.get("v") != schema:
        got = header.get("v") if isinstance(header, dict) else header
        raise CodecError(f"unknown completion schema {got!r} (the magic {blob[:4]!r} says schema {schema})")
    rows = header.get("s")
    if not isinstance(rows, list):
        raise CodecError("completion header has no sample list")
    n_tokens, n_logprobs = _count(rows, lengths)
    expected = width * n_tokens + 4 * n_logprobs
    if len(blob) - start != expected:
        raise CodecError(f"completion body is {len(blob) - start} bytes, header says {expected} "
                         f"({n_tokens} ids of {width} bytes, {n_logprobs} float32 logprobs)")
    tokens, logprobs = _unpack(blob, start, width, n_tokens)
    try:
        # The columns check the logprob rule first, then each row's fields (as Sample would).
        if not rows:
            return _EMPTY_COLUMNS
        if all(len(row) == 7 for row in rows):
            return SampleColumns(tokens, logprobs, *zip(*rows))
        turns = tuple(_turns(row[7]) if len(row) > 7 else () for row in rows)
        metadata = tuple(row[8] if len(row) > 7 else None for row in rows)
        segments = tuple(_segments(row[9]) if len(row) == 10 else () for row in rows)
        # The seven per-sample columns by name (_count checked every row has them), then the others.
        slots, counts, has_logprobs, rewards, versions, reasons, version_lists = zip(*(row[:7] for row in rows))
        return SampleColumns(tokens, logprobs, slots, counts, has_logprobs, rewards, versions, reasons,
                             version_lists, turns if any(turns) else (),
                             metadata if any(m is not None for m in metadata) else (),
                             segments if any(segments) else ())
    except (TypeError, ValueError) as exc:  # a non-list versions; InvalidInput is a ValueError
        raise CodecError(f"bad sample in completion: {exc}") from exc


_ROLE = {1: MODEL, 0: OBSERVATION}


def _turns(flat: Any) -> tuple[Turn, ...]:
    """A row's run-length turns ([role, n, version, ...]) as Turns; ValueError for any other shape."""
    if type(flat) is not list or len(flat) % 3:
        raise ValueError(f"turns must be a list of [role, n_tokens, version] triples, got {flat!r:.80}")
    out = []
    for i in range(0, len(flat), 3):
        role = flat[i]
        if type(role) is not int or role not in _ROLE:
            raise ValueError(f"a turn's role must be 1 (model) or 0 (observation), got {role!r}")
        out.append(Turn(_ROLE[role], flat[i + 1], flat[i + 2]))
    return tuple(out)


def _segments(flat: Any) -> tuple[tuple[int, int], ...]:
    """A row's run-length segments ([offset, version, ...]) as pairs; ValueError for any other shape
    (the values are checked by SampleColumns, as Sample checks them)."""
    if type(flat) is not list or len(flat) % 2:
        raise ValueError(f"segments must be a list of [offset, version] pairs, got {flat!r:.80}")
    return tuple(zip(flat[0::2], flat[1::2]))


def _count(rows: list[Any], lengths: tuple[int, ...]) -> tuple[int, int]:
    """(tokens, logprobs) the sample rows promise; CodecError for a row of the wrong shape (``lengths``:
    the row lengths the blob's schema allows)."""
    n_tokens = n_logprobs = 0
    for row in rows:
        if type(row) is not list or len(row) not in lengths:
            raise CodecError(f"bad sample row {row!r:.200}: expected a list of 7 fields (9 for a trajectory, "
                             f"10 with per-token versions in schemas 3 and 4)")
        count = row[1]
        if type(count) is not int or count < 0:
            raise CodecError(f"bad sample row {row!r}: token count must be an integer >= 0")
        if row[2] not in (0, 1):
            raise CodecError(f"bad sample row {row!r}: has_logprobs must be 0 or 1")
        n_tokens += count
        n_logprobs += count if row[2] else 0
    return n_tokens, n_logprobs


def _unpack(blob: bytes, start: int, width: int, n_tokens: int) -> tuple["array[int]", "array[float]"]:
    """All token ids (widened to int32) and all logprobs of a body whose length was checked."""
    mid = start + width * n_tokens
    tokens = array("i")
    if width == 4:
        tokens.frombytes(blob[start:mid])
    else:  # widen each 3-byte id to a little-endian int32 with a zero high byte (bytes slicing is C speed)
        wide = bytearray(4 * n_tokens)
        wide[0::4] = blob[start:mid:3]
        wide[1::4] = blob[start + 1:mid:3]
        wide[2::4] = blob[start + 2:mid:3]
        tokens.frombytes(wide)
    logprobs = array("f")
    logprobs.frombytes(blob[mid:])
    if not _LITTLE:
        tokens.byteswap()
        logprobs.byteswap()
    return tokens, logprobs


_GROUPS_MAGIC = b"RQG1"


def encode_completed(groups: Sequence[CompletedGroup]) -> bytes:
    """A lease's completed groups as one packet (module docstring), for ranks that did not lease."""
    head: list[list[Any]] = []
    parts: list[bytes] = []
    for g in groups:
        _, body = encode_group(g.group)
        blob = encode_completion(g.samples)
        head.append([g.entry_id, g.group.source_id, g.group.n, g.attempt, g.min_version, len(body), len(blob)])
        parts += (body, blob)
    header = orjson.dumps(head)
    return b"".join((_GROUPS_MAGIC, _HEAD.pack(len(header)), header, *parts))


def decode_completed(packet: bytes) -> list[CompletedGroup]:
    """The groups of an ``encode_completed`` packet; CodecError for anything else."""
    view = memoryview(packet)
    if bytes(view[:4]) != _GROUPS_MAGIC or len(view) < 8:
        raise CodecError("not a completed-groups packet (bad magic)")
    (size,) = _HEAD.unpack_from(view, 4)
    try:
        head = orjson.loads(view[8:8 + size])
        offset = 8 + size
        groups = []
        for entry_id, source_id, n, attempt, min_version, body_len, blob_len in head:
            body = bytes(view[offset:offset + body_len])
            blob = bytes(view[offset + body_len:offset + body_len + blob_len])
            offset += body_len + blob_len
            group = decode_group({b"sid": str(source_id).encode(), b"n": str(n).encode(), b"g": body})
            groups.append(CompletedGroup.from_columns(str(entry_id), group, decode_columns(blob), int(attempt),
                                                      int(min_version)))
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise CodecError(f"malformed completed-groups packet: {exc}") from exc
    if offset != len(view):
        raise CodecError(f"malformed completed-groups packet: {len(view) - offset} trailing bytes")
    return groups
