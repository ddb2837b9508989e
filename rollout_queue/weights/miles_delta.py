"""miles' disk-delta weight folders, read by the queue's workers.

miles (radixark/miles@31f1ca96, ``--update-weight-transfer-mode disk-delta``,
``miles/backends/megatron_utils/update_weight/update_weight_from_distributed/delta.py``) publishes
each weight version ``N`` as ``<--update-weight-disk-dir>/weight_v{N:06d}/``: safetensors files whose
tensors are the zstd-compressed byte-level changes of each HF tensor since version ``N - 1``
(``xor``: new ^ old, an involution that must be applied exactly once, in order; ``overwrite``: a
u4 count, u4 positions, then the new bytes), each file's safetensors metadata the checksum of each
changed tensor's new bytes, and ``model.safetensors.index.json`` with ``metadata`` (``version``,
``base_version``, ``delta_encoding``, ``compression_format``, ``checksum_format``) and
``weight_map``. Version 0 is the ``--hf-checkpoint`` itself. miles' own engines apply them in
sglang; this module is the same apply for the queue's workers, which the version record names by
that folder (``integrations/miles/weights.py``).

Rules:
1. A version is materialized as a full HF folder ``<cache>/<root key>/v{N:07d}``, complete the
   instant its name exists (built aside, renamed: ``store.atomic_folder``), from the newest
   materialized version below it, applying each delta after it in order. A file no delta touches
   is hard-linked, a touched one copied and patched, so a step costs the bytes that changed.
2. Every patched tensor's new bytes are checked against the checksum miles recorded before the
   folder is renamed; a mismatch (a wrong base, a skipped or repeated xor) raises WeightsError and
   leaves nothing behind. A missing delta folder in the sequence does too.
3. The base is ``$ROLLOUT_MILES_BASE`` (a local copy of the trainer's ``--hf-checkpoint``), else the
   path the trainer's hook recorded in ``rollout-queue-base.json`` in the delta folder.
4. Older materialized versions are removed, the newest ``keep`` kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from rollout_queue.core.errors import WeightsError
from rollout_queue.weights.store import atomic_folder

__all__ = ["BASE_RECORD", "is_miles_delta", "materialize", "miles_version"]

#: Written by the trainer's hook in the delta folder at miles' baseline: where version 0 is.
BASE_RECORD = "rollout-queue-base.json"
INDEX = "model.safetensors.index.json"
_FOLDER = re.compile(r"^weight_v(\d{6,})$")
_MATERIALIZED = re.compile(r"^v(\d{7,})$")


def _index(folder: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) and "delta_encoding" in (raw.get("metadata") or {}) else None


def is_miles_delta(folder: Path) -> bool:
    """Whether ``folder`` is a miles disk-delta version (its name and its index say so)."""
    return bool(_FOLDER.match(folder.name)) and _index(folder) is not None


def miles_version(folder: Path) -> int:
    match = _FOLDER.match(folder.name)
    if match is None:
        raise WeightsError(f"{folder}: not a miles weight_vNNNNNN folder")
    return int(match.group(1))


def _base(root: Path) -> Path:
    configured = os.environ.get("ROLLOUT_MILES_BASE")
    if configured:
        return Path(configured)
    try:
        return Path(json.loads((root / BASE_RECORD).read_text())["hf_checkpoint"])
    except (OSError, ValueError, KeyError) as exc:
        raise WeightsError(f"{root}: miles deltas need their base: set ROLLOUT_MILES_BASE to a local copy of the "
                           f"trainer's --hf-checkpoint (no {BASE_RECORD} from the trainer's hook: {exc})") from exc


def _checksum(algorithm: str, data: np.ndarray) -> str:
    """miles' ``miles.utils.disk_delta.checksum``, for the algorithms it offers."""
    if algorithm == "xxh3-128":
        import xxhash

        # ``data.data``: the array's own bytes as a memoryview, no copy (numpy's stubs make an ndarray a
        # Buffer only from Python 3.12; the arrays here are uint8 and contiguous, so the bytes hashed
        # are the same).
        return str(xxhash.xxh3_128(data.data).hexdigest())
    if algorithm == "blake3":
        import blake3

        return str(blake3.blake3(data.tobytes()).hexdigest())
    if algorithm == "adler32":
        return f"{zlib.adler32(data.tobytes(), 1):08x}"
    raise WeightsError(f"unknown checksum format {algorithm!r}")


def _locations(folder: Path) -> dict[str, tuple[str, int, int]]:
    """tensor name -> (file name, byte offset, nbytes), from the safetensors headers."""
    out: dict[str, tuple[str, int, int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                out[name] = (path.name, 8 + size + begin, end - begin)
    return out


def _apply(old: np.ndarray, diff: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "xor":
        if diff.size != old.size:
            raise WeightsError(f"an xor delta of {diff.size} bytes for a tensor of {old.size}")
        return np.bitwise_xor(old, diff)
    if encoding == "overwrite":
        (count,) = np.frombuffer(diff[:4].tobytes(), "<u4")
        positions = np.frombuffer(diff[4:4 + 4 * int(count)].tobytes(), "<u4")
        new = old.copy()
        new[positions] = diff[4 + 4 * int(count):]
        return new
    raise WeightsError(f"unknown delta encoding {encoding!r}")


def _patch(target: Path, delta: Path, touched: set[str]) -> None:
    """Apply one miles delta folder to the full folder ``target`` in place (a staging copy)."""
    import safetensors.numpy
    try:
        import zstandard
    except ImportError as exc:
        raise WeightsError("reading miles deltas needs zstandard: pip install zstandard") from exc
    index = _index(delta)
    assert index is not None
    meta = index["metadata"]
    if meta.get("compression_format", "zstd") != "zstd":
        raise WeightsError(f"{delta}: compression {meta.get('compression_format')!r}, only zstd is known")
    where = _locations(target)
    for file in sorted(set(index["weight_map"].values())):
        path = delta / file
        with open(path, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            digests = json.loads(handle.read(size)).get("__metadata__") or {}
        for name, compressed in safetensors.numpy.load_file(os.fspath(path)).items():
            if name not in where:
                raise WeightsError(f"{delta}: tensor {name!r} is not in the base checkpoint")
            fname, offset, nbytes = where[name]
            if fname not in touched:  # a hard link shares the base's bytes: copy before writing
                shutil.copyfile(target / fname, target / f".{fname}.copy")
                os.replace(target / f".{fname}.copy", target / fname)
                touched.add(fname)
            with open(target / fname, "r+b") as handle:
                handle.seek(offset)
                old = np.frombuffer(handle.read(nbytes), dtype=np.uint8)
                new = _apply(old, np.frombuffer(zstandard.ZstdDecompressor().decompress(compressed.tobytes()),
                                                dtype=np.uint8), meta["delta_encoding"])
                expected = digests.get(name)
                if expected is None or _checksum(meta["checksum_format"], new) != expected:
                    raise WeightsError(f"{delta}: {name!r} does not match the checksum miles recorded after the "
                                       "apply (a wrong base, or a delta skipped or applied twice); nothing was loaded")
                handle.seek(offset)
                handle.write(new.tobytes())


def default_cache() -> Path:
    from rollout_queue.weights.fetch import default_cache as root

    return root() / "miles"


def materialize(folder: Path, cache: Path | None = None, *, keep: int = 2) -> Path:
    """The full local HF folder of the miles version at ``folder`` (rules 1-4). Raises WeightsError."""
    folder = Path(folder).resolve()
    version, root = miles_version(folder), folder.parent
    store = (cache or default_cache()) / hashlib.sha256(os.fspath(root).encode()).hexdigest()[:16]
    target = store / f"v{version:07d}"
    if target.is_dir():
        return target
    have = sorted((int(m.group(1)), p) for p in (store.iterdir() if store.is_dir() else ())
                  if (m := _MATERIALIZED.match(p.name)) and int(m.group(1)) < version)
    start, source = have[-1] if have else (0, _base(root))
    if not source.is_dir():
        raise WeightsError(f"{source}: the base checkpoint of {root} is not there")
    deltas = [root / f"weight_v{v:06d}" for v in range(start + 1, version + 1)]
    for delta in deltas:
        if _index(delta) is None:
            raise WeightsError(f"{delta}: missing or not a miles delta; version {version} cannot be rebuilt")

    def fill(staging: Path) -> None:
        for item in source.iterdir():
            if item.is_file() and not item.name.startswith("."):
                _link_or_copy(item, staging / item.name)
        touched: set[str] = set()
        for delta in deltas:
            _patch(staging, delta, touched)

    atomic_folder(target, fill)
    for _, old in have[:len(have) - max(0, keep - 1)]:
        shutil.rmtree(old, ignore_errors=True)  # a folder another worker removed first is the outcome wanted
    return target


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link (the bytes are shared until a delta touches the file), a copy across filesystems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
