"""``python -m rollout_queue``: the same as the ``rollout-queue`` command."""

import sys

from rollout_queue.cli import main

sys.exit(main())
