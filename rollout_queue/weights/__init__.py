"""Policy weights between the trainer and the workers: versions as folders, full or delta.

- ``manifest``: the small JSON record in every version folder that says what it holds (a full
  state, or the tensors that changed since its base) and which folders rebuild it (its chain).
- ``store``: writing a version folder atomically, resolving a folder to its chain, reading the
  merged tensors, pruning without breaking a chain a worker may still need.
- ``publisher``: the trainer side; picks full or delta per update and records the version through
  an admission hold.

The version record in Redis holds one folder path (the ``weights_uri``); the folder's manifest
says how to rebuild it, so a worker that has its base applies only the delta, and one that joins
late reads the chain from the last full version.
"""

from rollout_queue.weights.manifest import MANIFEST_NAME, WeightManifest, read_manifest
from rollout_queue.weights.publisher import TRANSPORTS, WeightPublisher
from rollout_queue.weights.store import prune_versions, read_chain_state, weight_chain, write_version

__all__ = ["MANIFEST_NAME", "TRANSPORTS", "WeightManifest", "WeightPublisher", "prune_versions",
           "read_chain_state", "read_manifest", "weight_chain", "write_version"]
