"""The short chaos run of the default suite: every fault kind, a fixed seed, about a minute.

Processes (producer, 3 test-engine workers, a trainer, 2 reapers) run against a private Redis with AOF
``always`` while the nemesis SIGKILLs and SIGSTOPs them, kills -9 Redis and restarts it on its AOF,
and cuts client connections mid-call; the history checker then proves lost = 0, trained twice = 0,
stuck = 0 and no late settlement accepted (chaos/checker.py). The long run is documented in README.
"""

from __future__ import annotations

import os

from chaos.harness import RunConfig, run
from chaos.nemesis import FAULT_KINDS


def _kind() -> str | None:
    """The first server kind CI asked for (one is enough here; None: whatever is installed)."""
    kinds = [k.strip() for k in os.environ.get("ROLLOUT_TEST_SERVERS", "").split(",") if k.strip()]
    return kinds[0] if kinds else None


def test_short_chaos_run_loses_nothing_and_trains_nothing_twice(tmp_path) -> None:
    cfg = RunConfig(groups=1200, seed=20240611, kind=_kind(), fault_interval_s=0.6, deadline_s=170.0,
                    settle_s=50.0, lease_batch=16, train_ms=100.0, log_dir=str(tmp_path / "chaos"))
    result = run(cfg)
    summary = result.summary()
    print(summary)  # the figures land in the test log (pytest -s or on failure)
    assert result.finished, f"not every group settled before the deadline: {summary}"
    assert result.report.violations == [], summary
    assert (summary["lost"], summary["trained_twice"], summary["stuck"]) == (0, 0, 0)
    assert summary["committed"] + summary["dead_lettered"] == cfg.groups
    assert all(summary["faults"].get(k, 0) >= 1 for k in FAULT_KINDS), summary["faults"]
    assert summary["faults_total"] >= 20, summary["faults"]
