"""verl's weights reach the queue's workers: a ``CheckpointEngine`` backend that publishes each version
verl sends as a queue policy version (read at verl 0.9.1, ``verl/checkpoint_engine/base.py``).

Configuration only (docs/integrations/verl.md)::

    actor_rollout_ref.rollout.checkpoint_engine.backend=rollout_queue
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=rollout_queue.integrations.verl.weights
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.rollout_queue.root=/shared/weights/run-7
    ...

How verl drives a backend (``CheckpointEngineManager.update_weights``, ``engine_workers.py``):

1. Every actor rank builds one with ``is_master=(rank == 0)`` and ``engine_kwargs[backend]``, and
   every rank calls ``send_weights(actor.engine.get_per_tensor_param(), global_steps=g)``. Producing
   each tensor is itself collective over the actor group (FSDP's ``full_tensor()``), so every rank
   must walk the whole iterator, even one that has failed: a rank that stops early leaves the
   others blocked in their next gather. Only rank 0 keeps the tensors and writes.
2. Rank 0 writes them as one version folder through ``WeightPublisher`` (full or delta, atomically,
   with the model's ``config.json`` and tokenizer files beside a full version's safetensors, so the
   folder is a model any HF loader reads) and records it in the queue; ``python -m
   rollout_queue.workers`` processes follow it as they follow any published version.
3. verl's ``global_steps`` is the weights' version (one update per step). The queue's versions only
   grow, and a trainer that resumed from checkpoint ``c`` sends ``c`` again, below what the killed
   run published. So the queue version is ``global_steps + offset``, the offset fixed at this
   process's first publish: 0 when the step is above the queue's version, else just enough to go
   above it (``queue_version``). Steps then keep their spacing, and the staleness pairing of
   ``sampler.py`` (one version per step) holds. A step sent twice by the same process (verl syncs
   its hybrid and standalone replicas with the same step) is published once.
4. verl's own rollout replicas get nothing from this backend: ``receive_weights`` yields no tensor,
   so they keep the weights they have. The queue's workers are the rollout; verl's replicas are
   idle or absent (V1 ``separate_async`` updates its hybrid replicas, which serve validation, through
   its ``naive`` engine, not this one). A verl rollout that must follow the trainer (fully_async's
   rollouter) keeps a transport backend (``nccl``).

It never holds Redis across the write: the folder is written first, then one script records it
(``publish_version`` through an admission hold, as ``WeightPublisher`` does for every trainer).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.core.errors import IntegrationConfigError, VersionRegression
from rollout_queue.integrations.environment import queue_address
from rollout_queue.weights.manifest import MANIFEST_NAME
from rollout_queue.weights.publisher import WeightPublisher

log = logging.getLogger("rollout_queue.integrations.verl")

__all__ = ["BACKEND", "QueueCheckpointEngine", "WeightSettings", "queue_version"]

#: The name verl's ``checkpoint_engine.backend`` selects this engine by.
BACKEND = "rollout_queue"
_KWARGS = f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{BACKEND}"
#: Files of a model folder that are weights (written per version) or a version's own bookkeeping;
#: everything else at its top level (config, generation config, tokenizer, custom code) is copied.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt", ".gguf", ".index.json")


@dataclass(frozen=True)
class WeightSettings:
    """``checkpoint_engine.engine_kwargs.rollout_queue``: the queue, the weights root and the model
    folder whose config and tokenizer each full version carries; the rest is ``WeightPublisher``'s."""

    url: str
    queue: str
    root: str
    model_path: str
    transport: str = "folder"
    keep: int = 4
    full_every: int = 8
    dtype: str | None = None       # cast floating tensors before writing (e.g. bfloat16); None: as sent
    uri_base: str | None = None
    upload: bool = False

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> "WeightSettings":
        """From verl's engine kwargs; ``url``/``queue`` fall back to the environment
        (``queue_address``). Raises IntegrationConfigError naming the key to set or fix."""
        given = cls.check_names(kwargs)
        url, queue = queue_address(given.pop("url", None), given.pop("queue", None),
                                   needs="the queue's checkpoint engine", keys=(f"{_KWARGS}.url", f"{_KWARGS}.queue"))
        missing = [name for name in ("root", "model_path") if not given.get(name)]
        if missing:
            raise IntegrationConfigError(
                f"the queue's checkpoint engine needs {', '.join(f'{_KWARGS}.{m}' for m in missing)} (model_path "
                "is usually ${actor_rollout_ref.model.path})")
        # The paths as text; the other values are verl's config as given (its kwargs are untyped).
        settings = cls(url=url, queue=queue, root=str(given.pop("root")), model_path=str(given.pop("model_path")),
                       **given)
        if settings.transport not in ("folder", "delta"):
            raise IntegrationConfigError(f"{_KWARGS}.transport must be 'folder' or 'delta', got {settings.transport!r} "
                                         "(WeightPublisher's 'dist' pushes a model object, which verl does not send)")
        if settings.dtype is not None and not isinstance(getattr(torch, str(settings.dtype), None), torch.dtype):
            raise IntegrationConfigError(f"{_KWARGS}.dtype={settings.dtype!r} is not a torch dtype (bfloat16, float16, "
                                         "float32)")
        return settings

    @classmethod
    def check_names(cls, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The kwargs as a dict; raises IntegrationConfigError for a name this engine does not take
        (every rank checks this much; only rank 0 needs the values, and its environment)."""
        given, known = dict(kwargs), {f.name for f in fields(cls)}
        if set(given) - known:
            raise IntegrationConfigError(
                f"unknown {_KWARGS} {sorted(set(given) - known)}: the queue's checkpoint engine takes {sorted(known)}")
        return given


def queue_version(step: int, current: int, offset: int | None) -> tuple[int, int]:
    """The queue version verl step ``step`` is published as, and the offset from then on (module
    docstring, item 3): the offset once fixed, else 0 when ``step`` is above the queue's ``current``
    version, else ``current + 1 - step``."""
    if offset is None:
        offset = 0 if step > current else current + 1 - step
    return step + offset, offset


def model_files(model_path: str) -> list[Path]:
    """The non-weight files of verl's model folder (or of a hub model in the local cache) that make
    a version folder loadable on its own. Raises IntegrationConfigError when there is no config.json."""
    folder = Path(model_path)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model_path, allow_patterns=["*.json", "*.txt", "*.model", "*.jinja",
                                                                         "*.py", "*.tiktoken"]))
        except Exception as exc:  # no such hub model, or not in the cache while offline: say which
            raise IntegrationConfigError(f"model_path={model_path!r} is neither a folder nor a hub model this host "
                                         f"can read ({exc}): set it to ${{actor_rollout_ref.model.path}}") from exc
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                   and not p.name.endswith(_WEIGHT_SUFFIXES) and p.name != MANIFEST_NAME)
    if not any(p.name == "config.json" for p in files):
        raise IntegrationConfigError(f"model_path={model_path!r} has no config.json: point it at the HF model verl "
                                     "trains (actor_rollout_ref.model.path)")
    return files


class SentVersion:
    """One version as verl sent it, in the shape ``WeightPublisher`` writes: a ``state_dict`` (what a
    delta compares) and ``save_pretrained`` (a full version: safetensors, sharded past 5 GB, then the
    model's config and tokenizer files)."""

    def __init__(self, tensors: dict[str, torch.Tensor], files: Iterable[Path]) -> None:
        self.tensors, self.files = tensors, tuple(files)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def save_pretrained(self, folder: str | os.PathLike[str], safe_serialization: bool = True) -> None:
        from huggingface_hub import save_torch_state_dict

        folder = Path(folder)
        save_torch_state_dict(self.tensors, folder, safe_serialization=safe_serialization)
        for path in self.files:
            shutil.copy2(path, folder / path.name)


async def _items(weights: Any) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """verl's weights, a generator or an async iterator, in its own order. A sync generator is walked
    on the calling thread: each ``next`` may run collectives bound to it."""
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


@CheckpointEngineRegistry.register(BACKEND)
class QueueCheckpointEngine(CheckpointEngine):
    """``checkpoint_engine.backend=rollout_queue`` (module docstring). Built by verl on every actor rank
    and every rollout worker with the same engine kwargs; only the actor's rank 0 connects to the queue
    (at construction, so a wrong URL, queue or model path fails before training starts).

    Raises IntegrationConfigError, QueueNotFound (from the constructor on rank 0).
    """

    def __init__(self, bucket_size: int, is_master: bool = False, **engine_kwargs: Any) -> None:
        self.bucket_size, self.is_master = bucket_size, is_master
        WeightSettings.check_names(engine_kwargs)  # every rank refuses a typo, not rank 0 alone
        self.settings: WeightSettings | None = None
        self.queue: RolloutQueue | None = None
        self.publisher: WeightPublisher | None = None
        self.offset: int | None = None
        self.last_step: int | None = None
        self._files: list[Path] = []
        self._warned = False
        if is_master:
            self.settings = settings = WeightSettings.from_kwargs(engine_kwargs)
            self._files = model_files(settings.model_path)
            self.queue = RolloutQueue.from_url(settings.url, settings.queue, create=False)
            transport: Any = settings.transport  # checked by from_kwargs: "folder" or "delta"
            self.publisher = WeightPublisher(self.queue, settings.root, transport=transport,
                                             keep=settings.keep, full_every=settings.full_every,
                                             uri_base=settings.uri_base, upload=settings.upload)

    # -- verl's topology calls: the queue and the storage are the rendezvous, so there is none ---------

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: list[dict]) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        return {}, {}

    def init_process_group(self, **kwargs: Any) -> None:
        return None

    def finalize(self) -> None:
        return None

    # -- weights ---------------------------------------------------------------------------------------

    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
        """Rank 0: publish what verl sends as one queue version and return verl's sync metrics; every
        other rank: walk the iterator (item 1). Raises IntegrationConfigError for weights no worker
        can load (none, a name twice, an unmerged LoRA) or when another trainer moved the queue's
        version meanwhile; what the queue or the filesystem raises otherwise. Every rank has walked
        the whole iterator before anything is raised."""
        if not self.is_master:
            async for _ in _items(weights):
                pass
            return {}
        began = time.perf_counter()
        tensors = await self._collect(weights)
        return await asyncio.to_thread(self._publish, tensors, global_steps, began)

    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, torch.Tensor]]:
        """verl's rollout replicas: no tensors, they keep their weights (module docstring, item 4)."""
        if not self._warned:
            log.warning("checkpoint_engine.backend=%s: verl's own rollout replicas keep their weights (the "
                        "queue's workers load each version the trainer publishes)", BACKEND)
            self._warned = True
        return
        yield  # an async generator, as verl's server adapters iterate one

    async def _collect(self, weights: Any) -> dict[str, torch.Tensor]:
        """A CPU copy of every tensor (its own storage: tied weights must not share one in the file),
        cast to ``dtype`` when set. The first failure is raised only once the iterator is spent."""
        assert self.settings is not None, "only rank 0 collects"
        dtype = getattr(torch, self.settings.dtype) if self.settings.dtype else None
        tensors: dict[str, torch.Tensor] = {}
        failure: Exception | None = None
        async for name, tensor in _items(weights):
            if failure is not None:
                continue  # keep walking: the other ranks' gathers need this rank's share
            try:
                if name in tensors:
                    raise IntegrationConfigError(f"verl sent the tensor {name!r} twice in one version")
                if "lora_A" in name or "lora_B" in name:
                    raise IntegrationConfigError(
                        f"verl sent LoRA tensors ({name!r}): queue workers load whole models; set "
                        "actor_rollout_ref.model.lora.merge=True so verl sends the merged weights")
                cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
                tensors[name] = tensor.detach().to("cpu", dtype=cast, copy=True).contiguous()
            except Exception as exc:  # raised below, after the walk (docstring)
                failure = exc
        if failure is not None:
            raise failure
        if not tensors:
            raise IntegrationConfigError("verl sent no tensors: nothing to publish")
        return tensors

    def _publish(self, tensors: dict[str, torch.Tensor], step: int | None, began: float) -> dict[str, float]:
        """Write and record one version (item 3); a step this process published already is not
        published again."""
        assert self.queue is not None and self.publisher is not None, "only rank 0 publishes"
        if step is not None and step == self.last_step:
            return {"rollout_queue/weights_version": float(self.queue.version), "rollout_queue/weights_replay": 1.0}
        current = self.queue.version
        if step is None:  # verl gave no step: a new version all the same (the weights may have changed)
            version = current + 1
        else:
            version, self.offset = queue_version(step, current, self.offset)
        try:
            uri = self.publisher.publish(SentVersion(tensors, self._files), version)
        except VersionRegression as exc:
            raise IntegrationConfigError(
                f"queue {self.queue.name!r} is at version {exc.current}, above verl step {step} published as "
                f"{version}: another trainer publishes to this queue. One trainer per queue publishes versions "
                "(start the other on a queue of its own)") from exc
        self.last_step = step
        published = self.publisher.last
        assert published is not None
        log.info("verl step %s published as version %d (%s, %d tensors) at %s", step, version, published.kind,
                 published.tensors, uri)
        return {"rollout_queue/weights_version": float(version), "rollout_queue/weights_bytes": float(published.bytes),
                "rollout_queue/weights_tensors": float(published.tensors),
                "rollout_queue/weights_publish_s": time.perf_counter() - began}
