"""verl, configured rather than glued: the V1 trainer's sampler, its checkpoint hook, a weights
backend, and a queue-backed stand-in for fully_async's MessageQueue (read at verl 0.9.1 from PyPI).

- ``sampler.QueueReplayBuffer``: ``trainer.v1.sampler.custom_sampler``; each step's batch is a lease
  of completed groups, written into verl's TransferQueue the way verl's own agent loops write them.
- ``sampler.QueueCheckpointCallback``: ``trainer.checkpoint_callback_class``; after verl saved step
  ``k`` the queue drops the data that checkpoint covers.
- ``checkpoint_engine``: ``checkpoint_engine.custom_backend_module``; registers the ``rollout_queue``
  backend, which publishes each weights version verl sends as the queue's policy version.
- ``message_queue.QueueMessageQueue`` and ``patches/``: verl fully_async with the queue in place of
  its Ray MessageQueue.

This package imports verl only in its submodules (a machine without verl can import this one), and
it never changes verl: every hook is one verl loads by name from its own config.
"""
