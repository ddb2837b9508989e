"""Which Redis command each script runs on which key: (command, key pattern) pairs read from the Lua.

Owns the static reading of an assembled script (scripts.Script.source) that acl.py turns into
per-key grants: a command a role's scripts use on some keys only is granted on those keys alone (a
Redis 7 selector), so a leaked credential cannot aim it at another key of the queue (the worker's DEL
exists for payload keys; it must not delete the stream, the ledger or the dead letters).

How a key argument is read, and why this is enough: the scripts call Redis in a small number of
shapes, all written in the house style, and each is resolved to a key pattern under the queue's
prefix (a KEY_SUFFIXES value, or a built key such as ``lease:*`` / ``payload:*``):
- ``K.<role>`` (a declared or READS key);
- ``string.sub(K.<role>, 1, -n) .. 'lease:' .. id`` (a key built from the queue's prefix; everything
  after the last literal becomes ``*``), also through a local or a top-level constant;
- a local variable (each of its assignments in the function, or at top level, is resolved), a
  parameter of a local function (each call site's argument is resolved), or a local function's
  ``return``;
- ``call_batched({'CMD'}, items)`` (keys as the items: each element assigned to ``items``).
It must not guess: any command whose key it cannot resolve raises ``ValueError`` naming the script,
so a new shape fails the rule builder (and the test suite) instead of granting too much or too little.
It does no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from rollout_queue.core.keys import KEY_SUFFIXES
from rollout_queue.core.scripts import Script

#: Containers whose ACL name carries the subcommand (acl.CONTAINERS says why); their key, if any, is
#: the argument after the subcommand.
CONTAINERS = frozenset({"XGROUP", "XINFO", "OBJECT", "MEMORY", "SCRIPT", "CLIENT", "CONFIG", "FUNCTION", "INFO"})
#: Commands with no key argument (PUBLISH names a channel: channels are granted apart, with ``&``).
KEYLESS = frozenset({"TIME", "INFO", "PUBLISH"})
#: Commands all of whose arguments are keys.
ALL_KEYS = frozenset({"DEL", "UNLINK", "EXISTS", "MGET"})
_SUFFIX_OF = {suffix: role for role, suffix in KEY_SUFFIXES.items()}
_LITERAL = re.compile(r"'([A-Z]+)'")
_FUNCTION = re.compile(r"^([ \t]*)local function (\w+)\(([^)]*)\)", re.M)
_STRING = re.compile(r"^'([A-Za-z0-9_:]*)'$")
_SUB = re.compile(r"^string\.sub\(K\.(\w+),\s*1,\s*-(\d+)\)$")
_LONG_COMMENT = re.compile(r"--\[(=*)\[")
#: What ends an expression at bracket depth 0 besides a newline or ``;`` (Reader.expression).
_KEYWORD = re.compile(r"\s(?:end|then|do|else|elseif)\b")
_OPEN, _CLOSE = "({[", ")}]"


def _lex(text: str, pos: int = 0, *, comments: bool = True) -> Iterator[tuple[int, int, str]]:
    """The pieces of Lua ``text`` from ``pos``, as ``(start, end, kind)``: ``"string"`` (a quoted literal,
    its quotes and escapes included; an unterminated one runs to the end), ``"comment"`` (``-- ...`` up
    to its newline, which stays code, or ``--[[ ... ]]`` / ``--[==[ ... ]==]``; only with ``comments``)
    or ``"code"`` (one character). The only place that knows Lua's quoting and comments: every reader
    below builds on it, so a quote or a bracket inside a string can never be read differently by two
    of them."""
    n, i = len(text), pos
    while i < n:
        c = text[i]
        if c in "'\"":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            end, kind = min(j + 1, n), "string"
        elif comments and text.startswith("--", i):
            long = _LONG_COMMENT.match(text, i)
            close = text.find(f"]{long.group(1)}]", i) if long else text.find("\n", i)
            end = n if close < 0 else close + (len(long.group(1)) + 2 if long else 0)
            kind = "comment"
        else:
            end, kind = i + 1, "code"
        yield i, end, kind
        i = end


def _code(text: str, pos: int = 0) -> Iterator[tuple[int, str, int]]:
    """``(offset, character, depth)`` of each character of ``text`` from ``pos`` outside strings.
    ``depth`` counts the brackets opened since ``pos`` and still open; a closing bracket is reported at
    the depth it leaves, so -1 means it closes a bracket opened before ``pos``. The readers run on
    comment-free text (strip_comments), where a ``--`` is only met when ``pos`` fell inside a string (a
    regex matched there): it is read as code, not as a comment that would swallow the line."""
    depth = 0
    for at, _, kind in _lex(text, pos, comments=False):
        if kind != "code":
            continue
        c = text[at]
        if c in _CLOSE:
            depth -= 1
        yield at, c, depth
        if c in _OPEN:
            depth += 1


def strip_comments(source: str) -> str:
    """``source`` without Lua comments (``-- ...`` and ``--[[ ... ]]``), strings kept, offsets not."""
    return "".join(source[start:end] for start, end, kind in _lex(source) if kind != "comment")


def split_args(text: str, pos: int) -> tuple[list[str], int]:
    """The comma-separated expressions from ``pos`` up to the bracket that closes them, and the offset
    of that bracket. ``pos`` is just inside an opening bracket (or after a first argument)."""
    args, start = [], pos
    for i, c, depth in _code(text, pos):
        if depth < 0:
            args.append(text[start:i].strip())
            return [a for a in args if a], i
        if c == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    raise ValueError("unbalanced brackets")


def _top_split(expr: str, sep: str) -> list[str]:
    """``expr`` split at ``sep`` where it is outside brackets and strings."""
    parts, start = [], 0
    for i, _, depth in _code(expr):
        if depth == 0 and i >= start and expr.startswith(sep, i):  # i < start: inside the last separator
            parts.append(expr[start:i].strip())
            start = i + len(sep)
    return parts + [expr[start:].strip()]


@dataclass(frozen=True)
class _Function:
    name: str
    params: tuple[str, ...]
    start: int
    end: int


class _Reader:
    """Resolves key expressions in one script's comment-free source."""

    def __init__(self, name: str, text: str) -> None:
        self.name, self.text = name, text
        self.functions: list[_Function] = []
        for m in _FUNCTION.finditer(text):
            close = re.compile(rf"^{m.group(1)}end\b", re.M).search(text, m.end())
            if close is None:
                raise ValueError(f"script {name}: function {m.group(2)} has no end at its indentation")
            params = tuple(p.strip() for p in m.group(3).split(",") if p.strip())
            self.functions.append(_Function(m.group(2), params, m.start(), close.end()))

    def fail(self, what: str) -> ValueError:
        return ValueError(f"script {self.name}: cannot tell which key {what} names (script_access.py)")

    def enclosing(self, pos: int) -> _Function | None:
        inner = [f for f in self.functions if f.start <= pos < f.end]
        return min(inner, key=lambda f: f.end - f.start) if inner else None

    def scope(self, pos: int) -> tuple[int, int, list[_Function]]:
        """The span to look for a name's assignments in, and the functions nested in it (skipped)."""
        fn = self.enclosing(pos)
        lo, hi = (fn.start, fn.end) if fn else (0, len(self.text))
        return lo, hi, [f for f in self.functions if lo < f.start and f.end <= hi]

    def resolve(self, expr: str, pos: int, seen: frozenset[tuple[str, int]] = frozenset()) -> set[str]:
        """Key patterns (suffixes under the queue prefix) that ``expr``, written at ``pos``, may name."""
        expr = expr.strip()
        if (expr, pos) in seen:
            return set()
        seen = seen | {(expr, pos)}
        while expr.startswith("(") and expr.endswith(")") and split_args(expr, 1)[1] == len(expr) - 1:
            expr = expr[1:-1].strip()
        if len(ors := _top_split(expr, " or ")) > 1:
            return set().union(*(self.resolve(_top_split(p, " and ")[-1], pos, seen) for p in ors))
        if len(parts := _top_split(expr, "..")) > 1:
            return {self._concat(parts, pos, seen, p) for p in self._prefixes(parts[0], pos, seen)}
        if m := re.fullmatch(r"K\.(\w+)", expr):
            if m.group(1) not in KEY_SUFFIXES:
                raise self.fail(expr)
            return {KEY_SUFFIXES[m.group(1)]}
        if m := re.fullmatch(r"(\w+)\((.*)\)", expr, re.S):
            return self._returns(m.group(1), seen)
        if re.fullmatch(r"\w+", expr):
            return self._name(expr, pos, seen)
        raise self.fail(expr)

    def _concat(self, parts: list[str], pos: int, seen: frozenset[tuple[str, int]], base: str) -> str:
        out = base
        for part in parts[1:]:
            lit = _STRING.match(part)
            if lit is None or out.endswith("*"):
                return out if out.endswith("*") else out + "*"
            out += lit.group(1)
        return out

    def _prefixes(self, expr: str, pos: int, seen: frozenset[tuple[str, int]]) -> set[str]:
        """What the head of a concatenation names: the queue prefix itself, or a pattern."""
        m = _SUB.fullmatch(expr.strip())
        if m:
            if m.group(1) not in KEY_SUFFIXES or int(m.group(2)) != len(KEY_SUFFIXES[m.group(1)]) + 1:
                raise self.fail(expr)
            return {""}
        return self.resolve(expr, pos, seen)

    def _returns(self, fname: str, seen: frozenset[tuple[str, int]]) -> set[str]:
        fn = next((f for f in self.functions if f.name == fname), None)
        if fn is None:
            raise self.fail(f"{fname}(...)")
        out: set[str] = set()
        for m in re.finditer(r"\breturn\s+([^\n]+)", self.text[fn.start:fn.end]):
            out |= self.resolve(m.group(1), fn.start + m.start(), seen)
        return out

    def _name(self, name: str, pos: int, seen: frozenset[tuple[str, int]]) -> set[str]:
        fn = self.enclosing(pos)
        if fn is not None and name in fn.params:
            return self._arguments(fn, fn.params.index(name), seen)
        out: set[str] = set()
        for rhs, at in self.assignments(name, pos):
            if rhs.startswith("{"):
                continue  # a table: its elements are resolved by elements()
            out |= self.resolve(rhs, at, seen)
        if not out:
            raise self.fail(name)
        return out

    def _arguments(self, fn: _Function, index: int, seen: frozenset[tuple[str, int]]) -> set[str]:
        out: set[str] = set()
        for m in re.finditer(rf"(?<![\w.:]){fn.name}\(", self.text):
            if self.text[max(0, m.start() - 9):m.start()].endswith("function "):
                continue
            args, _ = split_args(self.text, m.end())
            if index >= len(args):
                raise self.fail(f"argument {index + 1} of {fn.name}")
            out |= self.resolve(args[index], m.start(), seen)
        uses = len(re.findall(rf"(?<![\w.:]){fn.name}\b", self.text))
        if not out and uses > 1:  # passed as a value: where it is called from is not read here
            raise self.fail(f"parameter {fn.params[index]} of {fn.name} (not called by name)")
        return out  # a helper this script includes but never calls runs nothing

    def assignments(self, name: str, pos: int) -> list[tuple[str, int]]:
        """Right-hand sides of ``[local] name = ...`` in the function around ``pos`` (nested functions
        skipped), else at the top level (an upvalue such as a key prefix constant)."""
        found = self._assignments(name, *self.scope(pos))
        if found or self.enclosing(pos) is None:
            return found
        return self._assignments(name, 0, len(self.text), self.functions)

    def _assignments(self, name: str, lo: int, hi: int, nested: list[_Function]) -> list[tuple[str, int]]:
        out = []
        for m in re.finditer(rf"(?:^|[\s;])(?:local\s+)?{name}\s*=(?!=)\s*", self.text[lo:hi]):
            at = lo + m.end()
            if any(f.start <= at < f.end for f in nested):
                continue
            out.append((self.expression(at), at))
        return out

    def expression(self, at: int) -> str:
        """The expression that starts at ``at``: up to the line's end, a ``;`` or a keyword
        (``end``, ``then`` ...) outside brackets and strings."""
        end = len(self.text)
        for i, c, depth in _code(self.text, at):
            if depth < 0 or depth == 0 and (c in "\n;" or _KEYWORD.match(self.text, i, i + 8)):
                end = i
                break
        return self.text[at:end].strip()

    def elements(self, name: str, pos: int, seen: frozenset[tuple[str, int]]) -> set[str]:
        """Key patterns of the items of table ``name``: its constructor's elements, ``name[i] = x``
        and ``table.insert(name, x)``."""
        lo, hi, _ = self.scope(pos)
        out: set[str] = set()
        for rhs, at in self.assignments(name, pos):
            if rhs.startswith("{"):
                out |= set().union(set(), *(self.resolve(e, at, seen) for e in split_args(rhs, 1)[0]))
        body = self.text[lo:hi]
        for m in re.finditer(rf"\b{name}\[[^\]]+\]\s*=(?!=)\s*", body):
            out |= self.resolve(self.expression(lo + m.end()), lo + m.end(), seen)
        for m in re.finditer(rf"table\.insert\({name},", body):
            args, _ = split_args(self.text, lo + m.end())
            out |= self.resolve(args[-1], lo + m.start(), seen)
        if not out:
            raise self.fail(f"the items of {name}")
        return out


def _call_keys(reader: _Reader, cmd: str, args: list[str], at: int) -> set[str]:
    if cmd in KEYLESS:
        return set()
    if cmd == "XREADGROUP":
        upper = [a.upper() for a in args]
        if "'STREAMS'" not in upper:
            raise reader.fail("XREADGROUP")
        args = args[upper.index("'STREAMS'") + 1:upper.index("'STREAMS'") + 2]
    elif cmd in CONTAINERS:
        args = args[1:2]
    elif cmd not in ALL_KEYS:
        args = args[:1]
    args = [a for a in args if not a.startswith("unpack(")]
    if not args:
        raise reader.fail(cmd)
    return set().union(*(reader.resolve(a, at) for a in args))


@lru_cache(maxsize=None)
def _access(name: str, source: str, known: frozenset[str]) -> dict[str, frozenset[str]]:
    text = strip_comments(source)
    reader = _Reader(name, text)
    found: dict[str, set[str]] = {}
    for m in _LITERAL.finditer(text):
        cmd = m.group(1)
        if cmd not in known:
            continue
        after = text[m.end():].lstrip(" \t")
        if after.startswith(","):
            args, _ = split_args(text, m.end() + text[m.end():].index(",") + 1)
        else:
            args = []
        named = _STRING.match(args[0]) if cmd in CONTAINERS and args else None
        sub = named.group(1) if named else ""
        if cmd in CONTAINERS and not sub:
            raise ValueError(f"script {name} calls {cmd} without a literal subcommand")
        acl_name = f"{cmd}|{sub}".lower() if sub else cmd.lower()
        if not args and not after.startswith(","):
            keys = _batched_items(reader, text, m, cmd)
        else:
            keys = _call_keys(reader, cmd, args, m.start())
        found.setdefault(acl_name, set()).update(keys)
    _check_calls(reader, text, known)
    for keys in found.values():
        bad = {k for k in keys if k.rstrip("*").rstrip(":") not in _SUFFIX_OF and not k.endswith(":*")}
        if bad:
            raise ValueError(f"script {name}: keys {sorted(bad)} are not keys of a queue (keys.py)")
    return {cmd: frozenset(keys) for cmd, keys in found.items()}


def _check_calls(reader: _Reader, text: str, known: frozenset[str]) -> None:
    """Every ``redis.call`` names its command as a literal, or unpacks a table that starts with one
    (then the literal scan saw it): a command in a variable would escape the grants."""
    for m in re.finditer(r"redis\.p?call\(\s*", text):
        rest = text[m.end():]
        lit = _LITERAL.match(rest)
        if lit and lit.group(1) in known:
            continue
        table = re.match(r"unpack\((\w+)\)", rest)
        heads = [rhs for rhs, _ in reader.assignments(table.group(1), m.start())] if table else []
        if heads and all(_starts_with_command(rhs, known) for rhs in heads):
            continue
        if heads == ["{}"] and _head_parameter(reader, m.start(), known):
            continue
        raise reader.fail(f"the command of the call at {rest[:40]!r}")


def _starts_with_command(table: str, known: frozenset[str]) -> bool:
    head = _LITERAL.match(table[1:].lstrip()) if table.startswith("{") else None
    return head is not None and head.group(1) in known


def _head_parameter(reader: _Reader, pos: int, known: frozenset[str]) -> bool:
    """An args table built empty inside a helper that receives the command as a table parameter
    (call_batched's ``head``): every call of the helper passes ``{'CMD', ...}`` there."""
    fn = reader.enclosing(pos)
    if fn is None:
        return False
    calls = [split_args(reader.text, m.end())[0]
             for m in re.finditer(rf"(?<![\w.:]){fn.name}\(", reader.text)
             if not reader.text[max(0, m.start() - 9):m.start()].endswith("function ")]
    return any(calls and all(i < len(a) and _starts_with_command(a[i], known) for a in calls)
               for i in range(len(fn.params)))


def _batched_items(reader: _Reader, text: str, m: re.Match[str], cmd: str) -> set[str]:
    """``call_batched({'CMD'}, items)``: the keys are the items. Any other bare command literal is a
    shape this reader does not know: refuse it."""
    head = re.compile(r"call_batched\(\{\s*$")
    tail = re.match(r"\s*\}\s*,\s*(\w+)\s*\)", text[m.end():])
    if cmd in KEYLESS:
        return set()
    if head.search(text[:m.start()]) is None or tail is None:
        raise reader.fail(f"the command literal '{cmd}' (not a call shape script_access.py reads)")
    return reader.elements(tail.group(1), m.start(), frozenset())


def script_access(script: Script, known: frozenset[str]) -> dict[str, frozenset[str]]:
    """ACL command name (lower case, ``container|sub``) -> the key patterns (suffixes under the queue's
    prefix: ``src``, ``payload:*``) the script runs it on; a keyless command maps to no keys.
    ``known``: the command names to look for (acl.KNOWN_COMMANDS).

    Raises:
        ValueError: a command whose key this reader cannot resolve (fail closed: see the module).
    """
    return _access(script.name, script.source, known)
