"""A small trainer PROCESS for the cluster process test, through the public API only:
``python -m tests.cluster.trainer_process URL QUEUE PARTITIONS GROUPS``.

It creates the queue (the trainer is the process that does), leases and commits until GROUPS groups
were committed, printing each committed group's source_id on stdout, one per line, then exits 0.
(``rollout-queue train`` does the same with a real model and torch; this one needs neither.)
"""

from __future__ import annotations

import sys

from rollout_queue import QueueConfig, RolloutQueue

CONFIG = QueueConfig(worker_timeout_s=1.0, lease_timeout_s=10.0, max_attempts=5)


def main(url: str, name: str, partitions: int, groups: int) -> int:
    q = RolloutQueue.from_url(url, name, CONFIG, partitions=partitions)
    print("ready", flush=True)
    done = 0
    while done < groups:
        lease = q.lease(min(4, groups - done), block_ms=200, partial=True, trainer_id="t-proc")
        if lease is None:
            continue
        lease.commit()
        done += len(lease.groups)
        for g in lease.groups:
            print(g.group.source_id, flush=True)
    q.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
