"""The old import path of core/flows/producer.py: this name is that module (not a copy), so
``from rollout_queue.core.producer_flows import produce`` keeps working."""

import sys

from rollout_queue.core.flows import producer as _producer

sys.modules[__name__] = _producer
