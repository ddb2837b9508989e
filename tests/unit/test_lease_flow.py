"""flows.lease and its protocol steps driven by hand, with no Redis (P2: payloads after the script).

Rules under test: the lease script names its members without payloads; the flow then reads every
payload with one MGET of the members' payload keys (each named by its entry and attempt) and
decodes the groups. A member whose payload is missing at that read (the
lease expired in between, or someone deleted it) or does not decode is undecodable: the flow hands
the lease back and leases again, exactly as for garbage, and never returns or trains on it. A hand-back
that finds the lease already expired (the reaper requeued it) is not an error for the trainer.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollout_queue import LeaseLost, ProtocolError, Sample, SourceGroup
from rollout_queue.core import flows
from rollout_queue.core import protocol as p
from rollout_queue.core.codec import encode_completion, encode_group
from rollout_queue.core.keys import QueueKeys

KEYS = QueueKeys("unit-lease")
GROUP = SourceGroup("s-1", "prompt", 2, {"k": 1})
SAMPLES = (Sample(0, (1, 2), (-0.5, -0.25), 1.0, 3), Sample(1, (3,), (), 0.0, 4, "length", (4,)))


class FakeClock:
    def __call__(self) -> float:
        return 100.0


def _kv(group: SourceGroup) -> list[bytes]:
    parents, body = encode_group(group)
    return [b"v", b"1", b"sid", group.source_id.encode(), b"n", str(group.n).encode(), b"p", parents, b"g", body]


def _granted(call: p.Call, ids: list[str], min_version: bytes = b"3", attempts: list[int] | None = None) -> list[Any]:
    """The script's 'ok' reply for ``call``: one member per id, attempt 1 (or ``attempts``), no payload."""
    lease_id = call.args[0]
    tries = attempts or [1] * len(ids)
    return [b"ok", lease_id.encode(), 99_000, 7,
            [[i.encode(), a, min_version, _kv(GROUP)] for i, a in zip(ids, tries)]]


def _start(groups: int = 2) -> tuple[Any, p.Call]:
    flow = flows.lease(KEYS, "trainer-1", groups, False, None, 0, FakeClock())
    call = next(flow)
    assert call.script.name == "lease"
    return flow, call


def _result(flow: Any, reply: Any) -> Any:
    with pytest.raises(StopIteration) as stop:
        flow.send(reply)
    return stop.value.value


def test_the_payloads_are_read_with_one_mget_after_the_script() -> None:
    """One MGET, in member order, of each member's payload key: the key of the attempt the member is
    leased under (its PEL delivery count), so a stale attempt's payload is never read."""
    flow, call = _start()
    read = flow.send(_granted(call, ["1-0", "2-0"], attempts=[1, 3]))
    assert read == p.Command(("MGET", KEYS.payload("1-0", 1), KEYS.payload("2-0", 3))) and read.idempotent
    assert read.args[1:] == ("rollout:{unit-lease}:payload:1-0:1", "rollout:{unit-lease}:payload:2-0:3")
    blob = encode_completion(SAMPLES)
    reply, token = _result(flow, [blob, blob])
    assert token == call.args[1] and reply.lease_id == call.args[0]
    assert [(g.entry_id, g.attempt, g.min_version, g.group) for g in reply.groups] == [
        ("1-0", 1, 3, GROUP), ("2-0", 3, 3, GROUP)]
    assert reply.groups[0].samples == SAMPLES and reply.undecodable == ()
    assert reply.groups[1].columns().token_ids.tolist() == [1, 2, 3]


@pytest.mark.parametrize("missing", [None, b"", b"RQC2 garbage"])
def test_a_missing_or_garbage_payload_hands_the_lease_back_and_leases_again(missing: bytes | None) -> None:
    flow, call = _start()
    flow.send(_granted(call, ["1-0", "2-0"]))
    rollback = flow.send([encode_completion(SAMPLES), missing])
    assert rollback.script.name == "rollback" and rollback.args[:2] == call.args[:2]  # lease id, token
    assert rollback.args[2] == "", "undecodable members are the data's storage, not the trainer's error: plain"
    again = flow.send([b"ok", b"rolled_back", 2, 0, 1])
    assert again.script.name == "lease" and again.args[0] != call.args[0], "a new lease id"
    assert _result(flow, [b"insufficient", 1, b"4-0"]) is None


def test_a_hand_back_that_finds_the_lease_expired_leases_again() -> None:
    """The lease expired between the script and the read: the reaper took the members back (their
    payloads with them), so the rollback answers lease_lost 'expired'; that is not the trainer's error."""
    flow, call = _start()
    flow.send(_granted(call, ["1-0", "2-0"]))
    rollback = flow.send([None, None])
    again = flow.send([b"lease_lost", b"expired"])
    assert rollback.script.name == "rollback" and again.script.name == "lease"
    assert flow.send(_granted(again, ["3-0", "4-0"])).args == ("MGET", KEYS.payload("3-0", 1), KEYS.payload("4-0", 1))
    blob = encode_completion(SAMPLES)
    reply, _ = _result(flow, [blob, blob])
    assert [g.entry_id for g in reply.groups] == ["3-0", "4-0"]


@pytest.mark.parametrize("state", [b"token", b"unknown", b"committed"])
def test_a_hand_back_refused_for_any_other_reason_raises(state: bytes) -> None:
    flow, call = _start()
    flow.send(_granted(call, ["1-0"]))
    flow.send([None])
    with pytest.raises(LeaseLost):
        flow.send([b"lease_lost", state])


def test_a_lease_record_without_members_reads_no_payloads() -> None:
    """A record whose member list was emptied by hand replays as 'ok' with nothing: no MGET is sent
    (MGET needs a key) and the lease comes back empty, as before P2."""
    flow, call = _start()
    reply, _ = _result(flow, [b"ok", call.args[0].encode(), 1, 0, []])
    assert reply.groups == () and reply.members == () and reply.undecodable == ()


def test_a_min_version_that_is_not_an_integer_is_undecodable() -> None:
    r = p.parse_lease([b"ok", b"L", 1, 0, [[b"1-0", 1, b"x", _kv(GROUP)]]], "L")
    assert p.decode_lease(r, [encode_completion(SAMPLES)]).undecodable == ("1-0",)


@pytest.mark.parametrize("payloads", [[], [b"a", b"b"], None, 5])
def test_a_payload_read_of_the_wrong_shape_is_a_protocol_error(payloads: Any) -> None:
    r = p.parse_lease([b"ok", b"L", 1, 0, [[b"1-0", 1, b"0", _kv(GROUP)]]], "L")
    with pytest.raises(ProtocolError):
        p.decode_lease(r, payloads)
