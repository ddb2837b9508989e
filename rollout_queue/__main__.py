"""``python -m rollout_queue``: the same as the ``rollout-queue`` command."""

import sys

from .cli import main

sys.exit(main())
