"""Trainer integrations: the framework-neutral contract (stream.py), the in-process dataset feed
(feed.py), data-parallel ranks (ranks.py), TRL's GRPOTrainer (trl.py, needs the ``trl`` extra) and
converters from a leased group to other frameworks' sample shapes (convert/).

Nothing here touches Redis keys or scripts: integrations call the public API only.
"""
