"""What the integration tests share: a queue filled with completed groups (a worker's part, by
hand) and Redis's own record of what was committed when."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from rollout_queue import RolloutQueue, Sample, SourceGroup
from tests.cluster.test_composite_lease import read_commits

__all__ = ["committed_steps", "fill", "read_commits", "world_of_one"]


@contextmanager
def world_of_one() -> Iterator[Any]:
    """torch.distributed in this process, a gloo world of one rank (so RankedStream's collectives run
    in a test), torn down after; yields ``torch.distributed``."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def fill(q: RolloutQueue, count: int, *, n: int = 2, version: int = 0, tokenized: bool = False) -> None:
    """Submit ``count`` groups of ``n`` and complete them at policy ``version`` (logprobs, rewards
    0..n-1); ``tokenized`` gives them prompt_token_ids."""
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", n, {}, (1, 2, 3) if tokenized else None) for i in range(count)])
    w = q.worker("w")
    done = 0
    while done < count:
        got = w.reserve(max_groups=count - done, block_ms=500)
        assert got, f"nothing to reserve after {done} of {count}"
        for r in got:
            w.complete(r.receipt, [Sample(slot=k, token_ids=(10 + k, 11), logprobs=(-0.5, -0.25), reward=float(k),
                                          version=version) for k in range(r.group.n)])
        done += len(got)


def committed_steps(q: RolloutQueue) -> list[tuple[int, int]]:
    """(step, groups) of each commits line."""
    out = []
    for _, kv in q.run(read_commits(q.keys)):
        raw: dict[Any, Any] = dict(zip(kv[::2], kv[1::2]))
        out.append((int(raw[b"step"]), len([i for i in raw[b"ids"].split(b",") if i])))
    return out
