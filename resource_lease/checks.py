"""System checks for the misconfigurations that would otherwise fail at 3 a.m."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import connections

from resource_lease.conf import LeaseSettings, lease_settings
from resource_lease.db import SUPPORTED_VENDORS

#: MySQLdb.constants.CLIENT.FOUND_ROWS (the MySQL protocol's CLIENT_FOUND_ROWS), without
#: importing the driver on other vendors.
_MYSQL_CLIENT_FOUND_ROWS = 2


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
    alias = lease_settings.DATABASE
    if alias not in settings.DATABASES:
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
        if alias == lease_settings.DATABASE and not any(v in engine for v in ("mysql", "postgresql", "sqlite3")):
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
        if "sqlite3" in engine and alias == lease_settings.DATABASE:
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
