"""The trainer's side: write each policy version (full or delta) and record it through a hold.

``transport="folder"`` writes every version in full (a ``save_pretrained`` folder, what any tool
can read). ``"delta"`` writes only the tensors that are not bit-identical to the last version this
publisher wrote; most tensors of a step at a small learning rate in bf16 are, and frozen ones
(embeddings, a LoRA's base) always are. A full version is written instead when there is no base
yet (first publish, a restarted trainer), when the chain reached ``full_every`` folders (a late
worker reads at most that many), or when more than ``max_delta_fraction`` of the bytes changed
(a delta would save nothing).

``"dist"`` pushes every version over torch.distributed to the workers that join its round
(``push.py``: gloo on CPUs, NCCL on GPUs, the queue as the rendezvous), and still writes it as a
delta chain: the fallback for a worker that missed the round (dead, stalled, started late, or an
engine that cannot receive pushes). When some worker received the push, the version is recorded
first and written after, so those workers generate on it while the folder is written; when none
did, it is written first (every worker then loads it from the folder).

A ``PeftModel`` (a run that trains a LoRA adapter) is published as its adapter, whole each time
(``lora.py``: a few MB; workers apply it over the base model they serve).

Memory: delta (and dist) mode keeps one CPU copy of the saved tensors to compare against.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rollout_queue.ops.logs import fields
from rollout_queue.weights import fetch as remote
from rollout_queue.weights.lora import check_publishable, is_peft_model
from rollout_queue.weights.manifest import read_manifest
from rollout_queue.weights.push import PushReport, WeightPush
from rollout_queue.weights.store import prune_versions, tensor_names, version_folder, write_version

if TYPE_CHECKING:
    import torch

    from rollout_queue.api.queue import RolloutQueue

log = logging.getLogger("rollout_queue.weights")

Transport = Literal["folder", "delta", "dist"]
TRANSPORTS: tuple[Transport, ...] = ("folder", "delta", "dist")


@dataclass(frozen=True)
class Published:
    """What one ``publish`` wrote: its URI, its folder, full or delta, tensors and bytes written, seconds;
    and, for ``dist``, the push (who received it over torch.distributed)."""

    uri: str
    folder: str
    kind: str
    tensors: int
    bytes: int
    write_s: float
    push: PushReport | None = None


class WeightPublisher:
    """Publishes the versions of one trainer's policy under ``root`` (one publisher per trainer)."""

    def __init__(self, queue: "RolloutQueue", root: str | os.PathLike[str], *, transport: Transport = "folder",
                 full_every: int = 8, max_delta_fraction: float = 0.5, keep: int = 4, wait_s: float = 0.0,
                 hold_timeout_s: float = 60.0, digests: bool = True, uri_base: str | None = None,
                 push: WeightPush | None = None, upload: bool = False) -> None:
        """``digests``: record each file's sha256 in the manifest (needed by workers that fetch
        versions over HTTP(S) or from an object store; costs one read of the written bytes).
        ``uri_base``: where workers find ``root`` (``https://weights.internal/run-7``, ``s3://bucket/run-7``:
        a server or sync of the folder); each version is recorded as ``<uri_base>/<folder name>``
        instead of its local path. ``upload``: copy each version to ``uri_base`` (an object store,
        through fsspec) before recording it, and remove pruned ones there too; without it, serve or
        sync ``root`` there yourself. ``push``: the rounds of ``transport="dist"`` (default: a gloo
        ``WeightPush`` with its defaults; pass one for NCCL, another join window or deadline)."""
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (the newest version is what workers load), got {keep}")
        self.queue, self.root, self.transport = queue, Path(root).resolve(), transport
        self.full_every, self.max_delta_fraction, self.keep = full_every, max_delta_fraction, keep
        self.wait_s, self.hold_timeout_s, self.digests = wait_s, hold_timeout_s, digests
        self.uri_base = uri_base.rstrip("/") if uri_base else None
        if upload and not self.uri_base:
            raise ValueError("upload=True needs uri_base: the store each version is copied to")
        self.upload = upload
        self.last: Published | None = None
        self.push = push if push is not None else (WeightPush(queue) if transport == "dist" else None)
        self._base: Path | None = None  # the folder the next delta builds on
        self._saved: dict[str, "torch.Tensor"] = {}  # name -> CPU copy of what _base rebuilds to

    def publish(self, model: Any, version: int, *, push: bool = True) -> str:
        """Write ``version`` of ``model`` and record it; returns its URI (the folder's path, or its
        name under ``uri_base``). ``push=False``: this update skips the push round of ``dist``
        (the trainer chooses per update: a version every worker may load from storage anyway, say
        right after a checkpoint restore).

        Raises VersionRegression / HoldLost as ``publish_weights`` documents; the folder written
        stays on disk then (a later delta may build on it, pruning removes it). Raises
        ``WeightsError``, nothing written or recorded, for a ``PeftModel`` whose adapter no worker
        would apply (``lora.check_publishable``: PiSSA or OLoRA initialisation, DoRA, ...).
        """
        began = time.perf_counter()
        if is_peft_model(model) and self.push is not None:
            raise ValueError("a LoRA run publishes its adapter as a folder (a few MB): use transport='folder'; "
                             "'dist' pushes whole models")
        if is_peft_model(model):
            check_publishable(model)  # an adapter every worker would refuse is refused here, nothing written
        if self.push is None or not push:
            folder, kind, count = self._write(model, version)
            uri = self._uri(folder)
            self._record(version, uri)
        else:
            folder = version_folder(self.root, version, unique=True)
            uri = self._uri(folder)
            pushed = self.push.push(model.state_dict(), version, uri)
            if pushed.acked:  # they generate on it while the fallback is written
                self._record(version, uri)
                _, kind, count = self._write(model, version, folder)
            else:
                _, kind, count = self._write(model, version, folder)
                self._record(version, uri)
        written = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        self.last = Published(uri, os.fspath(folder), kind, count, written, time.perf_counter() - began,
                              self.push.last if self.push is not None and push else None)
        removed = prune_versions(self.root, self.keep)
        if self.upload and removed:
            assert self.uri_base is not None
            remote.remove_remote(self.uri_base, [p.name for p in removed])
        return uri

    def _uri(self, folder: Path) -> str:
        return f"{self.uri_base}/{folder.name}" if self.uri_base else os.fspath(folder)

    def _record(self, version: int, uri: str) -> None:
        hold = self.queue.hold(timeout_s=self.hold_timeout_s)
        try:
            if self.wait_s > 0 and not hold.wait_terminal(self.wait_s):
                log.info("publishing while attempts still execute", extra=fields(queue=self.queue.name, version=version))
            hold.record_weight_update(version, uri)
        finally:
            hold.release()

    def _write(self, model: Any, version: int, target: Path | None = None) -> tuple[Path, str, int]:
        """Write the version (full or delta) and, with ``upload``, copy it to the store."""
        folder, kind, count = self._write_local(model, version, target)
        if self.upload:
            assert self.uri_base is not None
            remote.upload(folder, self.uri_base)
        return folder, kind, count

    def _write_local(self, model: Any, version: int, target: Path | None = None) -> tuple[Path, str, int]:
        adapter = is_peft_model(model)  # its own save_pretrained writes the adapter: always whole
        if self.transport in ("delta", "dist") and self._base is not None and not adapter:
            state = model.state_dict()
            changed = {name: state[name] for name, old in self._saved.items() if not _equal(state[name], old)}
            changed_bytes = sum(t.numel() * t.element_size() for t in changed.values())
            total_bytes = sum(t.numel() * t.element_size() for t in self._saved.values()) or 1
            manifest = read_manifest(self._base)
            if (manifest is not None and len(manifest.chain) < self.full_every
                    and changed_bytes <= self.max_delta_fraction * total_bytes):
                folder = write_version(self.root, version, tensors=changed, base=self._base, digests=self.digests,
                                       target=target)
                for name, tensor in changed.items():
                    self._saved[name].copy_(tensor.detach())
                self._base = folder
                return folder, "delta", len(changed)
        folder = write_version(self.root, version, model=model, digests=self.digests, target=target)
        manifest = read_manifest(folder)
        assert manifest is not None
        if self.transport in ("delta", "dist") and not adapter:
            self._remember(model, folder)
        return folder, "full", manifest.tensors

    def _remember(self, model: Any, folder: Path) -> None:
        """Keep a CPU copy of every saved tensor, the base of the next delta; or no base at all when
        the saved names are not the model's own (a model whose save renames keys)."""
        state = model.state_dict()
        saved = tensor_names(folder)
        if not saved <= set(state):
            log.warning("deltas disabled: the saved tensor names are not the model's state_dict names",
                        extra=fields(queue=self.queue.name, unknown=sorted(saved - set(state))[:5]))
            self.transport, self._base, self._saved = "folder", None, {}
            return
        self._saved = {name: state[name].detach().to("cpu", copy=True) for name in sorted(saved)}
        self._base = folder


def _equal(a: "torch.Tensor", b: "torch.Tensor") -> bool:
    """Bit-identical (NaNs included: a delta must not resend an unchanged NaN, nor miss a new one)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    current = a.detach().to("cpu")
    if current.is_floating_point():
        return bool(torch.equal(current.view(_int_view(current.dtype)), b.view(_int_view(b.dtype))))
    return bool(torch.equal(current, b))


def _int_view(dtype: "torch.dtype") -> "torch.dtype":
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[torch.empty((), dtype=dtype).element_size()]
