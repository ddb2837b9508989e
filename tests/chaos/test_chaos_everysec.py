"""AOF ``everysec`` under simulated host crashes: what is lost is bounded by the last second of writes.

Each Redis kill also drops the AOF bytes written in the last second (chaos/aof.py), as a power loss
would with ``appendfsync everysec``. The checker then requires every acknowledged operation missing
from Redis to lie in a loss window ([kill - 1 s, kill]), and every lost or twice-trained group to be
explained by one of them; nothing may stay owned. Long outages (down 1.5-3 x worker_timeout_s, half
of them a kill -9 that also drops the last second of AOF) run too. In the slow suite (about a
minute or two).
"""

from __future__ import annotations

import pytest

from rollout_queue.devtools.chaos.harness import RunConfig, run

from .test_chaos_short import _kind


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_everysec_losses_lie_in_the_last_second_before_each_kill(tmp_path, request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("the everysec crash run belongs to the slow suite: pytest -m slow")
    weights = {"worker_kill": 2, "worker_pause": 2, "trainer_kill": 2, "reaper_kill": 1, "redis_kill": 5,
               "redis_outage": 1, "conn_kill": 2}
    cfg = RunConfig(groups=800, seed=31, kind=_kind(), mode="everysec", weights=weights, fault_interval_s=0.7,
                    deadline_s=200.0, settle_s=60.0, lease_batch=16, train_ms=100.0, log_dir=str(tmp_path / "c"))
    result = run(cfg)
    summary = result.summary()
    print(summary)
    assert result.finished and result.report.violations == [], summary
    assert summary["stuck"] == 0
    assert summary["faults"]["redis_kill"] >= 3
    assert summary["acks_lost_unexplained"] == 0
    # The bound: 1 s of dropped writes, plus the 50 ms AOF sampling period and the checker's slack.
    assert summary["acks_lost_max_age_before_kill_s"] <= cfg.loss_window_s + 0.1
