"""Every relative link in the README and docs/ leads somewhere: the file exists, and so does the anchor."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file offers: explicit ``<a id>``s and GitHub's heading slugs."""
    text = path.read_text()
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+\s+(.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_relative_links_resolve():
    broken = []
    for page in [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such anchor)")
    assert broken == []


def test_the_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n[x](missing.md) [y](#title) [z](#nope)\n")
    targets = LINK.findall(page.read_text())
    assert targets == ["missing.md", "#title", "#nope"]
    assert "title" in anchors(page) and "nope" not in anchors(page)
