"""The transport's staged calls without Redis: the sans-IO policy (transport._policy) and the I/O
machine (transport.execute) driven by hand, their replies shaped as redis-py reads them.

A Call with a ``stage`` (a completion's payloads) goes as one transaction in one round trip:
MULTI, one SET NX per staged value, the EVALSHA, EXEC (WAIT behind it in durable mode); _unwrap reads
EXEC's answer as if the script had been called alone. Rules under test:

- EXEC's array ends with the script's reply: that is the call's reply (a WAIT's follows).
- EXECABORT (Redis refused a queued command, so nothing ran): the refusal itself is judged, as any
  reply is. READONLY, NOREPLICAS, MISCONF, BUSY... are refusals: sent again, idempotent or not, and
  ServerUnavailable past the window. NOPERM or OOM is not: ScriptError at once.
- NOSCRIPT inside EXEC's array: the script is loaded on the same connection and the whole
  transaction, its SETs included, is sent again once.
- A connection lost before EXEC was answered is "maybe ran": sent again only when idempotent, else
  (or past the window) OutcomeUnknown, never ServerUnavailable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from rollout_queue.core import protocol as p
from rollout_queue.core.errors import NotReplicated, OutcomeUnknown, ScriptError, ServerUnavailable
from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.policy import Durability, RetryPolicy
from rollout_queue.core.scripts import SCRIPTS
from rollout_queue.drivers.transport import (
    Acquire,
    Exchange,
    Pause,
    Release,
    _companions,
    _Outcome,
    _policy,
    _request,
    _Send,
    _Sleep,
    _unwrap,
    execute,
)

KEYS = QueueKeys("unit-tx")
PAYLOAD = b"RQC2\x05\x00\x00\x00staged bytes"
RETRY = RetryPolicy(window_s=1.0, first_backoff_s=0.01, max_backoff_s=0.1)
SCRIPT_OK = [b"ok", b"buffered", b""]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def err(text: str) -> ResponseError:
    """An error reply as redis-py's parser makes it (its class chosen by the code word)."""
    error = BaseParser.parse_error(text)
    assert isinstance(error, ResponseError)
    return error


EXECABORT = "EXECABORT Transaction discarded because of previous errors."
NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."


def staged(idempotent: bool = True) -> p.Call:
    """complete, as the worker flow builds it: its payload staged at the attempt's payload key."""
    return p.build(KEYS, "complete", idempotent=idempotent, entry_id="1-0", attempt=2, worker_id="w1",
                   size=len(PAYLOAD), min_version=0, slots="0,1", tokens=4, stage=((KEYS.payload("1-0", 2), PAYLOAD),))


def evalsha(call: p.Call) -> tuple[Any, ...]:
    return ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)


def answered(call: p.Call, reply: Any = None, *wait: int) -> _Outcome:
    """A transaction that ran: +OK, +QUEUED per queued command, EXEC's array (each SET's OK, then the
    script's reply), then any WAIT's count."""
    n = len(call.stage)
    return _Outcome([b"OK", *[b"QUEUED"] * (n + 1), [*[b"OK"] * n, SCRIPT_OK if reply is None else reply], *wait])


def aborted(call: p.Call, refused_at: int, text: str) -> _Outcome:
    """A transaction Redis discarded: the queued command at ``refused_at`` (0: the first SET; len(stage):
    the EVALSHA) was refused when queued, so EXEC answers EXECABORT and nothing ran."""
    queued: list[Any] = [b"QUEUED"] * (len(call.stage) + 1)
    queued[refused_at] = err(text)
    return _Outcome([b"OK", *queued, err(EXECABORT)])


def finish(policy: Any, outcome: Any) -> Any:
    with pytest.raises(StopIteration) as stop:
        policy.send(outcome)
    return stop.value.value


# -- what goes on the wire ------------------------------------------------------------------------


def test_a_staged_call_goes_as_multi_its_sets_the_evalsha_and_exec_in_one_send() -> None:
    call = staged()
    policy = _policy(call, RETRY, None, Clock())
    step = next(policy)
    assert step == _Send((("MULTI",), ("SET", KEYS.payload("1-0", 2), PAYLOAD, "NX"), evalsha(call), ("EXEC",)),
                         fresh=True)
    assert all(not isinstance(a, bytes) for a in evalsha(call)), "the payload travels in the SET only"
    assert finish(policy, answered(call)) == SCRIPT_OK


def test_complete_many_stages_every_payload_in_item_order_before_its_script() -> None:
    stage = ((KEYS.payload("1-0", 1), b"a"), (KEYS.payload("2-0", 3), b"bb"))
    call = p.build(KEYS, "complete_many", worker_id="w1", stage=stage,
                   items=["1-0", 1, 1, 0, "0", 1, "2-0", 3, 2, 0, "0", 1, "3-0", 1, "", 0, "", 0])
    assert _request(call) == (("MULTI",), ("SET", *stage[0], "NX"), ("SET", *stage[1], "NX"), evalsha(call), ("EXEC",))
    reply = [b"ok", SCRIPT_OK, SCRIPT_OK, [b"malformed", b"completion has no samples", b"ready"]]
    out = _Outcome([b"OK", b"QUEUED", b"QUEUED", b"QUEUED", [b"OK", b"OK", reply]])
    assert _unwrap(call, out) == _Outcome([reply])


def test_an_unstaged_call_or_a_command_is_sent_alone_and_read_as_is() -> None:
    plain = replace(staged(), stage=())
    assert _request(plain) == (evalsha(plain),)
    read = p.Command(("MGET", KEYS.payload("1-0", 1)))
    assert _request(read) == (("MGET", KEYS.payload("1-0", 1)),)
    out = _Outcome([[b"x"]])
    assert _unwrap(plain, out) is out and _unwrap(read, out) is out


def test_durable_mode_sends_wait_behind_exec_and_reads_its_count_after_the_scripts_reply() -> None:
    call = staged()
    policy = _policy(call, RETRY, Durability(1, 500), Clock())
    step = next(policy)
    assert step.commands == (*_request(call), ("WAIT", 1, 500)) and step.fresh
    assert _unwrap(call, answered(call, None, 0)) == _Outcome([SCRIPT_OK, 0])
    again = policy.send(answered(call, None, 0))  # no replica yet: WAIT again, on the same connection
    assert again == _Send((("WAIT", 1, 500),), fresh=False)
    assert finish(policy, _Outcome([1])) == SCRIPT_OK


def test_durable_mode_whose_wait_never_came_back_is_not_replicated() -> None:
    call = staged()
    policy = _policy(call, RETRY, Durability(1, 500), Clock())
    next(policy)
    ran = answered(call)  # EXEC answered, then the connection broke before WAIT's reply
    with pytest.raises(NotReplicated):
        policy.send(_Outcome(ran.replies, RedisConnectionError("lost")))


# -- EXECABORT: what Redis refused when it queued the command -------------------------------------


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("refused_at,text", [
    (0, "READONLY You can't write against a read only replica."),      # the SET, after a failover
    (1, "READONLY You can't write against a read only replica."),      # the EVALSHA
    (0, "NOREPLICAS Not enough good replicas to write."),
    (0, "MISCONF Errors writing to the AOF file"),
    (1, "BUSY Redis is busy running a script."),
])
def test_execabort_for_a_refusal_is_sent_again_idempotent_or_not(idempotent: bool, refused_at: int, text: str) -> None:
    call = staged(idempotent)
    clock = Clock()
    policy = _policy(call, RETRY, None, clock)
    first = next(policy)
    assert isinstance(policy.send(aborted(call, refused_at, text)), _Sleep), "nothing ran: back off and resend"
    clock.now += 0.1
    resent = policy.send(None)
    assert resent == first and resent.fresh, "the whole transaction again, on a fresh connection"
    assert finish(policy, answered(call)) == SCRIPT_OK


def test_execabort_for_a_refusal_past_the_window_is_server_unavailable() -> None:
    call = staged()
    clock = Clock()
    policy = _policy(call, RETRY, None, clock)
    next(policy)
    readonly = "READONLY You can't write against a read only replica."
    step = policy.send(aborted(call, 0, readonly))
    while isinstance(step, _Sleep):
        clock.now += 0.4
        step = policy.send(None)
        assert isinstance(step, _Send)
        try:
            step = policy.send(aborted(call, 0, readonly))
        except ServerUnavailable as exc:
            assert exc.refusal == "READONLY" and not isinstance(exc, NotReplicated)
            return
    pytest.fail("a refusal past the window must raise ServerUnavailable")


@pytest.mark.parametrize("refused_at,text,shown", [
    (0, "NOPERM User rq-q-worker has no permissions to run the 'set' command", "no permissions"),
    (1, "NOPERM User rq-q-worker has no permissions to run the 'evalsha' command", "no permissions"),
    (0, "OOM command not allowed when used memory > 'maxmemory'.", "command not allowed"),
])
def test_execabort_for_noperm_or_oom_raises_script_error_at_once(refused_at: int, text: str, shown: str) -> None:
    call = staged()
    policy = _policy(call, RETRY, None, Clock())
    next(policy)
    with pytest.raises(ScriptError) as info:
        policy.send(aborted(call, refused_at, text))
    assert "complete" in str(info.value) and shown in str(info.value)
    assert "EXECABORT" not in str(info.value) and "discarded" not in str(info.value), "the cause, not EXECABORT"


def test_a_refusal_inside_execs_array_is_judged_as_the_scripts_reply() -> None:
    """The script met a write refusal when EXEC ran it (its first write did not happen): sent again;
    a ROLLOUTQ error from the script is a ScriptError naming it."""
    call = staged()
    policy = _policy(call, RETRY, None, Clock())
    next(policy)
    assert isinstance(policy.send(answered(call, err("READONLY You can't write against a read only replica."))),
                      _Sleep)
    policy.send(None)
    with pytest.raises(ScriptError, match="ROLLOUTQ corrupt state"):
        policy.send(answered(call, err("ERR user_script:9: ROLLOUTQ corrupt state script: complete")))


def test_exec_answered_nil_is_a_script_error() -> None:
    call = staged()
    policy = _policy(call, RETRY, None, Clock())
    next(policy)
    with pytest.raises(ScriptError, match="EXEC answered None"):
        policy.send(_Outcome([b"OK", b"QUEUED", b"QUEUED", None]))


# -- NOSCRIPT: the server forgot the script -------------------------------------------------------


@pytest.mark.parametrize("durable", [False, True])
def test_noscript_inside_exec_loads_the_script_and_sends_the_whole_transaction_again(durable: bool) -> None:
    call = staged()
    durability = Durability(1, 500) if durable else None
    tail = (("WAIT", 1, 500),) if durable else ()
    policy = _policy(call, RETRY, durability, Clock())
    first = next(policy)
    assert first.commands == _request(call) + tail
    forgot = _Outcome([b"OK", b"QUEUED", b"QUEUED", [b"OK", err(NOSCRIPT)], *((1,) if durable else ())])
    reload = policy.send(forgot)
    loads = tuple(("SCRIPT", "LOAD", source) for source in (call.script.source, *_companions(call)))
    assert reload == _Send(loads + _request(call) + tail, fresh=False), "load, then MULTI/SETs/EVALSHA/EXEC again"
    shas = [SCRIPTS[name].sha.encode() for name in ("complete",)] + [b"sha"] * (len(loads) - 1)
    again = answered(call, None, *((1,) if durable else ()))
    assert finish(policy, _Outcome([*shas, *again.replies])) == SCRIPT_OK


def test_noscript_again_after_the_reload_is_a_script_error_not_a_loop() -> None:
    call = staged()
    policy = _policy(call, RETRY, None, Clock())
    next(policy)
    forgot = _Outcome([b"OK", b"QUEUED", b"QUEUED", [b"OK", err(NOSCRIPT)]])
    reload = policy.send(forgot)
    n = sum(1 for c in reload.commands if c[0] == "SCRIPT")
    with pytest.raises(ScriptError, match="No matching script"):
        policy.send(_Outcome([b"sha"] * n + forgot.replies))


def test_a_connection_lost_during_the_reload_is_maybe_ran() -> None:
    call = staged(idempotent=False)
    policy = _policy(call, RETRY, None, Clock())
    next(policy)
    reload = policy.send(_Outcome([b"OK", b"QUEUED", b"QUEUED", [b"OK", err(NOSCRIPT)]]))
    n = sum(1 for c in reload.commands if c[0] == "SCRIPT")
    with pytest.raises(OutcomeUnknown) as info:
        policy.send(_Outcome([b"sha"] * n + [b"OK", b"QUEUED"], RedisConnectionError("lost")))
    assert not isinstance(info.value, ServerUnavailable)


# -- a lost connection: EXEC may have run ---------------------------------------------------------


@pytest.mark.parametrize("read", [0, 1, 3])  # replies read before the connection broke (EXEC's is the 4th)
def test_a_connection_lost_before_exec_answered_is_retried_when_idempotent(read: int) -> None:
    call = staged()
    policy = _policy(call, RETRY, None, Clock())
    first = next(policy)
    lost = _Outcome(answered(call).replies[:read], RedisConnectionError("Connection reset by peer"))
    assert _unwrap(call, lost) == _Outcome([], lost.error), "no reply: maybe ran"
    assert isinstance(policy.send(lost), _Sleep)
    assert policy.send(None) == first, "sent again: SET NX keeps what a first EXEC adopted, the script replays"
    assert finish(policy, answered(call, [b"ok", b"replay", b""])) == [b"ok", b"replay", b""]


@pytest.mark.parametrize("read", [0, 3])
def test_a_connection_lost_before_exec_answered_is_outcome_unknown_when_not_idempotent(read: int) -> None:
    call = staged(idempotent=False)
    policy = _policy(call, RETRY, None, Clock())
    next(policy)
    with pytest.raises(OutcomeUnknown, match="may or may not have run") as info:
        policy.send(_Outcome(answered(call).replies[:read], RedisConnectionError("Connection reset by peer")))
    assert not isinstance(info.value, ServerUnavailable)


def test_a_try_that_may_have_run_is_never_reported_as_not_run() -> None:
    """Lost once (maybe ran), then refused until the window ends: OutcomeUnknown, not ServerUnavailable."""
    call = staged()
    clock = Clock()
    policy = _policy(call, RETRY, None, clock)
    next(policy)
    policy.send(_Outcome([b"OK"], RedisConnectionError("lost")))
    clock.now += 2.0
    policy.send(None)
    with pytest.raises(OutcomeUnknown) as info:
        policy.send(aborted(call, 0, "READONLY You can't write against a read only replica."))
    assert not isinstance(info.value, ServerUnavailable)


# -- the I/O machine: one connection, one write, per try ------------------------------------------


def test_the_machine_sends_the_transaction_in_one_exchange_and_a_broken_read_retries_on_a_new_connection() -> None:
    call = staged()
    machine = execute(call, RETRY, None, Clock(), cluster=False)
    step = next(machine)
    assert step == Acquire(KEYS["src"]), "routed by the script's first key (the queue's hash tag)"
    step = machine.send(("pool", "conn-1"))
    assert isinstance(step, Exchange) and step.held == ("pool", "conn-1") and step.commands == _request(call)
    step.out.replies.extend([b"OK", b"QUEUED"])  # then the connection breaks mid-read
    assert machine.throw(RedisConnectionError("lost")) == Release(("pool", "conn-1"), broken=True)
    assert isinstance(machine.send(None), Pause)
    assert machine.send(None) == Acquire(KEYS["src"])
    step = machine.send(("pool", "conn-2"))
    assert isinstance(step, Exchange) and step.commands == _request(call)
    step.out.replies.extend(answered(call).replies)
    assert machine.send(None) == Release(("pool", "conn-2"))
    with pytest.raises(StopIteration) as stop:
        machine.send(None)
    assert stop.value.value == SCRIPT_OK
