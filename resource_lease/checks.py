"""System checks for the misconfigurations that would otherwise fail at 3 a.m."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import connections

from resource_lease.conf import LeaseSettings, combination_problems, value_problem
from resource_lease.db import SUPPORTED_VENDORS

#: MySQLdb.constants.CLIENT.FOUND_ROWS (the MySQL protocol's CLIENT_FOUND_ROWS), without
#: importing the driver on other vendors.
_MYSQL_CLIENT_FOUND_ROWS = 2


def _lease_alias() -> Any:
    """RESOURCE_LEASE["DATABASE"] as given (not through lease_settings, whose read would raise
    on a bad value: E010 reports that)."""
    user = getattr(settings, "RESOURCE_LEASE", None)
    return (user if isinstance(user, dict) else {}).get("DATABASE", LeaseSettings.DATABASE)


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    if not settings.USE_TZ:
        errors.append(
            Error(
                "USE_TZ is off: lease expiries are stored in UTC and compared with the database's clock.",
                hint="Set USE_TZ = True.",
                id="resource_lease.E001",
            )
        )
    user = getattr(settings, "RESOURCE_LEASE", None)
    if user is not None and not isinstance(user, dict):
        errors.append(Error("RESOURCE_LEASE must be a dict.", id="resource_lease.E004"))
        return errors
    unknown = sorted(set(user or {}) - LeaseSettings.known_keys())
    if unknown:
        errors.append(
            Error(
                f"RESOURCE_LEASE has unknown keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(LeaseSettings.known_keys()))}.",
                id="resource_lease.E004",
            )
        )
    alias = _lease_alias()
    if isinstance(alias, str) and alias not in settings.DATABASES:
        errors.append(
            Error(f"RESOURCE_LEASE['DATABASE'] is {alias!r}, which is not in DATABASES.", id="resource_lease.E003")
        )
    return errors


@register(Tags.database)
def check_databases(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run with ``manage.py check --database ALIAS``: vendor and (MySQL) session time zone."""
    errors: list[CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor not in SUPPORTED_VENDORS:
            errors.append(
                Error(
                    f"Database {alias!r} is {connection.vendor!r}; resource_lease supports "
                    f"{', '.join(SUPPORTED_VENDORS)}.",
                    id="resource_lease.E002",
                )
            )
            continue
        if connection.vendor == "mysql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())")
                (offset,) = cursor.fetchone()
            if offset:
                errors.append(
                    CheckWarning(
                        f"Database {alias!r}: the MySQL session time zone is {offset / 3600:+g}h from UTC, so "
                        "NOW() and CURRENT_TIMESTAMP disagree with the UTC datetimes Django stores.",
                        hint='Add "init_command": "SET time_zone=\'+00:00\'" to OPTIONS. (The lease engine '
                        "itself uses UTC_TIMESTAMP and is not affected; your own queries are.)",
                        id="resource_lease.W001",
                    )
                )
    return errors


@register()
def check_vendor_static(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for alias, conf in settings.DATABASES.items():
        engine = conf.get("ENGINE", "")
        if alias == _lease_alias() and not any(v in engine for v in ("mysql", "postgresql", "sqlite3")):
            errors.append(
                Error(
                    f"Database {alias!r} uses {engine!r}; resource_lease supports MySQL/MariaDB, "
                    "PostgreSQL and SQLite.",
                    id="resource_lease.E002",
                )
            )
        client_flag = (conf.get("OPTIONS") or {}).get("client_flag")
        if "mysql" in engine and client_flag is not None and not int(client_flag) & _MYSQL_CLIENT_FOUND_ROWS:
            errors.append(
                CheckWarning(
                    f"Database {alias!r}: OPTIONS['client_flag'] replaces the CLIENT.FOUND_ROWS flag Django "
                    "sets, so UPDATE row counts on your connections (QuerySet.update(), the pool operations' "
                    "counts) report changed rows, not matched rows.",
                    hint="Include MySQLdb.constants.CLIENT.FOUND_ROWS in client_flag. (The lease engine's own "
                    "connections always set it and are not affected.)",
                    id="resource_lease.W003",
                )
            )
        if "sqlite3" in engine and alias == _lease_alias():
            name = str(conf.get("NAME", ""))
            if name in ("", ":memory:"):
                errors.append(
                    CheckWarning(
                        f"Database {alias!r} is an in-memory SQLite database: leases cannot be shared "
                        "between processes.",
                        hint="Use a file, with WAL, a busy timeout and transaction_mode IMMEDIATE.",
                        id="resource_lease.W002",
                    )
                )
    return errors


# -- RESOURCE_LEASE values (E010, E011) --------------------------------------------------------


@register()
def check_setting_values(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every ``RESOURCE_LEASE`` value checked at start-up, each error naming its key."""
    user = getattr(settings, "RESOURCE_LEASE", None)
    if not isinstance(user, dict):
        return []  # E004's
    errors: list[CheckMessage] = []
    for key, value in user.items():
        problem = value_problem(key, value)
        if problem is not None:
            default = getattr(LeaseSettings, key)
            errors.append(
                Error(
                    f"RESOURCE_LEASE[{key!r}] {problem}.",
                    hint=f"The default is {default!r}; see the settings table in the README.",
                    id="resource_lease.E010",
                )
            )
    errors.extend(Error(f"{message}.", id="resource_lease.E011") for message in combination_problems(user))
    return errors


# -- exact names and kinds (W010) -----------------------------------------------------------


@register(Tags.database)
def check_exact_collation(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run with ``manage.py check --database ALIAS`` (and by ``migrate``): the kind and name
    columns compare exactly (case, trailing spaces), as the migration ``ExactCollation`` set."""
    from django.apps import apps
    from django.db import router
    from django.db.utils import DatabaseError

    from resource_lease.db.collation import inexact_columns

    errors: list[CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        for model in apps.get_app_config("resource_lease").get_models():
            fields = getattr(model, "exact_text_fields", ())
            if not fields or model._meta.proxy or not router.allow_migrate_model(alias, model):
                continue
            table = model._meta.db_table
            columns = [str(getattr(model._meta.get_field(name), "column", name)) for name in fields]
            try:
                loose = inexact_columns(connection, table, columns)
            except DatabaseError:
                continue  # no connection or no table yet: migrate first
            if loose:
                listed = ", ".join(f"{column} ({collation})" for column, collation in loose.items())
                errors.append(
                    CheckWarning(
                        f"Database {alias!r}: {table} compares {listed} ignoring case or trailing spaces: "
                        "'PROXY' and 'proxy ' match 'proxy' (acquire('PROXY') leases kind 'proxy'), and names that "
                        "differ only in case collide.",
                        hint="Run `manage.py migrate resource_lease` (its ExactCollation operation sets a binary, "
                        "no-pad collation), or restore it after a hand-made ALTER TABLE.",
                        id="resource_lease.W010",
                    )
                )
    return errors


# -- SQLite shared by several processes (W011) --------------------------------------------------


@register()
def check_sqlite_concurrency(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The lease database on an SQLite file needs WAL, a busy timeout and IMMEDIATE
    transactions once more than one process uses it (workers, the admin, a Celery worker)."""
    from resource_lease.db.sqlite_options import FIX, multiprocess_problems

    alias = _lease_alias()
    conf = settings.DATABASES.get(alias) if isinstance(alias, str) else None
    if not conf:
        return []  # E003's
    problems = multiprocess_problems(conf)
    if not problems:
        return []
    return [
        CheckWarning(
            f"Database {alias!r} is SQLite with {'; '.join(problems)}: leasing from more than one process "
            "will fail with 'database is locked' or stall.",
            hint=f"If more than one process uses it, set {FIX}.",
            id="resource_lease.W011",
        )
    ]
