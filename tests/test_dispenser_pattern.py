"""A worker's ``pattern`` is one portable language, checked before anything is sent and
matched alike by every database (issue 37, point 7).

It was checked with Python's ``re`` and matched by each database's own regular expressions:
``job1`` claimed the key ``"job1\\n"`` on MariaDB and SQLite (their ``$`` matches before a
final newline), ``[[:alpha:]]``, ``a{,2}`` and inline flags meant different things, a pattern
the database refused failed only after the worker's own items had their fences raised, and
SQLite's Python REGEXP could stall on a catastrophic pattern. Now a pattern is the subset
literal text, ``.``, ``.*``, ``.+`` and ``\\`` escapes (``db.dispenser.pattern_parts``),
matched as LIKE (SQLite: GLOB) of its translation, and the same in Python (``key_matches``).

Negative control: with the old regular-expression match put back (the check, the
translation and the statements' fragments), the same comparison finds keys the database
claims that the pattern does not match (or the other way round) on every database.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection

from resource_lease import Dispenser
from resource_lease.db import dispenser as item_sql
from resource_lease.db import item_operations
from resource_lease.db.connections import lease_connection
from resource_lease.recipes import dispenser as dispenser_module
from resource_lease.recipes.dispenser import check_pattern, key_matches

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = [
    "job1",
    "job1\n",
    "job12",
    "Job1",
    "\njob1",
    "j%b1",
    "j_b1",
    "j!b1",
    "jxb1",
    "a*b",
    "a[b",
    "a?b",
    "aXb",
    "x.y",
    "xzy",
    "é-cut",
    "a-cut",
    "a-cut ",
    "A-CUT",
    "-cut",
    "x",
    "a",
    "a\\b",
    "😀-cut",
]

#: Patterns of the language, each meaning what Python's re.fullmatch(pattern, key, re.DOTALL)
#: says it means.
PATTERNS = [
    "job1",
    "job1.*",
    "job1.+",
    "j.b1",
    "j%b1",
    "j_b1",
    "j!b1",
    r"a\*b",
    r"a\[b",
    r"a\?b",
    "a.b",
    r"x\.y",
    "x.y",
    ".*-cut",
    ".+-cut",
    "..*",
    ".*",
    ".*b.*",
    ".",
    r"\-cut",
    ".-cut",
    r"a\\b",
]


def python_says(pattern: str) -> set[str]:
    return {key for key in KEYS if re.fullmatch(pattern, key, re.DOTALL)}


REFUSED = [
    "[[:alpha:]]",
    "a{,2}",
    "(?i)job1",
    "job[0-9]",
    r"job\d",
    "job1|job2",
    "(job1)",
    "job1?",
    "job1+",
    "job1*",
    "^job1",
    "job1$",
    "(a+)+b",
    "job1\\",
    r"\1",
]


def claimed_by(pattern: str) -> set[str]:
    dispenser = Dispenser("patterns", ttl=30)
    total, matching = dispenser.unfinished(pattern=pattern)
    items = dispenser.assign("w", limit=len(KEYS), pattern=pattern)
    dispenser.release("w")
    keys = {item.key for item in items}
    assert total == len(KEYS) and matching == len(keys), (pattern, total, matching, keys)
    return keys


@pytest.fixture
def keys() -> None:
    Dispenser("patterns", ttl=30).put(KEYS)


def test_every_database_claims_exactly_what_the_pattern_matches(keys: None) -> None:
    assert python_says("job1") == {"job1"} and python_says(".+-cut") == {"é-cut", "a-cut", "😀-cut"}
    assert python_says("j%b1") == {"j%b1"} and python_says("x.y") == {"x.y", "xzy"}
    for pattern in PATTERNS:
        expected = python_says(pattern)
        assert check_pattern(pattern) == pattern
        assert {key for key in KEYS if key_matches(pattern, key)} == expected, pattern
        assert claimed_by(pattern) == expected, f"{connection.vendor} claims other keys for {pattern!r}"


@pytest.mark.parametrize("pattern", REFUSED)
def test_a_pattern_outside_the_language_is_refused_before_any_claim(keys: None, pattern: str) -> None:
    dispenser = Dispenser("patterns", ttl=30)
    [own] = dispenser.assign("w", limit=1)
    with pytest.raises(ValueError, match="pattern"):
        dispenser.assign("w", limit=5, pattern=pattern)
    assert dispenser.check("w", [own]), "the worker's own item keeps its fence: done() still counts"
    with pytest.raises(ValueError, match="pattern"):
        dispenser.unfinished(pattern=pattern)


def test_the_python_match_does_not_blow_up() -> None:
    pattern = ".*a" * 30 + "b"
    check_pattern(pattern)
    assert not key_matches(pattern, "a" * 255)  # the classic wildcard match: no backtracking blow-up


# -- the negative control: each database's own regular expressions, as before ----------------

OLD_OPERATOR = {"sqlite": "REGEXP", "postgresql": "~", "mysql": "REGEXP"}


def old_check(value: Any, name: str = "pattern") -> str | None:
    if value is not None:
        re.compile(value)
    return value


@pytest.mark.filterwarnings("ignore::FutureWarning")  # "[[:alpha:]]" is a nested set to Python
def test_control_regular_expressions_of_each_database_disagree(keys: None, monkeypatch: pytest.MonkeyPatch) -> None:
    dialect = lease_connection(connection.alias).dialect
    placeholder = dialect.named_placeholder.format("pattern")
    new_match = item_sql.KEY_MATCH[connection.vendor].format(placeholder)
    old_match = f"{OLD_OPERATOR[connection.vendor]} {placeholder}"
    for name in ("ITEM_PATTERN", "ITEM_PATTERN_R", "ITEM_PATTERN_PLUS", "ITEM_MATCHING"):  # filled in per call
        assert new_match in dialect.sql[name]
        monkeypatch.setitem(dialect.sql, name, dialect.sql[name].replace(new_match, old_match))
    monkeypatch.setattr(dispenser_module, "check_pattern", old_check)
    monkeypatch.setattr(item_operations, "vendor_pattern", lambda d, pattern: f"^(?:{pattern})$")
    disagreements = {}
    for pattern, key in [("job1", "job1\n"), ("[[:alpha:]]", "x"), ("a{,2}", "a")]:
        python = bool(re.fullmatch(pattern, key))
        database = key in claimed_by(pattern)
        if database != python:
            disagreements[pattern] = (key, database, python)
    assert disagreements, f"{connection.vendor}: the old regex match agreed with Python: the control shows nothing"
