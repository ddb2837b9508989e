"""verl, configured rather than glued: the V1 trainer's sampler and its checkpoint hook (read at
verl 0.9.1 from PyPI).

- ``sampler.QueueReplayBuffer``: ``trainer.v1.sampler.custom_sampler``; each step's batch is a lease
  of completed groups, written into verl's TransferQueue the way verl's own agent loops write them.
- ``sampler.QueueCheckpointCallback``: ``trainer.checkpoint_callback_class``; after verl saved step
  ``k`` the queue drops the data that checkpoint covers.
- ``trajectories``: leased groups as the TransferQueue rows verl's own agent loops write.
- ``weights.QueueCheckpointEngine``: ``checkpoint_engine.backend=rollout_queue`` (registered when
  verl imports ``custom_backend_module``); each weight update verl sends becomes a published queue
  version that ``python -m rollout_queue.workers`` processes load.
- ``message_queue.MessageQueue``: verl fully_async's ``MessageQueue`` Ray actor with its interface,
  durable and exactly-once relative to verl's checkpoints; ``patches/fully_async_message_queue.patch``
  (two lines of ``fully_async_main.py``) makes verl build it.

This package imports verl only in its submodules (a machine without verl can import this one), and
it never changes verl except through that one patch: every other hook is one verl loads by name from
its own config.
"""
