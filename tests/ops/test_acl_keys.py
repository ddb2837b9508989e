"""Per-key grants (issue 29 item 7): a role holds a keyed command only on the keys its own scripts (or
its documented direct commands) use it on, read from the Lua by ops/script_access.py. Checked on
live servers with ACL DRYRUN (Redis and Valkey answer it without running the command): every write
command of the rule builder on every key of a queue, for every role, is allowed exactly where the
derived access says, and every (command, key) a role's scripts run is allowed."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

import pytest
import redis

from rollout_queue.core.keys import KEY_SUFFIXES, QueueKeys
from rollout_queue.core.scripts import SCRIPTS
from rollout_queue.ops import acl
from rollout_queue.ops.script_access import script_access, split_args, strip_comments
from rollout_queue.devtools.local_server import LocalServer

#: Every key of a queue, as a concrete name under its prefix: the KEY_SUFFIXES and the built ones.
KEY_NAMES = tuple(sorted(set(KEY_SUFFIXES.values()))) + ("lease:L1", "payload:1-0:1", "hold:H1", "partitions")
#: One command line for each write command (the key first, as ``{k}``): a new write command in the
#: rule builder needs a line here (the test fails on a missing one).
WRITE_LINES: dict[str, str] = {
    "append": "APPEND {k} v", "decr": "DECR {k}", "decrby": "DECRBY {k} 1", "del": "DEL {k}",
    "expire": "EXPIRE {k} 10", "expireat": "EXPIREAT {k} 1", "getdel": "GETDEL {k}", "getex": "GETEX {k}",
    "getset": "GETSET {k} v", "hdel": "HDEL {k} f", "hincrby": "HINCRBY {k} f 1",
    "hincrbyfloat": "HINCRBYFLOAT {k} f 1", "hmset": "HMSET {k} f v", "hset": "HSET {k} f v",
    "hsetnx": "HSETNX {k} f v", "incr": "INCR {k}", "incrby": "INCRBY {k} 1", "incrbyfloat": "INCRBYFLOAT {k} 1",
    "linsert": "LINSERT {k} BEFORE a b", "lmove": "LMOVE {k} {k} LEFT RIGHT", "lpop": "LPOP {k}",
    "lpush": "LPUSH {k} v", "lrem": "LREM {k} 0 v", "lset": "LSET {k} 0 v", "ltrim": "LTRIM {k} 0 1",
    "mset": "MSET {k} v", "persist": "PERSIST {k}", "pexpire": "PEXPIRE {k} 10", "pexpireat": "PEXPIREAT {k} 1",
    "rpop": "RPOP {k}", "rpush": "RPUSH {k} v", "sadd": "SADD {k} m", "set": "SET {k} v", "setnx": "SETNX {k} v",
    "spop": "SPOP {k}", "srem": "SREM {k} m", "unlink": "UNLINK {k}", "xack": "XACK {k} rollout 0-1",
    "xadd": "XADD {k} * f v", "xautoclaim": "XAUTOCLAIM {k} rollout c 0 0",
    "xclaim": "XCLAIM {k} rollout c 0 0-1", "xdel": "XDEL {k} 0-1", "xgroup|create": "XGROUP CREATE {k} g $",
    "xgroup|destroy": "XGROUP DESTROY {k} rollout", "xgroup|delconsumer": "XGROUP DELCONSUMER {k} rollout c",
    "xgroup|setid": "XGROUP SETID {k} rollout 0", "xgroup|createconsumer": "XGROUP CREATECONSUMER {k} rollout c",
    "xreadgroup": "XREADGROUP GROUP rollout c STREAMS {k} >", "xtrim": "XTRIM {k} MAXLEN 0",
    "zadd": "ZADD {k} 1 m", "zincrby": "ZINCRBY {k} 1 m", "zpopmax": "ZPOPMAX {k}", "zpopmin": "ZPOPMIN {k}",
    "zrem": "ZREM {k} m", "zremrangebyrank": "ZREMRANGEBYRANK {k} 0 -1",
    "zremrangebyscore": "ZREMRANGEBYSCORE {k} 0 1",
}
ROLES = ("producer", "worker", "trainer", "reaper")


@pytest.fixture
def users(server: LocalServer, queue_name: str, r: redis.Redis) -> Iterator[dict[str, str]]:
    """One ACL user per role, with the rules role_rules derives (what `acl --apply` writes)."""
    out = {}
    for role in ROLES:
        rules = acl.role_rules(queue_name, role, "pw")
        r.execute_command("ACL", "SETUSER", rules.user, *rules.rules)
        out[role] = rules.user
    yield out
    for user in out.values():
        r.execute_command("ACL", "DELUSER", user)


def dryrun(r: redis.Redis, user: str, line: str) -> bool:
    """Whether ``user`` may run ``line`` (ACL DRYRUN: nothing runs)."""
    try:
        reply = r.execute_command("ACL", "DRYRUN", user, *line.split())
    except redis.ResponseError as exc:  # a command the server does not know: no grant can matter
        raise AssertionError(f"{line}: {exc}") from exc
    return reply in (b"OK", "OK")


#: Read commands the scripts run, with arguments (the rest take the key alone).
READ_LINES = {"hget": "HGET {k} f", "hexists": "HEXISTS {k} f", "hmget": "HMGET {k} f", "zscore": "ZSCORE {k} m",
              "zmscore": "ZMSCORE {k} m", "zrange": "ZRANGE {k} 0 1", "zrevrange": "ZREVRANGE {k} 0 1",
              "zrangebyscore": "ZRANGEBYSCORE {k} 0 1", "zcount": "ZCOUNT {k} 0 1", "xrange": "XRANGE {k} - +",
              "xrevrange": "XREVRANGE {k} + -", "xpending": "XPENDING {k} rollout", "xinfo|groups": "XINFO GROUPS {k}"}


def probe_line(cmd: str) -> str:
    return WRITE_LINES.get(cmd) or READ_LINES.get(cmd) or f"{cmd.upper()} {{k}}"


def test_every_write_command_has_a_probe_line() -> None:
    containers = {c for c in acl.WRITE_COMMANDS if c.upper() in acl.CONTAINERS}
    assert {c for c in acl.WRITE_COMMANDS - containers - {"publish"}} <= set(WRITE_LINES)


def test_each_write_is_granted_only_on_the_keys_its_scripts_use(users: dict[str, str], queue_name: str,
                                                                r: redis.Redis) -> None:
    """Generated over the key roles x the write commands, for each role: allowed iff the derived access
    names that (command, key). For the worker: DEL on payload keys only (not src, ledger, dlq, history,
    ready, buffer, workers), no write at all on meta, push, commits, kept, ids or a lease record."""
    prefix = QueueKeys(queue_name).prefix
    wrong = []
    for role, user in users.items():
        access = acl.role_access(role)
        for cmd, line in WRITE_LINES.items():
            for name in KEY_NAMES:
                expected = any(fnmatch.fnmatchcase(name, p) for p in access.get(cmd, ()))
                if dryrun(r, user, line.format(k=prefix + name)) != expected:
                    wrong.append(f"{role}: {line.format(k=name)} {'refused' if expected else 'allowed'}")
    assert not wrong, wrong
    worker = acl.role_access("worker")
    assert worker["del"] == {"payload:*"} and "meta" not in set().union(*(
        keys for cmd, keys in worker.items() if cmd.split("|")[0] in acl.WRITE_COMMANDS))
    assert worker["zrem"] <= {"ready", "buffer", "bufver", "workers"}


def test_every_command_a_script_runs_is_granted_on_its_keys(users: dict[str, str], queue_name: str,
                                                            r: redis.Redis) -> None:
    """The other half: each (command, key) the role's scripts run is allowed (a write on a key the role
    may only read is the script's pcall'ed, refused, write: open.lua's create_refused)."""
    prefix = QueueKeys(queue_name).prefix
    for role, user in users.items():
        granted = acl.role_access(role)
        for name in acl.ROLES[role].scripts:
            for cmd, keys in script_access(SCRIPTS[name], acl.KNOWN_COMMANDS).items():
                for pattern in keys:
                    if not any(fnmatch.fnmatchcase(pattern, g) for g in granted.get(cmd, ())):
                        assert cmd.split("|")[0] in acl.WRITE_COMMANDS, (role, name, cmd, pattern)
                        continue
                    key = prefix + pattern.replace("*", "x")
                    line = probe_line(cmd)
                    assert dryrun(r, user, line.format(k=key)), (role, name, line.format(k=key))


def test_the_reader_fails_closed_on_a_key_it_cannot_tell() -> None:
    """A command whose key is not one of the shapes script_access reads raises, naming the script."""
    from dataclasses import replace

    from rollout_queue.ops.script_access import script_access as access

    bad = replace(SCRIPTS["heartbeat"], name="probe", source=SCRIPTS["heartbeat"].source + "\nredis.call('DEL', ARGV[1])\n")
    with pytest.raises(ValueError, match="probe"):
        access(bad, acl.KNOWN_COMMANDS)
    hidden = replace(SCRIPTS["heartbeat"], name="probe2",
                     source=SCRIPTS["heartbeat"].source + "\nlocal c = ARGV[1]\nredis.call(c, K.workers)\n")
    with pytest.raises(ValueError, match="probe2"):
        access(hidden, acl.KNOWN_COMMANDS)
    assert "'XACK'" not in strip_comments("-- 'XACK', K.src\nlocal x = 1 --[[ 'DEL' ]]")


def test_strings_comments_and_brackets_are_read_one_way() -> None:
    """One scanner serves every reader: a quote, a bracket or a ``--`` inside a string is text, a
    long comment ends only at its own level, and an unclosed one runs to the end."""
    assert strip_comments("local a = 'x -- y' -- gone\nb") == "local a = 'x -- y' \nb"
    assert strip_comments('c("a\\"--b", 1) -- d') == 'c("a\\"--b", 1) '
    assert strip_comments("x --[==[ ]] 'still' ]==] y") == "x  y"
    assert strip_comments("x --[=[ never closed") == "x "
    text = "f(a, '(,)', {b, c}, \"]\"), rest"
    assert split_args(text, 2) == (["a", "'(,)'", "{b, c}", '"]"'], text.index("), rest"))
    for unclosed in ("f(a, ')'", "f(a, {b)"):   # the string's bracket is text; the brace takes the paren
        with pytest.raises(ValueError, match="unbalanced"):
            split_args(unclosed, 2)
