"""One actor rank of a verl trainer sending weights (tests/integrations/test_verl_weights.py runs 2).

It does what verl 0.9.1's ``ActorRolloutRefWorker`` does with a checkpoint engine: imports
``custom_backend_module``, builds the backend with ``CheckpointEngineRegistry.new(backend,
is_master=(rank == 0), bucket_size=..., **engine_kwargs[backend])`` (``engine_workers.py``), and calls
``send_weights(per_tensor_param, global_steps=step)`` on every rank. Its per-tensor iterator is
FSDP-like: each rank holds one flat shard of every tensor and the full tensor is an ``all_gather``
over gloo, so a rank that stops walking the iterator leaves the other one blocked (the gloo timeout
turns that into an error, not a hang).

``--publish STEP:MODEL_FOLDER`` (repeatable) sends that folder's weights as verl step STEP, in order,
through one engine. ``--lora`` renames one tensor as an unmerged LoRA would be (rank 0 must refuse
it, after walking the whole iterator). Rank 0 writes the metrics of each send, or the error, to --out.
Exit codes: 0 done, 4 send_weights raised.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import orjson
import torch
import torch.distributed as dist


def sharded_weights(folder: str, rank: int, world: int, lora: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """The folder's tensors, each rebuilt from every rank's flat shard by one all_gather."""
    from safetensors.torch import load_file

    state = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(path)))
    for name in sorted(state):
        full = state[name].contiguous()
        flat = full.reshape(-1)
        per = -(-flat.numel() // world)
        shard = torch.zeros(per, dtype=flat.dtype)
        mine = flat[rank * per:(rank + 1) * per]
        shard[:mine.numel()] = mine
        parts = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(parts, shard)  # collective: every rank must reach it for every tensor
        gathered = torch.cat(parts)[:flat.numel()].reshape(full.shape)
        yield (name.replace(".weight", ".lora_A.weight") if lora and name == sorted(state)[0] else name), gathered


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--config", required=True, help="the checkpoint_engine config, as JSON")
    p.add_argument("--publish", action="append", default=[])
    p.add_argument("--out", required=True)
    p.add_argument("--lora", action="store_true")
    a = p.parse_args()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world,
                            timeout=timedelta(seconds=60))
    from omegaconf import OmegaConf
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.import_utils import import_external_libs

    config = omega_conf_to_dataclass(OmegaConf.create(orjson.loads(a.config)))
    import_external_libs(config.custom_backend_module or None)
    engine = CheckpointEngineRegistry.new(config.backend, is_master=(dist.get_rank() == 0),
                                          bucket_size=config.update_weights_bucket_megabytes << 20,
                                          **config.engine_kwargs.get(config.backend, {}))
    results: list[dict] = []
    code = 0
    try:
        for item in a.publish:
            step, folder = item.split(":", 1)
            metrics = asyncio.run(engine.send_weights(sharded_weights(folder, a.rank, a.world, a.lora),
                                                      global_steps=int(step)))
            results.append(dict(metrics or {}))
    except Exception as exc:  # reported through --out and the exit code
        results.append({"error": type(exc).__name__, "message": str(exc)})
        code = 4
    dist.barrier()  # both ranks got here: neither was left in a gather
    Path(a.out).write_bytes(orjson.dumps(results))
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
