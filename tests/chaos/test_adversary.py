"""The adversary's command set and its predictions, against real servers (chaos/adversary.py).

The chaos adversary sends, with the worker role's credential, every write that role's ACL rules
allow on the worker's keys plus the ones issue 29 named, and logs whether each was refused. The
checker holds every refusal against the rules' prediction, so the prediction must be what Redis and
Valkey actually do: here every candidate is sent once, under today's rules and under the rules the
ACL work (h-acl) is expected to bring (meta and push read-only, no XACK / XDEL), and the outcome must
match the prediction each time; and a refused command leaves every key of the queue as it was
(DUMP before and after), which the chaos run itself cannot observe amid the other processes.
"""

from __future__ import annotations

import random
import secrets
from typing import Any, Callable

import redis

from rollout_queue import QueueConfig, RolloutQueue, Sample, SourceGroup
from rollout_queue.core.keys import QueueKeys
from rollout_queue.devtools.chaos.adversary import (
    GROUP_COMMANDS, KEY_TYPES, REQUIRED, WRITES_BY_TYPE, Grants, Recon, _target_key, build, candidates, send,
)
from rollout_queue.ops.acl import role_rules


def _queue_with_work(url: str, name: str) -> None:
    """A queue where something is owned, buffered and ready, so attacks have real targets."""
    q = RolloutQueue.from_url(url, name, QueueConfig(max_attempts=3))
    q.submit([SourceGroup(f"s{i}", f"prompt {i}", n=1) for i in range(6)])
    w = q.worker("victim")
    w.heartbeat()
    got = w.reserve(max_groups=3)
    w.complete(got[0].receipt, [Sample(0, (1, 2), (-0.5, -0.5), reward=1.0, version=0)])
    w.fail(got[1].receipt, "requeued")
    q.close()


Rules = Callable[[str], tuple[str, ...]]


def _snapshot(r: Any, name: str) -> dict[bytes, bytes]:
    """Every key of the queue and its serialized value (DUMP): equal snapshots, an unchanged queue."""
    return {key: r.dump(key) for key in r.scan_iter(match=f"rollout:{{{name}}}:*", count=1000)}


def _outcomes(r: Any, url: str, base: str, rules_of: Rules,
              pairs: list[tuple[str, str]] | None = None) -> list[tuple[str, str, bool, str]]:
    """Each candidate attack (or each of ``pairs``) once, on a queue of its own (``<base>#<k>``, cleaned
    up with ``base``) with work in it, by a user holding ``rules_of`` that queue's name: (command, key,
    predicted, outcome)."""
    out = []
    for k, (command, role) in enumerate(candidates(base, rules_of(base)) if pairs is None else pairs):
        name, user, password = f"{base}#{k}", f"adv-{secrets.token_hex(3)}", secrets.token_hex(8)
        rules = rules_of(name)
        _queue_with_work(url, name)
        r.execute_command("ACL", "SETUSER", user, ">" + password, *rules)
        adv = redis.Redis.from_url(url, username=user, password=password)
        try:
            keys, rng = QueueKeys(name), random.Random(k)
            line = build(command, role, keys, Recon(adv, keys, rng), rng)
            before = _snapshot(r, name)
            sent = send(adv, Grants.parse(rules), line)
            out.append((command, role, sent.predicted, sent.outcome))
            if sent.outcome == "refused":  # NOPERM: Redis ran nothing, so no key of the queue changed
                assert _snapshot(r, name) == before, line
        finally:
            adv.close()
            r.execute_command("ACL", "DELUSER", user)
    return out


def _today(name: str) -> tuple[str, ...]:
    return role_rules(name, "worker").rules


def _after_acl_work(name: str) -> tuple[str, ...]:
    """Rules as the ACL work means to make them: meta and push read-only, no XACK and no XDEL."""
    keys = QueueKeys(name)
    out = []
    for x in _today(name):
        if x.startswith("("):  # a selector (+cmd ... ~key ...): drop XACK and XDEL from it
            parts = [p for p in x[1:-1].split() if p not in ("+xack", "+xdel")]
            x = f"({' '.join(parts)})" if any(p.startswith("+") for p in parts) else ""
        if x and x not in ("+xack", "+xdel"):
            out.append("%R" + x if x in ("~" + keys["meta"], "~" + keys["push"]) else x)
    return tuple(out)


def test_every_attack_is_refused_exactly_when_the_worker_rules_refuse_it(r: Any, redis_url: str, queue_name: str) -> None:
    menu = candidates(queue_name, _today(queue_name))
    assert set(REQUIRED) <= set(menu)
    scripts = [x for x in _today(queue_name) if x.startswith("+evalsha|")]
    assert sum(1 for c, _ in menu if c == "evalsha") == len(scripts) > 0  # every worker script, with garbage
    outcomes = _outcomes(r, redis_url, queue_name, _today)
    assert [o for o in outcomes if o[3] not in ("ran", "refused") or (o[3] == "ran") != o[2]] == []
    # Issue 29 item 7: meta (config, version, weights URI) and push (the round's rendezvous) are
    # read-only to the worker role.
    refused = {(c, k) for c, k, _, outcome in outcomes if outcome == "refused"}
    assert {(c, k) for k in ("meta", "push") for c in ("hset", "hdel", "del")} <= refused


def test_the_predictions_follow_the_rules_as_they_change(r: Any, redis_url: str, queue_name: str) -> None:
    outcomes = _outcomes(r, redis_url, queue_name, _after_acl_work)
    assert [o for o in outcomes if o[3] not in ("ran", "refused") or (o[3] == "ran") != o[2]] == []
    refused = {(c, k) for c, k, _, outcome in outcomes if outcome == "refused"}
    assert {("xack", "src"), ("xdel", "src"), ("hset", "meta"), ("del", "meta"), ("hset", "push")} <= refused


def test_every_write_the_worker_rules_refuse_is_refused_and_changes_nothing(r: Any, redis_url: str,
                                                                          queue_name: str) -> None:
    """Generated from the rules, not listed by hand: every write command of each key's type, on every
    key of the queue the adversary knows (KEY_TYPES), that the worker role's rules refuse, is sent
    once with the worker credential: Redis refuses it (NOPERM) and no key of the queue changes."""
    grants, keys = Grants.parse(_today(queue_name)), QueueKeys(queue_name)
    forbidden = [(cmd, role) for role, kind in KEY_TYPES.items() for cmd in WRITES_BY_TYPE[kind]
                 if (role == "src" or cmd not in GROUP_COMMANDS)
                 and not grants.permits(cmd, None, [_target_key(keys, role)])]
    # The keys another process trusts are among them, whole: the lease ownership, the config and
    # version, the push round, the commits, the dead letters, the lease and hold indexes.
    for role in ("leased", "meta", "push", "commits", "leases", "holds", "kept"):
        assert {c for c, k in forbidden if k == role} == set(WRITES_BY_TYPE[KEY_TYPES[role]]) - (
            GROUP_COMMANDS if role != "src" else set()), role
    assert ("xack", "src") in forbidden and ("xdel", "src") in forbidden
    outcomes = _outcomes(r, redis_url, queue_name, _today, forbidden)
    assert [o for o in outcomes if o[3] != "refused" or o[2]] == []
