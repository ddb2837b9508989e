"""The old import path of core/flows/owned.py: this name is that module (not a copy), so
``from rollout_queue.core.owned import OwnedAttempt`` and a monkeypatch of ``owned.PAGE`` keep working."""

import sys

from rollout_queue.core.flows import owned as _owned

sys.modules[__name__] = _owned
