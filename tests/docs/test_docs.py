"""The docs are the front page and the contract, so they are checked like code (no Redis needed).

- README.md stays a front page: at most ~200 lines, with the two commands CI and newcomers run.
- Every relative link in README.md, docs/*.md and benchmarks/README.md resolves to a file inside the
  repository, and every #anchor to a heading of that file; no doc points outside the clone (the
  contract used to live at ../shared/DESIGN.md: a clone must carry its own).
- Every benchmark table is what scripts/bench_tables.py renders from benchmarks/results.json.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").glob("*.md"),
               *(REPO / "docs" / "integrations").glob("*.md")])
CODE_OF = re.compile(r"^<!-- code: (\S+) -->\n```python\n(.*?)^```$", re.S | re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def prose(path: Path) -> str:
    """The file without its fenced code blocks (a link or heading in code is not one)."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(prose(path)):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(path))]


def test_the_docs_exist() -> None:
    names = {p.relative_to(REPO).as_posix() for p in DOCS}
    assert {"README.md", "docs/DESIGN.md", "docs/OPERATIONS.md", "docs/SCALING.md", "docs/CHAOS.md",
            "docs/PERFORMANCE.md"} <= names
    assert not (REPO / "docs" / "DESIGN_NOTES.md").exists(), "merged into docs/DESIGN.md"


def test_readme_is_a_front_page_with_the_two_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md is the front page: move reference material to docs/"
    commands = re.findall(r"^make (\w+)\b", text, re.M)
    assert commands[:2] == ["demo", "test"], commands
    makefile = (REPO / "Makefile").read_text()
    for target in ("demo", "test"):
        assert re.search(rf"^{target}:", makefile, re.M), f"README runs `make {target}`, the Makefile has no such target"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    bad = []
    for target in links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if REPO not in dest.parents and dest != REPO:
            bad.append(f"{target}: outside the repository")
            continue
        if not dest.exists():
            bad.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not bad, f"{doc.relative_to(REPO)}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_doc_depends_on_files_outside_the_clone(doc: Path) -> None:
    text = doc.read_text()
    for outside in ("../shared", "/work/shared", "shared/DESIGN.md"):
        assert outside not in text, f"{doc.relative_to(REPO)} refers to {outside}: a clone must be self-contained"


def test_no_python_or_markdown_file_points_at_the_old_design_notes() -> None:
    hits = []
    for path in REPO.rglob("*"):
        if path.suffix not in (".py", ".md", ".lua") or ".venv" in path.parts or ".git" in path.parts:
            continue
        if path == REPO / "docs" / "DESIGN.md" or path == Path(__file__):
            continue
        if "DESIGN_NOTES" in path.read_text(errors="replace"):
            hits.append(str(path.relative_to(REPO)))
    assert not hits, f"DESIGN_NOTES.md is merged into docs/DESIGN.md; update: {hits}"


def test_benchmark_tables_are_generated_from_results_json() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_tables.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


def test_every_bench_region_is_known_and_closed() -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import bench_tables
    finally:
        sys.path.remove(str(REPO / "scripts"))
    for doc in bench_tables.DOCS:
        text = doc.read_text()
        opened = re.findall(r"<!-- bench:([a-z0-9_-]+) -->", text)
        assert len(opened) == text.count("<!-- /bench -->"), f"{doc}: an unclosed bench region"
        assert set(opened) <= set(bench_tables.RENDERERS), f"{doc}: unknown regions {set(opened) - set(bench_tables.RENDERERS)}"
        assert len(bench_tables.REGION.findall(text)) == len(opened), f"{doc}: a region the renderer cannot parse"


def test_a_page_that_shows_a_file_shows_it_verbatim() -> None:
    """docs/integrations/trl.md's code is examples/trl_grpo.py, the script the TRL test runs; USAGE.md's
    reward functions are examples/rewards.py, the module the reward tests load."""
    shown = {}
    for doc in DOCS:
        for m in CODE_OF.finditer(doc.read_text()):
            shown[m.group(1)] = (doc, m.group(2))
    assert {"examples/trl_grpo.py", "examples/rewards.py"} <= set(shown)
    for path, (doc, code) in shown.items():
        assert code == (REPO / path).read_text(), f"{doc.relative_to(REPO)} shows an old copy of {path}"


# -- every documented command line parses --------------------------------------------------------------

#: Where command lines are written for people to copy: the docs, the examples and scripts, the images'
#: own commands, the Makefile, and the package's docstrings (workers/cli.py's examples). docker-compose
#: files: tests/demo/test_compose.py.
COMMAND_SOURCES = sorted({*DOCS, *(REPO / "examples").glob("*.py"), *(REPO / "scripts").glob("*.py"),
                          *(REPO / "scripts").glob("*.sh"), *(REPO / "deploy").glob("Dockerfile*"), REPO / "Makefile",
                          *(p for p in (REPO / "rollout_queue").rglob("*.py")
                            if re.search(r"rollout-queue |-m\W+rollout_queue", p.read_text()))})
#: A command at the start of a line or after a shell separator, after any VAR=value: `rollout-queue ...`,
#: `python -m rollout_queue ...` (the same command) or `python -m rollout_queue.workers ...` (the worker's).
PROGRAM = re.compile(r"(?:^|&&|;|\|\||\$\()\s*(?:[A-Za-z_]\w*=\S*\s+)*"
                     r"(?:\S*/)?(?:(?P<cli>rollout-queue)|(?:python3?|\$\(PY\))\s+-m\s+(?P<module>rollout_queue(?:\.workers)?))"
                     r"(?P<rest>\s.*)?$")
JSON_COMMAND = re.compile(r'\[\s*"rollout-queue"[^\]]*\]')
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
SHELL_END = {"|", "||", "&", "&&", ";", ">", ">>", "2>", "2>&1"}


def command_lines(path: Path) -> list[tuple[str, bool]]:
    """(command line, complete): every command line written in ``path``. A line in a code block,
    a script or a docstring is complete; a Markdown inline span may name a command or an option
    without its required arguments (`rollout-queue dlq`, `rollout-queue worker --weights-mode`)."""
    text = path.read_text(errors="replace")
    if path.suffix == ".md":
        blocks = "\n".join(m.group(0) for m in FENCE.finditer(text))
        spans = [(" ".join(m.group(1).split()), False) for m in INLINE.finditer(prose(path))]
    else:
        blocks, spans = text, []
    blocks = re.sub(r"\\{1,2}\n", " ", blocks)  # continuations (a docstring writes them \\)
    found = [(m.group(0), True) for line in blocks.splitlines() if (m := PROGRAM.search(line.strip()))]
    found += [(" ".join(json.loads(m.group(0))), True) for m in JSON_COMMAND.finditer(text)]
    found += [(line, True) for line in argv_lists(text)] if path.suffix == ".py" else []
    return found + [(m.group(0), False) for span, _ in spans if (m := PROGRAM.search(span))]


def argv_lists(source: str) -> list[str]:
    """The argv lists a Python file builds for ``-m rollout_queue[.workers]`` (a script starting a
    worker), as command lines. A computed value is left out with its option (``"--url", url``), or is
    a 1 where it stands alone; a ``*`` ends the list."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.List):
            continue
        words: list[str] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                break
            if isinstance(element, ast.Constant) and isinstance(element.value, str):
                words.append(element.value)
            elif words and words[-1].startswith("--"):
                words.pop()
            else:
                words.append("1")
        if "-m" in words and words[words.index("-m") + 1:][:1] in (["rollout_queue"], ["rollout_queue.workers"]):
            out.append(shlex.join(["python", *words[words.index("-m"):]]))
    return out


def argv_alternatives(line: str) -> tuple[str, list[list[str]]]:
    """(the parser: cli or worker, each argv the line stands for). Placeholders become values:
    `<dlq id>...`, an all-capitals word (`PATH`, `P`) and `...` after an option (`--url ...`) a 1,
    any other `...` ("and so on") nothing, `a|b` each of a and b."""
    m = PROGRAM.search(line)
    assert m is not None
    which = "worker" if m.group("module") == "rollout_queue.workers" else "cli"
    rest = re.sub(r"<[^<>]+>(\.\.\.)?", "1", m.group("rest") or "")
    words: list[str] = []
    for word in shlex.split(rest, comments=True):
        if word in SHELL_END or word.startswith(">"):
            break
        if word == "...":
            words += ["1"] if words and words[-1].startswith("--") and words[-1] != "--" else []
        else:
            words.append("1" if re.fullmatch(r"[A-Z][A-Z_]*", word) else word)
    argvs = [[]]
    for word in words:
        options = word.split("|") if "|" in word and not word.startswith("-") else [word]
        argvs = [argv + [o] for argv in argvs for o in options]
    return which, argvs


def parse_error(which: str, argv: list[str]) -> str | None:
    """None if the real parser takes ``argv`` (``--help`` included), else its error message."""
    from rollout_queue.cli import build_parser
    from rollout_queue.workers.cli import build_parser as worker_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            (worker_parser() if which == "worker" else build_parser()).parse_args(argv)
    except SystemExit as exc:
        return None if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("source", COMMAND_SOURCES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_documented_command_line_parses(source: Path) -> None:
    """Each `rollout-queue ...` (and `python -m rollout_queue[.workers] ...`) line that a doc, an
    example, a script or an image writes is taken by the real parser: a complete line as written, an
    inline mention but for the required arguments or an option's value it leaves out."""
    bad = []
    for line, complete in command_lines(source):
        which, argvs = argv_alternatives(line)
        for argv in argvs:
            error = parse_error(which, argv)
            mention = not complete and error is not None and (
                "the following arguments are required" in error or error.endswith("expected one argument"))
            if error is not None and not mention:
                bad.append(f"`{line}` ({' '.join(argv)}): {error}")
    assert not bad, f"{source.relative_to(REPO)}:\n  " + "\n  ".join(bad)


def test_the_command_lines_are_found() -> None:
    """Not vacuous: the forms the docs use are among the lines checked."""
    lines = {line for source in COMMAND_SOURCES for line, _ in command_lines(source)}
    for expected in ("rollout-queue worker --engine torch --model ./tiny --max-tokens 16 --temperature 1.0",
                     "rollout-queue worker --engine torch --model ./tiny --max-tokens 16 &",
                     "rollout-queue dlq requeue --all --yes", "python -m rollout_queue.workers --engine vllm",
                     "rollout-queue --help", "python -m rollout_queue --queue bench-trl worker -- --engine torch"):
        assert any(expected in line for line in lines), expected
