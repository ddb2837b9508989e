"""Payload encoding: orjson for structure, packed little-endian arrays for tokens and logprobs.

Owns the byte formats of the two payloads that live in Redis: a reservation's stream fields and a
completion blob. No pickle, ever: a payload from Redis is data, and decoding it must never run code.
Pure functions, no I/O. Decoding garbage raises CodecError with what is wrong.

Completion blob (schema 1):
    b"RQC1" | u32 LE header length | orjson header | int32 LE token ids | float32 LE logprobs
header = {"v": 1, "s": [[slot, n_tokens, has_logprobs, reward|null, version, finish_reason,
                          [versions...]], ...]}
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any, Mapping, Sequence

import orjson

from .errors import InvalidInput
from .models import Sample, SourceGroup

SCHEMA_VERSION = 1
_MAGIC = b"RQC1"
_HEAD = struct.Struct("<I")
_LITTLE = sys.byteorder == "little"


class CodecError(InvalidInput):
    """Bytes that do not decode as the documented format."""


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
    """One blob for all samples of a completion."""
    head = []
    tokens = array("i")
    logprobs = array("f")
    for s in samples:
        head.append([s.slot, len(s.token_ids), 1 if s.logprobs else 0, s.reward, s.version, s.finish_reason,
                     list(s.versions)])
        tokens.extend(s.token_ids)
        logprobs.extend(s.logprobs)
    if not _LITTLE:
        tokens.byteswap()
        logprobs.byteswap()
    header = orjson.dumps({"v": SCHEMA_VERSION, "s": head})
    return b"".join((_MAGIC, _HEAD.pack(len(header)), header, tokens.tobytes(), logprobs.tobytes()))


def decode_completion(blob: bytes) -> tuple[Sample, ...]:
    """The samples of a completion blob; CodecError for anything that is not schema 1."""
    if blob[:4] != _MAGIC or len(blob) < 8:
        raise CodecError("not a completion payload (bad magic)")
    (hlen,) = _HEAD.unpack_from(blob, 4)
    try:
        header = orjson.loads(blob[8:8 + hlen])
    except orjson.JSONDecodeError as exc:
        raise CodecError(f"completion header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or header.get("v") != SCHEMA_VERSION:
        raise CodecError(f"unknown completion schema {header.get('v') if isinstance(header, dict) else header!r}")
    rows = header.get("s")
    if not isinstance(rows, list):
        raise CodecError("completion header has no sample list")
    try:
        if any(int(r[1]) < 0 for r in rows):
            raise ValueError("negative token count")
        n_tokens = sum(int(r[1]) for r in rows)
        n_logprobs = sum(int(r[1]) for r in rows if r[2])
    except (TypeError, ValueError, IndexError) as exc:
        raise CodecError(f"bad sample row: {exc}") from exc
    body = memoryview(blob)[8 + hlen:]
    if len(body) != 4 * (n_tokens + n_logprobs):
        raise CodecError(f"completion body is {len(body)} bytes, header says {4 * (n_tokens + n_logprobs)}")
    tokens = array("i")
    tokens.frombytes(body[: 4 * n_tokens])
    logprobs = array("f")
    logprobs.frombytes(body[4 * n_tokens:])
    if not _LITTLE:
        tokens.byteswap()
        logprobs.byteswap()
    out = []
    t = lp = 0
    for row in rows:
        try:
            slot, count, has_lp, reward, version, finish, versions = row
            count = int(count)
            lps = logprobs[lp:lp + count] if has_lp else ()
            out.append(Sample(slot, tuple(tokens[t:t + count]), tuple(lps), reward, version, finish, tuple(versions)))
        except (TypeError, ValueError) as exc:  # a short row, a non-list versions; InvalidInput is a ValueError
            raise CodecError(f"bad sample in completion: {exc}") from exc
        t += count
        lp += count if has_lp else 0
    return tuple(out)
