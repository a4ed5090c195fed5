"""Argument checks and option defaults shared by every entry point of the public API.

A bad value is a ``ValueError`` naming the argument, raised before anything is written. One
function per rule, the same for every caller: ``check_name`` (the name of a lock, election,
group, barrier, dispenser, topic or config), ``encode_json`` (a JSON payload every vendor
stores), ``check_seconds`` / ``check_timeout``, ``check_holder``, and the defaults of the
options every recipe takes (``resolve_ttl``, ``resolve_using``, ``resolve_holder``).
``refuse_inside_single_writer_transaction`` refuses a write on SQLite from inside the
caller's own write transaction (it would wait for itself).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from resource_lease.conf import lease_settings
from resource_lease.db import json_text
from resource_lease.exceptions import LeaseError

#: The longest ttl, timeout or quarantine accepted, in seconds (about 31 years). Longer ones
#: put an expiry past what the databases and Python's datetime hold (year 9999): MySQL and
#: SQLite fail the statement, PostgreSQL commits a grant that can never be read back
#: (see docs/pitfalls.md#value-limits).
MAX_SECONDS = 1e9
#: The longest name of a lock, election, group, barrier, dispenser, topic or config.
MAX_NAME = 200


def check_text(value: str, name: str) -> str:
    """Text every database stores as given: no NUL characters (PostgreSQL refuses them, MySQL
    and SQLite keep them), nothing UTF-8 cannot encode (lone surrogates). See
    docs/pitfalls.md#value-limits."""
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be valid Unicode text (no lone surrogates), got {value!r}") from exc
    return value


def check_kind(kind: Any, name: str = "kind") -> str:
    """A pool's name: non-empty, at most 100 characters, not the reserved ``@`` prefix."""
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError(f"{name} must be a non-empty string, got {kind!r}")
    if len(kind) > 100:
        raise ValueError(f"{name} must be at most 100 characters, got {len(kind)}")
    if kind.startswith("@"):  # models.COORDINATION_PREFIX
        raise ValueError(
            f"{name} must not start with '@' (reserved for the rows of locks, elections and groups), got {kind!r}"
        )
    return check_text(kind, name)


def check_name(value: Any, name: str = "name") -> str:
    """The name of a lock, semaphore, election, group, barrier, dispenser, topic or config:
    a string of at most 200 characters without NUL, not empty nor only blanks (as a kind)."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME:
        raise ValueError(f"{name} must be at most 200 characters, got {len(value)}")
    return check_text(value, name)


def check_target(value: Any, name: str = "target") -> str | None:
    """What a grant is for (``acquire(kind, target=...)``): None, or a non-empty string of at
    most 200 characters (``models.TARGET_MAX``) without NUL."""
    if value is None:
        return None
    return check_name(value, name)


def check_seconds(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """A finite number of seconds, > 0 (or >= 0 with allow_zero) and at most MAX_SECONDS;
    bools and strings refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_SECONDS:g} seconds (about 31 years), got {value!r}")
    return float(value)


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    return None if value is None else check_seconds(value, name, allow_zero=True)


def check_holder(value: Any, name: str = "holder") -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string or None, got {value!r}")
    if len(value) > 255:
        raise ValueError(f"{name} must be at most 255 characters, got {len(value)}")
    return check_text(value, name)


def check_alias(value: Any, name: str = "using") -> str:
    if not isinstance(value, str) or value not in settings.DATABASES:
        known = ", ".join(sorted(settings.DATABASES))
        raise ValueError(f"{name} must name a database in settings.DATABASES ({known}), got {value!r}")
    return value


def check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_callable(value: Any, name: str) -> Callable[..., Any] | None:
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be callable or None, got {value!r}")
    return value


def check_aware(value: Any, name: str) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise ValueError(f"{name} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {value!r}")
    return value


def check_reason(value: Any, name: str = "reason") -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    if len(value) > 500:
        raise ValueError(f"{name} must be at most 500 characters, got {len(value)}")
    return check_text(value, name)


#: The priorities a waiter may have: a 32-bit signed integer (the line's column).
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1
#: The most keys a ``where=`` filter may have, and the longest key.
MAX_WHERE_KEYS = 32
MAX_WHERE_KEY = 200
#: The range of an integer ``where=`` value (what every database's JSON holds exactly).
MIN_WHERE_INT = -(2**63)
MAX_WHERE_INT = 2**63 - 1


def check_priority(value: Any, name: str = "priority") -> int:
    """A waiter's priority: an int (not a bool) in the 32-bit signed range; higher first."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValueError(f"{name} must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value!r}")
    return value


def check_where(value: Any, name: str = "where") -> dict[str, str | int | bool | None] | None:
    """A ``where=`` filter: None, or a dict of at most MAX_WHERE_KEYS keys (non-empty text of
    at most MAX_WHERE_KEY characters, without the double quote or backslash a JSON path
    cannot carry on every database, not starting with '-', which no MariaDB path can name) to the value ``data`` must hold under that key: a string,
    an int (64-bit), a bool or None, compared exactly (type and value: 1 is neither True nor
    1.0). Floats, lists and dicts are refused: the databases' JSON does not compare them alike.
    An empty dict is the same as None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of keys and values the resource's data must have, got {value!r}")
    if len(value) > MAX_WHERE_KEYS:
        raise ValueError(f"{name} must have at most {MAX_WHERE_KEYS} keys, got {len(value)}")
    checked: dict[str, str | int | bool | None] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"{name} keys must be non-empty strings, got {key!r}")
        if len(key) > MAX_WHERE_KEY:
            raise ValueError(f"{name} keys must be at most {MAX_WHERE_KEY} characters, got {len(key)}")
        if '"' in key or "\\" in key:
            raise ValueError(f"{name} keys must not contain '\"' or '\\\\', got {key!r}")
        if key.startswith("-"):
            # MariaDB (10.9+) reads '$."-a"' as a bad path (error 4042) however it is quoted
            # or escaped: no path can name such a key there, so no database takes one.
            raise ValueError(
                f"{name} keys must not start with '-' (MariaDB's JSON paths cannot name them), got {key!r}"
            )
        check_text(key, f"{name} key")
        if isinstance(item, str):
            check_text(item, f"{name}[{key!r}]")
        elif isinstance(item, int) and not isinstance(item, bool):
            if not MIN_WHERE_INT <= item <= MAX_WHERE_INT:
                raise ValueError(f"{name}[{key!r}] must fit in 64 bits, got {item!r}")
        elif item is not None and not isinstance(item, bool):
            raise ValueError(
                f"{name}[{key!r}] must be a string, an integer, a bool or None (compared exactly on every"
                f" database), got {type(item).__name__} {item!r}"
            )
        checked[key] = item
    return checked or None


_MISSING = object()


def where_matches(where: Mapping[str, Any] | None, data: Any) -> bool:
    """Whether a resource's ``data`` satisfies a checked ``where=`` filter, as the database
    judges it (``Dialect.matches_sql``): every key present with a value of the same JSON type
    and value (a bool is not an int, an int is not a float)."""
    if not where:
        return True
    if not isinstance(data, dict):
        return False
    for key, wanted in where.items():
        got = data.get(key, _MISSING)
        if got is _MISSING or type(got) is not type(wanted) or got != wanted:
            return False
    return True


#: The most lists and dicts a JSON value may nest (``[[1]]`` nests 2). MariaDB refuses a
#: document nested 32 deep (its JSON_DEPTH counts the innermost value as a level), and deeper
#: still Python's own ``json`` runs out of recursion: one limit everywhere, with room to
#: spare (docs/pitfalls.md#value-limits).
MAX_JSON_DEPTH = 30


def _json_path(path: tuple[Any, ...]) -> str:
    """Where inside a JSON value: ``['a'][0]``, its first steps only when it is deep."""
    shown = "".join(f"[{step!r}]" for step in path[:6])
    return shown if len(path) <= 6 else f"{shown}...({len(path)} levels down)"


def check_json_value(value: Any, name: str) -> None:
    """The one JSON rule, checked before anything is sent, the same for every entry point
    and every database: ``ValueError`` naming ``name`` (and where inside it) unless every
    dict key is a string (``json`` would turn None, 1 or True into text silently), lists
    and dicts nest at most ``MAX_JSON_DEPTH`` deep, and no float is NaN, an infinity or
    ``-0.0`` (PostgreSQL's ``jsonb`` reads it back as ``0.0``). Walked without recursion,
    so no depth is a ``RecursionError``; a value that contains itself is too deep."""
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(value, (), 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth >= MAX_JSON_DEPTH:
                raise ValueError(
                    f"{name} must not nest lists and dicts more than {MAX_JSON_DEPTH} deep (MariaDB refuses"
                    f" deeper JSON), got deeper at {name}{_json_path(path)}"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise ValueError(
                            f"{name} must have string keys only (JSON would turn {key!r} into text), got"
                            f" {type(key).__name__} key {key!r} in {name}{_json_path(path)}"
                        )
                    stack.append((child, (*path, key), depth + 1))
            else:
                stack.extend((child, (*path, index), depth + 1) for index, child in enumerate(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(
                    f"{name} must not contain NaN or infinity (not JSON), got {item!r} at {name}{_json_path(path)}"
                )
            if item == 0.0 and math.copysign(1.0, item) < 0:
                raise ValueError(
                    f"{name} must not contain -0.0 (PostgreSQL reads it back as 0.0), at {name}{_json_path(path)}"
                )


def encode_json(value: Any, name: str) -> str:
    """``value`` as JSON text that every vendor stores and reads back as given:
    ``check_json_value`` (string keys, at most ``MAX_JSON_DEPTH`` deep, no NaN, infinity
    or -0.0), no NUL character (PostgreSQL's jsonb refuses ``\\u0000``), valid Unicode.
    ``ValueError`` naming ``name`` otherwise (docs/pitfalls.md#value-limits)."""
    check_json_value(value, name)
    try:
        text = json_text.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be JSON-serializable (no NaN or infinity), got {value!r}: {exc}") from exc
    if "\\u0000" in text:
        raise ValueError(f"{name} must not contain NUL characters, got {value!r}")
    return check_text(text, name)


def check_json(value: Any, name: str) -> Any:
    """``value`` itself, once ``encode_json`` has accepted it."""
    encode_json(value, name)
    return value


def check_json_dict(value: Any, name: str) -> dict[str, Any]:
    """A JSON object: a dict with string keys that ``encode_json`` accepts."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict, got {value!r}")
    if not all(isinstance(key, str) for key in value):
        raise ValueError(f"{name} must have string keys, got {sorted(map(repr, value))}")
    return dict(check_json(value, name))


# -- the options every entry point takes ----------------------------------------------------


def resolve_ttl(ttl: Any, default: Any = None) -> float:
    """``ttl`` checked; when None, ``default`` (when None too, the ``TTL`` setting)."""
    if ttl is None:
        ttl = lease_settings.TTL if default is None else default
    return check_seconds(ttl, "ttl")


def resolve_using(using: Any, name: str = "using") -> str:
    """The database alias: ``using`` checked, or the ``DATABASE`` setting."""
    return check_alias(str(lease_settings.DATABASE) if using is None else using, name)


def resolve_holder(holder: Any, default: Callable[[], str]) -> str:
    """``holder`` checked, or ``default()`` (an identity of this process or thread)."""
    return check_holder(holder) or default()


#: Whether each alias's database has a single writer (SQLite), as its dialect says, asked once
#: per alias: the caller's transaction is then looked at only there. Django's ``connections``
#: is an asgiref ``Local``, and that lookup cost every ``acquire()`` some 10-15 us of CPU
#: between its round trips (docs/benchmarks.md, ninth session).
_single_writer: dict[str, bool] = {}


def refuse_inside_single_writer_transaction(alias: str, what: str) -> None:
    """On a single-writer database (SQLite), a write on the engine's own connection from
    inside the caller's open write transaction would wait for that transaction's own lock:
    refuse it clearly instead of hanging for the busy timeout (docs/pitfalls.md#sqlite)."""
    single = _single_writer.get(alias)
    if single is None:
        from resource_lease.db import dialect_class

        single = _single_writer[alias] = dialect_class(connections[alias].vendor).single_writer
    if single and transaction.get_connection(alias).in_atomic_block:
        raise LeaseError(
            f"{what} inside an open transaction on {alias!r}: this database has a single writer, so it would "
            "wait for your own transaction's lock. Call it before entering atomic() (or in transaction.on_commit)."
        )


@dataclass(frozen=True)
class Options:
    """The options an entry point takes (``ttl``, ``using``, ``holder``), checked, with the
    defaults they all share: ``Options.of(ttl=ttl, using=using, ...)``."""

    ttl: float
    using: str
    holder: str = ""

    @classmethod
    def of(
        cls,
        *,
        ttl: Any = None,
        using: Any = None,
        holder: Any = None,
        default_ttl: Any = None,
        default_holder: Callable[[], str] | None = None,
    ) -> Options:
        """``resolve_ttl``, ``resolve_using`` and (given ``default_holder``) ``resolve_holder``."""
        who = "" if default_holder is None else resolve_holder(holder, default_holder)
        return cls(resolve_ttl(ttl, default_ttl), resolve_using(using), who)

    def refuse_in_transaction(self, what: str) -> None:
        """``refuse_inside_single_writer_transaction`` on ``using``."""
        refuse_inside_single_writer_transaction(self.using, what)
