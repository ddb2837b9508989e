"""protocol.py (and the flows that drive it) with no Redis, in the h11 style: values in, values out.

Rule 1 under test: build() takes exactly the ARGV names of the script's header and lays keys and
ARGV out in header order. Rule 2: check() maps every status word of the one ERRORS table to its
exception, raises ProtocolError for an unknown status or a malformed reply, and never reads one as
success; the parsers do the same for replies of the wrong shape.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollout_queue import (
    CheckpointPruned,
    CheckpointRegression,
    LeasesOpen,
    RestoreInProgress,
    LeaseUnsatisfiable,
    ConfigMismatch,
    HeartbeatInfo,
    HoldLost,
    LeaseLost,
    MalformedCompletion,
    NotFound,
    PartialTooLarge,
    PayloadTooLarge,
    ProtocolError,
    Receipt,
    Sample,
    SourceGroup,
    StaleReceipt,
    VersionRegression,
)
from rollout_queue.core import flows
from rollout_queue.core.errors import ProducerConflict, WorkerNotLive
from rollout_queue.core import protocol as p
from rollout_queue.core.errors import LayoutMigrationRefused, QueueCreateRefused
from rollout_queue.core.codec import SCHEMA_VERSION, encode_completion, encode_group
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.scripts import SCRIPTS

KEYS = QueueKeys("unit")
RECEIPT = {"entry_id": "1-0", "attempt": 2, "worker_id": "w1"}


def _argv(name: str) -> dict[str, Any]:
    """One distinct value per ARGV name of the script (a list for the variadic one)."""
    script = SCRIPTS[name]
    out: dict[str, Any] = {a: f"value-of-{a}" for a in script.argv if not a.startswith("*")}
    if script.variadic:
        out[script.variadic] = ["v1", "v2", "v3"]
    return out


# -- build ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_build_lays_out_keys_and_argv_in_header_order(name: str) -> None:
    script = SCRIPTS[name]
    call = p.build(KEYS, name, **_argv(name))
    assert call.script is script and call.idempotent is True
    assert call.keys == tuple(KEYS[role] for role in script.keys)
    fixed = [a for a in script.argv if not a.startswith("*")]
    assert call.args == tuple(f"value-of-{a}" for a in fixed) + (("v1", "v2", "v3") if script.variadic else ())
    assert all(k.startswith("rollout:{unit}:") for k in call.keys)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_build_refuses_wrong_argv_names(name: str) -> None:
    argv = _argv(name)
    with pytest.raises(TypeError, match=f"script {name} takes ARGV"):
        p.build(KEYS, name, **argv, not_an_argv=1)
    if argv:
        missing = dict(argv)
        missing.pop(sorted(argv)[0])
        with pytest.raises(TypeError):
            p.build(KEYS, name, **missing)
        renamed = {("x" + k if i == 0 else k): v for i, (k, v) in enumerate(argv.items())}
        with pytest.raises(TypeError):
            p.build(KEYS, name, **renamed)


def test_build_marks_calls_that_are_not_safe_to_resend() -> None:
    assert p.build(KEYS, "dlq_requeue", idempotent=False, dlq_id="1-0").idempotent is False


def test_build_knows_only_the_library_scripts() -> None:
    with pytest.raises(KeyError):
        p.build(KEYS, "no_such_script")


# -- check: the status table -----------------------------------------------------------------------

# status -> (a reply, the call's context, the exception, fields the exception must carry)
ERROR_CASES: dict[str, tuple[list[Any], dict[str, Any], type[Exception], dict[str, Any]]] = {
    "stale_receipt": ([b"stale_receipt", b"w2", 3], RECEIPT, StaleReceipt,
                      {**RECEIPT, "owner": "w2", "delivery_count": 3}),
    "lease_lost": ([b"lease_lost", b"expired"], {"lease_id": "L1"}, LeaseLost, {"lease_id": "L1", "state": "expired"}),
    "hold_lost": ([b"hold_lost"], {"hold_id": "H1"}, HoldLost, {"hold_id": "H1"}),
    "payload_too_large": ([b"payload_too_large", 1, 500, 400], {"what": "source group"}, PayloadTooLarge,
                          {"what": "source group", "size": 500, "limit": 400}),
    "partial_too_large": ([b"partial_too_large", 500, 400], RECEIPT, PartialTooLarge,
                          {"what": "progress record of 1-0", "size": 500, "limit": 400}),
    "config_mismatch": ([b"config_mismatch", b"max_attempts", b"3", b"5"], {"queue": "unit"}, ConfigMismatch,
                        {"queue": "unit", "field": "max_attempts", "stored": "3", "given": "5"}),
    "malformed": ([b"malformed", b"2 of 3 slots have no output", b"dead"], RECEIPT, MalformedCompletion,
                  {"entry_id": "1-0", "detail": "2 of 3 slots have no output", "requeued_to": "dead"}),
    "version_regression": ([b"version_regression", 7], {"version": 5}, VersionRegression, {"version": 5, "current": 7}),
    "checkpoint_pruned": ([b"checkpoint_pruned", 10], {"step": 3}, CheckpointPruned, {"step": 3, "checkpoint": 10}),
    "checkpoint_regression": ([b"checkpoint_regression", 10], {"step": 3}, CheckpointRegression,
                              {"step": 3, "checkpoint": 10}),
    "leases_open": ([b"leases_open", 2], {"step": 3}, LeasesOpen, {"step": 3, "leased": 2}),
    "restore_in_progress": ([b"restore_in_progress", 4], {"what": "checkpoint 9"}, RestoreInProgress,
                            {"step": 4, "what": "checkpoint 9"}),
    "unsatisfiable": ([b"unsatisfiable", b"max_completed_groups", 4], {"lease_id": "L1", "groups": 8},
                      LeaseUnsatisfiable, {"groups": 8, "bound": "max_completed_groups", "limit": 4}),
    "not_found": ([b"not_found"], {"what": "dead letter", "id": "9-9"}, NotFound, {}),
    "cursor_moved": ([b"cursor_moved", 12], {"producer": "ds", "from": 8}, ProducerConflict, {"producer": "ds"}),
    "plan_mismatch": ([b"plan_mismatch", b"abc"], {"producer": "ds", "plan": "def"}, ProducerConflict,
                      {"producer": "ds"}),
    "not_live": ([b"not_live", 3], {"worker_id": "w9"}, WorkerNotLive, {"worker_id": "w9"}),
    "create_refused": ([b"create_refused"], {"queue": "unit"}, QueueCreateRefused, {"queue": "unit"}),
    "migration_refused": ([b"migration_refused", b"3.abc", b"4.def"], {"queue": "unit"}, LayoutMigrationRefused,
                          {"queue": "unit", "field": "library", "stored": "3.abc", "given": "4.def"}),
}


def test_every_status_word_of_the_table_has_a_case() -> None:
    assert set(ERROR_CASES) == set(p.ERRORS)


@pytest.mark.parametrize("status", sorted(ERROR_CASES))
def test_check_maps_each_status_word_to_its_exception(status: str) -> None:
    reply, context, error, fields = ERROR_CASES[status]
    with pytest.raises(error) as info:
        p.check(reply, ("ok",), context)
    assert {k: getattr(info.value, k) for k in fields} == fields
    assert str(info.value)  # every error explains itself
    with pytest.raises(error):
        p.check([p.s(reply[0]), *reply[1:]], ("ok",), context)  # text status words too


def test_payload_too_large_reads_size_and_limit_from_the_end_of_either_reply_shape() -> None:
    with pytest.raises(PayloadTooLarge) as info:
        p.check([b"payload_too_large", 900, 600], ("ok",), {})  # complete.lua has no index
    assert (info.value.size, info.value.limit) == (900, 600)


def test_check_returns_an_expected_status_and_the_reply() -> None:
    reply = [b"ok", b"ready"]
    assert p.check(reply, ("ok",), {}) == ("ok", reply)
    assert p.check([b"alive", 5], ("ok", "alive"), {}) == ("alive", [b"alive", 5])


@pytest.mark.parametrize("reply", [[b"bogus"], [b"OK"], [b"ok "], [b"granted", 1], [7], [[b"ok"]], [None]], ids=repr)
def test_check_raises_protocol_error_for_an_unknown_status(reply: list[Any]) -> None:
    with pytest.raises(ProtocolError, match="unknown status"):
        p.check(reply, ("ok",), {})


def test_a_status_the_caller_did_not_expect_is_never_success() -> None:
    with pytest.raises(ProtocolError):
        p.check([b"empty", 0], ("ok",), {})


@pytest.mark.parametrize("reply", [None, b"ok", "ok", 1, [], (), {"ok": 1}], ids=repr)
def test_check_raises_protocol_error_for_a_reply_that_is_not_a_status_list(reply: Any) -> None:
    with pytest.raises(ProtocolError, match="not a status list"):
        p.check(reply, ("ok",), {})


@pytest.mark.parametrize("reply, context", [
    ([b"stale_receipt"], RECEIPT), ([b"stale_receipt", b"w2", b"three"], RECEIPT), ([b"lease_lost"], {"lease_id": "L"}),
    ([b"payload_too_large", b"big"], {}), ([b"config_mismatch", b"field"], {"queue": "q"}), ([b"malformed"], RECEIPT),
    ([b"version_regression"], {"version": 1}), ([b"checkpoint_pruned", None], {"step": 1}),
    ([b"stale_receipt", b"w2", 3], {}),  # a refusal this call cannot produce: no receipt in its context
], ids=repr)
def test_check_raises_protocol_error_for_a_malformed_refusal(reply: list[Any], context: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="malformed"):
        p.check(reply, ("ok",), context)


# -- parsers -------------------------------------------------------------------------------------

GROUP = SourceGroup("s", "p", 2)


def _kv(group: SourceGroup) -> list[bytes]:
    parents, body = encode_group(group)
    return [b"v", str(SCHEMA_VERSION).encode(), b"sid", group.source_id.encode(), b"n", str(group.n).encode(),
            b"p", parents, b"g", body]


def test_parse_reserve_reads_the_grants() -> None:
    reply = [b"ok", 4, 1, b"", 2, [[b"1-0", 3, _kv(GROUP)]]]
    r = p.parse_reserve(reply, "w1")
    assert (r.status, r.version, r.version_published, r.wake_id, r.dead_lettered) == ("ok", 4, True, "", 2)
    [(receipt, fields)] = r.granted
    assert receipt == Receipt("1-0", 3, "w1")
    assert p.decode_reservation_group(fields) == GROUP


@pytest.mark.parametrize("status", [s for s in p.RESERVE_STATUSES if s != "ok"])
def test_parse_reserve_reads_each_refusal(status: str) -> None:
    r = p.parse_reserve([status.encode(), 0, 0, b"5-1", 0, []], "w1")
    assert (r.status, r.wake_id, r.granted) == (status, "5-1", ())


@pytest.mark.parametrize("reply", [
    [b"ok"], [b"ok", 0, 0, b"", 0], [b"ok", 0, 0, b"", 0, [[b"1-0"]]], [b"ok", b"x", 0, b"", 0, []],
    [b"ok", 0, 0, b"", 0, [[b"1-0", 1, [b"odd"]]]], [b"ok", 0, 0, b"", 0, [[b"not-an-id", 1, []]]],
    [b"ok", 0, 0, b"", 0, 5],
], ids=repr)
def test_parse_reserve_raises_protocol_error_for_a_malformed_reply(reply: list[Any]) -> None:
    with pytest.raises(ProtocolError):
        p.parse_reserve(reply, "w1")


def test_parse_lease_reads_members_and_lists_the_undecodable() -> None:
    # The record holds the version the queue judged the group by (4: its samples' newest, in
    # staleness_mode 'continue'); the group reports its oldest token, as its samples say (2).
    samples = (Sample(0, (1, 2), version=2, segments=((0, 2), (1, 4))), Sample(1, (2,), version=4))
    reply = [b"ok", b"L1", 1234, 5, [[b"1-0", 2, b"4", _kv(GROUP)], [b"2-0", 1, b"5", _kv(GROUP)]]]
    r = p.parse_lease(reply, "L1")
    assert (r.status, r.lease_id, r.deadline_ms, r.version, r.groups) == ("ok", "L1", 1234, 5, ())
    assert [(m.entry_id, m.attempt, m.min_version) for m in r.members] == [("1-0", 2, "4"), ("2-0", 1, "5")]
    # each member's payload key names its attempt (the PEL delivery count it is leased under)
    assert p.read_lease_payloads(KEYS, r) == p.Command(("MGET", KEYS.payload("1-0", 2), KEYS.payload("2-0", 1)))
    r = p.decode_lease(r, [encode_completion(samples), b"garbage"])
    assert (r.available, r.undecodable) == (1, ("2-0",))
    [g] = r.groups
    assert (g.entry_id, g.group, g.samples, g.attempt, g.min_version) == ("1-0", GROUP, samples, 2, 2)


@pytest.mark.parametrize("status", ["held", "insufficient"])
def test_parse_lease_reads_each_refusal(status: str) -> None:
    r = p.parse_lease([status.encode(), 3, b"9-0"], "L1")
    assert (r.status, r.available, r.wake_id, r.groups) == (status, 3, "9-0", ())


@pytest.mark.parametrize("reply", [[b"ok", b"L1"], [b"ok", b"L1", 1, 1, [[b"1-0"]]], [b"held"],
                                   [b"ok", b"L1", 1, 1, [[b"1-0", 1, b"0", b"payload", []]]]], ids=repr)
def test_parse_lease_raises_protocol_error_for_a_malformed_reply(reply: list[Any]) -> None:
    with pytest.raises(ProtocolError):
        p.parse_lease(reply, "L1")


def test_parse_lease_maps_lease_lost() -> None:
    with pytest.raises(LeaseLost):
        p.parse_lease([b"lease_lost", b"token"], "L1")


def test_parse_heartbeat() -> None:
    assert p.parse_heartbeat([b"ok", 3, 1, b"s3://w", 0, 99]) == HeartbeatInfo(3, True, "s3://w", False, 99)
    assert p.parse_heartbeat([b"ok", 0, 0, b"", 1, 7]).weights_uri is None
    for bad in ([b"ok", 3], [b"ok", b"x", 1, b"", 0, 1]):
        with pytest.raises(ProtocolError):
            p.parse_heartbeat(bad)


def test_parse_open() -> None:
    assert p.parse_open([b"ok", 1, b"library", b"1.abc", b"max_attempts", b"3"], "q") == (
        True, {"library": "1.abc", "max_attempts": "3"})
    with pytest.raises(ConfigMismatch):
        p.parse_open([b"config_mismatch", b"library", b"1.a", b"1.b"], "q")
    with pytest.raises(ProtocolError):
        p.parse_open([b"ok", 1, b"library"], "q")


# -- flows driven by hand: no socket, no clock of their own ---------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _empty(status: bytes = b"empty", wake_id: bytes = b"5-0") -> list[Any]:
    return [status, 0, 0, wake_id, 0, []]


def test_reserve_flow_rejects_an_undecodable_grant_and_asks_again() -> None:
    flow = flows.reserve(KEYS, "w1", 1, 0, 0, FakeClock())
    first = next(flow)
    assert first.script.name == "reserve" and first.idempotent
    kv = _kv(GROUP)
    kv[-1] = b"{not json"
    reject = flow.send([b"ok", 0, 0, b"", 0, [[b"1-0", 1, kv]]])
    assert reject.script.name == "reject"
    assert reject.args[:3] == ("1-0", 1, "w1") and reject.args[3].startswith("malformed_reservation")
    again = flow.send([b"ok", b"dead"])
    assert again.script.name == "reserve" and again.args[3] != first.args[3]  # a new request id
    with pytest.raises(StopIteration) as done:
        flow.send(_empty())
    assert done.value.value == []


def test_blocking_reserve_flow_waits_on_the_wake_stream_until_its_deadline() -> None:
    clock = FakeClock()
    flow = flows.reserve(KEYS, "w1", 1, 0, 1500, clock)
    next(flow)
    wait = flow.send(_empty(b"capacity", b"7-3"))
    assert isinstance(wait, p.Command)
    assert wait.args == ("XREAD", "BLOCK", 1500, "COUNT", 1, "STREAMS", KEYS["wake_work"], "7-3")
    clock.now += 1.0
    assert flow.send(None).script.name == "reserve"  # woken (or a chunk ended): try again
    wait = flow.send(_empty())
    assert wait.args[2] == 500
    clock.now += 0.6
    assert flow.send(None).script.name == "reserve"
    with pytest.raises(StopIteration) as done:
        flow.send(_empty())
    assert done.value.value == []


def test_submit_and_complete_flows_refuse_oversized_payloads_before_any_call() -> None:
    with pytest.raises(PayloadTooLarge):
        next(flows.submit(KEYS, [SourceGroup("s", "x" * 100, 1)], 50))
    with pytest.raises(PayloadTooLarge):
        next(flows.complete(KEYS, Receipt("1-0", 1, "w1"), [Sample(0, tuple(range(100)))], 50))


def test_complete_flow_sends_every_outputs_slot_and_the_oldest_version() -> None:
    samples = [Sample(1, (1,), version=4), Sample(0, (2,), version=2), Sample(1, (3,), version=9)]
    call = next(flows.complete(KEYS, Receipt("1-0", 1, "w1"), samples, 10_000))
    argv = dict(zip([a for a in call.script.argv], call.args))
    # The oldest sample version, and the newest any sample's tokens have (what 'continue' judges by).
    assert (argv["min_version"], argv["slots"]) == ("2:9", "1,0,1")
    spanning = [Sample(0, (1, 2), version=2, segments=((0, 2), (1, 7))), Sample(1, (3,), version=2)]
    spanned = next(flows.complete(KEYS, Receipt("1-0", 1, "w1"), spanning, 10_000))
    assert dict(zip(spanned.script.argv, spanned.args))["min_version"] == "2:7"
    same = next(flows.complete(KEYS, Receipt("1-0", 1, "w1"), [Sample(0, (1,), version=3)], 10_000))
    assert dict(zip(same.script.argv, same.args))["min_version"] == "3"  # one version: no newest sent
    # the payload is not in ARGV: it is staged (SET in the call's MULTI) at the attempt's payload key
    payload = encode_completion(samples)
    assert "payload" not in argv and argv["size"] == len(payload)
    assert call.stage == ((KEYS.payload("1-0", 1), payload),)
    assert all(not isinstance(a, bytes) for a in call.args), "no bytes through ARGV"
