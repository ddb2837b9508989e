"""LoRA adapter versions: a run that trains an adapter publishes the adapter, not the model.

A ``PeftModel`` published by ``WeightPublisher`` is written by its own ``save_pretrained`` (an
``adapter_config.json`` and the adapter's tensors, a few MB) as a version of kind ``lora``
(manifest.py); workers keep serving the base model they started with (``--model``) and apply each
adapter version over it:

- vLLM loads it with ``add_lora`` and serves every new request with the newest adapter, keeping
  older ones resident while requests started on them finish (engines/vllm.py);
- the torch engine merges it: each targeted weight becomes ``W0 + scaling * B @ A`` over a copy of
  the base weight ``W0`` kept from the first adapter (``merged_weights`` here).

What is refused (``WeightsError``, before anything is applied): adapters on anything but linear
layers' weights (embeddings, convolutions, ``modules_to_save``, trained biases), DoRA, and
``fan_in_fan_out`` layers: they are not "one low-rank product added to a weight". Also adapters
initialised by a method that changes the base weights (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA, MiCA:
any ``init_lora_weights`` but ``BASE_KEEPING_INITS``): peft subtracts their initial product from
the base weight (or quantises it), so the trainer's ``merge_and_unload`` is ``W_res + scaling * B @ A``
with a residual ``W_res`` no worker has, and the same adapter added to the served ``W0`` differs from
it (in the tiny test model, by up to 0.19 with PiSSA and 0.69 with OLoRA, on weights of at most 0.44). The publisher refuses such a model
before writing anything (``check_publishable``), and every worker refuses such a folder.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from rollout_queue.core.errors import WeightsError
from rollout_queue.weights.store import ADAPTER_CONFIG, safetensors_files

if TYPE_CHECKING:
    import torch

#: Prefix peft puts before the base model's own parameter names in a saved adapter.
PEFT_PREFIX = "base_model.model."


def is_adapter(folder: Path) -> bool:
    """Whether a (local) version folder is a LoRA adapter."""
    return (folder / ADAPTER_CONFIG).is_file()


def is_peft_model(model: Any) -> bool:
    """A peft ``PeftModel`` (what a LoRA run trains), told by duck typing so peft stays optional."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_config(folder: Path) -> dict[str, Any]:
    try:
        config = orjson.loads((folder / ADAPTER_CONFIG).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise WeightsError(f"{folder / ADAPTER_CONFIG}: unreadable ({exc})") from exc
    if not isinstance(config, dict):
        raise WeightsError(f"{folder / ADAPTER_CONFIG}: not a JSON object")
    return config


#: ``init_lora_weights`` values after which peft leaves the base weights as they were (only A and B
#: are initialised), so ``W0 + scaling * B @ A`` is exactly peft's merge. Anything else is refused.
BASE_KEEPING_INITS = (True, False, "gaussian", "eva", "orthogonal")


def scaling(config: Mapping[str, Any], where: Path | str) -> float:
    """peft's: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA. Refuses what is not plain LoRA."""
    if config.get("peft_type", "LORA") != "LORA":
        raise WeightsError(f"{where}: a {config.get('peft_type')} adapter, not LoRA")
    init = config.get("init_lora_weights", True)
    if not any(init is keep if isinstance(keep, bool) else init == keep for keep in BASE_KEEPING_INITS):
        raise WeightsError(
            f"{where}: an adapter initialised with init_lora_weights={init!r} was trained over base weights peft "
            "changed at initialisation (PiSSA, OLoRA, CorDA and LoftQ subtract their initial product from them "
            "or quantise them), so added to the served model it would not be the trainer's merge_and_unload: "
            f"initialise the adapter with one of {list(BASE_KEEPING_INITS)} (True is peft's default)")
    for key in ("use_dora", "fan_in_fan_out"):
        if config.get(key):
            raise WeightsError(f"{where}: {key} adapters are not supported (only W + scaling * B @ A)")
    if config.get("modules_to_save") or config.get("bias", "none") != "none":
        raise WeightsError(f"{where}: adapters that also train modules_to_save or biases are not supported")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(r, int) or r < 1 or not isinstance(alpha, (int, float)):
        raise WeightsError(f"{where}: adapter_config.json needs an integer r >= 1 and a lora_alpha")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise WeightsError(f"{where}: per-module rank or alpha patterns are not supported")
    return float(alpha) / (math.sqrt(r) if config.get("use_rslora") else r)


def check_publishable(model: Any) -> None:
    """Refuse, before anything is written, a ``PeftModel`` whose adapters no worker would apply
    (``scaling``'s rules, on the configs its ``save_pretrained`` would write). Raises ``WeightsError``."""
    for name, config in model.peft_config.items():
        scaling(config.to_dict(), f"adapter {name!r} of the published model")


def read_adapter(folder: Path) -> dict[str, tuple["torch.Tensor", "torch.Tensor"]]:
    """The adapter's (A, B) pairs by the base weight they modify (``model.layers.0.q_proj.weight``)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    try:
        for name in safetensors_files(folder):
            tensors.update(load_file(os.fspath(folder / name)))
    except Exception as exc:  # noqa: BLE001 - an unreadable file: nothing applied
        raise WeightsError(f"{folder}: unreadable adapter tensors ({exc})") from exc
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        module, _, tail = name.rpartition(".lora_")
        if tail not in ("A.weight", "B.weight") or not module.startswith(PEFT_PREFIX):
            raise WeightsError(f"{folder}: tensor {name!r} is not a linear layer's lora_A/lora_B weight")
        pairs.setdefault(module[len(PEFT_PREFIX):] + ".weight", {})[tail[0]] = tensor
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for target, pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise WeightsError(f"{folder}: {target} has lora_{'A' if 'B' in pair else 'B'} missing")
        a, b = pair["A"], pair["B"]
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != a.shape[0]:
            raise WeightsError(f"{folder}: {target}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not compose")
        out[target] = (a, b)
    if not out:
        raise WeightsError(f"{folder}: the adapter holds no tensors")
    return out


def merged_weights(folder: Path, base: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """Each weight the adapter at ``folder`` targets, as ``base[name] + scaling * B @ A`` (in the base
    weight's dtype and device). Raises ``WeightsError`` for an adapter that does not fit ``base``."""
    import torch

    factor = scaling(adapter_config(folder), folder)
    pairs = read_adapter(folder)
    unknown = sorted(set(pairs) - set(base))
    if unknown:
        raise WeightsError(f"{folder}: the adapter targets weights the model does not have: {unknown[:5]}")
    out: dict[str, torch.Tensor] = {}
    for name, (a, b) in pairs.items():
        w = base[name]
        if (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise WeightsError(f"{folder}: {name}: the adapter's {(b.shape[0], a.shape[1])} is not the weight's "
                               f"{tuple(w.shape)}")
        delta = (b.to(torch.float32) @ a.to(torch.float32)) * factor
        out[name] = (w.to(torch.float32) + delta.to(w.device)).to(w.dtype)
    return out
