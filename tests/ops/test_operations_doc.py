"""docs/OPERATIONS.md is true: every block marked ``tested=<id>`` runs, exactly as written, against a
queue in the known state (conftest.py), redis-cli as the read-only operator role and the CLI as admin,
and its answer is checked against what the doc says it means. A tested block without a check here, or
a check without its block, fails: the doc and this file move together."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from rollout_queue.ops import acl
from rollout_queue.devtools.local_server import LocalServer, available_servers
from rollout_queue import RolloutQueue
from rollout_queue.core import flows
from tests.ops.conftest import ALIVE, PROGRESS, REAPED, SAMPLE_SECONDS, SAMPLE_TOKENS, SILENT, TRAINER, KnownState

DOC = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
BLOCK = re.compile(r"^```sh tested=([\w-]+)\n(.*?)^```", re.M | re.S)
Check = Callable[[list[str], KnownState, redis.Redis], None]


def blocks() -> dict[str, str]:
    found = BLOCK.findall(DOC.read_text())
    assert len({name for name, _ in found}) == len(found), "two blocks share a tested= id"
    return dict(found)


def pairs(lines: list[str]) -> dict[str, str]:
    return dict(zip(lines[::2], lines[1::2]))


def check_who_holds(out: list[str], st: KnownState, r: redis.Redis) -> None:
    entry_id, owner, idle, attempt = out
    assert (entry_id, owner, attempt) == (st.ids[6], SILENT, "1") and int(idle) >= 0


def check_history(out: list[str], st: KnownState, r: redis.Redis) -> None:
    ledger, history = out
    assert ledger == f"a|1|{ALIVE}|failed"
    h = json.loads(history)
    assert h["f"] == 1 and [(a["a"], a["w"], a["t"], a["r"]) for a in h["h"]] == [(1, ALIVE, "failed", "CUDA OOM")]


def check_trained(out: list[str], st: KnownState, r: redis.Redis) -> None:
    assert re.fullmatch(rf"s\|committed\|1\|{re.escape(ALIVE)}\|\w+\|", out[0])
    line = pairs(out[2:])  # out[1] is the commit's stream ID
    assert line["ids"] == st.ids[1] and line["trainer"] == TRAINER and line["lease"] == out[0].split("|")[4]


def check_silent_workers(out: list[str], st: KnownState, r: redis.Redis) -> None:
    # Reaped first: host-z died and was reaped at once (its registration is gone, only `reaped` knows);
    # then the one silent worker nothing has reaped yet, with its last heartbeat.
    blank = out.index("")
    assert out[0].startswith("== reaped workers") and any(f" {REAPED} " in line for line in out[2:blank]), out
    silent = pairs(out[blank + 1:])  # host-a too when the CLI's start took longer than the 0.5 s timeout
    assert SILENT in silent and float(silent[SILENT]) > 0 and REAPED not in silent


def check_consumers(out: list[str], st: KnownState, r: redis.Redis) -> None:
    records: dict[str, dict[str, str]] = {}
    for i, word in enumerate(out):
        if word == "name":
            current = records.setdefault(out[i + 1], {})
        elif i % 2 == 0:
            current[word] = out[i + 1]
    assert {name: rec["pending"] for name, rec in records.items()} == {
        ALIVE: "1", SILENT: "1", "@ready": "1", "@done": "1", f"@lease:{st.lease_id}": "1"}


def check_attempts(out: list[str], st: KnownState, r: redis.Redis) -> None:
    rows = {out[i]: (out[i + 1], out[i + 3]) for i in range(0, len(out), 4)}
    assert rows == {st.ids[2]: (f"@lease:{st.lease_id}", "1"), st.ids[3]: ("@done", "1"), st.ids[4]: ("@ready", "1"),
                    st.ids[5]: (ALIVE, "1"), st.ids[6]: (SILENT, "1")}


def check_buffer_empty(out: list[str], st: KnownState, r: redis.Redis) -> None:
    # buffer 1; no hold (an empty list prints one empty line); then three counters and three meta
    # values (batch_groups -1: left to a trainer, none derived); ready 1.
    assert out == ["1", "", "2", "5", "1", "100000", "-1", "3", "1"]


def check_token_waste(out: list[str], st: KnownState, r: redis.Redis) -> None:
    # Three completions of 2 samples x 3 tokens, one committed; nothing continued nor thrown away: the
    # absent counters print as empty lines, which the run strips from the end of the output.
    assert out == ["18", "6"], out


def check_leases(out: list[str], st: KnownState, r: redis.Redis) -> None:
    lease_id, due, trainer, state, deadline, members = out
    assert (lease_id, trainer, state, members) == (st.lease_id, TRAINER, "active", st.ids[2])
    # Its holder beats: due trainer_silence_s (60 s) after the last beat, long before the deadline.
    beat = int(r.hget(f"{st.prefix}:lease:{lease_id}", "beat_ms"))
    assert int(float(due)) == beat + 60_000 < int(deadline)


def check_backlog(out: list[str], st: KnownState, r: redis.Redis) -> None:
    assert out == ["backlog: 2"]


def check_dlq(out: list[str], st: KnownState, r: redis.Redis) -> None:
    assert out[0] == "1" and out[1] == st.dlq_id
    letter = pairs(out[2:])
    assert (letter["entry_id"], letter["reason"], letter["attempt"], letter["source_id"]) == \
        (st.ids[0], "max_attempts", "2", "prompt-0")
    assert [a["r"] for a in json.loads(letter["history"])] == ["prompt too long for the engine"] * 2


def check_memory(out: list[str], st: KnownState, r: redis.Redis) -> None:
    sizes = {key: int(size) for size, key in (line.split(" ", 1) for line in out)}
    active = {f"{st.prefix}:lease:{x.decode()}" for x in r.zrange(f"{st.prefix}:leases", 0, -1)}
    every = {k.decode() for k in r.scan_iter(f"{st.prefix}:*")}
    closed = {k for k in every if k.startswith(f"{st.prefix}:lease:") and k not in active}
    assert set(sizes) == every - closed  # closed lease records only wait for their TTL
    # The completions of the leased and the buffered group: one payload key each, named by the attempt.
    payloads = {k for k in sizes if k.startswith(f"{st.prefix}:payload:")}
    assert payloads == {f"{st.prefix}:payload:{st.ids[2]}:1", f"{st.prefix}:payload:{st.ids[3]}:1"}, payloads
    assert all(v > 0 for v in sizes.values()) and list(sizes.values()) == sorted(sizes.values(), reverse=True)


def check_config(out: list[str], st: KnownState, r: redis.Redis) -> None:
    meta = pairs(out)  # meta's lines, then the counters' (no field name is in both)
    assert r.hget(f"{st.prefix}:meta", "failed") is None and r.hget(f"{st.prefix}:counters", "failed") == b"3"
    assert (meta["max_attempts"], meta["worker_timeout_ms"], meta["max_staleness"], meta["version"],
            meta["weights_uri"], meta["failed"]) == ("2", "500", "2", "3", "s3://weights/v3", "3")
    assert r.hget(f"{st.prefix}:intake", "submitted") == b"9"


def check_verify(out: list[str], st: KnownState, r: redis.Redis) -> None:
    text = "\n".join(out)
    table = out[:out.index("== the promise (DESIGN: Guarantees)")]  # the first table: groups by state
    rows = {line.split()[0]: line.split()[1] for line in table[2:] if line.strip()}
    assert rows == {"backlog": "2", "ready": "1", "executing": "2", "completed": "1", "leased": "1",
                    "committed": "1", "filtered": "0", "dead": "1", "lost": "0"}, text
    assert "PASS: the 9 submitted groups" in text and "none lost" in text


def check_cli_dlq_requeue(out: list[str], st: KnownState, r: redis.Redis) -> None:
    listed, requeued = out
    assert listed.split("\t")[:3] == [st.dlq_id, st.ids[0], "prompt-0"]
    dlq_id, new_id = requeued.split("\t")
    assert dlq_id == st.dlq_id and r.xlen(f"{st.prefix}:dlq") == 0
    assert r.hget(f"{st.prefix}:ids", "prompt-0") == new_id.encode()


def check_cli_requeue(out: list[str], st: KnownState, r: redis.Redis) -> None:
    table = "\n".join(out[:-1])
    assert "executing" in table and SILENT in table and "SILENT" in table
    assert out[-1] == f"{st.ids[6]}\tready"
    assert r.xpending_range(f"{st.prefix}:src", "rollout", st.ids[6], st.ids[6], 1)[0]["consumer"] == b"@ready"


def check_stragglers(out: list[str], st: KnownState, r: redis.Redis) -> None:
    rows = [line.split() for line in out if line.startswith(st.ids[0][:5])]
    assert {(row[0], row[1]) for row in rows} == {(st.ids[5], ALIVE), (st.ids[6], SILENT)}
    assert not any("@" in line for line in out)  # never the queue's own @ready/@done/@lease rows


def check_at_risk(out: list[str], st: KnownState, r: redis.Redis) -> None:
    (row,) = [line.split() for line in out if line.startswith(st.ids[0][:5])]
    assert row[:3] == [st.ids[4], "1", "1"] and "CUDA OOM" in " ".join(out)  # g4: failed once of 2


def check_reaped(out: list[str], st: KnownState, r: redis.Redis) -> None:
    line = pairs(out[1:19])  # out[0]: the stream ID; nine field/value pairs
    assert (line["worker"], line["terminal"], line["requeued"], line["ids"], line["done"]) == (REAPED, "lost", "0", "",
                                                                                             "1")
    assert line["progress"].startswith("4|1200|8000|") and int(line["heartbeat_ms"]) > 0
    assert any(REAPED in x and "worker silent past worker_timeout" in x for x in out[19:])


def check_progress(out: list[str], st: KnownState, r: redis.Redis) -> None:
    assert out[0].startswith(f"{PROGRESS.groups}|{PROGRESS.tokens}|{PROGRESS.uptime_ms}|")
    row = next(line.split() for line in out[1:] if line.startswith(ALIVE))
    assert row[-2:] == ["0.5", "250"]


def check_samples(out: list[str], st: KnownState, r: redis.Redis) -> None:
    lengths, durations = out[0].split("|")
    assert lengths == ",".join(map(str, SAMPLE_TOKENS)) and durations == ",".join(map(str, SAMPLE_SECONDS))
    assert out[1].startswith("== samples") and "reported by 1 worker(s)" in out[1]
    assert out[2].split() == ["samples", "p50", "p90", "p99", "max"]
    assert out[3].split() == ["tokens", "20", "256", "1024", "4096", "4096"]
    assert out[4].split() == ["seconds", "20", "5.0s", "20.0s", ">10m00s", ">10m00s"]


def setup_holds(st: KnownState) -> None:
    st.q.hold(timeout_s=120, holder=TRAINER, reason="weight update v4")


#: queue -> the lease its dead trainer left (setup_dead_trainer), for the check after the block.
DEAD_LEASES: dict[str, str] = {}


def setup_dead_trainer(st: KnownState) -> None:
    """A trainer leases a group with a short deadline (so its lease is due first) and dies. Run last:
    the holds block's hold is released first (a lease waits while admission is held)."""
    for hold_id in st.q.client.hkeys(st.q.keys["holders"]):
        st.q.run(flows.hold_release(st.q.keys, hold_id.decode()))
    dead = RolloutQueue.from_url(st.url, st.queue)
    lease = dead.lease(1, timeout_s=1.0, trainer_id="trainer-that-died")
    assert lease is not None
    DEAD_LEASES[st.queue] = lease.lease_id
    dead.close()


def check_cli_lease_rollback(out: list[str], st: KnownState, r: redis.Redis) -> None:
    lease_id = DEAD_LEASES[st.queue]
    assert out == [f"{lease_id}\trolled_back\t1"]
    assert r.hget(f"{st.prefix}:lease:{lease_id}", "revoked") == b"trainer host lost"


def check_holds(out: list[str], st: KnownState, r: redis.Redis) -> None:
    hold_id, line = out[0], out[1]
    holder, since, reason = line.split("|", 2)
    assert (holder, reason) == (TRAINER, "weight update v4") and int(since) > 0
    assert any(x.startswith(hold_id) and TRAINER in x and "weight update v4" in x for x in out[2:])


def check_waits(out: list[str], st: KnownState, r: redis.Redis) -> None:
    text = "\n".join(out)
    waited = next(line for line in out if line.startswith("waited"))
    assert all(f"{s} " in waited and f"{s} -" not in waited for s in ("backlog", "exec", "done", "leased"))
    assert f"! worker {SILENT} SILENT" in text and f"! admission HELD by {TRAINER}" in text


#: The most redis-cli processes a block may start: a recipe must not start one per key (minutes at
#: 100k payload keys); the memory recipe sends every MEMORY USAGE through one.
MAX_REDIS_CLI = {"memory": 3}

#: Blocks whose state needs one more step first (run just before the block, in CHECKS order).
SETUP: dict[str, Callable[[KnownState], None]] = {"holds": setup_holds, "cli-lease-rollback": setup_dead_trainer}

#: block id -> (the entry $E names, its check). Blocks run in this order: redis-cli first, the CLI
#: (which changes the state) after.
CHECKS: dict[str, tuple[int | None, Check]] = {
    "who-holds": (6, check_who_holds), "history": (4, check_history), "trained": (1, check_trained),
    "silent-workers": (None, check_silent_workers), "consumers": (None, check_consumers),
    "attempts": (None, check_attempts), "buffer-empty": (None, check_buffer_empty), "leases": (None, check_leases),
    "token-waste": (None, check_token_waste),
    "backlog": (None, check_backlog), "dlq": (None, check_dlq), "memory": (None, check_memory),
    "config": (None, check_config), "stragglers": (None, check_stragglers), "at-risk": (None, check_at_risk),
    "verify": (None, check_verify),
    "reaped": (None, check_reaped), "progress": (None, check_progress), "samples": (None, check_samples),
    "cli-requeue": (6, check_cli_requeue),
    "cli-dlq-requeue": (None, check_cli_dlq_requeue), "holds": (None, check_holds), "waits": (None, check_waits),
    "cli-lease-rollback": (None, check_cli_lease_rollback),
}


def test_every_tested_block_has_a_check() -> None:
    assert set(blocks()) == set(CHECKS)


def test_the_memory_recipe_names_every_key_of_a_queue() -> None:
    """Its fixed names are spelt in the recipe (the operator may not SCAN): a key added to keys.py
    must be added there too, or the answer leaves it out (the known state may not hold it)."""
    from rollout_queue.core.keys import KEY_SUFFIXES

    recipe = blocks()["memory"]
    listed = set(re.search(r"for s in (.*?); do", recipe, re.S).group(1).replace("\\", " ").split())  # type: ignore[union-attr]
    assert listed == set(KEY_SUFFIXES.values())


def test_every_recipe_is_tested() -> None:
    """A shell block in the guide is a recipe an operator will paste: each one is run above, except
    the two that set the reader's own variables (``Q``/``E``, ``REDIS_URL``) before any recipe."""
    untested = re.findall(r"^```sh\n(.*?)^```", DOC.read_text(), re.M | re.S)
    assert len(untested) == 2 and untested[0].startswith("Q=") and untested[1].startswith("export REDIS_URL")


def _redis_cli() -> str:
    found = shutil.which("redis-cli") or shutil.which("valkey-cli")
    valkey = available_servers().get("valkey")
    if found is None and valkey and Path(valkey).with_name("valkey-cli").exists():
        found = str(Path(valkey).with_name("valkey-cli"))
    if found is None:
        pytest.skip("no redis-cli or valkey-cli binary to run the guide's commands with")
    return found


@pytest.fixture
def shims(tmp_path: Path, known_state: KnownState, r: redis.Redis, server: LocalServer) -> Iterator[dict[str, str]]:
    """PATH entries: ``redis-cli`` logged in as the queue's operator, ``rollout-queue`` as its admin."""
    host = server.url.split("//")[1].split("/")[0]
    urls = {}
    for role in ("operator", "admin"):
        rules = acl.role_rules(known_state.queue, role, password=f"pw-{role}")
        r.execute_command("ACL", "SETUSER", rules.user, *rules.rules)
        urls[role] = f"redis://{rules.user}:pw-{role}@{host}/0"
    calls = tmp_path / "redis-cli.calls"
    for name, body in (("redis-cli", f'echo x >> "{calls}"\nexec "{_redis_cli()}" -u "$RQ_OPERATOR_URL" '
                                     '--no-auth-warning "$@"'),
                       ("rollout-queue", f'exec "{sys.executable}" -m rollout_queue "$@"')):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    root = Path(__file__).resolve().parents[2]
    yield {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "RQ_OPERATOR_URL": urls["operator"],
           "RQ_CLI_CALLS": str(calls),
           "REDIS_URL": urls["admin"], "ROLLOUT_QUEUE": known_state.queue, "Q": known_state.prefix,
           "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for role in ("operator", "admin"):
        r.execute_command("ACL", "DELUSER", acl.user_name(known_state.queue, role))


def test_the_guide_answers_its_questions(known_state: KnownState, shims: dict[str, str], r: redis.Redis) -> None:
    code = blocks()
    for name, (entry, check) in CHECKS.items():
        known_state.refresh()  # host-a must stay alive through the run, host-b silent
        if name in SETUP:
            SETUP[name](known_state)
        env = {**os.environ, **shims, "E": known_state.ids[entry] if entry is not None else "unset"}
        Path(shims["RQ_CLI_CALLS"]).write_text("")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", code[name]], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, (name, done.stderr)
        started = len(Path(shims["RQ_CLI_CALLS"]).read_text().split())
        assert started <= MAX_REDIS_CLI.get(name, 100), f"block {name!r} started {started} redis-cli processes"
        out = done.stdout.rstrip("\n").split("\n")
        try:
            check(out, known_state, r)
        except (AssertionError, ValueError, KeyError) as exc:
            raise AssertionError(f"block {name!r} of OPERATIONS.md answered:\n{done.stdout}") from exc
