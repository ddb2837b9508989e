"""One incarnation of a miles-shaped trainer, SIGKILLed at random by tests/integrations/test_miles_crash.py.

miles is not importable here (its modules import ray and sglang at module level), so this models
its loop order exactly as its source has it at radixark/miles@31f1ca96 and drives the same
``MilesLedger`` calls the queue-backed classes make:

- start: ``rollout_manager.load(start_rollout_id - 1)`` once the checkpoint's rollout id is known
  (``miles/ray/placement_group.py`` lines 177-182) -> ``QueueDataSource.load`` -> ``ledger.load``.
- ``train_async.py`` lines 73-111: ``generate(start)`` is started first; per rollout ``k`` it awaits
  ``generate(k)``, starts ``generate(k + 1)`` (which runs while ``k`` trains), trains ``k``, and every
  ``--save-interval`` rollouts saves the model (``save_training_model``) and then calls
  ``rollout_manager.save(k)`` -> ``QueueDataSource.save`` -> ``ledger.save``; every
  ``--update-weights-interval`` rollouts it awaits the generation in flight before updating weights.
- ``generate(k)`` is ``FullyAsyncRolloutFn._drain`` (``miles/rollout/fully_async_rollout.py``):
  ``rollout_batch_size`` calls of the buffer's ``get`` and one ``get_metrics``. Here ``get`` is what
  ``QueueDataBuffer.get`` does with a fresh group (``ledger.lease_one`` then ``ledger.hand_out``)
  and ``get_metrics`` ends the drain (``ledger.end_drain``). It runs in a thread of its own, as the
  ``RolloutManager`` actor's ``generate`` runs beside the trainer.
- ``--async-save``: Megatron writes checkpoint ``k`` in the background; the next ``save_model``
  finalises it first (``miles/backends/megatron_utils/actor.py`` ``save_model``), and the last
  rollout's save is synchronous (``force_sync``). Modelled by leaving ``rollout_k`` unwritten
  (``tmp_rollout_k``) until then.

Training is a short pause where a kill can land; so is the gap between the model's save and the
rollout manager's. What it trained goes to ``--out`` (one JSON line per rollout, flushed and fsynced
before the model's save), with a ``resume`` line per incarnation, so the test can count each prompt
(``source_id``) trained into the weights that survive.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rollout_queue.integrations.miles.ledger import MilesLedger, ledger_for  # noqa: E402
from tests.integrations.crash_runs import newest_checkpoint, trained_log  # noqa: E402


def drain(ledger: MilesLedger, groups: int) -> list[str]:
    """``generate(k)``: the source ids of the ``groups`` groups the buffer hands out, then get_metrics."""
    out: list[str] = []
    while len(out) < groups:
        lease = ledger.lease_one(block_ms=500)
        if lease is None:
            continue
        ledger.hand_out(lease)
        out.append(lease.groups[0].group.source_id)
    ledger.end_drain()
    return out


def finalise(ckpt: Path) -> None:
    """Megatron's ``maybe_finalize_async_save(blocking=True)``: a pending checkpoint becomes loadable."""
    for tmp in ckpt.glob("tmp_rollout_*"):
        tmp.rename(ckpt / tmp.name.removeprefix("tmp_"))


def run(a: argparse.Namespace) -> None:
    ckpt = Path(a.checkpoints)
    start = newest_checkpoint(ckpt, "rollout_", default=-1) + 1
    for stale in ckpt.glob("tmp_rollout_*"):   # an async save the killed incarnation never finalised
        stale.rmdir()
    args = SimpleNamespace(start_rollout_id=start, rollout_batch_size=a.groups, async_save=a.async_save)
    ledger = ledger_for(args)
    ledger.load(start - 1)
    pool = ThreadPoolExecutor(1)   # the RolloutManager actor
    with trained_log(a.out) as write:
        def save_model(rollout_id: int) -> None:
            finalise(ckpt)
            (ckpt / f"tmp_rollout_{rollout_id}").mkdir()
            if not a.async_save or rollout_id == a.num_rollout - 1:   # force_sync on the last rollout
                finalise(ckpt)

        write({"resume": start - 1, "pid": os.getpid()})
        next_future: Future[list[str]] | None = pool.submit(drain, ledger, a.groups)
        current: list[str] = []
        for rollout_id in range(start, a.num_rollout):
            if next_future is not None:
                current = next_future.result()
            if rollout_id + 1 < a.num_rollout:
                next_future = pool.submit(drain, ledger, a.groups)
            time.sleep(a.step_s)   # actor_model.train(rollout_id, ...): a kill here loses the rollout
            write({"rollout": rollout_id, "prompts": sorted(current)})
            if (rollout_id + 1) % a.save_interval == 0 or rollout_id == a.num_rollout - 1:
                save_model(rollout_id)
                if rollout_id == a.die_after_model_save:
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(a.step_s)   # then rollout_manager.save(rollout_id): a kill here too
                ledger.save(rollout_id)
                if rollout_id == a.die_after_save:
                    os.kill(os.getpid(), signal.SIGKILL)
            if (rollout_id + 1) % a.update_weights_interval == 0:
                current = next_future.result() if next_future is not None else []
                next_future = None
                time.sleep(a.step_s / 4)   # actor_model.update_weights(rollout_id=rollout_id)
        write({"done": a.num_rollout})
    pool.shutdown()


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("out", "checkpoints"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--num-rollout", type=int, required=True)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--save-interval", type=int, default=3)
    p.add_argument("--update-weights-interval", type=int, default=1)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--async-save", action="store_true", help="miles' --async-save (Megatron's background save)")
    p.add_argument("--die-after-model-save", type=int, default=-1,
                   help="SIGKILL this process between the model's save and the rollout manager's at that rollout")
    p.add_argument("--die-after-save", type=int, default=-1,
                   help="SIGKILL this process right after the rollout manager's save at that rollout")
    run(p.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
