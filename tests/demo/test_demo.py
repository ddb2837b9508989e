"""`rollout-queue demo` end to end in its short mode: private Redis, tiny model, producer, two torch
worker processes, reaper, GRPO trainer, a worker killed mid-run, and the ledger check (exit 0 only
when every group was trained exactly once). Marked slow (about 30-60 s): run with the full suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("task", ["digits", "tools"])
def test_the_demo_trains_and_passes_its_ledger_check_in_short_mode(task: str) -> None:
    """``tools``: multi-turn trajectories against the demo's environment, a worker killed mid-trajectory."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-m", "rollout_queue", "demo", "--engine", "torch", "--steps", "8",
                           "--kill-worker-after", "0.5", "--task", task], env=env, capture_output=True, text=True,
                          timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ledger check" in out and "PASS" in out and "FAIL" not in out
    assert "64 (64)" in out  # source groups enqueued (expected): 8 steps x 8 groups
    assert "64 / 0" in out   # committed exactly once / twice
    assert "8 of 8" in out   # optimizer steps
    assert "killed demo-worker-1" in out
    if task == "tools":
        assert "tool-follow rate at start / end" in out
