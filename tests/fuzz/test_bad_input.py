"""Bad input through the public API and straight into the complete script, beside a well-formed group.

Malformed and oversized completions, wrong and duplicate slots, non-UTF-8 text, NaN and infinite
rewards, out-of-range and huge token arrays, bad versions, bad source groups; and, bypassing every
Python check, raw ``complete`` calls (undecodable staged payloads, unknown schema versions, junk slot
lists, versions and declared sizes). Each must end in a typed error (a RolloutQueueError; from the
raw script path a status word or a ROLLOUTQ error), a dead letter, or an accepted completion; and
both the target group and a bystander submitted alongside must still be committed.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_queue import InvalidInput, MalformedCompletion, PayloadTooLarge, RolloutQueueError, Sample, SourceGroup
from rollout_queue.core import protocol as p
from rollout_queue.core.codec import encode_completion
from tests.helpers import after_settling

from .support import EXAMPLES, drive, fresh_queue, samples_for, typed

SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TEXT = st.text(max_size=40)  # includes lone surrogates: not valid UTF-8
TOKENS = st.one_of(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8),
                   st.lists(st.integers(), max_size=4),                # out of int32 range
                   st.just(list(range(20_000))))                       # over max_payload_bytes
SAMPLE = st.fixed_dictionaries({
    "slot": st.one_of(st.integers(-2, 5), st.booleans()),
    "token_ids": TOKENS,
    "logprobs": st.one_of(st.none(), st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=8)),
    "reward": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.integers(),
                        st.text(max_size=3)),
    "version": st.one_of(st.integers(-2, 3), st.sampled_from([2**21, 2**40])),
    "finish_reason": st.one_of(st.sampled_from(["stop", "length"]), TEXT),
})


def _sample(spec: dict[str, Any]) -> Sample:
    logprobs = spec["logprobs"]
    if logprobs is None:
        logprobs = [-0.5] * len(spec["token_ids"])
    return Sample(spec["slot"], spec["token_ids"], logprobs, spec["reward"], spec["version"], spec["finish_reason"])


def _built(specs: list[dict[str, Any]]) -> tuple[list[Sample], list[RolloutQueueError]]:
    built, refused = [], []
    for spec in specs:
        try:
            built.append(_sample(spec))
        except InvalidInput as exc:  # refused at construction: a typed error, nothing sent
            refused.append(exc)
    return built, refused


@SETTINGS
@given(specs=st.lists(SAMPLE, max_size=6))
def test_bad_completions_get_typed_errors_and_block_nothing(redis_url: str, specs: list[dict[str, Any]]) -> None:
    with fresh_queue(redis_url) as (q, raw):
        ids = q.submit([SourceGroup("target", "t", 3), SourceGroup("bystander", "b", 2)])
        w = q.worker("fuzz-worker")
        target, bystander = w.reserve(2)
        samples, _ = _built(specs)  # the refused ones raised InvalidInput: typed, nothing sent
        out = typed(lambda: w.complete(target.receipt, samples), script_errors="none")
        slots = {s.slot for s in samples}
        if out == "buffered":
            assert slots == {0, 1, 2}, "a completion that misses or invents a slot was accepted"
        elif isinstance(out, PayloadTooLarge):
            w.complete(target.receipt, samples_for(3))  # nothing was written: still ours to settle
        else:
            assert isinstance(out, MalformedCompletion) and slots != {0, 1, 2}, out
        w.complete(bystander.receipt, samples_for(2))
        assert drive(q, raw, ids) == set(ids)


SOURCE = st.fixed_dictionaries({
    "source_id": st.one_of(TEXT, st.sampled_from(["", "a|b", "ok-id"])),
    "prompt": st.one_of(TEXT, st.integers(), st.just("x" * 70_000)),
    "n": st.one_of(st.integers(-1, 6), st.sampled_from([65_536, 65_537, 5_000]), st.booleans()),
    "metadata": st.one_of(st.dictionaries(TEXT, st.one_of(TEXT, st.floats(allow_nan=True), st.integers()),
                                          max_size=3), st.just({"x": object()}), st.just([1])),
    "prompt_token_ids": st.one_of(st.none(), st.lists(st.integers(), max_size=4)),
})


@SETTINGS
@given(spec=SOURCE)
def test_bad_source_groups_are_refused_or_dead_lettered(redis_url: str, spec: dict[str, Any]) -> None:
    with fresh_queue(redis_url) as (q, raw):
        (bystander,) = q.submit([SourceGroup("bystander", "b", 2)])
        try:
            group = SourceGroup(**spec)
        except InvalidInput:
            group = None  # refused at construction: a typed error
        if group is not None:
            typed(lambda: q.submit([group]), script_errors="none")
        assert drive(q, raw, [bystander]) == {bystander}
        for letter in after_settling(q).dead_letters():  # whatever reserve refused is a dead letter with its reason
            assert letter.reason.startswith("malformed_reservation"), letter


PAYLOADS = st.one_of(
    st.binary(max_size=64),
    st.just(b"RQC1" + b"\xff" * 8),
    st.builds(lambda h: b"RQC1" + len(h).to_bytes(4, "little") + h,
              st.sampled_from([orjson.dumps({"v": 2, "s": [[0, 0, 0, None, 0, "stop", []]]}), b"{", b"[]",
                               orjson.dumps({"v": 1, "s": [[0, 5, 1, None, 0, "stop", []]]})])),
    st.just(encode_completion(samples_for(2))),
    st.just(b"x" * (64 * 1024 + 1)),
)
SLOTS = st.one_of(st.sampled_from(["0,1", "0,0,1", "1", "", "a,b", "0,,1", "-1,0,1", "1e400,0,1", "0x1,1", "0,1,2",
                                   "0.5,1", "nan,0,1"]), st.text(max_size=8))
MIN_VERSION = st.one_of(st.sampled_from(["0", "3", "-1", "1.5", "nan", "inf", "1e400", "", "abc", str(2**21),
                                         str(2**40)]), st.integers(-5, 5).map(str))


#: The size complete's ARGV declares for the staged payload: its true length (None), or junk.
SIZES = st.one_of(st.none(), st.sampled_from(["", "abc", "-1", "0", "1.5", "nan", "inf", "1e400", str(2**64),
                                              str(64 * 1024 + 1)]), st.text(max_size=6))


#: The token count complete's ARGV declares: any count in range, or junk.
TOKENS = st.one_of(st.integers(0, 2**31 - 1).map(str), st.sampled_from(["", "-1", "1.5", "nan", "1e3", str(2**31),
                                                                        "00000000007", " 1"]), st.text(max_size=4))


@SETTINGS
@given(payload=PAYLOADS, slots=SLOTS, min_version=MIN_VERSION, size=SIZES, stage_anyway=st.booleans(), tokens=TOKENS)
def test_raw_complete_calls_get_a_status_or_a_rolloutq_error(redis_url: str, payload: bytes, slots: str,
                                                            min_version: str, size: str | None,
                                                            stage_anyway: bool, tokens: str) -> None:
    """The payload is staged as the worker stages it (SET of the attempt's payload key in the call's
    MULTI); ARGV carries its declared size. A refusal must not keep the staged key; an accepted one
    keeps exactly the staged bytes; and once everything is committed no payload key is left."""
    with fresh_queue(redis_url) as (q, raw):
        ids = q.submit([SourceGroup("target", "t", 2), SourceGroup("bystander", "b", 2)])
        w = q.worker("fuzz-worker")
        target, bystander = w.reserve(2)
        rc = target.receipt
        key = q.keys.payload(rc.entry_id, rc.attempt)
        # As the worker does it, slots '' (no outputs) stages nothing and declares size ''; or staged anyway.
        staged = ((key, payload),) if slots or stage_anyway else ()
        declared = ("" if not slots else len(payload)) if size is None else size
        call = p.build(q.keys, "complete", entry_id=rc.entry_id, attempt=rc.attempt, worker_id=rc.worker_id,
                       size=declared, min_version=min_version, slots=slots, tokens=tokens, stage=staged)
        reply = typed(lambda: q.driver.execute(call), script_errors="rolloutq")
        if isinstance(reply, list):
            status = p.s(reply[0])
            assert status in ("ok", "malformed", "payload_too_large"), reply
            if status == "ok":  # accepted ARGV must have been well-formed where the script relies on it
                assert float(min_version).is_integer() and 0 <= float(min_version) < 2**21, min_version
                assert raw.get(key) == payload, "an accepted completion keeps the staged bytes"
                assert tokens.isdigit() and int(tokens) < 2**31, tokens  # so is its token count
                assert int(raw.hget(q.keys["tokens"], f"{rc.entry_id}:{rc.attempt}")) == int(tokens)
            else:
                assert not raw.exists(key), f"a refused completion ({status}) kept its staged payload"
            if status == "payload_too_large":
                w.complete(rc, samples_for(2))
                assert raw.get(key) == encode_completion(samples_for(2))
        else:
            w.complete(rc, samples_for(2))  # a ROLLOUTQ refusal of bad ARGV (its staged key: see below)
        w.complete(bystander.receipt, samples_for(2))
        assert drive(q, raw, ids) == set(ids)
        assert list(raw.scan_iter(match=q.keys.payload("*", "*"))) == [], "a payload key outlived its group"
        assert raw.hlen(q.keys["tokens"]) == 0, "a token record outlived its group"


def test_a_completion_refused_with_a_rolloutq_error_does_not_shadow_the_next_one(redis_url: str) -> None:
    """A call refused for a bad argument deletes what its transaction staged (payloads.parse_staged), so
    the next SET NX of the same attempt writes its own bytes and the script adopts those."""
    with fresh_queue(redis_url) as (q, raw):
        q.submit([SourceGroup("target", "t", 2)])
        w = q.worker("fuzz-worker")
        (target,) = w.reserve(1)
        rc = target.receipt
        key = q.keys.payload(rc.entry_id, rc.attempt)
        junk = b"RQC1" + b"\xff" * 8
        call = p.build(q.keys, "complete", entry_id=rc.entry_id, attempt=rc.attempt, worker_id=rc.worker_id,
                       size=len(junk), min_version="-1", slots="0,1", tokens=4, stage=((key, junk),))
        assert isinstance(typed(lambda: q.driver.execute(call), script_errors="rolloutq"), RolloutQueueError)
        assert w.complete(rc, samples_for(2)) == "buffered"
        assert raw.get(key) == encode_completion(samples_for(2)), "the refused call's staged bytes were adopted"
