"""The databases under test: aliases or URLs, their tables, their benchmark rows.

A target is a Django database alias the benchmark's own process uses (to migrate, seed and
read), plus a URL that its worker processes get as ``DATABASE_URL``. A URL becomes an extra
alias of this process; an alias gets a URL built from its settings (so ``--database default``
inside a test run points the workers at the test database).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connections

from resource_lease.db.settings import database_from_url
from resource_lease.models import LeaseEvent, Resource, Waiter

#: Every benchmark row has a kind starting with this; they are deleted before and after a run.
KIND_PREFIX = "lease-bench:"

_SCHEMES = {"mysql": "mysql", "postgresql": "postgres", "sqlite3": "sqlite"}
_aliases = itertools.count()


def kind_for(scenario: str) -> str:
    return f"{KIND_PREFIX}{scenario}"


@dataclass
class Target:
    alias: str
    url: str
    #: Short, stable name used in file names and JSON keys: mariadb, mysql, postgresql, sqlite.
    key: str = ""
    #: For people: "MariaDB 10.11.19".
    label: str = ""
    vendor: str = ""

    def describe(self) -> None:
        """Connect and fill in vendor, key and label (raises DatabaseError if it cannot)."""
        connection = connections[self.alias]
        connection.ensure_connection()
        self.vendor = connection.vendor
        self.key = connection.display_name.lower()
        version = ".".join(str(part) for part in connection.get_database_version())
        self.label = f"{connection.display_name} {version}"


def url_from_alias(alias: str) -> str:
    """A DATABASE_URL for worker processes that reaches the same database as ``alias``."""
    config: dict[str, Any] = connections[alias].settings_dict
    engine = str(config["ENGINE"]).rsplit(".", 1)[-1]
    scheme = _SCHEMES.get(engine)
    if scheme is None:
        raise ValueError(f"database {alias!r} uses {config['ENGINE']}, which the benchmark does not support")
    name = str(config["NAME"])
    if scheme == "sqlite":
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ValueError(f"database {alias!r} is in memory: worker processes cannot share it")
        return f"sqlite:///{Path(name).resolve()}"
    user = quote(str(config.get("USER") or ""), safe="")
    password = quote(str(config.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    host = str(config.get("HOST") or "")
    port = f":{config['PORT']}" if config.get("PORT") else ""
    return f"{scheme}://{credentials}{host}{port}/{quote(name, safe='')}"


def resolve(item: str) -> Target:
    """An alias of settings.DATABASES, or a URL (mysql://, postgres://, sqlite:///path)."""
    item = item.strip()
    if "://" not in item:
        if item not in connections.settings:
            known = ", ".join(connections.settings)
            raise ValueError(f"--database: {item!r} is neither a URL nor a database alias ({known})")
        return Target(alias=item, url=url_from_alias(item))
    try:
        config = database_from_url(item)
    except Exception as exc:
        raise ValueError(f"--database: cannot read the URL {item!r}: {exc}") from exc
    alias = f"lease_bench_{next(_aliases)}"
    configured = connections.configure_settings({"default": connections.settings["default"], alias: config})
    connections.settings[alias] = configured[alias]
    settings.DATABASES[alias] = configured[alias]
    return Target(alias=alias, url=item)


def prepare(target: Target) -> None:
    """Create the lease table if needed and remove rows an interrupted run left behind."""
    call_command("migrate", "resource_lease", database=target.alias, verbosity=0, interactive=False)
    clean(target)


def clean(target: Target) -> None:
    """Delete every benchmark row (one retry on a fresh connection: the server may have restarted)."""
    try:
        _delete(target)
    except DatabaseError:
        connections[target.alias].close()
        _delete(target)


def _delete(target: Target) -> None:
    Resource.objects.using(target.alias).filter(kind__startswith=KIND_PREFIX).delete()
    # Named locks of the benchmark (the lock scenarios' rows are "@lock" rows named with the prefix).
    Resource.objects.using(target.alias).filter(kind="@lock", name__startswith=KIND_PREFIX).delete()
    Waiter.objects.using(target.alias).filter(kind__startswith=KIND_PREFIX).delete()
    Waiter.objects.using(target.alias).filter(kind="@lock", name__startswith=KIND_PREFIX).delete()
    # The audit trail's events of benchmark resources (written with --audit).
    LeaseEvent.objects.using(target.alias).filter(kind__startswith=KIND_PREFIX).delete()


def seed(target: Target, kind: str, n: int) -> list[int]:
    """Make the pool of ``kind`` exactly n free resources (adding rows as needed); its ids."""
    rows = Resource.objects.using(target.alias).filter(kind=kind)
    have = rows.count()
    if have > n:
        rows.delete()
        have = 0
    if have < n:
        Resource.objects.using(target.alias).bulk_create(
            (Resource(kind=kind, name=f"r{i:07d}", data={"n": i}) for i in range(have, n)), batch_size=2000
        )
    return list(rows.order_by("pk").values_list("pk", flat=True)[:64])
