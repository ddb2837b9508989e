"""``manifest.json``: what a version folder holds and which sibling folders rebuild it.

Format (``rollout-queue-weights/1``)::

    {"format": "rollout-queue-weights/1", "version": 7, "kind": "delta", "base": 6,
     "chain": ["v0000005", "v0000006", "v0000007"], "files": {"model.safetensors": 40960},
     "sha256": {"model.safetensors": "9f86d0..."}, "tensors": 3}

- ``kind`` ``full``: every tensor of the model (a ``save_pretrained`` folder); ``chain`` is the
  folder itself. ``delta``: only the tensors that differ from version ``base``; ``chain`` lists
  the folders to apply in order, a full one first and this one last (siblings, by name, so a
  weights root can be moved or mounted elsewhere). ``lora``: a LoRA adapter (peft's
  ``save_pretrained`` of a ``PeftModel``: ``adapter_config.json`` and its tensors) over the base
  model the workers serve; its own chain, like a full version (``lora.py``).
- ``files``: each safetensors file (and a LoRA's ``adapter_config.json``) and its size: a reader
  refuses a truncated file.
- ``sha256``: each file's digest (written by default): what every worker checks each file against
  before anything is applied (``store.weight_chain``), and what a worker that fetches the version
  from an HTTP(S) or object store checks every byte against while fetching (``fetch.py``).

A folder without a manifest (written before manifests, or by any ``save_pretrained``) reads as a
full version of unknown number. This module does no I/O beyond the one JSON file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import orjson

from rollout_queue.core.errors import WeightsError

FORMAT = "rollout-queue-weights/1"
MANIFEST_NAME = "manifest.json"
Kind = Literal["full", "delta", "lora"]
#: Files a version may hold besides safetensors: a LoRA adapter's config (vLLM and peft read it).
CONFIG_FILES = ("adapter_config.json",)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class WeightManifest:
    version: int
    kind: Kind
    chain: tuple[str, ...]
    files: dict[str, int] = field(default_factory=dict)
    base: int | None = None
    tensors: int = 0
    sha256: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps({"format": FORMAT, "version": self.version, "kind": self.kind, "base": self.base,
                             "chain": list(self.chain), "files": self.files, "tensors": self.tensors,
                             "sha256": self.sha256})

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "WeightManifest":
        try:
            raw = orjson.loads(data)
            if raw.get("format") != FORMAT:
                raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT!r}")
            kind = raw["kind"]
            if kind not in ("full", "delta", "lora"):
                raise ValueError(f"kind {kind!r}")
            chain = tuple(str(n) for n in raw["chain"])
            if not chain or any("/" in n or n in ("", ".", "..") for n in chain):
                raise ValueError(f"chain {list(chain)!r}")
            files = {str(k): int(v) for k, v in raw["files"].items()}
            if any("/" in name or not (name.endswith(".safetensors") or name in CONFIG_FILES) for name in files):
                raise ValueError(f"files {sorted(files)!r}")
            digests = {str(k): str(v) for k, v in (raw.get("sha256") or {}).items()}
            if set(digests) - set(files) or any(not _HEX64.match(v) for v in digests.values()):
                raise ValueError(f"sha256 {sorted(digests)!r}")
            base = raw.get("base")
            manifest = cls(int(raw["version"]), kind, chain, files, None if base is None else int(base),
                           int(raw.get("tensors", 0)), digests)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WeightsError(f"{where}: not a valid weights manifest ({exc})") from exc
        if (kind != "delta") != (len(chain) == 1) or (kind == "delta") == (manifest.base is None):
            raise WeightsError(f"{where}: a full or LoRA version is its own chain, a delta names its base and chain")
        return manifest


def read_manifest(folder: Path) -> WeightManifest | None:
    """The folder's manifest; None for a plain ``save_pretrained`` folder (a full version)."""
    path = folder / MANIFEST_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WeightsError(f"{path}: unreadable ({exc})") from exc
    return WeightManifest.from_json(data, os.fspath(path))
