"""One incarnation of a slime-shaped trainer, SIGKILLed at random by tests/integrations/test_slime.py.

It drives ``QueueDataSource`` and ``generate_rollout`` the way slime's ``train.py`` does
(``slime/ray/placement_group.py``: ``load(start_rollout_id - 1)`` once the checkpoint's rollout id is
known; then per rollout ``generate``, the actor's training, and every ``--save-interval`` rollouts
``actor_model.save_model(k)`` followed by the data source's ``save(k)``). Training is a short pause
where a kill can land; so is the gap between the model's save and the data source's, the window a
commit deferred to ``save`` would lose.

What it trained goes to ``--out`` (one JSON line per rollout, flushed and fsynced before the model's
save), with a ``resume`` line per incarnation, so the test can count each prompt (``source_id``)
trained into the weights that survive.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rollout_queue.integrations.convert.slime import THIS_ROLLOUT_FUNCTION, QueueDataSource, generate_rollout  # noqa: E402
from tests.integrations.crash_runs import newest_checkpoint, trained_log  # noqa: E402


def source_id(sample: Any) -> str:
    """The prompt a sample answers (a dict where slime is not installed, slime's Sample where it is)."""
    metadata = sample["metadata"] if isinstance(sample, dict) else sample.metadata
    return str(metadata["source_id"])


def run(a: argparse.Namespace) -> None:
    ckpt = Path(a.checkpoints)
    start = newest_checkpoint(ckpt, "rollout_", default=-1) + 1
    args = SimpleNamespace(rollout_batch_size=a.groups, rollout_function_path=THIS_ROLLOUT_FUNCTION,
                           eval_interval=None, eval_function_path=None, rollout_global_dataset=True)
    source = QueueDataSource(args)
    source.load(start - 1)
    with trained_log(a.out) as write:
        write({"resume": start - 1, "pid": os.getpid()})
        for rollout_id in range(start, a.num_rollout):
            groups = generate_rollout(args, rollout_id, source)
            time.sleep(a.step_s)   # the actor's training: a kill here loses the rollout
            write({"rollout": rollout_id, "prompts": sorted(source_id(g[0]) for g in groups)})
            if (rollout_id + 1) % a.save_interval == 0:
                tmp = ckpt / f"tmp_rollout_{rollout_id}"
                tmp.mkdir(exist_ok=True)
                tmp.rename(ckpt / f"rollout_{rollout_id}")   # actor_model.save_model(rollout_id)
                if rollout_id == a.die_after_model_save:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(a.step_s)   # then rollout_manager.save(rollout_id): a kill here too
                source.save(rollout_id)
        write({"done": a.num_rollout})


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("out", "checkpoints"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--num-rollout", type=int, required=True)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--save-interval", type=int, default=3)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--die-after-model-save", type=int, default=-1,
                   help="SIGKILL this process between the model's save and the data source's at that rollout")
    run(p.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
