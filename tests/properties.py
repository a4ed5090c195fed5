"""Generated inputs (Hypothesis) for the public entry points: the strategies, the CI budget,
the contract's own rules for what must be accepted, a snapshot of every table of the app
(to prove a refusal wrote nothing) and the tally of examples per entry point, printed at the
end of the run (tests/conftest.py's terminal summary).

The budget: ``RESOURCE_LEASE_HYPOTHESIS_EXAMPLES`` scales every test's number of examples
(default 1: the CI run, each test its own fixed count; 10 for a long run). The examples are
derandomized (the same on every run, so CI is reproducible) and no example database is
kept (``database=None``: nothing under .hypothesis/ to commit).
"""

from __future__ import annotations

import math
import os
import unicodedata
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.apps import apps
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# -- the budget ------------------------------------------------------------------------------


def scale() -> float:
    raw = os.environ.get("RESOURCE_LEASE_HYPOTHESIS_EXAMPLES", "").strip()
    if not raw:
        return 1.0
    value = float(raw)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"RESOURCE_LEASE_HYPOTHESIS_EXAMPLES must be a number > 0, got {raw!r}")
    return value


def budget(examples: int) -> settings:
    """The settings of one property test: ``examples`` examples in CI (times the scale)."""
    return settings(
        max_examples=max(1, round(examples * scale())),
        deadline=None,  # a database round trip on a loaded machine is no failure
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- the tally -------------------------------------------------------------------------------

#: (entry point, "accepted" | "refused") -> examples run, across the session.
TALLY: Counter[tuple[str, str]] = Counter()


def tally(entry: str, accepted: bool) -> None:
    TALLY[(entry, "accepted" if accepted else "refused")] += 1


def tally_lines() -> list[str]:
    entries = sorted({entry for entry, _ in TALLY})
    return [
        f"{entry}: {TALLY[(entry, 'accepted')] + TALLY[(entry, 'refused')]} examples"
        f" ({TALLY[(entry, 'accepted')]} accepted, {TALLY[(entry, 'refused')]} refused)"
        for entry in entries
    ]


# -- text ------------------------------------------------------------------------------------

#: Characters that databases are known to treat specially: NUL, blanks of every kind, a lone
#: surrogate, case pairs that fold differently (ß, ſ, the Kelvin sign, dotless i), a combining
#: accent (NFD) and its composed form (NFC), astral characters (4-byte UTF-8), quotes and
#: backslashes (SQL and JSON paths), the line separators JSON escapes.
SPECIAL = [
    "\x00",
    " ",
    "\t",
    "\n",
    "\u00a0",
    "\u3000",
    "\u200b",
    "\ud800",
    "ß",
    "ſ",
    "\u212a",
    "ı",
    "İ",
    "\u0301",
    "é",
    "😀",
    "𝔘",
    "\U0010ffff",
    "'",
    '"',
    "\\",
    "%",
    "_",
    "\u2028",
    "\x7f",
    "\ufeff",
]

any_character = st.one_of(
    st.sampled_from(SPECIAL),
    st.characters(exclude_categories=()),  # every code point, lone surrogates too
    st.characters(codec="ascii"),
)


#: Any character the contract accepts in text (no NUL, no lone surrogate).
clean_character = st.one_of(
    st.sampled_from([c for c in SPECIAL if c not in ("\x00", "\ud800")]),
    st.characters(exclude_characters="\x00"),  # lone surrogates are excluded by default
)


#: What no text may hold: NUL (PostgreSQL refuses it, the others keep it) and lone surrogates
#: (UTF-8 cannot encode them).
poison = st.sampled_from(["\x00", "\ud800", "\udfff"])


def clean_text(max_size: int = 20) -> st.SearchStrategy[str]:
    """Text the contract accepts (any script, no NUL, no lone surrogate)."""
    return st.text(clean_character, max_size=max_size)


def text(max_size: int = 20) -> st.SearchStrategy[str]:
    """Short text of any script, with the special characters often: text the contract
    accepts, the same with NUL or a lone surrogate somewhere in it, or anything at all."""
    clean = st.text(clean_character, max_size=max_size // 2)
    return st.one_of(
        st.text(clean_character, max_size=max_size),
        st.builds(lambda a, p, b: a + p + b, clean, poison, clean),
        st.text(any_character, max_size=max_size),
    )


def mostly(valid: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid`` seven times in eight, else ``wild``: with several arguments drawn at once,
    enough calls have all of them valid to test what an accepted call does."""
    return st.integers(0, 7).flatmap(lambda i: wild if i == 0 else valid)


def long_text(limit: int) -> st.SearchStrategy[str]:
    """Text right at, just under and just over ``limit`` characters, or 10,000 of them, of
    one character (astral ones too: 4 bytes each in UTF-8)."""
    lengths = st.sampled_from(sorted({limit - 1, limit, limit + 1, 10_000}))
    return st.builds(lambda c, n: (c * n)[:n], st.sampled_from(["a", "é", "😀", "Z ", "\u3000"]), lengths)


def names(limit: int) -> st.SearchStrategy[Any]:
    """A name: mostly text the contract accepts (any script, at the length limit too), else
    text with NUL or a lone surrogate, past the limit, or something else callers pass by
    mistake."""
    return mostly(
        st.one_of(st.text(clean_character, max_size=20), long_text(limit)),
        st.one_of(text(), long_text(limit), st.sampled_from(NOT_TEXT)),
    )


#: What callers pass instead of text.
NOT_TEXT: list[Any] = [None, 5, b"proxy", ["proxy"], 1.5, True]


def variants(value: str) -> list[str]:
    """Strings a case- or accent-blind, space-padding or normalising comparison would take
    for ``value``; the ones that differ from it."""
    found = {
        value.upper(),
        value.lower(),
        value.casefold(),
        value + " ",
        value.rstrip(" "),
        " " + value,
        unicodedata.normalize("NFC", value),
        unicodedata.normalize("NFD", value),
        unicodedata.normalize("NFKC", value),
    }
    return sorted(v for v in found if v != value and v)


# -- numbers ---------------------------------------------------------------------------------

#: A number of seconds, or what callers pass instead: zero, negatives, NaN, infinities, huge
#: ints, bools, strings, None.
seconds_like = st.one_of(
    st.floats(min_value=0.05, max_value=1e9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 0.0, -0.0, 1e9, 1e9 + 1, 2**63, True, False, "5", None, math.nan, math.inf, -math.inf]),
)

#: A valid ttl (None: the default) long enough to outlive a slow test, and a valid timeout
#: (None: for ever). ``seconds_like`` has the short ones (a grant may expire before its release).
good_ttl = st.one_of(st.floats(min_value=5, max_value=1e9), st.integers(5, 10**9), st.none())
good_timeout = st.one_of(st.just(0), good_ttl)

huge_ints = st.one_of(st.integers(), st.sampled_from([2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**63, -(2**63) - 1]))


def seconds_ok(value: Any, *, allow_zero: bool = False, allow_none: bool = False) -> bool:
    """The contract for ttl, timeout, poll: a finite number (no bool), > 0 (>= 0 for a
    timeout), at most MAX_SECONDS; None where a default or "for ever" applies."""
    from resource_lease.validation import MAX_SECONDS

    if value is None:
        return allow_none
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if not math.isfinite(value) or value > MAX_SECONDS:
        return False
    return value > 0 or (allow_zero and value == 0)


def text_ok(value: Any, limit: int, *, blank: bool = False) -> bool:
    """The contract for a kind, name or holder: a str of 1..limit characters (not only
    blanks unless ``blank``), no NUL, encodable as UTF-8 (no lone surrogates)."""
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        return False
    if not blank and not value.strip():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- JSON ------------------------------------------------------------------------------------

#: Floats JSON writers and readers disagree on: past 1e16 Python writes an exponent (PostgreSQL's
#: jsonb then reads an integer back), -0.0, the smallest subnormal, the largest exact ints.
#: (-0.0 is refused: PostgreSQL's jsonb reads it back as 0.0.)
tricky_floats = st.sampled_from([1e16, 1.5e300, 5e-324, 1e-7, 0.1, 2.0**53 + 1, float(2**63), 1e22])


def _not_negative_zero(value: float) -> bool:
    return not (value == 0.0 and math.copysign(1.0, value) < 0)


#: JSON scalars the contract accepts (finite floats but -0.0, text without NUL or lone surrogates)...
good_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    huge_ints,
    st.floats(allow_nan=False, allow_infinity=False).filter(_not_negative_zero),
    tricky_floats,
    clean_text(),
)
#: ... and any, NaN, infinities, -0.0, NUL and lone surrogates included.
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    huge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    tricky_floats,
    st.just(-0.0),
    text(),
)
#: Dict keys JSON writers turn into text silently (the contract refuses them).
wild_keys = st.one_of(text(8), st.sampled_from([None, 1, True, 1.5]))


def json_trees(leaves: st.SearchStrategy[Any], keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
        max_leaves=12,
    )


#: A JSON payload: mostly one the contract accepts (nested lists and dicts of any scalars),
#: else one with NaN, infinity, NUL or a lone surrogate somewhere inside.
json_values = mostly(json_trees(good_json_scalars, clean_text(8)), json_trees(json_scalars, wild_keys))


def json_ok(value: Any, depth: int = 0) -> bool:
    """The contract for a JSON payload: JSON of dicts with str keys, lists, str, ints, finite
    floats but -0.0, bools and None, lists and dicts nested at most 30 deep; no NUL and no
    lone surrogate anywhere (keys too)."""
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return math.isfinite(value) and _not_negative_zero(value)
    if isinstance(value, str):
        return text_ok(value, 10**9, blank=True) or value == ""
    if isinstance(value, (list, dict)) and depth >= 30:
        return False
    if isinstance(value, list):
        return all(json_ok(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_ok(k) and json_ok(v, depth + 1) for k, v in value.items())
    return False


def same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values, types included: 1 is not 1.0 nor True; floats equal as floats."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return bool(a == b)


# -- nothing written -------------------------------------------------------------------------


def app_tables() -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the app, in primary-key order: what a refusal must leave
    as it was (a stronger check than counting rows)."""
    snapshot = {}
    for model in apps.get_app_config("resource_lease").get_models():
        if model._meta.proxy or not model._meta.managed:
            continue
        fields = [f.attname for f in model._meta.concrete_fields]
        snapshot[model._meta.db_table] = list(model._default_manager.order_by("pk").values_list(*fields))
    return snapshot


def row_counts() -> dict[str, int]:
    return {table: len(rows) for table, rows in app_tables().items()}


@contextmanager
def refused(argument: str) -> Iterator[None]:
    """The block must raise a ValueError that names ``argument``, and write nothing."""
    before = app_tables()
    try:
        yield
    except ValueError as exc:
        assert argument in str(exc), f"the ValueError does not name {argument!r}: {exc}"
    else:
        raise AssertionError(f"accepted, though {argument!r} breaks the contract")
    after = app_tables()
    changed = sorted(t for t in before if before[t] != after[t])
    assert not changed, f"a refused call wrote to {changed}"


@contextmanager
def refused_any(arguments: list[str]) -> Iterator[None]:
    """As ``refused``, when several arguments are bad: the error names one of them."""
    before = app_tables()
    try:
        yield
    except ValueError as exc:
        assert any(a in str(exc) for a in arguments), f"the ValueError names none of {arguments}: {exc}"
    else:
        raise AssertionError(f"accepted, though {arguments} break the contract")
    after = app_tables()
    changed = sorted(t for t in before if before[t] != after[t])
    assert not changed, f"a refused call wrote to {changed}"


def bad_arguments(checks: dict[str, bool]) -> list[str]:
    return [name for name, ok in checks.items() if not ok]


def delete_everything() -> None:
    """Empty the app's tables between two examples (the test database is flushed only after
    the test), and forget the rows the engine believes exist."""
    from resource_lease import named

    for model in apps.get_app_config("resource_lease").get_models():
        if not model._meta.proxy and model._meta.managed:
            model._default_manager.all().delete()
    with named._known_lock:
        named._known.clear()
