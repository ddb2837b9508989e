"""The docs are the front page and the contract, so they are checked like code (no Redis needed).

- README.md stays a front page: at most ~200 lines, with the two commands CI and newcomers run.
- Every relative link in README.md, docs/*.md and benchmarks/README.md resolves to a file inside the
  repository, and every #anchor to a heading of that file; no doc points outside the clone (the
  contract used to live at ../shared/DESIGN.md: a clone must carry its own).
- Every benchmark table is what scripts/bench_tables.py renders from benchmarks/results.json.
"""

from __future__ import annotations

import re
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
    """docs/integrations/trl.md's code is examples/trl_grpo.py, the script the TRL test runs."""
    shown = {}
    for doc in DOCS:
        for m in CODE_OF.finditer(doc.read_text()):
            shown[m.group(1)] = (doc, m.group(2))
    assert "examples/trl_grpo.py" in shown
    for path, (doc, code) in shown.items():
        assert code == (REPO / path).read_text(), f"{doc.relative_to(REPO)} shows an old copy of {path}"
