"""Include hygiene of the Lua library (no Redis): what each file calls, it includes itself.

The loader emits every include once, depth first, so a helper can call a function it never included
as long as some earlier include happened to pull it in. That works until the earlier include is
removed, and then the function is a nil global at run time, on whatever path first reaches it. So:
every script and helper names, with its own ``-- @include`` lines, every helper function (and
helper constant) it uses; the loader refuses a missing include or a cycle with a typed error; and
each ledger line format is spelled in exactly one helper.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from rollout_queue.core.errors import IncludeError, RolloutQueueError
from rollout_queue.core.scripts import SCRIPTS, assemble

LUA = resources.files("rollout_queue.core") / "lua"
SCRIPT_TEXTS = {p.name[:-4]: p.read_text() for p in LUA.iterdir() if p.name.endswith(".lua")}
INCLUDE_TEXTS = {p.name[:-4]: p.read_text() for p in (LUA / "include").iterdir() if p.name.endswith(".lua")}
INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.M)

#: Lua 5.1 and Redis globals a script may call without an include (string.*, table.*, math.*,
#: redis.*, cjson.*, ... are reached through a dot and never count as a call of a bare name).
BUILTINS = frozenset({
    "assert", "error", "getmetatable", "ipairs", "loadstring", "next", "pairs", "pcall", "rawequal",
    "rawget", "rawset", "select", "setmetatable", "tonumber", "tostring", "type", "unpack", "xpcall",
})
KEYWORDS = frozenset({
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
})
_TOKENS = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|\[\[.*?\]\]", re.S)


def _code(text: str) -> str:
    """The text without comments, every string literal replaced by ''."""
    return _TOKENS.sub(lambda m: "" if m.group(0).startswith("--") else "''", text)


def _strings(text: str) -> list[str]:
    """Every quoted string literal of the code (comments left out)."""
    return [m.group(0)[1:-1] for m in _TOKENS.finditer(text) if m.group(0)[0] in "'\""]


def _defined(code: str) -> set[str]:
    """Functions the file defines and the constants it declares at top level."""
    functions = re.findall(r"(?<![\w.:])function\s+(\w+)\s*\(", code)
    assigned = re.findall(r"\blocal\s+(\w+)\s*=\s*function\b", code)
    top = re.findall(r"^local\s+(?!function\b)(\w+)\s*=", code, re.M)
    return set(functions) | set(assigned) | set(top)


def _locals(code: str) -> set[str]:
    """Every name the file binds itself: locals, function parameters, loop variables."""
    names: set[str] = set()
    for m in re.finditer(r"\blocal\s+(?!function\b)(\w+(?:\s*,\s*\w+)*)", code):
        names |= {n.strip() for n in m.group(1).split(",")}
    for m in re.finditer(r"\bfunction\b[^(]*\(([^)]*)\)", code):
        names |= {n.strip() for n in m.group(1).split(",") if n.strip() not in ("", "...")}
    for m in re.finditer(r"\bfor\s+(\w+(?:\s*,\s*\w+)*)\s*(?:in\b|=)", code):
        names |= {n.strip() for n in m.group(1).split(",")}
    return names


def _calls(code: str) -> set[str]:
    """Bare names called as functions (``name(``), leaving out definitions, keywords and builtins."""
    out = set()
    for m in re.finditer(r"(?<![\w.:])(\w+)\s*\(", code):
        if code[:m.start()].rstrip().endswith("function") or m.group(1) in KEYWORDS | BUILTINS:
            continue
        out.add(m.group(1))
    return out


EXPORTS = {name: _defined(_code(text)) for name, text in INCLUDE_TEXTS.items()}
EVERY_EXPORT = set().union(*EXPORTS.values())


def _closure(deps: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(deps)
    while todo:
        dep = todo.pop()
        if dep not in seen and dep in INCLUDE_TEXTS:
            seen.add(dep)
            todo.extend(INCLUDE.findall(INCLUDE_TEXTS[dep]))
    return seen


def _unresolved(text: str) -> dict[str, str]:
    """Name -> 'transitive' (only an include of an include defines it) or 'undefined', for one file."""
    code = _code(text)
    own = _defined(code) | _locals(code)
    deps = INCLUDE.findall(text)
    direct = set().union(set(), *(EXPORTS.get(d, set()) for d in deps))
    reachable = set().union(set(), *(EXPORTS[d] for d in _closure(deps)))
    used = _calls(code) | {m.group(1) for m in re.finditer(r"(?<![\w.:])(\w+)", code) if m.group(1) in EVERY_EXPORT}
    return {name: "transitive" if name in reachable else "undefined" for name in used - own - direct}


FILES = sorted(SCRIPT_TEXTS) + [f"include/{name}" for name in sorted(INCLUDE_TEXTS)]


def _text(name: str) -> str:
    return INCLUDE_TEXTS[name[8:]] if name.startswith("include/") else SCRIPT_TEXTS[name]


@pytest.mark.parametrize("name", FILES)
def test_every_file_includes_what_it_calls(name: str) -> None:
    assert _unresolved(_text(name)) == {}, "add an -- @include line for each (its defining helper)"


def test_the_scanner_sees_a_transitive_call_and_an_undefined_one() -> None:
    # reserve_ready defines reserve_ready and reaches pel_entry; calling it through reserve_ready alone
    # is the mistake the test above exists to catch.
    text = "--[[ x ]]\n-- @include reserve_ready\nlocal o = pel_entry(A.id)\nreserve_ready(nil)\nnope(1)\n"
    assert _unresolved(text) == {"pel_entry": "transitive", "nope": "undefined"}
    ok = "--[[ x ]]\nlocal function f(g) return g(1) end\nlocal t = {}\nreturn f(tonumber) .. string.rep('x', 2)\n"
    assert _unresolved(ok) == {}


# -- the loader ---------------------------------------------------------------------------------

HEAD = "--[[\ns: a test script.\nKEYS:\n  meta  m\nARGV:\n  (none)\nReturns:\n  x\nInvariant:\n  y\n]]\n"


def test_a_missing_include_is_a_typed_error_naming_the_chain() -> None:
    includes = {"a": "-- @include b\nlocal function a() end\n", "b": "-- @include nope\nlocal function b() end\n"}
    with pytest.raises(IncludeError) as err:
        assemble("s", HEAD + "-- @include a\nreturn a()\n", includes)
    assert isinstance(err.value, RolloutQueueError)
    assert err.value.kind == "missing" and err.value.chain == ("s", "a", "b", "nope")
    assert "s -> a -> b -> nope" in str(err.value)


def test_an_include_cycle_is_a_typed_error_naming_the_chain() -> None:
    includes = {"a": "-- @include b\n", "b": "-- @include c\n", "c": "-- @include a\n"}
    with pytest.raises(IncludeError) as err:
        assemble("s", HEAD + "-- @include a\n", includes)
    assert err.value.kind == "cycle" and err.value.chain == ("s", "a", "b", "c", "a")
    with pytest.raises(IncludeError) as err:
        assemble("s", HEAD + "-- @include a\n", {"a": "-- @include a\n"})
    assert err.value.chain == ("s", "a", "a")


def test_a_shared_include_is_emitted_once_before_its_first_user() -> None:
    includes = {"a": "-- @include c\nA1\n", "b": "-- @include c\nB1\n", "c": "C1\n"}
    source = assemble("s", HEAD + "-- @include a\n-- @include b\nBODY\n", includes)
    assert source.count("C1") == 1
    assert source.index("C1") < source.index("A1") < source.index("B1") < source.index("BODY")


def test_the_shipped_library_assembles_as_loaded() -> None:
    for name, text in SCRIPT_TEXTS.items():
        assert assemble(name, text, INCLUDE_TEXTS) == SCRIPTS[name].source


# -- ledger lines -------------------------------------------------------------------------------

#: Each ledger line format (docs/DESIGN.md, the `ledger` key) and the one helper that spells it: the
#: builder, and any parser or predicate over that format, live there and nowhere else.
LEDGER_FORMATS = {"a|": "include/ledger", "s|": "include/ledger_settled"}


@pytest.mark.parametrize("prefix", sorted(LEDGER_FORMATS))
def test_each_ledger_line_format_is_spelled_in_exactly_one_helper(prefix: str) -> None:
    spelled = sorted(
        name for name in FILES if any(s.lstrip("^").startswith(prefix) for s in _strings(_text(name)))
    )
    assert spelled == [LEDGER_FORMATS[prefix]], "build or read the line through that helper's functions"


# -- the receipt/replay check -------------------------------------------------------------------


def _without_comments(text: str) -> str:
    return _TOKENS.sub(lambda m: "" if m.group(0).startswith("--") else m.group(0), text)


def test_the_receipt_refusal_is_built_in_one_helper() -> None:
    """Every settlement by receipt refuses through receipt_refusal: nobody else asks the PEL for a
    receipt or builds the stale_receipt reply, so the replay rule cannot fork again."""
    calls = sorted(name for name in FILES if "check_receipt" in _calls(_code(_text(name))))
    replies = sorted(name for name in FILES if re.search(r"\{\s*'stale_receipt'", _without_comments(_text(name))))
    assert calls == replies == ["include/receipt_refusal"]


def test_reserve_is_a_dispatcher_over_its_two_paths() -> None:
    """reserve.lua reads as its header: checks, replay, the ready path, the backlog path, the answer.
    The loops live in reserve_ready / reserve_backlog, each readable alone."""
    text = SCRIPT_TEXTS["reserve"]
    assert len(text.splitlines()) < 80
    assert not re.search(r"\b(for|while|repeat)\b", _code(text[text.index("]]"):]))
    assert {"reserve_ready", "reserve_backlog"} <= set(INCLUDE.findall(text))


def test_the_text_config_fields_are_one_table_the_client_agrees_with() -> None:
    """load_config refuses a stored text field outside its values and config_set a new one, both from
    text_fields.lua, and that table says what QueueConfig.TEXT_FIELDS says: no script spells them."""
    from rollout_queue.core.config import TEXT_FIELDS

    table = _code(INCLUDE_TEXTS["text_fields"])
    in_lua = {name: set(re.findall(r"(\w+) = true", values))
              for name, values in re.findall(r"(\w+) = \{([^{}]*)\}", table)}
    assert in_lua == {name: set(values) for name, values in TEXT_FIELDS.items()}
    users = sorted(name for name in FILES if "TEXT_FIELDS" in _code(_text(name)) and name != "include/text_fields")
    assert users == ["config_set", "include/load_config"]
    # Neither checks a value by spelling it (load_config may still set one: strictly on-policy is 'drop').
    for name in users:
        assert not re.search(r"~= '(fifo|lifo|drop|continue|pace)'", _without_comments(_text(name))), name
