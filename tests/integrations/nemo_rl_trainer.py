"""One incarnation of a NeMo-RL-shaped trainer, SIGKILLed at random by tests/integrations/test_nemo_rl.py.

It drives the queue sampler the way NeMo-RL's ``SingleControllerActor`` does at the pinned commit
(NVIDIA-NeMo/RL@7ea279ab): the real ``create_sampler`` and ``TQReplayBuffer`` over NeMo-RL's
in-process data plane, ``set_dispatch_index(current_step)`` with the step of the newest finalized
``step_N`` folder, then per step ``evict``, ``select``, the "optimizer step" (reading and clearing
the rows, a short pause where a kill can land), ``current_step += 1``, and every ``--save`` steps
the checkpoint (a ``tmp_step_N`` folder renamed to ``step_N``, as CheckpointManager finalizes).

What it trained goes to ``--out`` (one JSON line per step, flushed and fsynced before the
checkpoint), with a ``resume`` line per incarnation, so the test can count each source group
(entry) trained into the weights that survive: a step after the checkpoint an incarnation resumed from was
lost with the process, and its groups must be trained again, once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integrations.crash_runs import newest_checkpoint, trained_log  # noqa: E402
from tests.integrations.framework_src import add_source  # noqa: E402

add_source("NEMO_RL_SRC")


async def run(a: argparse.Namespace) -> None:
    from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer
    from nemo_rl.algorithms.async_utils.staleness_sampler import CustomSamplerConfig, create_sampler
    from nemo_rl.data_plane.adapters.noop import NoOpDataPlaneClient

    ckpt = Path(a.checkpoints)
    current = newest_checkpoint(ckpt, "step_", default=0)
    dp = NoOpDataPlaneClient()
    dp.register_partition(partition_id="train", fields=["input_ids"], num_samples=4096, consumer_tasks=["train"])
    buffer = TQReplayBuffer(dp, "train", pad_value_dict={"token_ids": 0})
    sampler = create_sampler(buffer, CustomSamplerConfig(
        target="rollout_queue.integrations.nemo_rl.sampler:QueueSampler", url=a.url, queue=a.queue,
        wait_s=a.wait_s, checkpoint_dir=str(ckpt), block_ms=200))
    sampler.set_dispatch_index(current)
    with trained_log(a.out) as write:
        write({"resume": current, "pid": os.getpid()})
        while current < a.steps:
            await sampler.evict(current_train_weight=current)
            meta, n = await sampler.select(current_train_weight=current, min_prompt_groups=a.groups,
                                           max_prompt_groups=a.groups)
            rows = dp.get_samples(sample_ids=meta.sample_ids, partition_id="train", select_fields=["input_ids"])
            assert rows["input_ids"].shape[0] == n * a.n
            time.sleep(a.step_s)   # the optimizer step: a kill here loses the step
            dp.clear_samples(sample_ids=list(meta.sample_ids), partition_id="train")
            current += 1
            # row ids are {slot}_g{i}, slots rq-{lease_id}-{entry_id} (the sampler's)
            write({"step": current, "entries": sorted({s.rsplit("_g", 1)[0].split("-", 2)[2]
                                                       for s in meta.sample_ids})})
            if current % a.save == 0 or current == a.steps:
                tmp = ckpt / f"tmp_step_{current}"
                tmp.mkdir(exist_ok=True)
                tmp.rename(ckpt / f"step_{current}")
        write({"done": current})


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("url", "queue", "out", "checkpoints"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--save", type=int, default=2)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--wait-s", type=float, default=120.0)
    asyncio.run(run(p.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
