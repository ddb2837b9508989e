"""All reply parsing lives in core/protocol.py (issue 13 item 2).

Two checks: an AST scan that no flow, action or partitioned flow reads a raw reply itself (no
subscript, unpacking or conversion of a name bound from ``yield`` or from ``check()``), and a fuzz of
every parser with replies of the wrong shape (None, too short, a wrong type in each field): each
raises ProtocolError, never IndexError or TypeError.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Callable

import pytest

import rollout_queue
from rollout_queue.core import protocol as p
from rollout_queue.core.errors import ProtocolError
from rollout_queue.core.models import Receipt

PACKAGE = Path(rollout_queue.__file__).resolve().parent
#: Every module that drives replies but must leave their reading to protocol.py.
CHECKED = ("core/flows/*.py", "ops/actions.py", "ops/views.py", "ops/partition_views.py", "ops/verify.py", "scale/*.py")
#: scale/fleet.py's flows yield requests to the fleet reserver (reservation lists come back), no Redis reply.
EXEMPT = ("scale/fleet.py",)
#: Conversions that read a raw reply as a value (a parser's job).
CONVERSIONS = {"int", "float", "bytes", "str", "s", "text", "bool"}
#: Calls whose result is still the raw reply (check() returns it beside the status word).
RAW_CALLS = {"check"}


def _callee(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return ""


def _is_raw(node: ast.AST, raw: set[str]) -> bool:
    """A raw reply: a ``yield`` expression, a name bound from one, or check()'s result."""
    return (isinstance(node, ast.Yield) or (isinstance(node, ast.Name) and node.id in raw)
            or _callee(node) in RAW_CALLS)


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def raw_reply_reads(source: str) -> list[str]:
    """Each place a function reads a raw reply positionally or converts it, as 'line: code'."""
    tree = ast.parse(source)
    found: list[str] = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        raw: set[str] = set()
        # Names bound from a yield (or from check()) anywhere in the function, in source order.
        for node in sorted(ast.walk(fn), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if _is_raw(node.value, raw):
                    for t in targets:
                        if isinstance(t, (ast.Tuple, ast.List)) and _callee(node.value) not in RAW_CALLS:
                            found.append(f"{node.lineno}: unpacks a raw reply: {ast.unparse(node)}")
                        raw.update(_names(t))
        for node in ast.walk(fn):
            if isinstance(node, ast.Subscript) and _is_raw(node.value, raw):
                found.append(f"{node.lineno}: indexes a raw reply: {ast.unparse(node)}")
            elif (isinstance(node, ast.Call) and _callee(node) in CONVERSIONS
                  and any(_is_raw(a, raw) for a in node.args)):
                found.append(f"{node.lineno}: converts a raw reply: {ast.unparse(node)}")
            elif isinstance(node, (ast.For, ast.comprehension)) and _is_raw(node.iter, raw):
                found.append(f"{node.lineno if hasattr(node, 'lineno') else node.iter.lineno}: iterates a raw "
                             f"reply: {ast.unparse(node.iter)}")
    return sorted(set(found), key=lambda x: int(x.split(":")[0]))


def checked_modules() -> list[Path]:
    return sorted({path for pattern in CHECKED for path in PACKAGE.glob(pattern)
                   if str(path.relative_to(PACKAGE)) not in EXEMPT})


def test_the_scan_finds_what_it_is_for() -> None:
    """The checker itself: each form of a raw read is flagged, a parsed one is not."""
    bad = """
def flow(keys):
    reply = yield p.build(keys, "x")
    _, r = p.check(reply, ("ok",), {})
    n = int(r[1])
    w = p.s(p.check(reply, ("ok",), {})[1][1])
    last = yield p.Command(("XREVRANGE",))
    a, b = yield p.Command(("HMGET",))
    for x, y in last:
        pass
    v = (yield p.Command(("GET",)))[0]
    return int(reply), text(last[0][0])
"""
    got = raw_reply_reads(bad)
    assert [g.split(":")[0] for g in got] == ["5", "6", "8", "9", "11", "12", "12"], got
    good = """
def flow(keys):
    reply = yield p.build(keys, "x")
    n, dead, done = p.parse_rollback(reply, "L")
    last = p.parse_last_id((yield p.Command(("XREVRANGE",))))
    if not (yield p.Command(("EXISTS",))):
        return last or "0-0"
    stored = yield p.Command(("GET",))
    return 1 if stored is None else p.parse_count(stored, "GET")
"""
    assert raw_reply_reads(good) == []


@pytest.mark.parametrize("path", checked_modules(), ids=lambda x: str(x.relative_to(PACKAGE)))
def test_no_module_reads_a_raw_reply_itself(path: Path) -> None:
    got = raw_reply_reads(path.read_text())
    assert not got, f"{path.relative_to(PACKAGE)} reads replies itself (use a parser in core/protocol.py): {got}"


def test_the_scan_covers_every_flow_module() -> None:
    names = {str(x.relative_to(PACKAGE)) for x in checked_modules()}
    assert {"ops/actions.py", "ops/views.py", "ops/verify.py", "scale/flows.py", "scale/multi_lease.py"} <= names
    assert {f"core/flows/{m}.py" for m in ("base", "queue", "worker", "trainer", "hold", "reaper", "owned",
                                          "producer")} <= names


# -- every parser refuses a reply of the wrong shape ------------------------------------------------

R = Receipt("1-0", 2, "w1")
KV = [b"entry_id", b"2-0", b"attempt", b"3"]
#: parser, its arguments after the reply, a valid reply, the fewest elements a valid reply has
PARSERS: list[tuple[Callable[..., Any], tuple[Any, ...], list[Any], int]] = [
    (p.parse_submit, (), [b"ok", 2, b"1-0", b"2-0"], 2),
    (p.parse_publish_version, (3, ""), [b"ok", b"published", 3], 3),
    (p.parse_complete, (R,), [b"ok", b"buffered", b""], 3),
    (p.parse_ended, ("fail", R), [b"ok", b"ready"], 2),
    (p.parse_close_worker, ("w1",), [b"ok", 1, 0, 1], 4),
    (p.parse_commit, ("L",), [b"ok", b"committed", b"5-0", 2], 4),
    (p.parse_rollback, ("L",), [b"ok", b"rolled_back", 2, 0, 1], 5),
    (p.parse_extend, ("L",), [b"ok", 99_000], 2),
    (p.parse_hold_open, ("H",), [b"ok", 3, 99_000], 3),
    (p.parse_hold_poll, ("H",), [b"ok", 3, b"7-0"], 3),
    (p.parse_hold_release, ("H",), [b"ok", 0], 2),
    (p.parse_checkpoint, (4,), [b"ok", 10, 1], 3),
    (p.parse_restore, (4,), [b"ok", 10, 0], 3),
    (p.parse_reap_scan, (), [b"ok", [b"w1"], [b"L1"], [b"H1"], 2, 1, 0, [b"w8"]], 8),
    (p.parse_sweep_owners, (), [b"ok", [b"w9"], 1], 3),
    (p.parse_reap_worker, ("w1",), [b"ok", 2, 1, 1], 4),
    (p.parse_expire_lease, (b"L1",), [b"ok", b"expired", 3, 1], 4),
    (p.parse_reap_stale, (), [b"ok", 1, 1], 3),
    (p.parse_reindex, (), [b"ok", 0, 1], 3),
    (p.parse_prune, (), [b"ok", 32, 0], 3),
    (p.parse_finish_interrupted, (), [b"ok", b"restore", 4, 7, 1], 5),
    (p.parse_stats, (), [b"ok", [b"version", b"3", b"retained", b"1"], 1000, 10, 2, 1, 1, 0, 0, 0, 0, 0,
                         [b"3", b"2"], 5, 5, 0, 12, 1], 18),
    (p.parse_dlq_requeue, ("1-0",), [b"ok", b"9-0"], 2),
    (p.parse_produce, ("p1", "plan", 0), [b"ok", 2, 2, 5], 4),
    (p.parse_requeue, (R,), [b"ok", b"ready"], 2),
    (p.parse_config_set, ("q",), [b"ok", 2], 2),
    (p.parse_drain_start, (), [b"ok", b"draining", 99_000, 3], 4),
    (p.parse_drain_stop, (), [b"ok", b"stopped", 0], 3),
    (p.parse_dlq_purge, (), [b"ok", 3, 1], 3),
    (p.parse_heartbeat, (), [b"ok", 3, 1, b"s3://w", 0, 99], 6),
    (p.parse_time, (), [b"1700000000", b"123456"], 2),
    (p.parse_hmget, (("a", "b"),), [b"1", None], 2),
    (p.parse_pending, (), [[b"1-0", b"w1", 5, 1]], 0),
    (p.parse_hscan, (), [b"0", [b"1-0", b"{\"f\": 1}"]], 2),
    (p.parse_owned, ("w1",), [[b"1-0", b"w1", 5, 1]], 0),
    (p.parse_stream_entries, (), [[b"1-0", KV]], 0),
    (p.parse_stream_info, (), [b"length", 3, b"last-generated-id", b"5-0", b"entries-added", 7], 4),
    (p.parse_last_id, (), [[b"1-0", KV]], 0),
    (p.parse_dead_letters, (), [[b"1-0", KV]], 0),
]
IDS = [f"{x[0].__name__}-{i}" for i, x in enumerate(PARSERS)]


def _wrong(value: Any) -> Any:
    """A value of the wrong type for this field: a number for a list, a list for a scalar."""
    return 5 if isinstance(value, list) else [b"x", [b"y"]]


@pytest.mark.parametrize("parser,args,valid,fewest", PARSERS, ids=IDS)
def test_each_parser_reads_its_documented_reply(parser: Callable[..., Any], args: tuple[Any, ...],
                                                valid: list[Any], fewest: int) -> None:
    parser(valid, *args)


@pytest.mark.parametrize("parser,args,valid,fewest", PARSERS, ids=IDS)
def test_each_parser_raises_protocol_error_for_a_reply_of_the_wrong_shape(
        parser: Callable[..., Any], args: tuple[Any, ...], valid: list[Any], fewest: int) -> None:
    status = isinstance(valid[0], bytes) and not valid[0][:1].isdigit()  # a script's status list
    bad: list[Any] = [None, 7, b"ok", {"a": 1}]
    bad += [valid[:n] for n in range(1 if status else 0, fewest)]  # too short
    for i in range(len(valid)):  # each field of the wrong type
        if parser is p.parse_hmget:  # any value is a field's value: only the count is the shape
            break
        bad += [valid[:i] + [None] + valid[i + 1:], valid[:i] + [_wrong(valid[i])] + valid[i + 1:]]
    for reply in bad:
        if not status and reply == [] and fewest == 0:
            continue
        with pytest.raises(ProtocolError):
            parser(reply, *args)
            pytest.fail(f"{parser.__name__} accepted {reply!r}")


@pytest.mark.parametrize("reply", [[b"ok", b"maybe", 3], [b"ok", b"rolled_back", 2, 1]], ids=repr)
def test_a_word_outside_the_documented_set_is_a_protocol_error(reply: list[Any]) -> None:
    with pytest.raises(ProtocolError, match="publish_version"):
        p.parse_publish_version(reply, 3, "")


def test_the_error_names_the_script_and_the_reply() -> None:
    with pytest.raises(ProtocolError, match=r"rollback.*\[b'ok', b'rolled_back'\]"):
        p.parse_rollback([b"ok", b"rolled_back"], "L")
    with pytest.raises(ProtocolError, match="XPENDING"):
        p.parse_pending([[b"1-0", b"w1"]])
    with pytest.raises(ProtocolError, match="HGET meta version"):
        p.parse_count(b"nope", "HGET meta version")


def test_a_refusal_is_still_its_typed_error() -> None:
    from rollout_queue.core.errors import LeaseLost, StaleReceipt

    with pytest.raises(LeaseLost):
        p.parse_rollback([b"lease_lost", b"token"], "L")
    with pytest.raises(StaleReceipt):
        p.parse_ended([b"stale_receipt", b"w2", 3], "fail", R)


def test_counts_read_absent_and_empty_as_zero() -> None:
    assert [p.parse_count(x, "c") for x in (None, b"", 7, b"12")] == [0, 0, 7, 12]
    assert p.parse_last_id([]) is None and p.parse_producer_cursor(None) == (0, None)
    assert p.parse_producer_cursor(b"12|plan-a") == (12, "plan-a")


def test_single_value_reads_refuse_what_is_no_such_value() -> None:
    assert p.parse_partition_record(None, "q", "k") is None and p.parse_partition_record(b"3", "q", "k") == 3
    for bad in (b"0", b"-2", b"three", b"inf", b"1e300", [b"3"]):
        with pytest.raises(ProtocolError, match="partition record k"):
            p.parse_partition_record(bad, "q", "k")
    assert p.parse_text(None, "GET") is None and p.parse_text(b"\xff", "GET") == "\ufffd"
    assert p.parse_score(None, "ZSCORE") is None and p.parse_score(b"inf", "ZSCORE") == float("inf")
    for parse, bad in ((p.parse_text, 5), (p.parse_text, [b"x"]), (p.parse_score, b"soon"), (p.parse_score, [1]),
                       (p.parse_count, [1]), (p.parse_count, b"1.5x")):
        with pytest.raises(ProtocolError):
            parse(bad, "CMD")
