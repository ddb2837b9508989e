"""Every Lua header against the code it heads (no Redis): the header is the script's contract.

STYLE (Lua scripts): each file opens with one sentence, then KEYS, ARGV, Returns and Invariant; the
loader turns KEYS/ARGV into the prelude and into the builder's layout, so a key the code uses but the
header does not declare would be nil at run time, and a declared key the code never touches is a lie.
Helpers in include/ carry a header block too. Key roles come only from keys.py.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from rollout_queue.core.keys import KEY_SUFFIXES
from rollout_queue.core.scripts import SCRIPTS

LUA = resources.files("rollout_queue.core") / "lua"
NAMES = sorted(p.name[:-4] for p in LUA.iterdir() if p.name.endswith(".lua"))
INCLUDES = sorted(p.name[:-4] for p in (LUA / "include").iterdir() if p.name.endswith(".lua"))
SECTIONS = ("KEYS", "READS", "ARGV", "Returns", "Invariant")
ITEM = re.compile(r"^  (\*?[a-z_]+)\s+\S")


def _text(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def _header(name: str) -> str:
    text = _text(name)
    assert text.startswith("--[["), f"{name}.lua must open with a --[[ header ]] block"
    return text[4:text.index("]]")]


def _sections(name: str) -> dict[str, list[str]]:
    """Section name -> its lines, read independently of scripts.py's own parser."""
    out: dict[str, list[str]] = {}
    current = None
    for line in _header(name).splitlines():
        if line.rstrip(":") in SECTIONS and line.endswith(":"):
            current = line[:-1]
            out[current] = []
        elif current:
            out[current].append(line)
    return out


def _items(lines: list[str]) -> list[str]:
    return [m.group(1) for m in map(ITEM.match, lines) if m]


def _code(source: str) -> str:
    """The assembled source without comments and without the generated K/A prelude."""
    source = re.sub(r"--\[\[.*?\]\]", "", source, flags=re.S)
    source = re.sub(r"--[^\n]*", "", source)
    return "\n".join(line for line in source.splitlines() if not re.match(r"local [KA] = \{", line))


def test_every_script_file_is_in_the_library() -> None:
    assert NAMES == sorted(SCRIPTS)


@pytest.mark.parametrize("name", NAMES)
def test_the_header_has_its_four_sections_in_order(name: str) -> None:
    header = _header(name)
    assert header.lstrip("\n").startswith(f"{name}: "), "the header opens with '<name>: <one sentence>'"
    lines = header.splitlines()
    found = [line[:-1] for line in lines if line.endswith(":") and line[:-1] in SECTIONS]
    assert found == [x for x in SECTIONS if x != "READS" or x in found]  # READS is optional
    sections = _sections(name)
    assert _items(sections["KEYS"]), "a transition touches at least one key"
    for section in ("Returns", "Invariant"):
        assert any(line.strip() for line in sections[section]), f"{section} is empty"
    assert _items(sections["ARGV"]) or any("(none)" in line for line in sections["ARGV"])


@pytest.mark.parametrize("name", NAMES)
def test_the_loader_reads_the_same_keys_and_argv(name: str) -> None:
    sections = _sections(name)
    script = SCRIPTS[name]
    assert script.keys == tuple(_items(sections["KEYS"]))
    assert script.reads == tuple(_items(sections.get("READS", [])))
    assert script.argv == tuple(_items(sections["ARGV"]))
    assert all(not a.startswith("*") for a in script.argv[:-1]), "only the last ARGV may be variadic"
    prelude = script.source.splitlines()[1]
    declared = ", ".join(f"{k} = KEYS[{i}]" for i, k in enumerate(script.keys, 1))
    assert prelude.startswith("local K = {" + declared) and prelude.endswith("}")
    for role in script.reads:  # built from the first declared key's prefix (same hash tag)
        assert f"{role} = string.sub(KEYS[1], 1, -{len(KEY_SUFFIXES[script.keys[0]]) + 1}) .. '{KEY_SUFFIXES[role]}'" in prelude


@pytest.mark.parametrize("name", NAMES)
def test_every_key_role_is_one_of_keys_py(name: str) -> None:
    assert set(SCRIPTS[name].keys) | set(SCRIPTS[name].reads) <= set(KEY_SUFFIXES)
    assert len(set(SCRIPTS[name].keys)) == len(SCRIPTS[name].keys)


@pytest.mark.parametrize("name", NAMES)
def test_every_key_and_argv_the_code_uses_is_declared_and_every_declared_one_is_used(name: str) -> None:
    script = SCRIPTS[name]
    code = _code(script.source)
    used_keys = set(re.findall(r"\bK\.(\w+)", code))
    used_argv = set(re.findall(r"\bA\.(\w+)", code))
    declared_argv = {a.lstrip("*") for a in script.argv}
    declared = set(script.keys) | set(script.reads)
    assert used_keys - declared == set(), "used but not declared in KEYS or READS (nil at run time)"
    assert declared - used_keys == set(), "declared in KEYS or READS but never used"
    assert used_argv - declared_argv == set(), "used but not declared in ARGV"
    assert declared_argv - used_argv == set(), "declared in ARGV but never used"


@pytest.mark.parametrize("name", NAMES + [f"include/{i}" for i in INCLUDES])
def test_every_include_exists_and_carries_a_header(name: str) -> None:
    text = _text(name)
    for dep in re.findall(r"^-- @include (\w+)\s*$", text, flags=re.M):
        assert dep in INCLUDES, f"{name} includes unknown helper {dep}"
    if name.startswith("include/"):
        assert "--[[" in text and "]]" in text, f"helper {name} has no header block"
        body = re.sub(r"^-- @include \w+\s*$", "", text, flags=re.M).lstrip()
        assert body.startswith("--[["), f"helper {name}: the header comes before the code"
