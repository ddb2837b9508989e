"""The owned view without Redis: the XPENDING command it sends, the parser, and the paging of the flow
(h11 style: replies are fed to the flow by hand)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_queue import InvalidInput, ProtocolError, Receipt
from rollout_queue.core.flows import owned as o
from rollout_queue.core.keys import QueueKeys

KEYS = QueueKeys("unit")
SRC = KEYS["src"]


def drive(flow: Any, replies: list[Any]) -> tuple[list[tuple[Any, ...]], Any]:
    """Run a flow on canned replies; the commands it sent and its result."""
    sent: list[tuple[Any, ...]] = []
    reply: Any = None
    try:
        while True:
            op = flow.send(reply)
            sent.append(op.args)
            assert op.idempotent, "a read-only view must be safe to resend"
            reply = replies.pop(0)
    except StopIteration as stop:
        return sent, stop.value


def test_the_command_is_the_extended_xpending_of_one_consumer() -> None:
    assert o.owned_command(KEYS, "w1", "-", 10).args == ("XPENDING", SRC, "rollout", "-", "+", 10, "w1")
    assert o.owned_command(KEYS, "w1", "(5-0", 3, min_idle_ms=2500).args == (
        "XPENDING", SRC, "rollout", "IDLE", 2500, "(5-0", "+", 3, "w1")


def test_rows_become_exact_receipts_with_their_idle_time() -> None:
    got = o.parse_owned([[b"1-0", b"w1", 1500, 1], [b"2-3", b"w1", 0, 4]], "w1")
    assert got == [o.OwnedAttempt(Receipt("1-0", 1, "w1"), 1500), o.OwnedAttempt(Receipt("2-3", 4, "w1"), 0)]
    assert got[1].entry_id == "2-3"


@pytest.mark.parametrize("row", [
    [b"1-0", b"w1", 5],                 # too short
    b"1-0",                              # not a row
    [b"x", b"w1", 5, 1],                 # not a stream ID
    [b"1-0", b"w1", 5, 0],               # attempt 0 cannot exist
    [b"1-0", b"w1", b"soon", 1],         # idle not a number
])
def test_a_malformed_row_is_a_protocol_error(row: Any) -> None:
    with pytest.raises(ProtocolError):
        o.parse_owned([row], "w1")


def test_a_negative_idle_reads_as_just_delivered() -> None:
    [a] = o.parse_owned([[b"1-0", b"w1", -40, 1]], "w1")  # the server's clock stepped back
    assert a.idle_ms == 0


def test_a_row_of_another_consumer_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="'w2'"):
        o.parse_owned([[b"1-0", b"w2", 5, 1]], "w1")


def test_owned_attempt_validates_idle() -> None:
    with pytest.raises(InvalidInput):
        o.OwnedAttempt(Receipt("1-0", 1, "w1"), -5)
    with pytest.raises(InvalidInput):
        o.OwnedAttempt(Receipt("1-0", 1, "w1"), True)


def test_the_flow_pages_with_an_exclusive_start_until_a_short_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(o, "PAGE", 2)
    pages = [[[b"1-0", b"w", 9, 1], [b"2-0", b"w", 8, 2]], [[b"3-0", b"w", 7, 1], [b"4-0", b"w", 6, 1]],
             [[b"5-0", b"w", 5, 3]]]
    sent, got = drive(o.owned_attempts(KEYS, "w", min_idle_ms=5), pages)
    assert [args[5] for args in sent] == ["-", "(2-0", "(4-0"]
    assert all(args[3:5] == ("IDLE", 5) for args in sent)  # the filter on every page
    assert [(a.entry_id, a.receipt.attempt, a.idle_ms) for a in got] == [
        ("1-0", 1, 9), ("2-0", 2, 8), ("3-0", 1, 7), ("4-0", 1, 6), ("5-0", 3, 5)]


def test_the_flow_stops_at_the_limit_and_on_an_exact_last_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(o, "PAGE", 2)
    full = [[b"1-0", b"w", 1, 1], [b"2-0", b"w", 1, 1]]
    sent, got = drive(o.owned_attempts(KEYS, "w", limit=3), [full, [[b"3-0", b"w", 1, 1]]])
    assert [args[-2] for args in sent] == [2, 1] and len(got) == 3
    sent, got = drive(o.owned_attempts(KEYS, "w"), [full, []])
    assert len(sent) == 2 and len(got) == 2


@pytest.mark.parametrize("kwargs", [{"worker_id": "@ready"}, {"worker_id": ""}, {"min_idle_ms": -1},
                                    {"limit": 0}])
def test_bad_arguments_are_refused_before_anything_is_sent(kwargs: dict[str, Any]) -> None:
    args = {"worker_id": "w1", **kwargs}
    with pytest.raises(InvalidInput):
        next(o.owned_attempts(KEYS, **args))
