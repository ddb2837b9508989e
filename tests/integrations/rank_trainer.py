"""One rank of a data-parallel trainer on the queue (tests/integrations/test_ranks.py runs W of these).

A DDP-wrapped linear model over gloo learns from each rank's share of the step's lease; each rank
writes what it trained (step, entry ids) to --out before the step's vote. ``--slow-step K`` makes this
rank stall inside step K (after training, before the vote) so the test can SIGKILL it there;
``--raise-step K`` makes it raise inside step K (data it cannot train on).
Exit codes: 0 done, 3 RankFailed (the step was rolled back), 4 StreamStarved or WorkersGone (rank 0:
no batch can come). Either error also prints ``ERROR-AT <type> <unix time>`` on stderr, so a harness
times it (scripts/bench_hang.py: kill -> trainer error).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import orjson
import torch
import torch.distributed as dist

from rollout_queue import RolloutQueue
from rollout_queue.core.errors import RankFailed, StreamStarved
from rollout_queue.integrations.ranks import RankedStream


def main() -> int:
    p = argparse.ArgumentParser()
    for name in ("--url", "--queue", "--out"):
        p.add_argument(name, required=True)
    for name in ("--rank", "--world", "--port", "--steps", "--groups"):
        p.add_argument(name, type=int, required=True)
    p.add_argument("--slow-step", type=int, default=0)
    p.add_argument("--raise-step", type=int, default=0, help="raise ValueError inside this step (bad data)")
    p.add_argument("--wait-s", type=float, default=30.0, help="TrainingStream's wait_s")
    p.add_argument("--fleet-grace", type=float, default=None, help="fleet_grace_s (default: worker_timeout_s)")
    a = p.parse_args()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ranked = RankedStream(RolloutQueue.from_url(a.url, a.queue, create=False), groups_per_step=a.groups,
                          wait_s=a.wait_s, lease_timeout_s=120, fleet_grace_s=a.fleet_grace)
    out = Path(a.out).open("ab", buffering=0)
    try:
        for step in range(1, a.steps + 1):
            with ranked.step(step) as share:
                x = torch.tensor([[len(s.token_ids), s.reward or 0.0, s.version] for g in share.groups
                                  for s in g.samples], dtype=torch.float32)
                opt.zero_grad()
                model(x).pow(2).mean().backward()  # DDP all-reduces the gradients over gloo
                opt.step()
                out.write(orjson.dumps({"step": step, "rank": a.rank, "entries": [g.entry_id for g in share.groups],
                                        "lease_groups": share.lease_groups, "version": share.version}) + b"\n")
                if step == a.raise_step:
                    raise ValueError(f"rank {a.rank} cannot train step {step}")
                if step == a.slow_step:
                    out.write(orjson.dumps({"step": step, "rank": a.rank, "stalled": True}) + b"\n")
                    time.sleep(120)
    except RankFailed as exc:
        print(f"ERROR-AT RankFailed {time.time():.3f}", file=sys.stderr)
        print(f"RankFailed: {exc}", file=sys.stderr)
        return 3
    except StreamStarved as exc:
        print(f"ERROR-AT {type(exc).__name__} {time.time():.3f}", file=sys.stderr)
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 4
    finally:
        out.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without running C++ destructors: gloo's threads may still be winding down at interpreter
    # exit, and libstdc++ then aborts ("terminate called without an active exception", seen in CI).
    os._exit(code)
