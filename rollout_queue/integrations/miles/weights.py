"""miles' ``--custom-update-weight-post-write-path`` hook: each disk-delta version miles writes is
recorded in the queue, so the queue's workers follow miles' trainer with no exporter.

Read at radixark/miles@31f1ca96 (``update_weight_from_distributed/delta.py``, ``utils/arguments.py``):
the hook is ``hook(args, version_dir, rollout_engines)``, called on every trainer rank after a
version's files are written and before any engine reads them, and once on rank 0 at the baseline
with the delta root itself (just emptied); "the hook gates itself". Here:

- at the baseline it records where version 0 is (``rollout-queue-base.json``: ``--hf-checkpoint``),
  which a worker on the trainer's filesystem uses as its base (others set ``ROLLOUT_MILES_BASE``);
- for ``weight_vNNNNNN`` it publishes version ``N`` with the folder as its weights URI, from rank 0
  only (every rank's files are written by then: miles' writer ends on a barrier). Workers rebuild
  it with ``rollout_queue/weights/miles_delta.py`` (checksums verified).
- ``ROLLOUT_MILES_NEXT_POST_WRITE`` (``module.function``) names a hook of the user's own (an
  object-store upload) to run first, so publishing never precedes the files being visible.

The queue is ``REDIS_URL`` / ``ROLLOUT_QUEUE``, as for every process of this project. slime
(THUDM/slime@624b824a) has the same hook and the same folders (``--update-weight-transport disk``,
``--update-weight-mode full`` or ``delta``; a full folder is loaded as it is), so it serves slime too.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from rollout_queue.api.queue import RolloutQueue
from rollout_queue.integrations.environment import queue_address
from rollout_queue.weights.miles_delta import BASE_RECORD

__all__ = ["record_version"]


def _rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _next_hook() -> Any:
    path = os.environ.get("ROLLOUT_MILES_NEXT_POST_WRITE")
    if not path:
        return None
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def record_version(args: Any, version_dir: str, rollout_engines: Any = None) -> bool:
    """The post-write hook (module docstring). Returns whether this call recorded a version."""
    chained = _next_hook()
    if chained is not None:
        chained(args, version_dir, rollout_engines)
    if _rank() != 0:
        return False
    folder = Path(version_dir).resolve()
    url, name = queue_address(needs="record_version (it publishes to the queue)")
    if not folder.name.startswith("weight_v"):  # the baseline: the delta root, just emptied
        base = {"hf_checkpoint": os.fspath(Path(args.hf_checkpoint).resolve())}
        (folder / BASE_RECORD).write_text(json.dumps(base))
        return False
    version = int(folder.name[len("weight_v"):])  # slime's full-mode folders have no delta index
    queue = RolloutQueue.from_url(url, name, create=False)
    try:
        return bool(queue.publish_version(version, os.fspath(folder)))
    finally:
        queue.close()
