"""PostgreSQL: the engine's own sessions read ``timestamptz`` with psycopg's compiled loader,
not the Python one Django registers on each connection (``db.postgresql.load_timestamps_natively``:
about 7 µs a value, four or five values a grant), and only where the two give the same values:
a session in UTC.

What a grant reads through them is what Django reads of the same row: the same instants, aware,
with ``datetime.timezone.utc``. Negative control: a session in another time zone keeps Django's
loader (psycopg's would give datetimes in that zone).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.db.connections import close_connections, lease_connection
from resource_lease.models import Resource

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="Django's loader of timestamptz is PostgreSQL's"),
]

COLUMNS = ("busy_before", "acquired_at", "renewed_at", "created_at")


def _timestamptz_loader(raw: Any) -> type:
    import psycopg

    return raw.adapters.get_loader(psycopg.adapters.types["timestamptz"].oid, psycopg.pq.Format.TEXT)


def test_a_grant_reads_its_times_natively_as_django_reads_them(make_pool: Any) -> None:
    close_connections()  # a session opened by this test, set up as every engine session is
    make_pool("native-times", 1)
    lease = acquire("native-times", ttl=30)
    try:
        engine_session = lease_connection("default").wrapper.connection
        assert _timestamptz_loader(engine_session).__module__.startswith("psycopg_binary")
        connection.ensure_connection()
        assert "django" in _timestamptz_loader(connection.connection).__module__  # Django's own, untouched
        stored = Resource.objects.get(pk=lease.resource.pk)  # through Django's connection and loader
        for column in COLUMNS:
            granted, read = getattr(lease.resource, column), getattr(stored, column)
            assert granted == read, column
            assert granted.tzinfo is dt.UTC and read.tzinfo is dt.UTC, column
        assert lease.expires_at == stored.busy_before and lease.expires_at.tzinfo is dt.UTC
    finally:
        lease.release()
        close_connections()


def test_a_session_in_another_time_zone_keeps_djangos_loader() -> None:
    import psycopg
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    from resource_lease.db.postgresql import load_timestamps_natively

    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as raw:
        register_tzloader(dt.UTC, raw)  # as Django does on each connection
        djangos = _timestamptz_loader(raw)
        raw.execute("SET TIME ZONE 'Europe/Paris'")
        load_timestamps_natively(raw)
        # Control: kept. The two loaders disagree here (Django's labels the session's local
        # time UTC: it relies on the session being in Django's zone), so no swap is safe.
        assert _timestamptz_loader(raw) is djangos
        raw.execute("SET TIME ZONE 'UTC'")
        load_timestamps_natively(raw)
        assert _timestamptz_loader(raw).__module__.startswith("psycopg_binary")
        native = raw.execute("SELECT statement_timestamp()").fetchone()[0]  # type: ignore[index]
        assert native.tzinfo is dt.UTC
