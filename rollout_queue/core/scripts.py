"""The Lua script library: reads lua/*.lua, resolves includes, and states each script's contract.

Each script's header (KEYS / ARGV sections) is the single source of its calling convention: the
loader turns it into the script's prelude (``local K = {src = KEYS[1], ...}``, ``local A = {...}``)
and into ``Script.keys`` / ``Script.argv``, which protocol.py uses to build calls. So the Lua text,
the header and the Python builder cannot disagree. No I/O against Redis happens here; transports
run ``Script.source`` / ``Script.sha`` and reload on NOSCRIPT (see ``client.py`` / ``aio.py``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from typing import Mapping

from rollout_queue.core.errors import IncludeError
from rollout_queue.core.keys import KEY_SUFFIXES

#: Scripts that write nothing queue state (their headers say read-only): sent as EVALSHA_RO (so a
#: read-only ACL role may run them), never followed by WAIT in durable mode, and loaded beside any
#: script a restarted server forgot (transport._companions). Every other script, including any added
#: later, counts as a write: forgetting a name here costs a WAIT, never durability.
READ_ONLY_SCRIPTS = frozenset({"stats", "reap_scan"})

#: Version of the data layout the scripts keep in Redis. Bump when a key's meaning changes (and teach
#: open.lua to migrate from the previous one, or refuse it with a typed error). 4: the counters moved
#: out of `meta` into `counters` (the worker role may write counters, never meta).
DATA_LAYOUT = 4

_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.M)
_SECTION = re.compile(r"^(KEYS|READS|ARGV|Returns|Invariant):\s*$")
_ITEM = re.compile(r"^  (\*?[a-z_]+)\s+\S")


@dataclass(frozen=True)
class Script:
    """One transition: its name, the key roles and ARGV names its header declares, and its source."""

    name: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    source: str
    sha: str
    header: str
    #: Keys the script reads without declaring them (READS section): Redis checks every declared key
    #: of an EVALSHA as read-write, so a key that a role may only read (%R~, acl.py) is named here and
    #: built in the prelude from the first declared key's prefix (same hash tag, same slot).
    reads: tuple[str, ...] = ()

    @property
    def variadic(self) -> str | None:
        """The name of the trailing variadic ARGV (declared ``*name``), if any."""
        return self.argv[-1][1:] if self.argv and self.argv[-1].startswith("*") else None


def parse_header(text: str) -> tuple[str, dict[str, list[str]]]:
    """The leading ``--[[ ... ]]`` block and its KEYS/ARGV item names."""
    if not text.startswith("--[["):
        raise ValueError("a script must open with a --[[ header ]] block")
    header = text[4:text.index("]]")]
    sections: dict[str, list[str]] = {"KEYS": [], "READS": [], "ARGV": [], "Returns": [], "Invariant": []}
    current = None
    for line in header.splitlines():
        m = _SECTION.match(line)
        if m:
            current = m.group(1)
            continue
        if current in ("KEYS", "READS", "ARGV"):
            item = _ITEM.match(line)
            if item:
                sections[current].append(item.group(1))
    return header, sections


def _expand(name: str, includes: Mapping[str, str], emitted: set[str], chain: tuple[str, ...]) -> str:
    """Depth-first include expansion; each include is emitted once, after its own includes.

    ``chain`` is the path from the script down to ``name``. Emitting a helper once is what lets two
    helpers share a third; a helper met again *on its own path* is a cycle, which silent dedupe would
    turn into a helper emitted before what it calls (a nil global at run time), so it raises.
    """
    chain = chain + (name,)
    if name in chain[1:-1]:
        raise IncludeError("cycle", chain)
    if name not in includes:
        raise IncludeError("missing", chain)
    out = []
    for dep in _INCLUDE.findall(includes[name]):
        if dep not in emitted:
            out.append(_expand(dep, includes, emitted, chain))
    emitted.add(name)
    out.append(_INCLUDE.sub("", includes[name]))
    return "\n".join(out)


def assemble(name: str, text: str, includes: Mapping[str, str]) -> str:
    """Script ``name``'s source: its prelude, every include it reaches (each once), then its body.

    Raises:
        IncludeError: an include is missing or closes a cycle (the chain is in the error).
    """
    header, sections = parse_header(text)
    keys, argv, reads = tuple(sections["KEYS"]), tuple(sections["ARGV"]), tuple(sections["READS"])
    emitted: set[str] = set()
    body = [_expand(dep, includes, emitted, (name,)) for dep in _INCLUDE.findall(text) if dep not in emitted]
    return f"-- rollout-queue:{name}\n" + _prelude(keys, argv, reads) + "\n".join(body) + "\n" + _INCLUDE.sub("", text[text.index("]]") + 2:])


def _prelude(keys: tuple[str, ...], argv: tuple[str, ...], reads: tuple[str, ...] = ()) -> str:
    k = ", ".join(f"{role} = KEYS[{i}]" for i, role in enumerate(keys, 1))
    if reads:
        if not keys:
            raise ValueError("a script with READS needs a declared key to build them from")
        cut = len(KEY_SUFFIXES[keys[0]]) + 1
        k += ", " + ", ".join(f"{role} = string.sub(KEYS[1], 1, -{cut}) .. '{KEY_SUFFIXES[role]}'" for role in reads)
    fixed = [a for a in argv if not a.startswith("*")]
    a = ", ".join(f"{n} = ARGV[{i}]" for i, n in enumerate(fixed, 1))
    lines = [f"local K = {{{k}}}", f"local A = {{{a}}}"]
    if len(fixed) < len(argv):
        rest = argv[-1][1:]
        lines.append(f"A.{rest} = {{}}")
        lines.append(f"for i = {len(fixed) + 1}, #ARGV do A.{rest}[#A.{rest} + 1] = ARGV[i] end")
    return "\n".join(lines) + "\n"


def _read_lua() -> tuple[dict[str, str], dict[str, str]]:
    root = resources.files("rollout_queue.core") / "lua"
    scripts = {p.name[:-4]: p.read_text() for p in root.iterdir() if p.name.endswith(".lua")}
    includes = {p.name[:-4]: p.read_text() for p in (root / "include").iterdir() if p.name.endswith(".lua")}
    return scripts, includes


def load_library() -> dict[str, Script]:
    """Every transition script, assembled and hashed.

    Raises:
        IncludeError: an include is missing or closes a cycle.
    """
    texts, includes = _read_lua()
    library = {}
    for name, text in sorted(texts.items()):
        header, sections = parse_header(text)
        keys, argv, reads = tuple(sections["KEYS"]), tuple(sections["ARGV"]), tuple(sections["READS"])
        source = assemble(name, text, includes)
        library[name] = Script(name, keys, argv, source, hashlib.sha1(source.encode()).hexdigest(), header, reads)
    return library


SCRIPTS: dict[str, Script] = load_library()


def _counter_fields() -> frozenset[str]:
    """The counters the scripts move, as load_config.lua lists them (its COUNTERS table)."""
    text = _read_lua()[1]["load_config"]
    table = re.search(r"local COUNTERS = \{(.*?)\}", text, re.S)
    if table is None:
        raise ValueError("load_config.lua has no COUNTERS table")
    return frozenset(re.findall(r"'([a-z_]+)'", table.group(1)))


#: Fields of the ``counters`` hash (plus the per-reason ``filtered_reason:*`` ones): since data layout
#: 4 they live apart from ``meta`` (config, library, policy version), which the worker role only reads.
COUNTER_FIELDS = _counter_fields()


def counter_home(field: str) -> str:
    """The key role that holds ``field``: ``counters`` for a counter, else ``meta``."""
    return "counters" if field in COUNTER_FIELDS or field.startswith("filtered_reason:") else "meta"

#: The library version stored in each queue's meta: the data layout plus a digest of every script,
#: so two different builds of rollout-queue never drive one queue with different transition code.
LIBRARY_VERSION = f"{DATA_LAYOUT}.{hashlib.sha1(''.join(s.sha for s in SCRIPTS.values()).encode()).hexdigest()[:12]}"
