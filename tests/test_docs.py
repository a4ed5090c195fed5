"""docs/pitfalls.md and the code that cites it stay in step.

Comments cite the database facts the code relies on as ``docs/pitfalls.md#<anchor>`` (the
docs as ``pitfalls.md#<anchor>``): every anchor cited must exist, every fact in the document
must be cited by the app, and nothing may cite the numbered "PITFALLS n" list that users of
the app do not have.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PITFALLS = ROOT / "docs" / "pitfalls.md"
CITATION = re.compile(r"(?:docs/)?pitfalls\.md#([a-z0-9-]+)")


def anchors() -> list[str]:
    return re.findall(r'<a id="([a-z0-9-]+)"></a>', PITFALLS.read_text())


def sources() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("resource_lease", "project", "tests", "scripts"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ""))
    return [p for p in files if "__pycache__" not in p.parts]


def citations() -> dict[str, set[str]]:
    """``{anchor: {file cited from, ...}}`` over the repository's code and docs."""
    found: dict[str, set[str]] = {}
    for path in sources():
        for anchor in CITATION.findall(path.read_text(errors="replace")):
            found.setdefault(anchor, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_cited_anchor_exists() -> None:
    known = set(anchors())
    missing = {anchor: sorted(where) for anchor, where in citations().items() if anchor not in known}
    assert not missing, f"cited but not in docs/pitfalls.md: {missing}"


def test_anchors_are_unique_and_listed_in_the_contents() -> None:
    names = anchors()
    assert len(names) >= 15 and len(names) == len(set(names)), names
    text = PITFALLS.read_text()
    assert [a for a in names if f"](#{a})" not in text] == [], "every section belongs in the list at the top"


def test_every_fact_is_cited_by_the_app() -> None:
    cited = citations()
    uncited = [a for a in anchors() if not any(w.startswith("resource_lease/") for w in cited.get(a, ()))]
    assert not uncited, f"no module of resource_lease/ cites these sections: {uncited}"


def test_nothing_cites_the_numbered_list_users_do_not_have() -> None:
    stale = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for path in sources()
        if path != Path(__file__).resolve()
        for match in re.finditer(r"\bPITFALLS(?:\.md)?(?: \d+)?", path.read_text(errors="replace"))
    ]
    assert not stale, stale


def test_no_user_facing_text_speaks_of_the_seed() -> None:
    """ "The seed" was the team's word for the hand-written MySQL/ZooKeeper/Redis code the app
    replaces; a user does not know it. The docs, the code's docstrings and the demos say what
    was there instead (a MySQL lock record, a ZooKeeper watch, the Redis TaskDispenser)."""
    jargon = re.compile(r"\bthe seed\b|\bseed's\b|\bseed document\b|^\|\s*seed\s*\|", re.IGNORECASE | re.MULTILINE)
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)!r}"
        for path in sources()
        if path != Path(__file__).resolve()
        for match in jargon.finditer(path.read_text(errors="replace"))
    ]
    assert not found, found
