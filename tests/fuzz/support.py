"""Helpers of the bad-input fuzz: a throwaway queue per example, the good groups' full lifecycle, and
the rule every call must keep (a typed error, never an untyped one, never a Lua runtime error).

It owns no fixture (hypothesis examples share the session server) and deletes every key it created.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import redis

from rollout_queue import QueueConfig, RolloutQueue, RolloutQueueError, Sample, ScriptError, SourceGroup
from rollout_queue.core.keys import QueueKeys

T = TypeVar("T")

#: Examples per fuzz test; raise it for a deeper run: ROLLOUT_FUZZ_EXAMPLES=1000 pytest tests/fuzz
EXAMPLES = int(os.environ.get("ROLLOUT_FUZZ_EXAMPLES", "60"))

CFG = QueueConfig(max_payload_bytes=64 * 1024, max_completed_groups=8, max_attempts=5, worker_timeout_s=30.0,
                  lease_timeout_s=30.0, hold_timeout_s=30.0)
_LUA_RUNTIME = re.compile(r"user_script:\d+: |attempt to |bad argument #")


@contextmanager
def fresh_queue(url: str, config: QueueConfig = CFG) -> Iterator[tuple[RolloutQueue, redis.Redis]]:
    """A queue with a unique name on the session server; every key of it is deleted afterwards."""
    name = f"fuzz-{uuid.uuid4().hex[:12]}"
    q = RolloutQueue.from_url(url, name, config)
    raw = redis.Redis.from_url(url)
    try:
        yield q, raw
    finally:
        keys = list(raw.scan_iter(match=q.keys.pattern, count=1000))
        if keys:
            raw.unlink(*keys)
        raw.close()
        q.close()


def good_groups(prefix: str, count: int) -> list[SourceGroup]:
    return [SourceGroup(f"{prefix}-{i}", f"a well-formed prompt {i}", n=2 + i % 2) for i in range(count)]


def samples_for(n: int) -> list[Sample]:
    return [Sample(slot, [slot + 1, 7], [-0.5, -0.25], reward=0.5) for slot in range(n)]


def typed(call: Callable[[], T], *, script_errors: str = "rolloutq") -> T | RolloutQueueError:
    """Run ``call``; return its value or the RolloutQueueError it raised. Anything else fails the test.

    ``script_errors``: 'none' (the garbage keeps every key's type: no script error at all),
    'rolloutq' (only a ROLLOUTQ error: corrupt state or bad ARGV), 'wrongtype' (a key of the wrong
    type: a WRONGTYPE reply is the clear error). A Lua runtime error is never acceptable.
    """
    try:
        return call()
    except ScriptError as exc:
        text = str(exc)
        assert not _LUA_RUNTIME.search(text) or "ROLLOUTQ" in text, f"a Lua runtime error: {text}"
        allowed = {"none": (), "rolloutq": ("ROLLOUTQ",), "wrongtype": ("ROLLOUTQ", "WRONGTYPE")}[script_errors]
        assert any(word in text for word in allowed), f"unexpected script error ({script_errors}): {text}"
        return exc
    except RolloutQueueError as exc:
        return exc


def settled_committed(raw: redis.Redis, keys: QueueKeys, entry_ids: list[str]) -> set[str]:
    ledger = raw.hmget(keys["ledger"], entry_ids) if entry_ids else []
    return {e for e, v in zip(entry_ids, ledger) if v is not None and v.startswith(b"s|committed|")}


def drive(q: RolloutQueue, raw: redis.Redis, want: list[str], *, timeout_s: float = 10.0,
          script_errors: str = "none") -> set[str]:
    """Run the lifecycle (reap, reserve -> complete, lease -> commit) until every entry of ``want`` is
    committed or ``timeout_s`` passes (staged work waits for its worker or lease timeout); every call
    must keep the ``typed`` rule. Returns the committed ones. Anything reserved is completed
    well-formed: garbage that passed validation is a group like any other."""
    w = q.worker("fuzz-worker")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        typed(q.reap, script_errors=script_errors)
        got = typed(lambda: w.reserve(8), script_errors=script_errors)
        for r in got if isinstance(got, list) else []:
            typed(lambda r=r: w.complete(r.receipt, samples_for(r.group.n)), script_errors=script_errors)
        lease = typed(lambda: q.lease(8, partial=True), script_errors=script_errors)
        if lease is not None and not isinstance(lease, RolloutQueueError):
            typed(lambda: lease.commit(), script_errors=script_errors)
        done = settled_committed(raw, q.keys, want)
        if done == set(want):
            return done
        time.sleep(0.05)  # polling interval inside a deadline-bound wait (timeouts are server-side)
    return settled_committed(raw, q.keys, want)

