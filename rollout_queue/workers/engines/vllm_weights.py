"""The vLLM worker extension that reloads a version chain (``rollout_queue.weights``) in place.

vLLM imports this class by name in each of its worker processes (``worker_extension_cls``) and
mixes it into the worker, so ``collective_rpc("rq_reload_chain", args=(folders,))`` runs
``rq_reload_chain`` beside the model. Only paths cross the process boundary (tensors inside
``collective_rpc`` arguments arrive as lists in multiprocess mode).

Every tensor of the model is handed to ``reload_weights``, the newest folder of the chain that
holds it winning: vLLM's in-place reload processes whole layers (CPU kernels repack weights after
loading), so a delta is applied as a full reload whose unchanged tensors come from the page cache.
This module must not import vLLM at module level beyond what the worker already has loaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ChainReload:
    """Mixed into vLLM's worker: ``self.model_runner`` is the worker's model runner."""

    model_runner: Any

    def rq_reload_chain(self, folders: list[str]) -> int:
        """Reload the model from ``folders`` (a full folder first, deltas after). Returns the
        number of tensors loaded."""
        from safetensors import safe_open

        from rollout_queue.weights.store import safetensors_files

        newest: dict[str, str] = {}  # tensor name -> file holding its newest value
        for folder in folders:
            for path in (Path(folder) / name for name in safetensors_files(Path(folder))):
                with safe_open(os.fspath(path), framework="pt", device="cpu") as handle:
                    for name in handle.keys():
                        newest[name] = os.fspath(path)
        by_file: dict[str, list[str]] = {}
        for name, path in newest.items():
            by_file.setdefault(path, []).append(name)

        def weights() -> Iterator[tuple[str, Any]]:
            for path, names in by_file.items():
                with safe_open(path, framework="pt", device="cpu") as handle:
                    for name in names:
                        yield name, handle.get_tensor(name)

        self.model_runner.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        return len(newest)
