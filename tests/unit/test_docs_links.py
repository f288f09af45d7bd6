"""The README and docs/ stay a short entry point whose every link leads somewhere real.

Documentation drifts silently: a file is moved, a heading renamed, and a link goes
nowhere without any test failing.  So every relative link and image in README.md and
docs/*.md must name a file of this repository (and, with a ``#fragment``, a heading of
that Markdown file), and nothing may point outside the repository: the docs describe
this project alone.  The README is held under 250 lines so that a newcomer reads it in
minutes; the rest belongs in docs/.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"<(?:img|a)\b[^>]*\b(?:src|href)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _prose(markdown: str) -> str:
    """The text links can live in: fenced blocks and inline code removed."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def links(path: Path) -> list[str]:
    text = _prose(path.read_text(encoding="utf-8"))
    return LINK.findall(text) + HTML_REF.findall(text)


def heading_anchors(path: Path) -> set[str]:
    """The fragments GitHub renders for a file's headings (duplicates get -1, -2, ...)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def documents() -> list[Path]:
    return [README, *DOCS]


def test_docs_folder_exists_and_holds_the_moved_documents():
    names = {path.name for path in DOCS}
    assert {"design.md", "operations.md", "invariants.md", "cli.md", "benchmarks.md"} <= names


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_to_a_file_or_heading_inside_the_repository(document: Path):
    problems = []
    for target in links(document):
        if SCHEME.match(target):
            problems.append(f"{target}: points outside the repository")
            continue
        location, _, fragment = target.partition("#")
        if document == README and location.startswith("../"):
            problems.append(f"{target}: leaves the repository root")
            continue
        if location.startswith("/"):
            problems.append(f"{target}: absolute path")
            continue
        resolved = (document.parent / unquote(location)).resolve() if location else document
        if resolved != REPO and REPO not in resolved.parents:
            problems.append(f"{target}: resolves outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file {resolved.relative_to(REPO)}")
        elif fragment and resolved.suffix == ".md" and fragment not in heading_anchors(resolved):
            problems.append(f"{target}: no heading #{fragment} in {resolved.relative_to(REPO)}")
    assert not problems, f"{document.relative_to(REPO)}:\n  " + "\n  ".join(problems)


def test_readme_shows_the_architecture_picture_and_a_report_screenshot():
    targets = links(README)
    assert "docs/img/architecture.svg" in targets
    assert "docs/img/report.png" in targets


def test_no_document_refers_to_a_design_file_that_is_gone():
    assert not (REPO / "DESIGN.md").exists()
    for document in documents():
        assert "DESIGN.md" not in document.read_text(encoding="utf-8"), document
