"""Generation runtimes for rollout-queue workers.

This package owns everything that may import torch or vLLM (engines, the worker loop, the tiny
test model). It must stay importable without them: heavy imports happen inside the submodules
that need them, never here, so ``import workers`` is cheap in a CPU-only trainer or a CLI.
"""
