"""miles (radixark/miles@31f1ca96): the queue in miles' own seams, by configuration only.

- ``QueueDataBuffer``: ``--custom-async-data-buffer-path rollout_queue.integrations.miles.QueueDataBuffer``
- ``QueueDataSource``: ``--data-source-path rollout_queue.integrations.miles.QueueDataSource``
- ``record_version``: ``--custom-update-weight-post-write-path rollout_queue.integrations.miles.record_version``

All three read the queue from ``REDIS_URL`` and ``ROLLOUT_QUEUE`` (docs/integrations/miles.md).
Importing this package needs no miles; using the first two needs miles' modules.
"""

from rollout_queue.integrations.miles.buffer import QueueDataBuffer
from rollout_queue.integrations.miles.data_source import QueueDataSource
from rollout_queue.integrations.miles.weights import record_version

__all__ = ["QueueDataBuffer", "QueueDataSource", "record_version"]
