"""A worker credential used adversarially: random direct commands of the worker ACL role, interleaved with a run.

The harness applies the worker role's ACL user (``rollout_queue.ops.acl.role_rules``, what
``rollout-queue acl --apply`` writes) to the chaos server through an ``aclfile``, so it survives
every restart, and runs this process authenticated as that user. It sends, at the pace the fault's
weight sets, one command at a time: the direct commands the worker role may send on the worker's
keys (``candidates``: derived from the rules, so the set follows them as they change) and the ones
issue 29 named whatever the rules say (``REQUIRED``: XACK / XCLAIM / XDEL / XREADGROUP on the
source stream, HSET / HDEL / DEL on meta, push, push members, the indexes, ledger, history, dlq,
workers, clock; SET on a payload), plus EVALSHA of every worker script the rules allow with garbage
arguments. Targets are real (an owned entry, a buffered one, a field that exists), read with the
same credential where it may read.

Each command is logged with what the rules predict (``Grants.permits``) and what happened:
``refused`` (NOPERM: Redis ran nothing), ``ran`` (with its reply, or the error a command that ran
answered: WRONGTYPE, a script's ROLLOUTQ refusal), or ``unavailable`` (Redis down: nothing sent).
The checker fails the run on a command the rules refuse that ran, and names every ran command
that touched an entry a violation is about (the attack the queue did not survive).
"""

from __future__ import annotations

import argparse
import fnmatch
import random
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import redis

from rollout_queue.core.keys import QueueKeys
from rollout_queue.core.scripts import SCRIPTS
from rollout_queue.devtools.chaos.oplog import OpLog
from rollout_queue.ops.acl import ROLES, WRITE_COMMANDS, role_rules

#: The consumer group of the source stream, and the consumer the adversary reads and claims as.
GROUP, CONSUMER = "rollout", "chaos-adversary"
#: The Redis type of each key role a worker touches (what commands make sense on it).
KEY_TYPES: dict[str, str] = {
    "src": "stream", "dlq": "stream", "wake_work": "stream", "wake_done": "stream", "settled": "stream",
    "reaped": "stream", "meta": "hash", "counters": "hash", "history": "hash", "ledger": "hash", "push": "hash",
    "push_members": "hash", "clock": "hash", "reserves": "hash", "progress": "hash", "ready": "zset",
    "buffer": "zset", "bufver": "zset", "workers": "zset", "holds": "zset", "retired": "zset",
    "payload": "string", "parked": "hash", "leased": "hash", "partial": "hash", "partial_head": "hash",
    "suspects": "zset", "leases": "zset", "kept": "zset", "commits": "stream", "ids": "hash", "intake": "hash",
    "holders": "hash",
}
#: The direct commands that change a key of each type.
WRITES_BY_TYPE: dict[str, tuple[str, ...]] = {
    "stream": ("xack", "xclaim", "xdel", "xreadgroup", "xadd", "del"),
    "hash": ("hset", "hdel", "hincrby", "del"),
    "zset": ("zadd", "zrem", "del"),
    "string": ("set", "del"),
}
#: Commands of a consumer group: only the source stream has one.
GROUP_COMMANDS = frozenset({"xack", "xclaim", "xreadgroup"})
#: What issue 29 asked the adversary to send whatever the rules say: some are refused once the ACL
#: work (h-acl) takes them away from the worker role, and a refused one must change nothing.
REQUIRED: tuple[tuple[str, str], ...] = tuple(
    [(c, "src") for c in ("xack", "xclaim", "xdel", "xreadgroup")]
    + [(c, k) for k in ("meta", "push", "push_members", "ledger", "history", "clock") for c in ("hset", "hdel", "del")]
    + [(c, k) for k in ("ready", "buffer", "bufver", "workers") for c in ("zadd", "zrem", "del")]
    + [("xdel", "dlq"), ("del", "dlq"), ("set", "payload")]
    # K.leased is what makes a leased group the lease's alone (lua/include/leased_guard.lua): the
    # worker role reads it and must never write it.
    + [(c, "leased") for c in ("hset", "hdel", "del")])
#: Where an XCLAIM sends an entry: the adversary itself, or one of the queue's own owners, which the
#: scripts act on (a parking consumer with a forged record, @ready / @done with an index entry, a
#: lease's consumer): the moves a leased group must survive (leased_guard).
CLAIM_TO = (CONSUMER, "@dead", "@filtered", "@ready", "@done", "@lease")
#: Values written where a number or a word belongs.
GARBAGE = ("0", "-1", "x", "1e400", "nan", "9999999999", "", "a|b|c", "{}")
_STREAM_ID = re.compile(r"\d+-\d+")


@dataclass(frozen=True)
class Permissions:
    """One permission set of an ACL user (its root, or one selector): commands, keys read-write, keys
    read-only."""

    commands: frozenset[str]
    write_keys: tuple[str, ...]
    read_keys: tuple[str, ...]

    @classmethod
    def parse(cls, rules: Sequence[str]) -> "Permissions":
        commands, write, read = set(), [], []
        for rule in rules:
            if rule.startswith("+"):
                commands.add(rule[1:].lower())
            elif rule.startswith("%R~"):
                read.append(rule[3:])
            elif rule.startswith("~"):
                write.append(rule[1:])
        return cls(frozenset(commands), tuple(write), tuple(read))

    def permits(self, name: str, first_arg: str | None, keys: Sequence[str]) -> bool:
        writes = name in WRITE_COMMANDS or name == "evalsha"  # a script's keys are checked read-write
        if name in self.commands or (first_arg is not None and f"{name}|{first_arg.lower()}" in self.commands):
            return all(_match(k, self.write_keys) or (not writes and _match(k, self.read_keys)) for k in keys)
        return False


@dataclass(frozen=True)
class Grants:
    """One ACL user's rules, read back: its root permissions and its selectors (``(+cmd ... ~key ...)``,
    acl.key_grants): Redis runs a command if any one of them allows it on all its keys."""

    root: Permissions
    selectors: tuple[Permissions, ...]

    @property
    def commands(self) -> frozenset[str]:
        """Every command some permission set names (on some keys)."""
        return self.root.commands.union(*(s.commands for s in self.selectors))

    @classmethod
    def parse(cls, rules: Sequence[str]) -> "Grants":
        selectors = [Permissions.parse(r[1:-1].split()) for r in rules if r.startswith("(") and r.endswith(")")]
        return cls(Permissions.parse([r for r in rules if not r.startswith("(")]), tuple(selectors))

    def permits(self, command: str, first_arg: str | None, keys: Sequence[str]) -> bool:
        """Whether Redis runs ``command`` (with ``first_arg``, for ``evalsha|<sha>``) on ``keys``."""
        name = command.lower()
        return any(p.permits(name, first_arg, keys) for p in (self.root, *self.selectors))


def _match(key: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(key, p) for p in patterns)


def candidates(queue: str, rules: Sequence[str]) -> list[tuple[str, str]]:
    """(command, key role) pairs: every write the rules let the worker role send on a key of the
    worker's (derived, so the set follows the rules), and every REQUIRED one; plus ``evalsha`` with
    each worker script the rules allow (``evalsha:<script name>``)."""
    grants, keys = Grants.parse(rules), QueueKeys(queue)
    derived = [(cmd, role) for role, kind in KEY_TYPES.items() for cmd in WRITES_BY_TYPE[kind]
               if (role == "src" or cmd not in GROUP_COMMANDS) and grants.permits(cmd, None, [_target_key(keys, role)])]
    scripts = [("evalsha", f"script:{s}") for s in ROLES["worker"].scripts
               if f"evalsha|{SCRIPTS[s].sha}" in grants.commands]
    return sorted(set(derived) | set(REQUIRED)) + scripts


def _target_key(keys: QueueKeys, role: str) -> str:
    return keys.payload("1-0", 1) if role == "payload" else keys[role]


class Recon:
    """What the adversary knows of the queue, read with its own credential (a refused read: nothing)."""

    def __init__(self, r: redis.Redis, keys: QueueKeys, rng: random.Random) -> None:
        self.r, self.keys, self.rng = r, keys, rng

    def _try(self, fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except redis.RedisError:
            return default

    def owned(self) -> tuple[str, int] | None:
        """An entry some worker owns now, with its delivery count."""
        rows = self._try(lambda: self.r.xpending_range(self.keys["src"], GROUP, "-", "+", 50), [])
        if not rows:
            return None
        row = self.rng.choice(rows)
        return _s(row["message_id"]), int(row["times_delivered"])

    def entry(self) -> str:
        """An entry id: an owned one, else one of the stream's last, else one that does not exist."""
        got = self.owned()
        if got:
            return got[0]
        rows = self._try(lambda: self.r.xrevrange(self.keys["src"], count=20), [])
        return _s(self.rng.choice(rows)[0]) if rows else "0-1"

    def member(self, role: str) -> str:
        rows = self._try(lambda: self.r.zrange(self.keys[role], 0, 20), [])
        return _s(self.rng.choice(rows)) if rows else self.entry()

    def field(self, role: str) -> str:
        if role in ("ledger", "history", "parked", "leased", "partial", "partial_head"):
            return self.entry()
        fields = self._try(lambda: list(self.r.hgetall(self.keys[role])), [])
        return _s(self.rng.choice(fields)) if fields else self.rng.choice(("version", "state", "ms", "x"))

    def lease_consumer(self) -> str:
        """The consumer of an active lease (one some entry is pending to), else a made-up one."""
        rows = self._try(lambda: self.r.xpending_range(self.keys["src"], GROUP, "-", "+", 200), [])
        leases = sorted({_s(row["consumer"]) for row in rows if _s(row["consumer"]).startswith("@lease:")})
        return self.rng.choice(leases) if leases else "@lease:chaos"

    def stream_id(self, role: str) -> str:
        if role == "src":
            return self.entry()
        rows = self._try(lambda: self.r.xrevrange(self.keys[role], count=5), [])
        return _s(self.rng.choice(rows)[0]) if rows else "0-1"


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def build(command: str, role: str, keys: QueueKeys, recon: Recon, rng: random.Random) -> list[str]:
    """The full command line of one attack (command name first)."""
    if command == "evalsha":
        script = SCRIPTS[role.split(":", 1)[1]]
        args = [rng.choice(GARBAGE) + ("x" * rng.choice((0, 0, 300))) for _ in range(rng.randrange(0, 9))]
        return ["EVALSHA", script.sha, str(len(script.keys)), *(keys[k] for k in script.keys), *args]
    if role == "payload":  # an owned entry's payload (a buffered or leased one's is read by a trainer)
        got = recon.owned()
        eid, attempt = got if got else (recon.entry(), 1)
        key = keys.payload(eid, attempt)
        return ["SET", key, rng.choice(GARBAGE)] if command == "set" else [command.upper(), key]
    key, garbage = keys[role], rng.choice(GARBAGE)
    lines: dict[str, Callable[[], list[str]]] = {
        "xack": lambda: ["XACK", key, GROUP, recon.stream_id(role)],
        "xclaim": lambda: _xclaim(key, recon, rng, role),
        "xdel": lambda: ["XDEL", key, recon.stream_id(role)],
        "xreadgroup": lambda: ["XREADGROUP", "GROUP", GROUP, CONSUMER, "COUNT", "1", "STREAMS", key, ">"],
        "xadd": lambda: ["XADD", key, "*", "chaos", garbage],
        "hset": lambda: ["HSET", key, recon.field(role), _forged(role, rng) or garbage],
        "hdel": lambda: ["HDEL", key, recon.field(role)],
        "hincrby": lambda: ["HINCRBY", key, recon.field(role), str(rng.choice((1, -1, 1000)))],
        "zadd": lambda: ["ZADD", key, str(rng.choice((0, -1, 1e15))), recon.member(role)],
        "zrem": lambda: ["ZREM", key, recon.member(role)],
        "del": lambda: ["DEL", key],
    }
    return lines[command]()


def _xclaim(key: str, recon: Recon, rng: random.Random, role: str) -> list[str]:
    """An XCLAIM of an owned entry to the adversary or to one of the queue's owners (CLAIM_TO), at
    its count or a forged one (RETRYCOUNT: a receipt's attempt)."""
    to = rng.choice(CLAIM_TO)
    to = recon.lease_consumer() if to == "@lease" else to
    line = ["XCLAIM", key, GROUP, to, "0", recon.stream_id(role)]
    return line + (["RETRYCOUNT", str(rng.choice((1, 2, 3)))] if rng.random() < 0.5 else []) + ["JUSTID"]


def _forged(role: str, rng: random.Random) -> str | None:
    """A well-formed forged record for the hashes whose values the scripts parse (None: garbage)."""
    if role == "parked":  # what park_many writes: <settlement>|<attempt>|<worker>|<ms>|<reason>
        return f"{rng.choice(('dead', 'filtered'))}|{rng.choice((1, 2))}|chaos-adversary|0|forged"
    if role == "leased":  # what lease.lua writes: <lease_id>|<attempt>
        return f"chaos|{rng.choice((1, 2))}"
    return None


def entries_touched(line: Sequence[str], reply: Any) -> list[str]:
    """The entry ids a command named or (XREADGROUP, XCLAIM) was answered with."""
    named = [a for a in line[2:] if _STREAM_ID.fullmatch(a) or ":payload:" in a]
    ids = [_STREAM_ID.search(a).group(0) for a in named if _STREAM_ID.search(a)]  # type: ignore[union-attr]
    ids += _STREAM_ID.findall(repr(reply)) if line[0] in ("XREADGROUP", "XCLAIM") else []
    return sorted(set(ids))


@dataclass(frozen=True)
class Sent:
    """One attack's fate: what the rules predicted, and what the server did."""

    predicted: bool
    outcome: str  # ran | refused | unavailable
    detail: str
    reply: Any = None


def targets(line: Sequence[str]) -> tuple[str | None, list[str]]:
    """(first argument the ACL names, keys) of a command line, as Redis's ACL check reads them."""
    if line[0] == "EVALSHA":
        return line[1], list(line[3:3 + int(line[2])])
    if line[0] == "XREADGROUP":
        return None, [line[line.index("STREAMS") + 1]]
    return None, [line[1]]


def send(r: redis.Redis, grants: Grants, line: Sequence[str]) -> Sent:
    """Send one command line with the credential ``r`` holds (an EVALSHA of a script the server's
    cache lost in a restart is loaded, as the worker role may, and sent again)."""
    predicted = grants.permits(line[0], *targets(line))
    # redis-py parses an XCLAIM reply as messages unless told it is ids (its own xclaim passes this).
    options = {"parse_justid": True} if line[0] == "XCLAIM" and "JUSTID" in line else {}
    try:
        try:
            reply = r.execute_command(*line, **options)
        except redis.exceptions.NoScriptError:
            r.script_load(next(s.source for s in SCRIPTS.values() if s.sha == line[1]))
            reply = r.execute_command(*line, **options)
        return Sent(predicted, "ran", repr(reply)[:200], reply)
    except redis.exceptions.NoPermissionError as exc:
        return Sent(predicted, "refused", str(exc)[:200])
    except redis.ConnectionError as exc:
        return Sent(predicted, "unavailable", str(exc)[:200])
    except redis.ResponseError as exc:  # it ran and answered an error (WRONGTYPE, a script's ROLLOUTQ)
        return Sent(predicted, "ran", f"error: {exc}"[:200])


def run_adversary(args: argparse.Namespace) -> int:
    """Send one random attack every ``--interval-s`` (exponential) until ``--until`` (wall clock)."""
    from rollout_queue.devtools.chaos import roles

    log = OpLog(args.log, "adversary", user=args.user)
    stop = roles.stop_event()
    rng = random.Random(f"{args.seed}:adversary:{args.index}")
    keys = QueueKeys(args.queue)
    rules = role_rules(args.queue, "worker").rules  # the rules applied (its password is not part of them)
    grants, menu = Grants.parse(rules), candidates(args.queue, rules)
    if args.commands:  # "xack src,del meta": only these (to see what each one breaks on its own)
        wanted = {tuple(c.split()) for c in args.commands.split(",") if c.strip()}
        menu = [m for m in menu if m in wanted or (m[0], m[1].split(":")[0]) in wanted]

    def body() -> None:
        r = redis.Redis.from_url(args.url, username=args.user, password=args.password, socket_timeout=2.0,
                                 socket_connect_timeout=1.0)
        recon = Recon(r, keys, rng)
        log.write("start", menu=[f"{c} {k}" for c, k in menu])
        while not stop.wait(rng.expovariate(1 / args.interval_s)) and time.time() < args.until:
            command, role = rng.choice(menu)
            try:
                line = build(command, role, keys, recon, rng)
            except redis.ConnectionError:
                continue
            t = time.time()
            sent = send(r, grants, line)
            log.write("adv_cmd", sent=t, command=command, key=role, line=[a[:80] for a in line[:12]],
                      predicted="allowed" if sent.predicted else "refused", outcome=sent.outcome,
                      detail=sent.detail, ids=entries_touched(line, sent.reply),
                      scope="entry" if _entry_scoped(command, role) else "key")

    return roles.guarded(log, body)


#: Keys whose members or fields are entries: an attack on one of them is aimed at that entry.
ENTRY_KEYS = frozenset({"src", "ready", "buffer", "bufver", "ledger", "history", "payload", "parked", "leased",
                        "partial", "partial_head", "suspects", "kept"})


def _entry_scoped(command: str, role: str) -> bool:
    """Whether an attack is aimed at one entry (XACK of an owned entry) or at a whole key (DEL ready)."""
    return command not in ("del", "xadd", "evalsha") and role in ENTRY_KEYS


# -- the checker's adversary rules ----------------------------------------------------------------

_SOURCE_ID = re.compile(r"chaos-\d+-\d{6}")


def check_adversary(c: Any) -> None:
    """The adversary's rules (``Checker.check_adversary``, after every other check): a command the
    rules refuse must have been refused (one that ran means the applied ACL grants more than
    role_rules says), and one they allow must have run; then every violation about an entry a
    command that ran touched names that command (blame), and the others name the key-wide commands
    that ran (DEL, HSET meta, ...: they may explain it). Blame explains a violation, it does not
    excuse it: the run still fails, saying which attack the queue did not survive."""
    sent = c.h.by_op["adv_cmd"]
    if not sent:
        return
    r = c.report
    by: Counter[str] = Counter(f"{rec['command']} {rec['key']} {rec['outcome']}" for rec in sent)
    for rec in sent:
        if rec["outcome"] == "ran" and rec["predicted"] == "refused":
            r.violate(f"the worker credential ran {' '.join(rec['line'][:4])}, which role_rules refuses: the "
                      f"applied ACL grants more than its rules ({rec['detail']})")
        elif rec["outcome"] == "refused" and rec["predicted"] == "allowed":
            r.violate(f"the worker credential was refused {' '.join(rec['line'][:4])}, which role_rules allows "
                      f"({rec['detail']}): the rules and the server disagree")
    ran = [rec for rec in sent if rec["outcome"] == "ran"]
    touched: dict[str, list[dict[str, Any]]] = {}
    for rec in ran:
        if rec["scope"] == "entry":
            for eid in rec["ids"]:
                touched.setdefault(eid, []).append(rec)
                sid = c.h.sid_of.get(eid)
                if sid:
                    touched.setdefault(sid, []).append(rec)
    wide = [rec for rec in ran if rec["scope"] == "key"]
    blamed = 0
    for k, text in enumerate(r.violations):
        names = set(_STREAM_ID.findall(text)) | set(_SOURCE_ID.findall(text))
        hits = [rec for name in names for rec in touched.get(name, [])]
        if hits:
            blamed += 1
            first = min(hits, key=lambda x: x["sent"])
            r.violations[k] = (f"{text} [the adversary's {' '.join(first['line'][:4])} ran at {first['sent']:.3f}"
                               f"{f' (and {len(hits) - 1} more on it)' if len(hits) > 1 else ''}]")
        elif wide:
            r.violations[k] = (f"{text} [{len(wide)} key-wide adversary commands ran and may explain it, the first "
                               f"{' '.join(wide[0]['line'][:3])} at {wide[0]['sent']:.3f}]")
    r.adversary = {"sent": len(sent), "ran": len(ran), "refused": sum(rec["outcome"] == "refused" for rec in sent),
                   "unavailable": sum(rec["outcome"] == "unavailable" for rec in sent), "key_wide_ran": len(wide),
                   "violations_blamed": blamed, "by_command": dict(sorted(by.items()))}
