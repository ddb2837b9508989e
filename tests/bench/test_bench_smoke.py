"""Smoke test of scripts/bench.py: a cheap subset in --quick mode writes the documented JSON shape.

It checks keys and shapes, never timings: the machine is shared and noisy, and targets are goals,
not assertions. The peers (rq, arq, bullmq: the `bench` extra) and the slow scenarios stay out.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rollout_queue.devtools.local_server import available_servers

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = ("raw", "calls", "latency", "bytes", "depth")
EXPECTED = {
    "raw": {"raw_groups_per_s", "raw_redis_cpu_us_per_group", "raw_commands_per_group"},
    "calls": {"round_trips_per_group", "commands_per_group", "evalsha_per_group", "complete_commands_per_group",
              "lease_commands_per_group", "commit_commands_per_group", "submit_commands_per_group",
              "reserve_commands_per_group"},
    "latency": {"lease_p50_ms", "lease_p99_ms", "reserve_p50_ms", "reserve_p99_ms", "complete_p50_ms"},
    "bytes": {"bytes_per_token", "payload_bytes_per_token"},
    "depth": {"depth_worst_ratio", "depth_backlog_worst_ratio", "depth_workers_worst_ratio", "depth_sweep_max_us",
              "depth_longest_script_ms", "depth_snapshot_longest_command_ms"},
}


def test_quick_subset_writes_the_documented_json(tmp_path: Path) -> None:
    kind = "redis" if "redis" in available_servers() else "valkey"
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "bench.py"), "--quick", "--repeats", "1", "--kind", kind,
         "--scenarios", ",".join(SCENARIOS), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"command", "quick", "sizes", "environment", "scenarios", "targets", "errors"} <= set(report)
    assert report["quick"] is True and report["errors"] == {}
    assert report["environment"]["server"]["appendfsync"] == "everysec"
    assert set(report["scenarios"]) == set(SCENARIOS)
    for name, keys in EXPECTED.items():
        scenario = report["scenarios"][name]
        assert len(scenario["runs"]) == 1
        summary = scenario["summary"]
        assert keys <= set(summary), (name, sorted(keys - set(summary)))
        for key in keys:
            assert set(summary[key]) >= {"median", "min", "max", "runs"}
    by_metric = {row["metric"]: row for row in report["targets"]}
    for metric in ("round_trips_per_group", "commands_per_group", "lease_p99_ms", "bytes_per_token",
                   "depth_worst_ratio", "depth_longest_script_ms"):
        row = by_metric[metric]
        assert row["op"] in ("<=", ">=") and isinstance(row["met"], bool)
    # The table printed on stdout carries the same verdicts.
    assert "round trips per group" in proc.stdout
