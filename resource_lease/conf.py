"""Settings: one dict, ``settings.RESOURCE_LEASE``, read lazily with typed defaults.

Values are read from Django's settings on first use and cached until ``RESOURCE_LEASE``
changes (``override_settings`` sends ``setting_changed``), so tests can override them and
the acquire path pays a dictionary lookup per read. A ``RESOURCE_LEASE`` that is not a dict,
or has an unknown key (a typo: ``{"TTl": 5}``), is reported by the system check
``resource_lease.E004`` and fails the first read of any setting (``LeaseConfigError``, an
``ImproperlyConfigured``, naming the key and the known key it most likely meant); every value is checked once, by the system checks
``resource_lease.E010`` (a bad value, named) and ``E011`` (values that do not fit together),
and again when first read (``LeaseConfigError`` naming the setting), so a process that runs
no checks (a Celery worker) fails as clearly.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from resource_lease.exceptions import LeaseConfigError


class LeaseSettings:
    #: Seconds a lease lasts without renewal when ``acquire()`` is given no ttl.
    TTL: float = 30.0
    #: Database alias used when ``acquire()`` is given no ``using``.
    DATABASE: str = "default"
    #: Fraction of the ttl between two background renewals.
    RENEW_FRACTION: float = 1 / 3
    #: A holder stops trusting its lease this fraction of the ttl before the
    #: local deadline (capped by SAFETY_MARGIN_MAX seconds).
    SAFETY_MARGIN: float = 0.1
    SAFETY_MARGIN_MAX: float = 2.0
    #: First and largest pause (seconds) between attempts of the waits that are not a line
    #: (a barrier waiting for its members, a group member name waiting for its old holder).
    BACKOFF_BASE: float = 0.02
    BACKOFF_MAX: float = 1.0
    #: Seconds between two looks at its line of the first waiter, where the database cannot
    #: wake it (MySQL/MariaDB, SQLite; a look is one indexed read): a freed row reaches it
    #: about this late. A waiter with n places ahead of it looks every (n + 1) x this, at most
    #: LINE_POLL_MAX apart. Waiters in the same process are woken at once everywhere, and on
    #: PostgreSQL a release wakes them (NOTIFY).
    LINE_POLL: float = 0.005
    #: The longest pause between two looks of any waiter (PostgreSQL: the fallback for a
    #: NOTIFY missed while the listener reconnected; everywhere: a row freed by an operator, a
    #: lease that expired unreleased is noticed at its expiry).
    LINE_POLL_MAX: float = 1.0
    #: Retries of a statement the database rolled back for a transient reason (deadlock,
    #: serialization failure, a Galera certification conflict; docs/pitfalls.md#read-committed).
    #: A lock wait timeout is not retried: it has already waited LOCK_WAIT_TIMEOUT.
    TRANSIENT_RETRIES: int = 8
    #: Seconds a lease statement may wait for a row lock (MySQL innodb_lock_wait_timeout,
    #: PostgreSQL lock_timeout) so a renewal cannot hang past its ttl
    #: (docs/pitfalls.md#lock-wait).
    LOCK_WAIT_TIMEOUT: float = 5.0
    #: Seconds a thread keeps its sample of a kind's free resource ids, which ``acquire()``
    #: tries by primary key before it scans the pool (see ``resource_lease.db.picking``): a new
    #: resource is tried by probes at most this long after it was added (the scan finds it
    #: at once), and on MySQL/MariaDB, where a probed row's name and data come from the
    #: sample, a changed payload is returned at most this long after the change (quarantine
    #: and disabling count at once everywhere). 0 turns probing off: every acquire scans,
    #: least recently used first.
    PROBE_REFRESH: float = 1.0
    #: The engine's own connections have the server parse and plan each lease statement
    #: once per connection, not on every execution (PostgreSQL: psycopg's server-side
    #: binding and prepared statements, unless the alias's OPTIONS choose
    #: ``server_side_binding`` or ``prepare_threshold`` themselves; MariaDB: the probe's grant
    #: and the release, by SQL ``PREPARE``). Turn off behind a pooler or proxy that cannot
    #: carry prepared statements (PgBouncer in transaction mode before 1.21, ProxySQL).
    #: Your own connections keep Django's settings.
    PREPARED_STATEMENTS: bool = True
    #: Seconds a dispenser's claim lasts unless renewed, when ``Dispenser`` (or a ``Worker``)
    #: is given no ttl: work items take longer than a lease's critical section.
    DISPENSER_TTL: float = 300.0
    #: Default quarantine length (seconds) for a resource found invalid.
    QUARANTINE_SECONDS: float = 3600.0
    #: Keep an audit trail of lease events (``LeaseEvent``): grants, take-overs, releases,
    #: losses and operators' actions. Off by default: a busy pool writes two rows per lease.
    AUDIT: bool = False
    #: Seconds between two batch writes of the audit trail's background thread.
    AUDIT_FLUSH_INTERVAL: float = 1.0
    #: Events kept in memory at most while the database cannot take them; beyond, new
    #: events are dropped (and the drop is logged) rather than slowing the lease path.
    AUDIT_MAX_BUFFERED: int = 10_000
    #: Age (days) beyond which ``manage.py prune_lease_events`` deletes events by default.
    AUDIT_RETENTION_DAYS: float = 30.0
    #: Keys of the resources' ``data`` that operators see and filter by (e.g. ``("region",)``):
    #: a column and a filter by value each in the admin's Resources list, a column each in
    #: ``inspect_pool``. Only these: the admin accepts no other lookup on ``data``, and never
    #: one on ``url`` (its password is masked).
    DATA_KEYS: tuple[str, ...] = ()

    def __getattribute__(self, name: str) -> Any:
        if not name.isupper():
            return object.__getattribute__(self, name)
        # Resolved once and cached on the instance until RESOURCE_LEASE changes.
        cache = object.__getattribute__(self, "__dict__")
        if name not in cache:
            user = getattr(settings, "RESOURCE_LEASE", None)
            if "_shape_checked" not in cache:
                # A typo ({"TTl": 5}) or a non-dict fails at first use too, not only in
                # ``manage.py check``: a Celery worker or a script runs no checks.
                problem = shape_problem(user)
                if problem is not None:
                    raise LeaseConfigError(problem)
                cache["_shape_checked"] = True
            user = user or {}
            if name in user:
                problem = value_problem(name, user[name])
                if problem is not None:
                    raise LeaseConfigError(f"RESOURCE_LEASE[{name!r}] {problem}")
                cache[name] = user[name]
            else:
                cache[name] = getattr(type(self), name)
        return cache[name]

    def reload(self) -> None:
        """Forget the cached values (done automatically when RESOURCE_LEASE changes)."""
        self.__dict__.clear()

    @classmethod
    def known_keys(cls) -> set[str]:
        return {key for key in vars(cls) if key.isupper()}


lease_settings = LeaseSettings()


def unknown_key_problem(key: Any) -> str:
    """``RESOURCE_LEASE`` has the unknown key ``key``: the phrase naming it, with the known key
    it most likely meant (a different case, a typo) when there is one."""
    known = sorted(LeaseSettings.known_keys())
    text = str(key)
    guess = next((name for name in known if name == text.upper()), None)
    if guess is None:
        close = difflib.get_close_matches(text.upper(), known, n=1, cutoff=0.6)
        guess = close[0] if close else None
    hint = f" (did you mean {guess!r}?)" if guess else f" (known keys: {', '.join(known)})"
    return f"RESOURCE_LEASE has an unknown key {key!r}{hint}"


def shape_problem(user: Any) -> str | None:
    """What is wrong with ``settings.RESOURCE_LEASE`` as a whole (not a dict, an unknown key),
    or None. Shared by the system check E004 and the first read of a setting."""
    if user is None:
        return None
    if not isinstance(user, dict):
        return f"RESOURCE_LEASE must be a dict, got {type(user).__name__} {user!r:.80}"
    unknown = sorted((key for key in user if key not in LeaseSettings.known_keys()), key=str)
    if unknown:
        return "; ".join(unknown_key_problem(key) for key in unknown)
    return None


# -- validation: one rule per key, shared by the system checks and the lazy read --------------

#: The most seconds any duration setting may be (about 31 years, as ``validation.MAX_SECONDS``).
_MAX_SECONDS = 1e9


def _number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {value!r} ({type(value).__name__})"
    if not math.isfinite(value):
        return f"must be finite, got {value!r}"
    return None


def _seconds(*, allow_zero: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if (problem := _number(value)) is not None:
            return problem.replace("a number", "a number of seconds")
        if value < 0 or (value == 0 and not allow_zero):
            return f"must be {'>= 0' if allow_zero else '> 0'} seconds, got {value!r}"
        if value > _MAX_SECONDS:
            return f"must be at most {_MAX_SECONDS:g} seconds, got {value!r}"
        return None

    return check


def _fraction(*, low_open: bool, high: float) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if (problem := _number(value)) is not None:
            return problem
        if value < 0 or (low_open and value == 0) or value >= high:
            return f"must be {'>' if low_open else '>='} 0 and < {high:g}, got {value!r}"
        return None

    return check


def _count(*, minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be a whole number, got {value!r} ({type(value).__name__})"
        if value < minimum:
            return f"must be >= {minimum}, got {value!r}"
        return None

    return check


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be True or False, got {value!r} ({type(value).__name__})"


def _alias(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return f"must be a database alias (a non-empty string), got {value!r}"
    return None  # that it is in DATABASES is check E003's


def _days(value: Any) -> str | None:
    if (problem := _number(value)) is not None:
        return problem.replace("a number", "a number of days")
    if value <= 0:
        return f"must be > 0 days, got {value!r}"
    if value * 86400 > _MAX_SECONDS:
        return f"must be at most {_MAX_SECONDS / 86400:.0f} days, got {value!r}"
    return None


#: The most keys ``DATA_KEYS`` may name (each is a column of the Resources list).
MAX_DATA_KEYS = 4


def _data_keys(value: Any) -> str | None:
    if not isinstance(value, (list, tuple)):
        return f"must be a list or tuple of keys of the resources' data, got {value!r} ({type(value).__name__})"
    if len(value) > MAX_DATA_KEYS:
        return f"must name at most {MAX_DATA_KEYS} keys (a column each), got {len(value)}"
    for key in value:
        if not isinstance(key, str) or not key or len(key) > 100 or any(c in key for c in '"\\\x00'):
            return f"must hold non-empty strings of at most 100 characters without '\"' or '\\\\', got {key!r}"
        if key == "url":
            return "must not name 'url': its password is masked, and a filter by it would tell the password"
    if len(set(value)) != len(value):
        return f"must not name a key twice, got {list(value)!r}"
    return None


#: What each key accepts; a key missing here would go unchecked (a test keeps them in step).
RULES: dict[str, Callable[[Any], str | None]] = {
    "TTL": _seconds(),
    "DATABASE": _alias,
    "RENEW_FRACTION": _fraction(low_open=True, high=1),
    "SAFETY_MARGIN": _fraction(low_open=False, high=1),
    "SAFETY_MARGIN_MAX": _seconds(allow_zero=True),
    "BACKOFF_BASE": _seconds(),
    "BACKOFF_MAX": _seconds(),
    "LINE_POLL": _seconds(),
    "LINE_POLL_MAX": _seconds(),
    "TRANSIENT_RETRIES": _count(minimum=0),
    "LOCK_WAIT_TIMEOUT": _seconds(),
    "PROBE_REFRESH": _seconds(allow_zero=True),
    "QUARANTINE_SECONDS": _seconds(),
    "DISPENSER_TTL": _seconds(),
    "PREPARED_STATEMENTS": _bool,
    "AUDIT": _bool,
    "AUDIT_FLUSH_INTERVAL": _seconds(),
    "AUDIT_MAX_BUFFERED": _count(minimum=1),
    "AUDIT_RETENTION_DAYS": _days,
    "DATA_KEYS": _data_keys,
}


def value_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``value`` for ``RESOURCE_LEASE[key]`` (a phrase starting with
    "must"), or None if it is fine or the key is unknown."""
    rule = RULES.get(key)
    return None if rule is None else rule(value)


def combination_problems(user: Mapping[str, Any]) -> list[str]:
    """Values each fine on their own that do not fit together (with the defaults filling in
    keys not given); each message names the settings."""
    values = {key: user.get(key, getattr(LeaseSettings, key)) for key in RULES}
    if any(value_problem(key, value) for key, value in values.items()):
        return []  # reported one by one first
    problems = []
    renew, margin = values["RENEW_FRACTION"], values["SAFETY_MARGIN"]
    if renew >= 1 - margin:
        problems.append(
            f"RESOURCE_LEASE['RENEW_FRACTION'] ({renew:g}) must be below 1 - RESOURCE_LEASE['SAFETY_MARGIN']"
            f" ({1 - margin:g}): auto-renewal would come after the lease stops being trusted, so every lease"
            " would be lost"
        )
    if values["BACKOFF_MAX"] < values["BACKOFF_BASE"]:
        problems.append(
            f"RESOURCE_LEASE['BACKOFF_MAX'] ({values['BACKOFF_MAX']:g}) must be >= RESOURCE_LEASE['BACKOFF_BASE']"
            f" ({values['BACKOFF_BASE']:g})"
        )
    if values["LINE_POLL_MAX"] < values["LINE_POLL"]:
        problems.append(
            f"RESOURCE_LEASE['LINE_POLL_MAX'] ({values['LINE_POLL_MAX']:g}) must be >= RESOURCE_LEASE['LINE_POLL']"
            f" ({values['LINE_POLL']:g})"
        )
    return problems


@receiver(setting_changed)
def _reload_on_change(setting: str, **kwargs: Any) -> None:
    if setting == "RESOURCE_LEASE":
        lease_settings.reload()
