"""Trainer integrations: the framework-neutral contract (stream.py), the in-process dataset feed
(feed.py), data-parallel ranks (ranks.py), TRL's GRPOTrainer (trl.py, needs the ``trl`` extra),
converters from a leased group to other frameworks' sample shapes (convert/) and where every adapter
finds its queue (environment.py: REDIS_URL / ROLLOUT_QUEUE, as every process of the project).

Nothing here touches Redis keys or scripts: integrations call the public API only.
"""
