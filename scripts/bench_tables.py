"""Render the benchmark tables of the docs from benchmarks/results.json; never copy a figure by hand.

    python scripts/bench_tables.py           # rewrite every marked region in place
    python scripts/bench_tables.py --check   # exit 1 (and show a diff) if a region is out of date

A region is the text between ``<!-- bench:NAME -->`` and ``<!-- /bench -->`` in one of DOCS; NAME
picks its renderer (RENDERERS below). ``scripts/bench.py`` writes the scenarios and targets of
results.json, ``scripts/cluster_bench.py`` its ``cluster`` section, and bench_engine, bench_trl,
bench_overlap, bench_weights and bench_waste (with ``--results benchmarks/results.json``) theirs; after any of
them, run this script and commit the docs with the results. ``tests/docs/test_docs.py`` runs ``--check``.

Standard library only: the check runs in the default test suite without Redis.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
DOCS = (ROOT / "docs" / "PERFORMANCE.md", ROOT / "docs" / "SCALING.md", ROOT / "benchmarks" / "README.md")
REGION = re.compile(r"(<!-- bench:(?P<name>[a-z0-9_-]+) -->\n)(?P<body>.*?)(<!-- /bench -->)", re.S)

#: The capacity example of docs/SCALING.md: a 1,000-GPU run at ~0.3 groups/s per GPU.
EXAMPLE_GROUPS_PER_S = 300
EXAMPLE_BUFFER_GROUPS = 1024  # QueueConfig.max_completed_groups' default


def fmt(x: float | None) -> str:
    """The figure as bench.py prints it: 3 significant digits or so, thousands separated."""
    if x is None or x != x:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def label(text: str) -> str:
    """'4   submit (batch 32)' -> '4. &nbsp; submit (batch 32)': the scenario number, then the figure."""
    num, _, rest = text.partition(" ")
    indent = len(rest) - len(rest.lstrip(" "))
    return f"{num}. " + ("&nbsp;&nbsp;" * indent) + rest.lstrip(" ")


def summary(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {k: v for s in results.get("scenarios", {}).values() for k, v in s.get("summary", {}).items()}


def verdict(row: dict[str, Any]) -> str:
    if row["op"] is None:
        return ""
    met = "**met**" if row["met"] else "**missed**"
    return f"{row['op']} {fmt(row['target'])} {met}"


def table(head: list[str], align: str, rows: list[list[str]]) -> str:
    marks = {"l": "---", "r": "---:"}
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(marks[a] for a in align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# -- the full run (scripts/bench.py) ------------------------------------------------------------


def render_environment(results: dict[str, Any]) -> str:
    env, sizes = results["environment"], results["sizes"]
    server = env["server"]
    # Older runs stored True for an installed peer, newer ones its version.
    peers = ", ".join(p if ok is True else f"{p} {ok}" for p, ok in sorted(env.get("peers", {}).items()) if ok) or "none"
    return (f"`{results['command']}`{' (quick)' if results.get('quick') else ''}: {server['kind']} "
            f"{server['version']}, `appendfsync {server['appendfsync']}`, {env['cpus']} CPUs, load average "
            f"{env['loadavg_start'][0]:.2f} at the start and {env['loadavg_end'][0]:.2f} at the end, "
            f"{sizes['repeats']} repeats of each scenario, {env['wall_s']:.0f} s in all; Python "
            f"{env['python']}, redis-py {env['redis_py']}, hiredis {env.get('hiredis') or 'none'}; "
            f"peers installed: {peers}.\n")


def render_goals(results: dict[str, Any]) -> str:
    rows = [[label(r["label"]), r["unit"], fmt(r["median"]), f"{fmt(r['min'])} - {fmt(r['max'])}", verdict(r)]
            for r in results["targets"] if r["op"] is not None]
    return table(["goal", "unit", "median", "min - max", "target"], "llrrl", rows)


def render_figures(results: dict[str, Any]) -> str:
    rows = [[label(r["label"]), r["unit"], fmt(r["median"]), f"{fmt(r['min'])} - {fmt(r['max'])}", verdict(r)]
            for r in results["targets"]]
    return table(["figure", "unit", "median", "min - max", "target"], "llrrl", rows)


TRANSITIONS = ("submit", "reserve", "complete", "complete_many", "lease", "commit")


def render_transitions(results: dict[str, Any]) -> str:
    s = summary(results)
    rows = []
    for name in TRANSITIONS:
        cmds, usec = s.get(f"{name}_commands_per_group"), s.get(f"{name}_script_usec_per_group")
        if cmds is None and usec is None:
            continue
        rows.append([f"`{name}`", fmt(cmds and cmds["median"]), fmt(usec and usec["median"])])
    for key, what in (("commands_per_group", "lifecycle, all calls"),):
        if key in s and "script_usec_per_group" in s:
            rows.append([what, fmt(s[key]["median"]), fmt(s["script_usec_per_group"]["median"])])
    return table(["transition", "Redis commands per group", "script µs per group"], "lrr", rows)


def render_costs(results: dict[str, Any]) -> str:
    s = summary(results)
    wanted = (
        ("redis_cpu_us_per_group", "Redis CPU per group, lifecycle (8 x 512 tokens + logprobs)"),
        ("script_usec_per_group", "of which inside scripts"),
        ("raw_redis_cpu_us_per_group", "Redis CPU per group, raw pipeline carrying the same bytes"),
        ("client_cpu_us_per_group", "client CPU per group, lifecycle, all processes"),
        ("trainer_cpu_us_per_group", "of which the trainer"),
        ("raw_client_cpu_us_per_group", "client CPU per group, raw pipeline"),
        ("ours_tiny_redis_cpu_us", "Redis CPU per item, ours, ~200 B"),
        ("bullmq_redis_cpu_us", "Redis CPU per job, bullmq"),
        ("arq_redis_cpu_us", "Redis CPU per job, arq"),
        ("rq_redis_cpu_us", "Redis CPU per job, RQ"),
        ("ours_tiny_worker_cpu_us", "worker process CPU per item, ours"),
        ("bullmq_worker_cpu_us", "worker process CPU per job, bullmq"),
        ("rq_worker_cpu_us", "worker process CPU per job, RQ"),
    )
    rows = [[what, fmt(s[key]["median"]), f"{fmt(s[key]['min'])} - {fmt(s[key]['max'])}"]
            for key, what in wanted if key in s]
    return table(["cost (µs)", "median", "min - max"], "lrr", rows)


DEPTH_OPS = ("submit", "reserve", "complete", "lease", "commit", "stats", "reap_scan", "sweep_owners", "reindex")


def render_depth(results: dict[str, Any]) -> str:
    """Scenario 9: each transition's median server µs per call at the smallest and largest size of
    each dimension (medians of the repeats) and their ratio; the snapshot's longest command."""
    s = summary(results)
    sizes = results["sizes"].get("depth", {})
    rows = []
    for dim in ("backlog", "buffer", "workers", "leases"):
        if not sizes.get(dim) or f"depth_{dim}_worst_ratio" not in s:
            continue
        small, large = min(sizes[dim]), max(sizes[dim])
        cells = [f"{small:,} -> {large:,}"]
        for op in DEPTH_OPS + ("snapshot",):
            # a transition's median call (µs) and its ratio; the snapshot's longest command (µs)
            key = f"depth_{dim}_{op}_longest_us_" if op == "snapshot" else f"depth_{dim}_{op}_us_"
            a, b = s.get(f"{key}{small}"), s.get(f"{key}{large}")
            if a is None or b is None:
                cells.append("n/a")
            else:
                a, b = a["median"], b["median"]
                cells.append(f"{fmt(a)} -> {fmt(b)}" + ("" if op == "snapshot" else f" ({b / max(a, 1.0):.2f}x)"))
        rows.append([dim] + cells)
    return table(["dimension", "size"] + [f"`{op}`" for op in DEPTH_OPS] + ["snapshot, longest command"],
                 "ll" + "r" * (len(DEPTH_OPS) + 1), rows)


# -- the sections of the other benchmarks (one each) -----------------------------------------------


def section(results: dict[str, Any], name: str, script: str,
            args: str = " --results benchmarks/results.json") -> dict[str, Any]:
    """Section ``name`` of the results, or exit saying which command writes it."""
    if name not in results:
        raise SystemExit(f"benchmarks/results.json has no `{name}` section: run {script}{args}")
    return results[name]


def ran(s: dict[str, Any]) -> str:
    """The line under a table that says which command made it, when, and how loaded the machine was."""
    env = s["environment"]
    return (f"`{s['command'].strip()}` ({s['date']}): {env['cpus']} CPUs, load average {env['loadavg_start']:.2f} "
            f"at the start and {env['loadavg_end']:.2f} at the end.\n\n")


# -- scripts/bench_engine.py ----------------------------------------------------------------------


def render_engine(results: dict[str, Any]) -> str:
    e = section(results, "engine", "scripts/bench_engine.py")
    env = e["environment"]
    repeats = env.get("repeats", 1)
    head = ran(e) + (f"{env['groups']} groups x {env['n']} samples x {env['max_tokens']} tokens, {env['slots']} "
                     f"engine slots, a version every {env['publish_every_s']:g} s in `queue+weights`"
                     + (f"; medians of {repeats} interleaved repeats, x bare judged on its median.\n\n"
                        if repeats > 1 else ".\n\n"))
    rows = []
    for r in e["rows"]:
        judged = r["arm"] != "bare"
        target = "" if not judged else f">= {env['target']:.2f} " + ("**met**" if r["x_bare"] >= env["target"] else "**missed**")
        spread = f"{r['x_bare_min']:.3f} - {r['x_bare_max']:.3f}" if "x_bare_min" in r and judged else ""
        cores = r.get("cores") or {}
        rows.append([r["engine"], r["arm"], f"{r['tokens']:,}", fmt(r["window_s"]), fmt(r["tokens_per_s"]),
                     f"{r['x_bare']:.3f}", spread, str(r.get("versions", 0))]
                    + [f"{cores[role]:.2f}" if role in cores else "" for role in CORE_ROLES] + [target])
    return head + table(["engine", "arm", "tokens", "window s", "tokens/s", "x bare", "min - max", "versions"]
                        + [f"{role} cores" for role in CORE_ROLES] + ["target"], "llrrrrrr" + "r" * len(CORE_ROLES) + "l", rows)


#: bench_engine's CPU roles, in the order of the engine table's columns (CPU s per s, steady window)
CORE_ROLES = ("engine", "frontend", "trainer", "redis")


# -- scripts/bench_trl.py -------------------------------------------------------------------------


def render_trl(results: dict[str, Any]) -> str:
    s = section(results, "trl", "scripts/bench_trl.py")
    env = s["environment"]
    names = {"trl_alone": "TRL alone", "trl_queue": f"TRL + queue, {env['workers']} workers"}
    rows = []
    for key, r in s["arms"].items():
        hit = r.get("steps_to_target")
        rows.append([names.get(key, key), fmt(r["wall_s"]), fmt(r["train_runtime_s"]),
                     fmt(r["train_runtime_s"] / env["steps"]), f"{r['reward_first5']:.3f}",
                     f"{r['reward_last5']:.3f}", str(hit) if hit else "never"])
    last = env["steps"]
    return ran(s) + table(["arm", "wall s", "trainer s (sum of step_time)", "s/step", "reward, steps 1-5",
                           f"reward, steps {last - 4}-{last}", f"steps to 3-step mean >= {env['target']:g}"],
                          "lrrrrrr", rows)


# -- scripts/bench_overlap.py ---------------------------------------------------------------------


def render_overlap(results: dict[str, Any]) -> str:
    s = section(results, "overlap", "scripts/bench_overlap.py")
    rows = []
    for r in s["rows"]:
        if "error" in r:
            rows.append([str(r["workers"]), r["mode"], "failed: " + r["error"], "", "", "", "", ""])
            continue
        rows.append([str(r["workers"]), r["mode"], str(r["steps"]), f"{r['s_per_step']:.3f}", f"{r['idle']:.0%}",
                     fmt(r["lag_s"]), f"{r['reward_end']:.3f}", f"{r['x_on_policy']:.2f}"])
    env = s["environment"]
    return (ran(s) + f"{env['steps']} steps per cell, {env['batch_groups']} groups per step, async cells "
            f"`max_staleness={env['staleness']}`.\n\n"
            + table(["workers", "mode", "steps", "s/step", "trainer idle", "lag s", "reward end", "x on-policy"],
                    "rlrrrrrr", rows))


# -- scripts/bench_weights.py ---------------------------------------------------------------------


def render_weights(results: dict[str, Any]) -> str:
    s = section(results, "weights", "scripts/bench_weights.py")
    env = s["environment"]
    rows = [[f"{r['size']} ({r['params_m']:.1f}M)", str(r["workers"]), f"{r['changed']:.2f}", r["transport"],
             f"{r['mb_written']:.1f}", f"{r['publish_s']:.3f}", f"{r['pause_s']:.3f}", f"{r['to_new_s']:.3f}",
             f"{r['x_folder']:.2f}"] for r in s["rows"]]
    return (ran(s) + f"Median of {env['versions']} versions per cell, torch {env['torch']}, "
            f"{env['threads']} torch thread(s).\n\n"
            + table(["size", "workers", "changed", "transport", "MB written", "publish s", "pause s", "to new s",
                     "x folder"], "lrrlrrrrr", rows))


# -- scripts/bench_waste.py ------------------------------------------------------------------------

WASTE_HEAD = ("engine", "workload", "arm", "steps", "s/step", "trained tokens", "gen / trained", "aborted",
              "evicted", "other", "past bound", "KS", "long decile", "wait max", "wait p99", "never trained",
              "long trained", "admission waits")


def waste_cells(r: dict[str, Any]) -> list[str]:
    """One arm's cells (bench_waste.py prints the same while it runs)."""
    if "error" in r:
        return [r["engine"], r["workload"], r["arm"], "failed: " + r["error"][:120]] + [""] * (len(WASTE_HEAD) - 4)

    def f(x: float, digits: int = 2) -> str:
        return "n/a" if x is None or x != x else f"{x:.{digits}f}"

    exits = [c for c in r.get("exit_codes", []) if c != 0]
    flags = ((" (stalled)" if r["stalled"] else "") + (" (drain deadline)" if r["drain_deadline"] else "")
             + (f" (worker exit {', '.join(map(str, exits))})" if exits else ""))
    return [r["engine"], r["workload"], r["arm"] + flags, str(r["steps"]), f(r["s_per_step"]),
            f"{r['trained_tokens']:,}", f(r["gen_per_trained"]), f(r["aborted_per_trained"]),
            f(r["evicted_per_trained"]), f(r["other_per_trained"]),
            f(r.get("past_bound_per_trained", float("nan"))), f(r["ks"]), f(r["long_decile"]),
            str(r["wait_max"]), f(r["wait_p99"], 1), str(r["never_trained"]),
            f"{r['long_trained']} / {r['long_first']}", str(r.get("admission_waits", "n/a"))]


def render_waste(results: dict[str, Any]) -> str:
    s = section(results, "waste", "scripts/bench_waste.py")
    env = s["environment"]
    head = ran(s) + (f"{env['steps']} steps of {env['batch_groups']} groups x {env['n']} samples per arm, a version "
                     f"every step, `max_staleness={env['max_staleness']}`, {env['turn_tokens']} tokens per model turn; "
                     + "; ".join(f"{e}: {x['workers']} worker{'s' if x['workers'] > 1 else ''} x {x['slots']} slots, "
                                 f"{x['train_s']:g} s per step"
                                 + (f", {x['turn_s']:g} s per turn" if x.get("turn_s") else "")
                                 for e, x in env["engines"].items()) + ".\n\n")
    engine = results.get("engine")
    bare = next((r for r in engine["rows"] if (r["engine"], r["arm"]) == ("vllm", "queue+weights")), None) if engine else None
    tail = ("" if bare is None else
            f"\nvLLM through the queue with a version every {engine['environment']['publish_every_s']:g} s: "
            f"{bare['x_bare']:.3f}x bare (`{engine['command'].strip()}`, {engine['date']}; the goal is >= 0.9).\n")
    return head + table(list(WASTE_HEAD), "lll" + "r" * (len(WASTE_HEAD) - 3),
                        [waste_cells(r) for r in s["rows"]]) + tail


# -- scripts/cluster_bench.py ---------------------------------------------------------------------


def cluster(results: dict[str, Any]) -> dict[str, Any]:
    return section(results, "cluster", "scripts/cluster_bench.py", args="")


def render_cluster_environment(results: dict[str, Any]) -> str:
    c = cluster(results)
    m = c["machine"]
    load = ""
    if "loadavg_start" in m:
        load = f", load average {m['loadavg_start'][0]:.2f} at the start and {m['loadavg_end'][0]:.2f} at the end"
    return (f"`{c['command']}`: {m['kind']} {m.get('version', '')}, `appendfsync {m.get('appendfsync', 'everysec')}`, "
            f"{m['cpus']} CPUs{load}; {m['workers']} worker processes + 1 trainer/producer process, "
            f"{m['groups_per_run']:,} groups per run, median of {m['repeats']}; payload {m['payload']}.\n")


def render_cluster(results: dict[str, Any]) -> str:
    rows = []
    for run in cluster(results)["runs"]:
        runs = sorted(run["groups_per_s_runs"])
        rows.append([run["config"], f"{run['groups_per_s']:,} ({runs[0]:,} - {runs[-1]:,})",
                     fmt(run["redis_cpu_us_per_group"]), fmt(run["scripts_per_group"]),
                     " / ".join(f"{x:.2f}" for x in run["node_cpu_share"]),
                     f"{run['one_core_groups_per_s']:,}" if run["one_core_groups_per_s"] else "n/a"])
    return table(["config", "groups/s (min - max)", "Redis CPU µs / group", "scripts / group",
                  "CPU share per node", "groups/s at one busy core"], "lrrrlr", rows)


def _runs(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {run["config"]: run for run in cluster(results)["runs"]}


def render_cluster_ratios(results: dict[str, Any]) -> str:
    r = _runs(results)
    one, one_p3 = r["1 node, P=1 (plain queue)"], r["1 node, P=3"]
    c1, c3 = r["3-node cluster, P=1"], r["3-node cluster, P=3"]

    def pct(a: float, b: float) -> str:
        return f"{(a / b - 1) * 100:+.0f}%"

    busiest = max(c1["node_cpu_share"])
    return (f"- partitions on one node (P = 3 against P = 1): {pct(one_p3['redis_cpu_us_per_group'], one['redis_cpu_us_per_group'])} "
            f"Redis CPU per group;\n"
            f"- cluster mode, one queue (3-node P = 1 against 1 node P = 1): "
            f"{pct(c1['redis_cpu_us_per_group'], one['redis_cpu_us_per_group'])}, and the busiest node does "
            f"{busiest:.0%} of the work;\n"
            f"- cluster mode, three partitions (3-node P = 3 against 1 node P = 3): "
            f"{pct(c3['redis_cpu_us_per_group'], one_p3['redis_cpu_us_per_group'])};\n"
            f"- the rate at which the busiest core saturates, 3-node P = 3 against 1 node P = 1: "
            f"{c3['one_core_groups_per_s'] / one['one_core_groups_per_s']:.1f}x.\n")


def render_memory(results: dict[str, Any]) -> str:
    mem = cluster(results)["memory"]
    b = mem["bytes_per_group"]
    rows = [[state, f"{b[state]:,}"] for state in ("backlog", "executing", "completed", "leased", "committed") if state in b]
    rows += [[f"&nbsp;&nbsp;after commit: `{key}`", f"{v:,}"] for key, v in b.get("after_commit_by_key", {}).items()]
    if "completion_8x1024_tokens_with_logprobs" in b:
        rows.append(["one completion of 8 x 1,024 tokens with logprobs (its `payload:*` key)",
                     f"{b['completion_8x1024_tokens_with_logprobs']:,}"])
    return (f"Measured over {mem['groups']:,} groups (small payload), every key of the queue:\n\n"
            + table(["state", "bytes per group"], "lr", rows))


def render_capacity(results: dict[str, Any]) -> str:
    r = _runs(results)
    large = r["1 node, P=1, large payload"]
    b = cluster(results)["memory"]["bytes_per_group"]
    completion, after = b["completion_8x1024_tokens_with_logprobs"], b["committed"]
    g = EXAMPLE_GROUPS_PER_S
    core = g * large["redis_cpu_us_per_group"] / 1e6
    return (f"- one Redis core is busy {core:.0%} of the time ({g} x {fmt(large['redis_cpu_us_per_group'])} µs, "
            f"the large-payload row);\n"
            f"- a full buffer of {EXAMPLE_BUFFER_GROUPS:,} groups holds {EXAMPLE_BUFFER_GROUPS * completion / 1e6:.0f} MB "
            f"({fmt(completion / 1e3)} KB per completion), and the AOF takes ~{g * completion / 1e6:.0f} MB/s "
            f"(each completion is written once and deleted at commit);\n"
            f"- what stays after commit ({after} B per group) comes to {after * g * 86400 / 1e9:.1f} GB with the "
            f"default retention of a day and {after * g * 3600 / 1e6:.0f} MB with an hour, whatever the run's length.\n")


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "environment": render_environment,
    "goals": render_goals,
    "figures": render_figures,
    "transitions": render_transitions,
    "costs": render_costs,
    "depth": render_depth,
    "engine": render_engine,
    "trl": render_trl,
    "overlap": render_overlap,
    "weights": render_weights,
    "waste": render_waste,
    "cluster-environment": render_cluster_environment,
    "cluster": render_cluster,
    "cluster-ratios": render_cluster_ratios,
    "memory": render_memory,
    "capacity": render_capacity,
}


def render(text: str, results: dict[str, Any], where: str = "") -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise SystemExit(f"{where}: unknown region bench:{name} (known: {', '.join(RENDERERS)})")
        return m.group(1) + RENDERERS[name](results) + m.group(4)

    return REGION.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a region is out of date")
    ap.add_argument("--results", default=str(RESULTS))
    args = ap.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    stale = []
    for doc in DOCS:
        old = doc.read_text()
        new = render(old, results, str(doc.relative_to(ROOT)))
        if new == old:
            continue
        if args.check:
            stale.append(doc)
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                       str(doc.relative_to(ROOT)), "generated"))
        else:
            doc.write_text(new)
            print(f"rewrote {doc.relative_to(ROOT)}")
    if stale:
        print(f"\nout of date: {', '.join(str(d.relative_to(ROOT)) for d in stale)}; "
              "run python scripts/bench_tables.py and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
