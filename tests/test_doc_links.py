"""Every relative link of README.md, CHANGELOG.md and docs/*.md resolves: the file, and the
``#anchor`` in a Markdown file (a heading as GitHub slugs it, or an ``<a id>``). The README
became a front page that links to everything else, so a page moved or a heading renamed
must not leave a dead link. The negative control gives the same check a tree with a missing
file, a missing anchor and a missing image."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCED = re.compile(r"```.*?```", re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but - and _ dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.*)$", FENCED.sub("", text), re.M):
        s = slug(heading)
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    return found | set(re.findall(r'<a id="([^"]+)"', text))


def broken_links(root: Path) -> list[str]:
    pages = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]
    broken = []
    for page in (p for p in pages if p.exists()):
        text = INLINE_CODE.sub("", FENCED.sub("", page.read_text()))
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target) or target.startswith("//"):
                continue  # http:, mailto:, ...
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{where} (no such anchor)")
    return broken


def test_every_relative_link_resolves() -> None:
    assert broken_links(ROOT) == []


def test_the_check_finds_dead_links(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some part\n")
    (tmp_path / "README.md").write_text(
        "[fine](docs/a.md#some-part) [gone](docs/b.md) [renamed](docs/a.md#old-part) ![pic](docs/p.png)\n"
        "`[not a link](docs/c.md)`\n"
    )
    assert broken_links(tmp_path) == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#old-part (no such anchor)",
        "README.md: docs/p.png (no such file)",
    ]
