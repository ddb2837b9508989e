"""The CLI on garbage and hostile text in Redis (issue 12 item 14).

Every field a command reads is written by hand with values no transition writes (``created_ms=abc``,
a heartbeat score of 1e308, history that is not JSON) and with hostile text (newlines that would
forge a table row, ANSI escapes, C1 controls, rich markup). Every command must then end with an
exit code and a clear message, never a traceback; print no raw control character; forge no line;
and mark what it could not read. A queue whose counters or config the scripts refuse gets the
scripts' own clear message. ``inspect`` of a dead entry reads the attempts from its dead letter.
"""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis

from rollout_queue import RolloutQueue, SourceGroup
from rollout_queue.cli import render
from rollout_queue.ops.escape import clean
from rollout_queue.devtools.local_server import LocalServer
from rollout_queue.core.scripts import counter_home
from tests.conftest import _delete_queue_keys
from tests.ops.conftest import ALIVE, SILENT, Cli, KnownState, build_known_state

#: Hostile text: a forged row after a newline, an ANSI colour and screen clear, an OSC title, a C1
#: CSI, a tab (a forged field in tab-separated output), rich markup, a bidi override.
HOSTILE = "x\nFORGED row\r\x1b[31mred\x1b[2J\x1b]0;pwned\x07\x9b31m\tFORGED-TAB [bold red]markup[/bold red] \u202eevil"
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def hostile(tag: str) -> str:
    return f"{tag}-{HOSTILE}"


def make_hostile(st: KnownState, r: redis.Redis) -> dict[str, str]:
    """Write garbage and hostile text into every field the CLI reads. Returns ids the commands need."""
    k = st.q.keys
    now_ms = int(r.time()[0]) * 1000
    # A group submitted through the API with hostile (but valid) text: its pristine fields are stream fields.
    [hostile_entry] = st.q.submit([SourceGroup(hostile("sid").replace("|", "/"), hostile("prompt"), 2,
                                               {"note": hostile("meta")})])
    # A stream entry written by hand: fields that do not decode.
    raw_entry = r.xadd(k["src"], {"sid": hostile("rawsid"), "n": "abc", "g": b"\xff{not json", "v": "x"}).decode()
    lease_key = k.lease(st.lease_id)
    r.hset(lease_key, mapping={"created_ms": "abc", "version": "\x1b[31m", "trainer": hostile("trainer"),
                               "state": hostile("state"), "deadline": "soon", "versions": "x,y"})
    r.zadd(k["leases"], {hostile("lease"): 1e308, "inf-lease": float("inf")})
    r.zadd(k["workers"], {hostile("worker"): now_ms, "huge-score-worker": 1e308, "neg-inf-worker": float("-inf")})
    r.zadd(k["workers"], {SILENT: 1e308})  # a known worker whose score became garbage
    # The PEL owner of g6 becomes a hostile consumer name (an orphan nobody registered).
    r.xclaim(k["src"], "rollout", hostile("consumer"), 0, [st.ids[6]], justid=True)
    r.hset(k["ledger"], st.ids[1], "s|committed|\x1b[31m|" + hostile("ledger"))
    r.hset(k["ledger"], st.ids[8], "s|")
    r.hset(k["history"], st.ids[4], orjson.dumps(
        {"f": "x", "h": [{"a": "abc", "w": hostile("hw"), "t": "failed", "r": hostile("reason"), "ms": "soon"},
                         5, "str", {"a": 2, "w": ["list"], "r": {"d": 1}, "ms": 1e300}]}))
    r.hset(k["history"], st.ids[5], b"\xffnot json")
    r.xadd(k["dlq"], {"entry_id": hostile("eid"), "source_id": hostile("dsid"), "reason": hostile("dreason"),
                      "attempt": "\u00b2", "worker": hostile("dworker"), "history": "{not json",
                      "f:sid": hostile("fsid"), "f:n": "abc", "f:g": b"\xff"})
    r.hset(k["counters"], mapping={"filtered_reason:\x1b[31mred": 5, "filtered_reason:ok": "abc"})
    r.hset(k["meta"], mapping={"drain_reason": hostile("drain"), "drain_since_ms": "abc", "zzz\nFORGED": "1"})
    r.zadd(k["holds"], {"operator-drain": float("inf")})
    r.zadd(k["bufver"], {st.ids[3]: float("inf")})
    return {"hostile_entry": hostile_entry, "raw_entry": raw_entry,
            "hostile_dlq": r.xrevrange(k["dlq"], count=1)[0][0].decode()}


@pytest.fixture(scope="module")
def hostile_state(server: LocalServer) -> Iterator[tuple[KnownState, dict[str, str]]]:
    queue = f"t-{uuid.uuid4().hex[:12]}"
    st = build_known_state(server.url, queue)
    r = redis.Redis.from_url(server.url)
    extra = make_hostile(st, r)
    yield st, extra
    r.close()
    st.close()
    if server.is_running():
        _delete_queue_keys(server.url, queue)


def commands(st: KnownState, extra: dict[str, str]) -> list[tuple[str, ...]]:
    ids = [*st.ids, extra["hostile_entry"], extra["raw_entry"]]
    out: list[tuple[str, ...]] = [("stats",), ("stats", "--json"), ("top", "--once"), ("top", "--once", "--json"),
                                  ("workers",), ("workers", "--json"), ("leases",), ("leases", "--json"),
                                  ("dlq", "list"), ("dlq", "list", "--json"), ("dlq", "show", extra["hostile_dlq"]),
                                  ("dlq", "show", extra["hostile_dlq"], "--json"), ("verify",), ("verify", "--json"),
                                  ("config", "show"), ("config", "show", "--json"), ("drain", "status"),
                                  ("metrics", "--once")]
    out += [("inspect", e) for e in ids] + [("inspect", e, "--json") for e in ids]
    return out


def assert_safe(args: tuple[str, ...], code: int, out: str, err: str) -> None:
    """No traceback (main returned), no internal error, no raw control character, no forged line."""
    assert "internal error" not in err and "Traceback" not in err, (args, err)
    for stream, text in (("stdout", out), ("stderr", err)):
        bad = RAW_CONTROL.search(text)
        where = "" if bad is None else text[max(0, bad.start() - 60):bad.end() + 20]
        assert bad is None, f"{args}: raw {bad.group()!r} on {stream}: {where!r}"
        forged = [line for line in text.splitlines() if line.lstrip().startswith(("FORGED", "row"))]
        assert not forged, (args, forged)


def test_every_command_reads_hostile_and_garbage_fields_safely(cli: Cli, hostile_state: Any) -> None:
    st, extra = hostile_state
    for args in commands(st, extra):
        code, out, err = cli(st.url, st.queue, *args)
        assert_safe(args, code, out, err)
        assert code == (1 if args[0] == "verify" else 0), (args, err)  # verify: a broken ledger FAILs, no error
        if "--json" in args:
            json.loads(out.split("\n}\n")[0] + ("\n}" if "\n}\n" in out else ""))  # valid JSON (one frame)
        if args == ("dlq", "list"):
            assert all(line.count("\t") == 6 for line in out.splitlines()), out  # no forged field


def test_garbage_is_marked_not_fatal(cli: Cli, hostile_state: Any) -> None:
    st, extra = hostile_state
    code, out, _ = cli(st.url, st.queue, "leases", "--json")
    by_id = {x["lease_id"]: x for x in json.loads(out)}
    known = by_id[st.lease_id]
    assert (known["created_ms"], known["version"], known["trainer"]) == (None, None, hostile("trainer"))
    assert known["garbage"] == ["created_ms='abc'", "version='\\x1b[31m'", "deadline='soon'"], known
    assert by_id["inf-lease"]["deadline_ms"] is None and by_id["inf-lease"]["garbage"]
    code, out, _ = cli(st.url, st.queue, "workers", "--json")
    ws = {w["worker_id"]: w for w in json.loads(out)}
    assert ws[SILENT]["garbage"] and ws[SILENT]["last_heartbeat_ms"] is None and not ws[SILENT]["alive"]
    assert ws[hostile("worker")]["garbage"] == [] and ws[hostile("consumer")]["executing_groups"] == 1
    code, out, _ = cli(st.url, st.queue, "workers")
    assert code == 0 and "GARBAGE heartbeat score=" in out and ">10000d" not in out, out
    code, out, _ = cli(st.url, st.queue, "inspect", st.ids[4], "--json")
    e = json.loads(out)
    assert any("history failures" in g for g in e["garbage"]) and e["history"][0]["reason"] == hostile("reason")
    code, out, _ = cli(st.url, st.queue, "stats", "--json")
    s = json.loads(out)
    assert "ok" not in s["filtered_by_reason"] and not any("\x1b" in k for k in s["filtered_by_reason"])
    assert s["drain"]["active"] and s["drain"]["deadline_ms"] is None and s["drain"]["garbage"]
    code, out, _ = cli(st.url, st.queue, "stats")
    assert code == 0 and "DRAINING" in out and "\\x1b[31m" in out  # the reason shows, escaped


def test_a_score_of_1e308_is_not_a_200_digit_duration() -> None:
    assert render.duration(1e308) == ">10000d" and render.duration(-1e308) == "->10000d"
    assert render.duration(float("nan")) == "?" and render.duration(None) == "-"
    assert render.duration(3 * 86_400_000 + 4 * 3_600_000) == "3d04h" and render.duration(7_200_000) == "2h00m"


def test_clean_escapes_every_control_character() -> None:
    assert clean("a\nb\tc\x1b[31m\x9b\u2028\u202e") == "a\\nb\\tc\\x1b[31m\\x9b\\u2028\\u202e"
    assert clean("[bold]plain ünïcode[/bold]") == "[bold]plain ünïcode[/bold]"
    assert clean(12) == "12"


def test_rich_tables_escape_markup_and_controls(hostile_state: Any) -> None:
    """On a terminal the CLI renders with rich: markup in a value prints as typed, controls escaped."""
    from rich.console import Console

    st, _ = hostile_state
    sections = [render.section(hostile("title"), ("a", hostile("col")), [(hostile("cell"), None)])]
    console = Console(file=io.StringIO(), width=400, record=True, color_system=None)
    console.print(render.rich_group(sections))
    text = console.export_text()
    assert "[bold red]markup[/bold red]" in text and "\\x1b[31m" in text and RAW_CONTROL.search(text) is None


def test_inspect_of_a_dead_entry_shows_the_attempts_its_dead_letter_carries(cli: Cli, hostile_state: Any) -> None:
    """The history hash of an entry is deleted when it dies; its dead letter keeps the attempts."""
    st, _ = hostile_state
    code, out, _ = cli(st.url, st.queue, "inspect", st.ids[0], "--json")
    e = json.loads(out)
    assert code == 0 and e["state"] == "dead" and e["counted_failures"] == 2
    assert [(a["attempt"], a["worker_id"], a["terminal"], a["reason"]) for a in e["history"]] == \
        [(1, ALIVE, "failed", "prompt too long for the engine"), (2, ALIVE, "failed", "prompt too long for the engine")]
    code, out, _ = cli(st.url, st.queue, "inspect", st.ids[0])
    assert code == 0 and out.count("prompt too long for the engine") == 2


@pytest.mark.parametrize("field, value", [("committed", "abc"), ("max_staleness", "True"),
                                          ("lease_timeout_ms", "\x1b[31m1"), ("version", "1.5")])
def test_a_field_the_scripts_refuse_gets_their_clear_message(cli: Cli, server: LocalServer, queue_name: str,
                                                             r: redis.Redis, field: str, value: str) -> None:
    q = RolloutQueue.from_url(server.url, queue_name)
    q.submit([SourceGroup("a", "b", 1)])
    r.hset(q.keys[counter_home(field)], field, value)
    for args in [("stats",), ("stats", "--json"), ("top", "--once"), ("workers",), ("leases",), ("dlq", "list"),
                 ("config", "show"), ("drain", "status"), ("metrics", "--once"), ("inspect", "1-0")]:
        code, out, err = cli(server.url, queue_name, *args)
        assert_safe(args, code, out, err)
        assert code in (0, 1, 2, 4), (args, code, err)
        assert code == 0 or err.startswith("rollout-queue: "), (args, err)
    q.close()
