"""scripts/bench_waste.py: its figures' arithmetic, and its --quick run (the scripted engine's arms through
the shipped processes) writing the documented rows with tokens that add up.

It checks what holds whatever the machine's speed: every token trained was generated, an arm without
updates throws nothing away, continue mode aborts nothing, abort mode aborts something, pace evicts
nothing for staleness, each arm runs the settings it names and new-default the shipped ones; never a rate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from bench_tables import WASTE_HEAD, render_waste, waste_cells  # noqa: E402
from bench_waste import ARMS, QUICK, heavy_records, parse_arm, parse_args, queue_config, tool_records  # noqa: E402

from rollout_queue import QueueConfig  # noqa: E402
from rollout_queue.core.config import DERIVED  # noqa: E402
from rollout_queue.workers.cli import defaults  # noqa: E402

#: The arms --quick runs (every listed one the scripted engine runs), per workload.
QUICK_ARMS = ("reference", "old-default", "fair-drop", "modes-continue", "modes-pace", "new-default")
from bench_waste_run import decile_share, ks_distance  # noqa: E402


def test_ks_distance_is_the_largest_gap_between_the_two_empirical_cdfs() -> None:
    assert ks_distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_distance([1, 1], [5, 5]) == 1.0
    # 10% of the reference is long; the sample trained none of it: the CDFs part by 0.1 below 20.
    assert ks_distance([16] * 9, [16] * 9 + [320]) == pytest.approx(0.1)
    assert ks_distance([], [1]) != ks_distance([], [1])  # NaN: nothing to compare


def test_the_longest_decile_share_is_over_the_references_own_share() -> None:
    reference = [16] * 90 + [320] * 10
    assert decile_share([16] * 90 + [320] * 10, reference) == pytest.approx(1.0)
    assert decile_share([16] * 95 + [320] * 5, reference) == pytest.approx(0.5)
    assert decile_share([16] * 10, reference) == 0.0


def test_the_workloads_hold_one_long_group_in_ten_and_four_slow_tools() -> None:
    heavy = heavy_records(200)
    for block in range(0, 200, 10):
        kinds = [r["kind"] for r in heavy[block:block + 10]]
        assert kinds.count("long") == 1
    assert all(10 <= r["turns"] <= 30 for r in heavy if r["kind"] == "long")
    assert {r["turns"] for r in heavy if r["kind"] == "short"} == {1}
    tool = tool_records(100)
    assert [r["id"] for r in tool if r["kind"] == "long"] == ["t000003", "t000011", "t000019", "t000027"]


def test_an_arm_is_configuration_and_a_malformed_one_is_refused() -> None:
    name, arm = parse_arm('pace={"weights_mode": "continue", "queue": {"batch_groups": 4}, "worker_args": ["--x"]}')
    assert (name, arm.weights_mode, dict(arm.queue), arm.worker_args) == ("pace", "continue", {"batch_groups": 4},
                                                                           ("--x",))
    for bad in ("pace", "pace={", "pace=[1]", 'pace={"no_such_field": 1}'):
        with pytest.raises(ValueError):
            parse_arm(bad)
    # The queue's config passes through as JSON; one QueueConfig refuses fails before any arm runs.
    _, derived = parse_arm('d={"weights_mode": null, "admission": "derived", "queue": {"staleness_mode": "pace"}}')
    config = queue_config(derived, QUICK)
    assert (derived.weights_mode, config.batch_groups, config.staleness_mode) == (None, DERIVED, "pace")
    for refused in ('x={"queue": {"staleness_mode": "pace"}}', 'x={"queue": {"no_such_field": 1}}',
                    'x={"admission": "sometimes"}'):
        with pytest.raises(SystemExit):
            parse_args(["--quick", "--arm", refused, "--arms", "x"])


def test_every_arm_but_new_default_pins_what_it_measures() -> None:
    """A later change of a default must not change what an arm measures (the old default stays abort
    mode without admission or the fairness rule); new-default leaves every setting to the defaults."""
    old = queue_config(ARMS["old-default"], QUICK)
    assert (ARMS["old-default"].weights_mode, old.batch_groups, old.staleness_mode, old.max_stale_evictions) == (
        "abort", None, "drop", 0)
    for name, mode in (("fair-drop", "drop"), ("modes-continue", "continue"), ("modes-pace", "pace")):
        config = queue_config(ARMS[name], QUICK)
        assert (ARMS[name].weights_mode, config.batch_groups, config.staleness_mode) == ("continue", QUICK.batch_groups,
                                                                                         mode), name
    new = ARMS["new-default"]
    assert (new.weights_mode, new.admission, dict(new.queue)) == (None, "derived", {})


def test_quick_runs_every_scripted_arm_and_the_tokens_add_up(tmp_path: Path) -> None:
    out = tmp_path / "waste.json"
    proc = subprocess.run([sys.executable, "scripts/bench_waste.py", "--quick", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(r["workload"], r["arm"]): r for r in report["rows"]}
    assert set(rows) == {(w, a) for w in ("heavy", "tool") for a in QUICK_ARMS}
    env = report["environment"]
    shipped = QueueConfig()
    for (workload, arm), r in rows.items():
        assert "error" not in r and r["engine"] == "scripted" and not r["stalled"], r
        assert r["exit_codes"] == [0] * env["engines"]["scripted"]["workers"] and not r["drain_deadline"]
        assert r["steps"] >= env["steps"] and r["trained_groups"] == r["steps"] * env["batch_groups"]
        # Every token trained or left over was generated once, in a completed attempt or in an aborted
        # one whose progress a later attempt continued (single samples, and trajectories whose
        # environment restores): what is left is thrown away.
        assert sum(r["generated"].values()) >= r["trained_tokens"] + r["leftover_tokens"] > 0
        # Continued tokens count under aborted when generated and are trained later, so evicted goes
        # negative by at most that much (the module's docstring, gen/trained).
        assert r["gen_per_trained"] >= 1.0 and r["evicted_per_trained"] >= -r["aborted_per_trained"]
        assert 0 <= r["never_trained"] <= env["steps"] * env["batch_groups"] and r["wait_max"] >= 0
        assert r["ks"] == r["ks"] and r["long_first"] == 4  # the reference ran first in each workload
        if r["config"]["weights_mode"] == "continue":
            assert r["aborted_per_trained"] == 0.0, r  # continue never aborts
        if r["config"]["batch_groups"] is None:
            assert r["admission_waits"] == 0, r  # nothing sends a reserve away without admission control
        if r["config"]["staleness_mode"] == "pace":
            assert r["evictions"].get("stale", 0) == 0, r  # pace never evicts for staleness
        if (r["config"]["staleness_mode"], r["config"]["max_stale_evictions"]) == ("drop", 0) or not r["versions"]:
            assert r["past_bound_per_trained"] == 0.0, r  # drop without the fairness rule trains no token past the bound
        # What the queue and the workers ran with: what the arm names, and new-default the shipped defaults.
        expected = {"old-default": ("abort", None, "drop", 0),
                    "fair-drop": ("continue", env["batch_groups"], "drop", 2),
                    "modes-continue": ("continue", env["batch_groups"], "continue", shipped.max_stale_evictions),
                    "modes-pace": ("continue", env["batch_groups"], "pace", shipped.max_stale_evictions),
                    "new-default": (defaults()["weights_mode"], env["batch_groups"], shipped.staleness_mode,
                                    shipped.max_stale_evictions)}
        if arm in expected:
            c = r["config"]
            got = (c["weights_mode"], c["batch_groups"], c["staleness_mode"], c["max_stale_evictions"])
            assert got == expected[arm], (arm, got)
    for workload in ("heavy", "tool"):
        reference = rows[(workload, "reference")]
        # No version published: nothing aborted, stale or evicted; generated = trained + left over.
        assert reference["gen_per_trained"] == 1.0 and reference["versions"] == 0
    # In abort mode the long trajectories span versions: some are aborted.
    assert rows[("heavy", "old-default")]["aborted_per_trained"] > 0
    assert " | ".join(WASTE_HEAD) in proc.stdout
    # The docs' table renders from such a section (bench_tables.py), the line under it included.
    section = {"command": "python scripts/bench_waste.py --quick", "date": "today", **report}
    text = render_waste({"waste": section})
    assert text.count("| scripted |") == 2 * len(QUICK_ARMS) and "max_staleness=" in text
    assert all(waste_cells(r)[3] == str(r["steps"]) for r in report["rows"])
