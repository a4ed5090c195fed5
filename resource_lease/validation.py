"""Argument checks shared by the public API: a bad value is a ValueError naming it."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any

from django.conf import settings

#: The longest ttl, timeout or quarantine accepted, in seconds (about 31 years). Longer ones
#: put an expiry past what the databases and Python's datetime hold (year 9999): MySQL and
#: SQLite fail the statement, PostgreSQL commits a grant that can never be read back
#: (see docs/pitfalls.md#value-limits).
MAX_SECONDS = 1e9


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
    a non-empty string of at most 200 characters without NUL."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > 200:
        raise ValueError(f"{name} must be at most 200 characters, got {len(value)}")
    return check_text(value, name)


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
