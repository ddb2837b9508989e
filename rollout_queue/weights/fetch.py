"""Versions in a remote store: workers that share no filesystem with the trainer.

A weights URI with a scheme other than ``file`` (``http://``, ``https://``, ``s3://``, ``gs://``, any
protocol ``fsspec`` knows with its driver installed) names a version folder in a store the trainer
publishes to (its weights root synced or served there). ``localize`` copies the version's chain
into a per-worker cache and returns the local folder, which the engine then loads like any other.

Rules:
1. Every byte is checked: a remote version must have a manifest with a sha256 per file, and each
   file is hashed while it is written to the cache; a mismatch or a short file raises
   ``WeightsError`` and leaves nothing in the cache.
2. A cached folder is complete the instant its name exists (fetched aside, renamed), so a worker
   killed mid-fetch never loads a partial folder, and one restarted finds what was complete. It is
   used only while its manifest is the store's: every folder of the chain has its manifest read
   from the store at each ``localize`` (one small request each), and a cached folder whose manifest
   differs (the store's folder of that name was rewritten) is discarded and fetched again.
3. Fetching happens before the engine pauses (the runtime's fetch, then apply): a slow store
   delays the update, never generation.
4. The cache keeps the newest ``keep`` versions per store folder, chains included.

The cache root is ``$ROLLOUT_WEIGHTS_CACHE`` or ``~/.cache/rollout-queue/weights``.

The trainer's side (``upload``, ``remove_remote``): a version folder is copied to the store before
it is recorded, its manifest last, so a worker that finds a manifest finds every file it names;
versions pruned locally are removed from the store too. Credentials and endpoints are fsspec's
(for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL`` for a store that
is not AWS), on the trainer and on every worker alike.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
import secrets
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from rollout_queue.core.errors import WeightsError
from rollout_queue.weights import miles_delta
from rollout_queue.weights.manifest import MANIFEST_NAME, WeightManifest, read_manifest
from rollout_queue.weights.store import atomic_folder, folder_version, prune_versions, weight_chain

CHUNK = 8 * 2**20


def default_cache() -> Path:
    return Path(os.environ.get("ROLLOUT_WEIGHTS_CACHE") or Path.home() / ".cache" / "rollout-queue" / "weights")


def is_remote(uri: str) -> bool:
    scheme = urlsplit(uri).scheme
    return bool(scheme) and scheme != "file" and len(scheme) > 1  # "C:" on Windows is a drive


def localize(uri: str, cache: Path | None = None, *, keep: int = 4) -> Path:
    """The local folder of the version at ``uri``: local paths (and ``file://``) as they are; remote
    ones fetched with their chain into ``cache`` (rules 1, 2, 4). Raises ``WeightsError``."""
    if not is_remote(uri):
        local = Path(urlsplit(uri).path if uri.startswith("file://") else uri)
        if miles_delta.is_miles_delta(local):  # a miles disk-delta version: rebuilt into a full folder here
            return miles_delta.materialize(local, (cache / "miles") if cache is not None else None)
        return local
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec comes with the workers extra
        raise WeightsError(f"{uri}: fetching remote weights needs fsspec (pip install 'rollout-queue[workers]')") from exc
    parent, _, name = uri.rstrip("/").rpartition("/")
    try:
        fs, _ = fsspec.core.url_to_fs(parent)
    except (ImportError, ValueError) as exc:
        raise WeightsError(f"{uri}: no fsspec driver for it ({exc})") from exc
    store = (cache or default_cache()) / hashlib.sha256(parent.encode()).hexdigest()[:16]
    head = _manifest(fs, f"{parent}/{name}")
    if head.chain[-1] != name:
        raise WeightsError(f"{uri}: its manifest ends its chain with {head.chain[-1]!r}, not itself")
    for member in head.chain:
        manifest = head if member == name else _manifest(fs, f"{parent}/{member}")
        cached = store / member
        if cached.is_dir() and _manifest_or_none(cached) != manifest:
            _discard(cached)  # the store's folder of this name is not the one cached: old bytes
        if not cached.is_dir():
            _fetch(fs, f"{parent}/{member}", manifest, cached)
        if _manifest_or_none(cached) != manifest:  # a worker sharing the cache fetched another meanwhile
            raise WeightsError(f"{parent}/{member}: the store's folder changed while it was fetched; retried later")
    prune_versions(store, keep)
    return store / name


def resolve(uri: str, cache: Path | None = None) -> tuple[Path, ...]:
    """The checked local chain of the version at ``uri`` (``localize``, then ``store.weight_chain``:
    every file's size and recorded digest), its own folder last. What an engine loads; it may hash
    gigabytes, so engines call it in a thread, before they pause. Raises ``WeightsError``."""
    return weight_chain(localize(uri, cache))


def older_versions(uri: str, below: int, limit: int = 4) -> list[tuple[int, str]]:
    """Version folders beside the local one at ``uri`` with a version below ``below``, newest first,
    at most ``limit``: what a worker that cannot load ``uri`` yet may start on. A folder's version is
    its manifest's (its name's when it has none, e.g. ``QueueWeightTransfer``'s); one whose manifest
    is unreadable or disagrees with its name is skipped, and so is a version with several folders
    (an attempt never recorded beside the one that was: which one the queue recorded is unknown).
    Nothing is loaded or checked here (the engine checks what it loads). Remote stores are not
    listed: []."""
    if is_remote(uri):
        return []
    folder = localize(uri)
    try:
        siblings = [(version, p) for p in folder.parent.iterdir()
                    if p != folder and (version := folder_version(p.name)) is not None and version < below]
    except OSError:  # the weights root itself is not there (yet)
        return []
    out: list[tuple[int, str]] = []
    counts = Counter(version for version, _ in siblings)
    for version, path in sorted(siblings, reverse=True):
        if counts[version] > 1:
            continue
        if (path / MANIFEST_NAME).exists():
            manifest = _manifest_or_none(path)
            if manifest is None or manifest.version != version:
                continue
        out.append((version, os.fspath(path)))
        if len(out) == limit:
            break
    return out


def _manifest_or_none(folder: Path) -> WeightManifest | None:
    try:
        return read_manifest(folder)
    except WeightsError:  # garbage where a manifest should be: not the store's
        return None


def _discard(folder: Path) -> None:
    """Remove a stale cached folder: renamed aside first (its name is free at once; a reader that
    already opened its files keeps them), then deleted. Another worker may have done either."""
    aside = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}.stale")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise WeightsError(f"{folder}: a stale cached version that cannot be removed ({exc})") from exc
    shutil.rmtree(aside, ignore_errors=True)


def _filesystem(uri: str) -> object:
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - fsspec comes with the workers extra
        raise WeightsError(f"{uri}: a remote weights store needs fsspec (pip install 'rollout-queue[workers]')") from exc
    try:
        return fsspec.core.url_to_fs(uri)[0]
    except (ImportError, ValueError) as exc:
        raise WeightsError(f"{uri}: no fsspec driver for it ({exc})") from exc


def upload(folder: Path, uri_base: str) -> str:
    """Copy the version ``folder`` to ``<uri_base>/<its name>`` (files first, the manifest last);
    returns that URI. Raises ``WeightsError`` when the store refuses or cannot be reached."""
    fs = _filesystem(uri_base)
    target = f"{uri_base.rstrip('/')}/{folder.name}"
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_NAME)
    try:
        for path in files + [folder / MANIFEST_NAME]:
            fs.put_file(os.fspath(path), f"{target}/{path.name}")  # type: ignore[attr-defined]
    except Exception as exc:  # any driver's client error: the version is not there
        raise WeightsError(f"{target}: upload failed ({type(exc).__name__}: {exc})") from exc
    return target


def remove_remote(uri_base: str, names: list[str]) -> None:
    """Remove pruned version folders from the store (best effort: a folder left costs storage only)."""
    if not names:
        return
    fs = _filesystem(uri_base)
    for name in names:
        try:
            fs.rm(f"{uri_base.rstrip('/')}/{name}", recursive=True)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - gone already, or not ours to remove
            continue


def _manifest(fs: object, folder_uri: str) -> WeightManifest:
    try:
        data = fs.cat_file(f"{folder_uri}/{MANIFEST_NAME}")  # type: ignore[attr-defined]
    except (OSError, FileNotFoundError) as exc:
        raise WeightsError(f"{folder_uri}: no manifest there ({exc})") from exc
    except Exception as exc:  # HTTP client errors of whatever fsspec driver: the store is unreachable
        raise WeightsError(f"{folder_uri}: the store did not answer ({type(exc).__name__}: {exc})") from exc
    manifest = WeightManifest.from_json(data, f"{folder_uri}/{MANIFEST_NAME}")
    if set(manifest.sha256) != set(manifest.files):
        raise WeightsError(f"{folder_uri}: a remote version needs a sha256 for every file "
                           "(publish with digests=True, the default)")
    return manifest


def _fetch(fs: object, folder_uri: str, manifest: WeightManifest, target: Path) -> None:
    def fill(staging: Path) -> None:
        for name, size in manifest.files.items():
            digest, written = hashlib.sha256(), 0
            try:
                with fs.open(f"{folder_uri}/{name}", "rb") as src, open(staging / name, "wb") as dst:  # type: ignore[attr-defined]
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                        written += len(chunk)
                        if written > size:  # a store sending more than recorded is stopped, not read to its end
                            break
            except WeightsError:
                raise
            except Exception as exc:  # a dropped connection, a 404 mid-chain
                raise WeightsError(f"{folder_uri}/{name}: fetch failed ({type(exc).__name__}: {exc})") from exc
            if written != size or digest.hexdigest() != manifest.sha256[name]:
                raise WeightsError(f"{folder_uri}/{name}: {written} bytes with sha256 {digest.hexdigest()[:12]}..., "
                                   f"the manifest recorded {size} bytes and {manifest.sha256[name][:12]}...")
        (staging / MANIFEST_NAME).write_bytes(manifest.to_json())

    try:
        atomic_folder(target, fill)
    except FileExistsError:
        pass  # another worker sharing the cache fetched it meanwhile: complete by rule 2
