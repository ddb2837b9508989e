"""The vLLM worker extension that reloads a version chain (``rollout_queue.weights``) in place.

vLLM imports this class by name in each of its worker processes (``worker_extension_cls``) and
mixes it into the worker, so ``collective_rpc("rq_reload_chain", args=(folders,))`` runs
``rq_reload_chain`` beside the model. Only paths cross the process boundary (tensors inside
``collective_rpc`` arguments arrive as lists in multiprocess mode).

Every tensor of the model is handed to ``reload_weights``, the newest folder of the chain that
holds it winning: vLLM's in-place reload processes whole layers (CPU kernels repack weights after
loading), so a delta is applied as a full reload whose unchanged tensors come from the page cache.
Pushed versions (``rollout_queue.weights.push``) are received here too, beside the model: in a
thread of the worker process (``rq_push_begin``), so the engine keeps stepping while the tensors
arrive, polled with ``rq_push_status``, applied by ``rq_push_apply`` with the same
``reload_weights`` once the version is recorded. Only the ticket (a dict) and status strings cross
the process boundary.
This module must not import vLLM at module level beyond what the worker already has loaded.
"""

from __future__ import annotations

import os
import threading
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
        for name, file in newest.items():
            by_file.setdefault(file, []).append(name)

        def weights() -> Iterator[tuple[str, Any]]:
            for path, names in by_file.items():
                with safe_open(path, framework="pt", device="cpu") as handle:
                    for name in names:
                        yield name, handle.get_tensor(name)

        self.model_runner.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        return len(newest)

    # -- pushed versions ---------------------------------------------------------------------

    def _rq_push(self) -> dict[str, Any]:
        state = self.__dict__.get("_rq_push_state")
        if state is None:
            state = self.__dict__["_rq_push_state"] = {"status": "none", "staged": None}
        return state

    def rq_push_begin(self, ticket: dict[str, Any]) -> str:
        """Start receiving the round of ``ticket`` (a PushTicket's fields) in a thread; 'pending'."""
        from rollout_queue.core.models import PushTicket
        from rollout_queue.weights.push import receive

        state = self._rq_push()
        if state["status"] == "pending":
            return "failed: a push is being received already"
        parsed = PushTicket(**ticket)
        state.update(status="pending", staged=None)
        device = getattr(self, "device", None)

        def run() -> None:
            try:
                staged = receive(parsed, device=device)
            except Exception as exc:  # noqa: BLE001 - reported through rq_push_status
                state.update(status=f"failed: {exc}", staged=None)
                return
            state.update(status="ok", staged=staged)

        threading.Thread(target=run, name=f"rq-push-{parsed.epoch}", daemon=True).start()
        return "pending"

    def rq_push_status(self) -> str:
        """'pending', 'ok' (staged), 'none', or 'failed: why'."""
        return str(self._rq_push()["status"])

    def rq_push_apply(self, uri: str) -> int:
        """Reload the model from the staged push of ``uri``; the number of tensors loaded (-1: none staged)."""
        state = self._rq_push()
        staged = state["staged"]
        state.update(status="none", staged=None)
        if staged is None or staged.uri != uri:
            return -1
        self.model_runner.reload_weights(weights_iterator=iter(staged.tensors.items()), is_checkpoint_format=True)
        return len(staged.tensors)
