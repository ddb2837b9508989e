"""``python -m rollout_queue.workers``: the same command as ``rollout-queue worker``."""

import sys

from rollout_queue.workers.cli import main

if __name__ == "__main__":  # vLLM spawns processes that re-import __main__: keep the guard
    sys.exit(main())
