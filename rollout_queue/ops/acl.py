"""Redis ACL rules for the roles that use one queue: producer, worker, trainer, reaper, operator, admin.

Owns deriving each role's rules from the script library itself, so that they follow the Lua as it
changes: which scripts a role may run (EVALSHA allow-listed by SHA1, with Redis's ``+cmd|first-arg``
rule), and which command those scripts call on which key (a script runs with its caller's
permissions; ops/script_access.py reads the (command, key) pairs from the Lua): every keyed command is
granted in a Redis 7 selector on exactly the keys it is used on (``(+del +set ~payload:*)``), so the
worker's DEL of payloads is no DEL of the stream, plus the plain commands a role's client sends
outside scripts (blocking XREAD on a wake stream, HGET of the version, the worker's MULTI / SET / EXEC
that stages a completion's payload around its complete call, the trainer's MGET of the payloads it
leased, SUBSCRIBE to the versions channel).
It does no I/O; ``rollout-queue acl`` prints or applies the rules.

What these rules can and cannot prevent (docs/OPERATIONS.md, "Roles and ACLs", says it for people):
- They confine every role to one queue's keys and channel, and each role to its own transitions: a
  worker's EVALSHA of commit.lua is refused, and a worker cannot touch the commits, kept, ids or
  lease keys at all, nor delete a consumer; a key that every script of a role only READS is read-only
  to it (``%R~``): the worker reads meta (config, version, weights URI) and push (a round's
  rendezvous) but cannot write either, the producer reads meta and counters; the operator role runs
  no write command, in or out of a script, and neither SCANs nor loads scripts.
- SCRIPT LOAD is allowed to the other roles: a loaded script only runs if its SHA1 is on the list, and
  SHA1 names the content, so only the genuine scripts run. New code needs new rules (fail closed: NOPERM).
- They cannot stop a holder of a role's password from sending, directly, the commands its own
  scripts use on the keys they use them on (a worker credential can XCLAIM in the source stream).
  Redis has no "only inside this script" permission; so what another process trusts lives in keys
  the role cannot write (a leased group's ownership in ``leased``: lua/include/leased_guard.lua). ACLs stop the wrong process and a misconfigured
  one and bound a leaked credential to one queue; they are not a sandbox for hostile code.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from rollout_queue.core.keys import KEY_SUFFIXES, QueueKeys
from rollout_queue.core.scripts import LIBRARY_VERSION, READ_ONLY_SCRIPTS, SCRIPTS, Script
from rollout_queue.ops.script_access import script_access
from rollout_queue.scale.layout import partition_names

#: Commands whose ACL rules name a subcommand (``xgroup|create``) or a first argument (``info|server``:
#: the queue clock reads the server's run_id, lua/include/now_ms.lua): granting the whole command
#: would also grant XGROUP DESTROY, CONFIG SET, every INFO section and the like.
CONTAINERS = frozenset({"XGROUP", "XINFO", "OBJECT", "MEMORY", "SCRIPT", "CLIENT", "CONFIG", "FUNCTION", "INFO"})

#: Redis command names a script may call. A quoted upper-case word in a script that is in this set is
#: taken as a command the script runs; option words (COUNT, JUSTID, ...) are not in it.
KNOWN_COMMANDS = frozenset("""
APPEND DECR DECRBY DEL EXISTS EXPIRE EXPIREAT GET GETDEL GETEX GETSET INCR INCRBY INCRBYFLOAT MGET MSET
PERSIST PEXPIRE PEXPIREAT PTTL SET SETNX STRLEN TTL TYPE UNLINK
HDEL HEXISTS HGET HGETALL HINCRBY HINCRBYFLOAT HKEYS HLEN HMGET HMSET HRANDFIELD HSCAN HSET HSETNX HSTRLEN HVALS
LINDEX LINSERT LLEN LMOVE LPOP LPOS LPUSH LRANGE LREM LSET LTRIM RPOP RPUSH
SADD SCARD SISMEMBER SMEMBERS SMISMEMBER SPOP SRANDMEMBER SREM SSCAN
ZADD ZCARD ZCOUNT ZINCRBY ZMSCORE ZPOPMAX ZPOPMIN ZRANGE ZRANGEBYSCORE ZRANK ZREM ZREMRANGEBYRANK
ZREMRANGEBYSCORE ZREVRANGE ZREVRANGEBYSCORE ZREVRANK ZSCAN ZSCORE
XACK XADD XAUTOCLAIM XCLAIM XDEL XGROUP XINFO XLEN XPENDING XRANGE XREAD XREADGROUP XREVRANGE XTRIM
PUBLISH TIME OBJECT MEMORY INFO
""".split())

#: The commands of KNOWN_COMMANDS that write. A read-only role (the operator) is granted none of them,
#: even where its scripts name one: the queue clock's bookkeeping in stats and reap_scan is written
#: with redis.pcall and simply skipped under a read-only role (lua/include/now_ms.lua).
WRITE_COMMANDS = frozenset("""
APPEND DECR DECRBY DEL EXPIRE EXPIREAT GETDEL GETEX GETSET INCR INCRBY INCRBYFLOAT MSET PERSIST PEXPIRE
PEXPIREAT SET SETNX UNLINK HDEL HINCRBY HINCRBYFLOAT HMSET HSET HSETNX LINSERT LMOVE LPOP LPUSH LREM LSET
LTRIM RPOP RPUSH SADD SPOP SREM ZADD ZINCRBY ZPOPMAX ZPOPMIN ZREM ZREMRANGEBYRANK ZREMRANGEBYSCORE XACK XADD
XAUTOCLAIM XCLAIM XDEL XGROUP XREADGROUP XTRIM PUBLISH
""".lower().split())

#: Plain read commands (outside scripts) of the read-only operator: the views and OPERATIONS.md.
READ_COMMANDS = (
    "xpending", "xrange", "xrevrange", "xlen", "xinfo|stream", "xinfo|groups", "xinfo|consumers",
    "zrange", "zrangebyscore", "zrevrange", "zscore", "zcard", "zcount", "hget", "hgetall", "hmget", "hlen",
    "hstrlen", "hexists", "hkeys", "hscan", "exists", "type", "ttl", "pttl", "memory|usage", "object|encoding",
    "get",  # the partition-count record (views.partition_count): read to find a logical queue's partitions
    "strlen", "mget",  # a completion payload's size (inspect) and the payloads themselves
)


@dataclass(frozen=True)
class Role:
    """What one kind of process needs. ``raw`` are commands its client sends outside scripts, on the key
    roles ``raw_keys``; ``all_keys`` grants the queue's whole prefix instead of the keys listed;
    ``read_keys`` are key roles it may only read (``%R~``), whatever its scripts' commands;
    ``read_only``: no write command at all, and no SCRIPT LOAD (its scripts are loaded for it by the
    first other client after a restart: transport._companions); ``selectors``: (command, key pattern
    under the queue's prefix) pairs granted only on those keys, as a Redis 7 selector
    ``(+cmd ~pattern)``: a raw command that must not reach the role's other keys."""

    name: str
    summary: str
    scripts: tuple[str, ...]
    raw: tuple[str, ...] = ()
    raw_keys: tuple[str, ...] = ()
    versions_channel: bool = False
    all_keys: bool = False
    read_only: bool = False
    read_keys: tuple[str, ...] = ()
    selectors: tuple[tuple[str, str], ...] = ()


_OPEN = ("open",)
ROLES: dict[str, Role] = {r.name: r for r in (
    Role("producer", "submits source groups (submit, or produce: groups + cursor); reads the config",
         _OPEN + ("submit", "produce"), ("hget",), ("meta", "producers"), read_keys=("meta",)),
    Role("worker", "reserves, completes, fails, aborts, filters; heartbeats",
         _OPEN + ("reserve", "complete", "complete_many", "fail", "abort", "filter", "reject", "heartbeat",
                  "close_worker", "push_join", "save_partial"),
         # MULTI, SET, EXEC: a completion's payloads are staged in its call's transaction; SET only on
         # payload:* (a selector), so it cannot overwrite meta or the stream with a string.
         # HMGET: the progress records of the entries a reserve granted (flows.reservations).
         ("hget", "hmget", "xread", "subscribe", "multi", "exec"), ("meta", "wake_work", "partial"),
         versions_channel=True,
         # clock: the queue clock every deadline is judged by (lua/include/now_ms.lua records it with
         # redis.pcall): read-only, so a worker credential cannot move every lease's and worker's
         # deadline; the trainer's, reaper's and producer's scripts record it.
         read_keys=("clock",),
         selectors=(("set", "payload:*"),)),
    Role("trainer", "leases, commits, rolls back, holds admission, publishes versions, checkpoints",
         _OPEN + ("lease", "commit", "rollback", "extend", "lease_beat", "hold_open", "hold_poll", "hold_release",
                  "publish_version", "checkpoint", "restore", "stats",
                  "push_open", "push_seal", "push_close", "derive_admission", "settle_parked"),
         ("hget", "hmget", "xread"), ("meta", "wake_work", "wake_done"), versions_channel=True,
         # the payloads of the groups it leased (P2); the workers that are gone, named in WorkersGone
         # (core/liveness.last_workers: read-only, on these keys alone)
         selectors=(("mget", "payload:*"), ("zrevrange", "workers"), ("xrevrange", "reaped"), ("hget", "clock"))),
    Role("reaper", "requeues the work of silent workers, expired leases and stale groups",
         _OPEN + ("reap_scan", "reap_worker", "expire_lease", "reap_stale", "hold_release", "prune",
                  "finish_interrupted", "reindex", "sweep_owners", "settle_parked")),
    Role("operator", "read-only: stats, top, inspect, workers, leases, verify, dlq list, metrics, the redis-cli guide",
         ("stats", "reap_scan"), READ_COMMANDS + ("subscribe",), versions_channel=True, all_keys=True,
         read_only=True),
)}
#: The admin may run every script and every non-dangerous command on the queue's keys (it can EVAL);
#: it cannot run server-wide commands (FLUSHALL, CONFIG, ACL, FUNCTION, SCRIPT FLUSH, KEYS, INFO but
#: its server section, which the queue clock reads).
ADMIN_RULES = ("+@all", "-@dangerous", "-@admin", "-function", "-script", "+script|load", "+script|exists",
               "+info|server")
ROLE_NAMES = tuple(ROLES) + ("admin",)



def roles_running(script: str) -> tuple[str, ...]:
    """The roles whose rules let them run ``script`` (the admin runs every script): what a refused
    operator action names as the role to use."""
    return tuple(name for name, role in ROLES.items() if script in role.scripts) + ("admin",)


_CALL = re.compile(r"""'([A-Z]+)'(?:\s*,\s*'([A-Z]+)')?""")


def script_commands(script: Script) -> set[str]:
    """The ACL command names (lower case, ``container|sub``) a script's assembled source calls."""
    out = set()
    for cmd, sub in _CALL.findall(script.source):
        if cmd not in KNOWN_COMMANDS:
            continue
        if cmd in CONTAINERS:
            if not sub:
                raise ValueError(f"script {script.name} calls {cmd} without a literal subcommand")
            out.add(f"{cmd}|{sub}".lower())
        else:
            out.add(cmd.lower())
    return out


def script_keys(script: Script, keys: QueueKeys) -> set[str]:
    """Key patterns a script declares (KEYS): Redis checks an EVALSHA's declared keys as read-write,
    so the role's root permissions hold them, for its EVALSHAs only (every other keyed command is
    granted per key, ``key_grants``)."""
    return {keys[role] for role in script.keys}


def script_reads(script: Script, keys: QueueKeys) -> set[str]:
    """Key patterns a script names under READS: a role all of whose scripts only read a key holds it
    read-only (``%R~``), so it cannot write it directly either."""
    return {keys[role] for role in script.reads}


#: Commands that name no key: granted at the root of a role's rules (PUBLISH and SUBSCRIBE name a
#: channel, which ``&`` rules confine).
KEYLESS = frozenset({"ping", "time", "cluster|slots", "command", "script|load", "wait", "multi", "exec",
                     "subscribe", "info|server", "publish"})


def role_access(role: str, library: Mapping[str, Script] = SCRIPTS) -> dict[str, frozenset[str]]:
    """Command -> the key patterns (suffixes under a queue's prefix: ``src``, ``payload:*``) a role may
    run it on: what its scripts run it on (script_access.py reads the Lua), its raw commands on its
    raw keys, its selectors, and GET / EXISTS of the partition-count record. A write command is dropped
    on a key the role may only read (its scripts name it under READS and never declare it, or its
    ``read_keys``): a script of the role that writes there uses ``redis.pcall`` and answers a refusal
    (open.lua's create_refused). Fail closed: a script whose keys cannot be read raises ValueError."""
    spec = ROLES[role]
    scripts = [library[name] for name in spec.scripts]
    suffix = KEY_SUFFIXES
    written = {suffix[k] for s in scripts for k in s.keys}
    read_only = ({suffix[k] for s in scripts for k in s.reads} | {suffix[k] for k in spec.read_keys}) - written
    forced = {suffix[k] for k in spec.read_keys} & written
    if forced:  # Redis checks an EVALSHA's declared keys as read-write: that script would be refused
        raise ValueError(f"role {role}: a script it runs declares {sorted(forced)}, which it may only read")
    access: dict[str, set[str]] = {}
    for script in scripts:
        for cmd, keys in script_access(script, KNOWN_COMMANDS).items():
            if keys:
                access.setdefault(cmd, set()).update(keys)
    for cmd in spec.raw:
        if cmd not in KEYLESS:
            access.setdefault(cmd, set()).update(suffix[k] for k in spec.raw_keys)
    for cmd, pattern in spec.selectors:
        access.setdefault(cmd, set()).add(pattern)
    for cmd in ("get", "exists"):  # opening reads the partition-count record first (scale/flows)
        access.setdefault(cmd, set()).add("partitions")
    out = {}
    for cmd, patterns in access.items():
        granted = patterns - read_only if cmd.split("|")[0] in WRITE_COMMANDS else patterns
        if granted:
            out[cmd] = frozenset(granted)
    return out


def key_grants(access: Mapping[str, frozenset[str]], prefixes: Sequence[str]) -> list[str]:
    """Redis 7 selectors for per-key grants: the commands used on one set of keys share a selector
    ``(+cmd ... ~key ... %R~key ...)``; a write command holds its keys read-write, a read command
    read-only. A command granted in a selector runs only on that selector's keys."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for cmd, keys in sorted(access.items()):
        mode = "~" if cmd.split("|")[0] in WRITE_COMMANDS else "%R~"
        rules = tuple(mode + prefix + k for k in sorted(keys) for prefix in prefixes)
        groups.setdefault(rules, []).append("+" + cmd)
    return [f"({' '.join(cmds + list(rules))})" for rules, cmds in sorted(groups.items(), key=lambda g: g[1])]


@dataclass(frozen=True)
class RoleRules:
    """One role's ACL user for one queue."""

    role: str
    user: str
    rules: tuple[str, ...]

    def setuser(self) -> str:
        """``ACL SETUSER ...`` as typed at the redis-cli prompt (no token needs quoting there: a
        selector ``(+cmd ~pattern)`` split at its space is merged back by Redis)."""
        return " ".join(("ACL", "SETUSER", self.user) + self.rules)

    def aclfile(self) -> str:
        """The line for an ``aclfile``."""
        return " ".join(("user", self.user) + self.rules)


def user_name(queue: str, role: str) -> str:
    return f"rq-{queue}-{role}"


def role_rules(queue: str, role: str, password: str | None = None,
               library: Mapping[str, Script] = SCRIPTS, partitions: int = 1) -> RoleRules:
    """The ACL rules of ``role`` for ``queue``. ``partitions`` > 1: the same rules on every partition's
    keys (``queue#0`` …, scale/layout.py), plus reading the partition-count record under the logical
    name.

    Passwords: with one, ``resetpass`` comes before its SHA-256 (only the hash is written), so applying
    a new password revokes every old one: a rotation after a leak must lock the leaked one out, and
    ACL SETUSER otherwise *adds* passwords. Without one, the user's existing passwords are kept, so
    re-applying after an upgrade (new script SHA1s) leaves every process able to log in; a new user
    cannot log in until one is added (``>secret``).
    Re-applying never stacks: ``resetkeys``/``resetchannels``/``-@all`` clear the root permissions and
    ``clearselectors`` the selectors (ACL SETUSER appends a selector each time it is given one)."""
    head = ["on", "resetkeys", "resetchannels", "clearselectors", "-@all"]
    if password is not None:
        head += ["resetpass", "#" + hashlib.sha256(password.encode()).hexdigest()]
    names = partition_names(queue, partitions)
    record = QueueKeys(queue).partitions
    if role == "admin":
        keys_rules = [r for n in names for r in ("~" + QueueKeys(n).pattern, "&" + QueueKeys(n).pattern)]
        if partitions > 1:
            keys_rules += ["~" + record]
        return RoleRules(role, user_name(queue, role), tuple(head + keys_rules + list(ADMIN_RULES)))
    spec = ROLES[role]
    scripts = [library[name] for name in spec.scripts]
    # A Redis Cluster client reads the slot map (CLUSTER SLOTS) and the command table (COMMAND) when it
    # connects: metadata only, granted to every role so each process runs on a cluster URL too.
    base = {"ping", "time", "cluster|slots", "command"} | ({"script|load", "wait"} if not spec.read_only else set())
    channels = [f"&{QueueKeys(n).versions_channel}" for n in names]
    if spec.all_keys:  # the operator: reads every key of its queue, writes none, in or out of a script
        commands = base | set(spec.raw)
        for script in scripts:
            commands |= script_commands(script)
        commands = {c for c in commands if c.split("|")[0] not in WRITE_COMMANDS}
        key_rules = ["%R~" + QueueKeys(n).pattern for n in names]
        if partitions > 1:
            key_rules.append("%R~" + record)  # the logical name's record (its own prefix is no partition)
        rules = head + key_rules + (channels if spec.versions_channel else [])
        rules += ["+" + c for c in sorted(commands)] + [
            f"+{'evalsha_ro' if s.name in READ_ONLY_SCRIPTS else 'evalsha'}|{s.sha}" for s in scripts]
        return RoleRules(role, user_name(queue, role), tuple(rules))
    # Every other role: the root holds the keyless commands and the EVALSHA of each of its scripts on
    # the keys the scripts declare; every keyed command is granted in a selector on the keys it is
    # used on (role_access), so a credential cannot aim a command of one key at another.
    access = role_access(role, library)
    commands = base | {c for c in spec.raw if c in KEYLESS} | {
        c for s in scripts for c, keys in script_access(s, KNOWN_COMMANDS).items() if not keys and c in KEYLESS}
    declared = sorted({k for n in names for s in scripts for k in script_keys(s, QueueKeys(n))})
    prefixes = [QueueKeys(n).prefix for n in names]
    selectors = key_grants(access, prefixes)
    if partitions > 1:
        selectors.append("(+get +exists %R~" + record + ")")  # the logical name's partition-count record
    rules = head + ["~" + k for k in declared] + selectors
    rules += channels if spec.versions_channel or "publish" in commands else []
    rules += ["+" + c for c in sorted(commands)] + [
        f"+{'evalsha_ro' if s.name in READ_ONLY_SCRIPTS else 'evalsha'}|{s.sha}" for s in scripts]
    return RoleRules(role, user_name(queue, role), tuple(rules))


def all_rules(queue: str, roles: Sequence[str] = ROLE_NAMES,
              passwords: Mapping[str, str] | None = None, partitions: int = 1) -> list[RoleRules]:
    passwords = passwords or {}
    return [role_rules(queue, r, passwords.get(r), partitions=partitions) for r in roles]


def banner(queue: str) -> list[str]:
    """The comment lines printed above the rules."""
    return [
        f"# Redis ACL users for rollout-queue queue {queue!r}, script library {LIBRARY_VERSION}.",
        "# Regenerate and apply after every upgrade of rollout-queue: scripts are allow-listed by SHA1,",
        "# so a new library is refused (NOPERM) until the rules match it. Create the queue as admin first:",
        "# worker, trainer and reaper may run `open`, which creates a missing queue with its own config;",
        "# a producer (read-only meta) and the operator cannot create one.",
        "# --password ROLE=SECRET replaces every password the user had (resetpass: rotation revokes the",
        "# old one); a role given no password keeps the passwords it has (re-applying after an upgrade",
        "# keeps logins working), and a new user without one cannot log in until one is added (>secret).",
    ] + [f"#   {user_name(queue, r.name)}: {r.summary}" for r in ROLES.values()] + [
        f"#   {user_name(queue, 'admin')}: every script and non-dangerous command on the queue's keys",
    ]
