"""The short chaos run of the default suite: every fault kind, a fixed seed, about a minute.

Processes (producer, 3 test-engine workers with 2, 4 and 6 slots, the 2- and 6-slot ones
overcommitting, 2 shipped workers (``rollout_queue.workers``, scripted engine, the chaos environment
and reward: every 11th group hangs, raises or returns hostile values in them), 2 trainers, a pusher
publishing versions over torch.distributed pushes to the shipped workers, a live member that cannot
reach the trainer and invented ids trying to join, 2 reapers) run against a private Redis with AOF
``always`` while the nemesis SIGKILLs and SIGSTOPs them (push members mid-round too), kills -9 Redis
and restarts it on its AOF, takes Redis down for longer than worker_timeout_s (a clean stop and a
kill -9, 1.5-3 x worker_timeout_s each), and cuts client connections mid-call. Groups have mixed n
(1 to 8: some larger than every worker's slots). The history checker then proves lost = 0, trained
twice = 0, stuck = 0 (nothing owned at the end and no group without progress for longer than the
bound, measured during the run), dead letters only for poison and hostile groups, every counted
failure charged to a group that caused it, no shipped worker dead of its groups, no late settlement
accepted, no downtime counted against a live worker, lease or hold, every push round ended by its
deadline and every live shipped worker on the last version (chaos/checker.py). A worker credential
(the adversary) sends, with the worker role's ACL user, the moves a group must survive: XCLAIM of an
owned entry (a leased one too) to itself, a made-up consumer or one of the queue's own owners, index
entries invented in ready and the buffer, forged counters and commands the rules refuse (XACK,
HSET leased, the clock, meta). Not forged parked records: with an XCLAIM to @dead they dead-letter a
group the worker does not hold, the one settlement a worker credential can still force
(docs/OPERATIONS.md); the long runs send them (docs/CHAOS.md).
Partial rollouts run under it: the shipped workers save progress every 0.1 s and continue their
trajectories from it, the nemesis kills and pauses shipped workers that own entries with progress
records, and the checker replays every trained sample (versions, no token twice, no record left).
The long runs are documented in docs/CHAOS.md.
"""

from __future__ import annotations

import os

from rollout_queue.devtools.chaos.envs import HOSTILITIES
from rollout_queue.devtools.chaos.harness import RunConfig, run
from rollout_queue.devtools.chaos.nemesis import DEFAULT_WEIGHTS


def _kind() -> str | None:
    """The first server kind CI asked for (one is enough here; None: whatever is installed)."""
    kinds = [k.strip() for k in os.environ.get("ROLLOUT_TEST_SERVERS", "").split(",") if k.strip()]
    return kinds[0] if kinds else None


#: The adversary's menu here (see the module docstring): what it may send and what it must be refused.
ADVERSARY = ("xclaim src,xreadgroup src,zadd ready,zrem ready,zadd buffer,zadd bufver,hset counters,"
             "hincrby counters,xack src,xdel src,hset leased,hset clock,hset meta,hset push,del meta")


def test_short_chaos_run_loses_nothing_and_trains_nothing_twice(tmp_path) -> None:
    # Long outages twice as likely as by default, so a run of this length meets a clean stop and a kill.
    weights = {**DEFAULT_WEIGHTS, "redis_outage": 1.5, "credential": 2}
    # Paced at 25 groups/s, submission spans >= 44 s on any machine: a fast one settled the unpaced
    # run in ~24 s with only 19 faults (CI), a loaded one takes ~60 s with ~90.
    cfg = RunConfig(groups=1100, seed=20240611, kind=_kind(), fault_interval_s=0.35, deadline_s=170.0,
                    submit_rate=25.0, settle_s=50.0, lease_batch=16, train_ms=100.0, weights=weights,
                    traj_workers=2, pushes=True, log_dir=str(tmp_path / "chaos"), adversary_commands=ADVERSARY)
    result = run(cfg)
    summary = result.summary()
    print(summary)  # the figures land in the test log (pytest -s or on failure)
    assert result.finished, f"not every group settled before the deadline: {summary}"
    assert result.report.violations == [], summary
    assert (summary["lost"], summary["trained_twice"], summary["stuck"]) == (0, 0, 0)
    assert summary["committed"] + summary["dead_lettered"] == cfg.groups
    assert summary["dead_lettered"] == summary["dead_poison"] + summary["dead_hostile"] and summary["dead_valid"] == 0
    assert summary["stalls"] == 0 and summary["no_progress_max_s"] <= summary["no_progress_bound_s"], summary
    assert all(summary["faults"].get(k, 0) >= 1 for k in cfg.nemesis_weights()), summary["faults"]
    assert summary["faults_total"] >= 20, summary["faults"]
    # Redis was down longer than worker_timeout_s at least once, with work in flight.
    assert summary["outages_longer_than_worker_timeout"] >= 1, summary["outages"]
    assert summary["faults"].get("redis_outage_in_flight", 0) >= 1, summary["faults"]
    # Groups larger than a worker's slots were granted to the overcommitting workers.
    assert summary["oversize_grants"] >= 1, summary
    # The shipped workers ran trajectories, hostile groups among them, each failure charged to its group.
    assert summary["shipped"]["settled"].get("complete_ok", 0) >= 1, summary["shipped"]
    assert set(summary["charges"]) & {h.name for h in HOSTILITIES}, summary["charges"]
    assert "innocent" not in summary["charges"], summary["charges"]
    # Partial rollouts ran under the faults: attempts continued earlier ones' progress records, the
    # trained trajectories were replayed token by token (samples.py), and no record was left.
    assert summary["partials"]["continued"] > 0 and summary["partials"]["left"] == 0, summary["partials"]
    assert summary["trained_samples"]["trajectories"] >= 1, summary["trained_samples"]
    # Versions went by push rounds, and an id that never heartbeat was refused a rank.
    assert summary["pushes"]["pushes"] >= 1 and summary["pushes"]["invented_refused"] >= 1, summary["pushes"]
    # The worker credential ran commands and was refused others, and the queue kept its promise.
    assert summary["adversary"]["ran"] >= 1 and summary["adversary"]["refused"] >= 1, summary["adversary"]
