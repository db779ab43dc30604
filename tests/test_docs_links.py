"""Every relative markdown link of the documentation points to a file that exists and, with an anchor, to a heading.

Pages move sections between them (a page keeps its current evidence, ``docs/history/`` the dated history); a link
to a moved heading then lands at the top of the page without a word. Anchors follow GitHub's slugs: the heading's
text lowercased, every character but letters, digits, spaces, ``-`` and ``_`` dropped, spaces turned to ``-``, and
``-1``, ``-2`` ... appended to repeated headings. Links inside code (fenced blocks, inline spans) are not links.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted({ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *(ROOT / "docs").rglob("*.md")})
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+).*?\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text: ``"`make demo`: the smoke grid"`` -> ``"make-demo-the-smoke-grid"``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def outside_code(text: str) -> list[str]:
    """The page's lines, those of fenced code blocks (and the fences) blanked, so that line numbers stay."""
    lines, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"^\s*(```+|~~~+)", line)
        if marker:
            fence = None if fence and marker.group(1)[0] == fence else (fence or marker.group(1)[0])
        lines.append("" if marker or fence else line)
    return lines


def anchors(page: Path) -> set[str]:
    """Every anchor a page has: its headings' slugs (with GitHub's suffixes for repeats) and HTML anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in outside_code(page.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    """``"page:line: target (why)"`` for each relative link of ``page`` that does not resolve."""
    problems = []
    for number, line in enumerate(outside_code(page.read_text(encoding="utf-8")), start=1):
        for target in LINK.findall(INLINE_CODE.sub(" ", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not resolved.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where} (no heading with that anchor in {resolved.relative_to(ROOT)})")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_a_heading(page: Path):
    assert broken_links(page) == []


@pytest.mark.parametrize(("heading", "expected"), [
    ("`make demo`: the smoke grid", "make-demo-the-smoke-grid"),
    ("Second GPU run (2026-11-27, one NVIDIA H200)", "second-gpu-run-2026-11-27-one-nvidia-h200"),
    ("The label gap against the texture's variation (2026-11-24)", "the-label-gap-against-the-textures-variation-2026-11-24"),
    ("`npsemiseg run`: time to the first step (2026-11-23)", "npsemiseg-run-time-to-the-first-step-2026-11-23"),
    ("U2PL seed 1: one exploding step", "u2pl-seed-1-one-exploding-step"),
    ("snake_case and -dashes-", "snake_case-and--dashes-"),
])
def test_slugs_follow_github(heading: str, expected: str):
    assert slug(heading) == expected


def test_a_moved_heading_and_a_missing_file_are_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The check is not vacuous: a link to a heading that is gone, or to a file that is gone, is reported; a link in
    code is not a link; a repeated heading gets GitHub's ``-1`` suffix."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "history.md").write_text("# History\n\n## Old run (2026-11-21)\n\n## Old run (2026-11-21)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Current\n\n[ok](#current) [ok](history.md#old-run-2026-11-21) [ok](history.md#old-run-2026-11-21-1)\n"
        "[moved](#old-run-2026-11-21) [gone](nothing.md) `[code](nothing.md)`\n\n```\n[fenced](nothing.md)\n```\n")
    assert broken_links(page) == [
        "page.md:6: #old-run-2026-11-21 (no heading with that anchor in page.md)",
        "page.md:6: nothing.md (no such file)",
    ]
