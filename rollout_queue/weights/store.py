"""Version folders on storage: written atomically, resolved to their chain, read, pruned.

Rules:
1. A folder is complete the instant its name exists: it is written under a hidden staging name
   beside its final one and renamed (same filesystem, atomic). Its manifest is written last,
   inside the staging folder, so a manifest always describes files that exist.
2. Resolution checks everything a reader relies on before any tensor is applied: every folder of
   the chain exists, has a manifest, the versions follow each other, each file has the size the
   manifest recorded and, where the manifest recorded one, its sha256 (``check_digest``). A failure
   raises ``WeightsError`` and the engine keeps its weights. Engines resolve a chain once per load,
   off the thread that generates.
3. Pruning keeps the newest ``keep`` versions and every folder their chains need.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout_queue.core.errors import WeightsError
from rollout_queue.weights.manifest import MANIFEST_NAME, Kind, WeightManifest, read_manifest

if TYPE_CHECKING:
    import torch

DELTA_FILE = "model.safetensors"
#: What peft's save_pretrained of a PeftModel writes beside its tensors: the folder is a LoRA adapter.
ADAPTER_CONFIG = "adapter_config.json"
_VERSION_FOLDER = re.compile(r"^v\d{7,}(-[0-9a-f]+)?$")


def folder_version(name: str) -> int | None:
    """The version a folder's name says (``v0000007``, ``v0000007-1a2b3c4d``); None for any other name."""
    return int(name[1:].partition("-")[0]) if _VERSION_FOLDER.match(name) else None


def atomic_folder(target: Path, fill: Callable[[Path], None]) -> Path:
    """Run ``fill(staging)`` and rename the staging folder to ``target``. Raises FileExistsError."""
    if target.exists():
        raise FileExistsError(f"{target} exists: write each policy version to a fresh folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        fill(staging)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; workers may run as another user
        os.rename(staging, target)
    finally:
        if staging.exists():  # only when the write failed: a partial folder nobody may load
            shutil.rmtree(staging)
    return target


def save_model(model: Any, folder: Path) -> None:
    """A transformers model with ``save_pretrained``; any other module as one state-dict file."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, safe_serialization=True)
    else:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()},
                  os.fspath(folder / DELTA_FILE))


def version_folder(root: Path, version: int, *, unique: bool = False) -> Path:
    """``root/v0000007``; a fresh suffixed name when a failed earlier attempt left that one, or
    always with ``unique`` (a pushed version: its URI is announced before the folder exists, so a
    restarted trainer's same version must not share the URI of one a worker may have staged)."""
    folder = root / f"v{version:07d}"
    return folder if not folder.exists() and not unique else root / f"v{version:07d}-{secrets.token_hex(4)}"


def write_version(root: str | os.PathLike[str], version: int, *, model: Any = None,
                  tensors: Mapping[str, "torch.Tensor"] | None = None,
                  base: Path | None = None, digests: bool = True, target: Path | None = None) -> Path:
    """Write version ``version`` under ``root``: a full folder of ``model``, or (``tensors`` and
    ``base``, a folder from ``weight_chain``'s last element) a delta of the changed ``tensors``.
    ``digests``: record each file's sha256 (read back from the page cache, ~1.7 GB/s here), which
    workers fetching the version from a remote store need. ``target``: the folder to write (a name
    ``version_folder`` gave earlier, announced before the write); default: ``version_folder``'s."""
    digests_on = digests
    if (model is None) == (tensors is None) or (tensors is not None and base is None):
        raise ValueError("write_version takes a model (full) or tensors and a base folder (delta)")
    root_path = Path(root).resolve()
    target = target or version_folder(root_path, version)

    def fill(staging: Path) -> None:
        if model is not None:
            save_model(model, staging)
            chain: tuple[str, ...] = (target.name,)
            count, base_version = 0, None
        else:
            from safetensors.torch import save_file

            assert tensors is not None and base is not None
            base_manifest = _manifest_of(base)
            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, os.fspath(staging / DELTA_FILE))
            chain, count, base_version = base_manifest.chain + (target.name,), len(tensors), base_manifest.version
        files = {p.name: p.stat().st_size for p in sorted(staging.glob("*.safetensors"))}
        if model is not None:
            count = sum(len(_tensor_names(staging / name)) for name in files)
        adapter = model is not None and (staging / ADAPTER_CONFIG).exists()  # a PeftModel saves its adapter
        if adapter:
            files[ADAPTER_CONFIG] = (staging / ADAPTER_CONFIG).stat().st_size
        digests = {name: file_sha256(staging / name) for name in files} if digests_on else {}
        kind: Kind = "lora" if adapter else "full" if model is not None else "delta"
        manifest = WeightManifest(version, kind, chain, files, base_version, count, digests)
        (staging / MANIFEST_NAME).write_bytes(manifest.to_json())

    return atomic_folder(target, fill)


def file_sha256(path: Path) -> str:
    """The file's sha256, streamed (``hashlib.file_digest``: ~1.4 GB/s on one core here)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


#: Files this process hashed and found as their manifest recorded, by identity: path, device, inode,
#: size, mtime and ctime (ns). Rewriting a file in place changes its ctime (``utime`` cannot set it
#: back) and replacing it changes its inode, so either is hashed again. A file whose ctime was within
#: ``_SETTLED_NS`` of the hash is not remembered (a write within the same timestamp tick would keep
#: the identity: git's "racy clean" case). Bounded: emptied when full.
_VERIFIED: dict[tuple[object, ...], str] = {}
#: Files of one chain hashed at once (a sharded checkpoint: ~1 GB/s per thread).
HASH_THREADS = 4
_VERIFIED_MAX = 4096
_SETTLED_NS = 2_000_000_000
_verified_lock = threading.Lock()


def _identity(path: Path) -> tuple[object, ...]:
    st = os.stat(path)
    return (os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def check_digest(path: Path, expected: str) -> None:
    """Refuse (``WeightsError``) a file whose bytes are not the ones its manifest recorded. Hashes
    it unless this process already did since it last changed (``_VERIFIED``)."""
    began = time.time_ns()
    try:
        before = _identity(path)
        with _verified_lock:
            if _VERIFIED.get(before) == expected:
                return
        actual = file_sha256(path)
        after = _identity(path)
    except OSError as exc:
        raise WeightsError(f"{path}: unreadable ({exc})") from exc
    if actual != expected:
        raise WeightsError(f"{path}: sha256 {actual[:12]}..., the manifest recorded {expected[:12]}...: "
                           "not the bytes that were published (corrupt, or overwritten)")
    ctime_ns = before[-1]
    assert isinstance(ctime_ns, int)
    if after == before and ctime_ns < began - _SETTLED_NS:
        with _verified_lock:
            if len(_VERIFIED) >= _VERIFIED_MAX:
                _VERIFIED.clear()
            _VERIFIED[before] = expected


def _manifest_of(folder: Path) -> WeightManifest:
    manifest = read_manifest(folder)
    if manifest is None:
        raise WeightsError(f"{folder}: a delta needs a base folder with a manifest (written by write_version)")
    return manifest


def weight_chain(uri: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The folders that rebuild the version at ``uri``, a full one first; checked (rule 2). Hashes
    the files with a recorded digest this process has not verified yet: call it off the thread
    that generates (a full multi-GB version costs seconds, WEIGHTS.md)."""
    folder = Path(uri)
    if not folder.is_dir():
        raise WeightsError(f"{folder}: no weights folder there")
    manifest = read_manifest(folder)
    if manifest is None:
        if not any(folder.glob("*.safetensors")):
            raise WeightsError(f"{folder}: no safetensors files and no manifest")
        return (folder,)
    if manifest.chain[-1] != folder.name:
        raise WeightsError(f"{folder}: its manifest ends its chain with {manifest.chain[-1]!r}, not itself")
    chain = tuple(folder.parent / name for name in manifest.chain)
    previous: WeightManifest | None = None
    digests: list[tuple[Path, str]] = []  # hashed once every cheaper check passed, for the whole chain
    for member in chain:
        found = manifest if member == folder else read_manifest(member) if member.is_dir() else None
        if found is None:
            raise WeightsError(f"{folder}: the folder {member.name!r} of its chain is missing (pruned?)")
        if found.kind == "lora" and len(chain) > 1:
            raise WeightsError(f"{folder}: a LoRA adapter ({member.name!r}) is a version of its own, never part of a chain")
        if (previous is None) != (found.kind != "delta") or (previous is not None and found.base != previous.version):
            raise WeightsError(f"{folder}: {member.name!r} does not follow version "
                               f"{previous.version if previous else None} in the chain")
        for name, size in found.files.items():
            try:
                actual = (member / name).stat().st_size
            except OSError as exc:
                raise WeightsError(f"{member / name}: missing ({exc})") from exc
            if actual != size:
                raise WeightsError(f"{member / name}: {actual} bytes, the manifest recorded {size}")
        digests += [(member / name, digest) for name, digest in sorted(found.sha256.items())]
        previous = found
    if len(digests) > 1:  # shards hash in parallel: hashlib releases the GIL
        with ThreadPoolExecutor(min(len(digests), HASH_THREADS), thread_name_prefix="weights-sha256") as pool:
            list(pool.map(lambda item: check_digest(*item), digests))
    elif digests:
        check_digest(*digests[0])
    return chain


def chain_key(chain: Sequence[Path]) -> tuple[tuple[object, ...], ...]:
    """What the bytes of ``chain`` are, beyond its folders' names: every file's identity (``_identity``).
    A folder rewritten under the same name (a store's folder fetched again, a folder replaced) has
    another key, so a reader that applied the old one must not take it for what it holds."""
    try:
        return tuple(_identity(path) for member in chain for path in sorted(member.iterdir()) if path.is_file())
    except OSError as exc:
        raise WeightsError(f"{chain[-1]}: unreadable ({exc})") from exc


def read_chain_state(chain: Sequence[Path], since: Sequence[Path] | None = None) -> dict[str, "torch.Tensor"]:
    """The tensors of ``chain``, later folders overriding earlier ones. When ``since`` (the chain
    the reader already applied) is a prefix of ``chain``, only the folders after it are read."""
    from safetensors.torch import load_file

    start = len(since) if since is not None and tuple(chain[:len(since)]) == tuple(since) else 0
    state: dict[str, torch.Tensor] = {}
    for member in chain[start:]:
        for name in safetensors_files(member):
            state.update(load_file(os.fspath(member / name)))
    return state


def safetensors_files(folder: Path) -> list[str]:
    """The safetensors files of one version folder: those its index names (a sharded save), else all."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return sorted(p.name for p in folder.glob("*.safetensors"))


def _tensor_names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as handle:
        return list(handle.keys())


def tensor_names(folder: Path) -> set[str]:
    """Every tensor name a full folder holds (read from the safetensors headers only)."""
    return {name for file in safetensors_files(folder) for name in _tensor_names(folder / file)}


def prune_versions(root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Remove version folders older than the newest ``keep`` that none of those needs. Returns them.

    A worker still reading a removed folder fails its load and keeps its weights (WeightsError):
    ``keep`` must exceed the versions a worker may lag. Removal errors are ignored: a folder another
    process already removed is the outcome wanted.
    """
    root_path = Path(root)
    versions = sorted(p for p in root_path.iterdir() if p.is_dir() and _VERSION_FOLDER.match(p.name))
    if keep <= 0 or len(versions) <= keep:
        return []
    needed: set[str] = set()
    for folder in versions[-keep:]:
        try:
            manifest = read_manifest(folder)
        except WeightsError:
            manifest = None
        needed.update(manifest.chain if manifest else (folder.name,))
    removed = [p for p in versions[:-keep] if p.name not in needed]
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
    return removed
