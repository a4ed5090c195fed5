"""Kinds and names compare exactly on every database: case and trailing spaces count.

On MySQL/MariaDB the default collations (the test database's is utf8mb4_unicode_ci, as a
user's would be) ignore both; the migration's ExactCollation fixes the columns and the
system check resource_lease.W010 warns when they are not exact.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from resource_lease import NoResourceAvailable, acquire
from resource_lease.checks import check_exact_collation
from resource_lease.db.collation import collation_sql, inexact_columns
from resource_lease.models import LeaseEvent, Resource

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_kind_in_other_case_or_with_a_trailing_space_is_another_kind(make_pool: Any) -> None:
    make_pool("proxy", 1)
    for other in ("PROXY", "Proxy", "proxy ", "proxy  "):
        with pytest.raises(NoResourceAvailable) as error:
            acquire(other, ttl=5)
        assert error.value.exists is False, f"{other!r} leased a resource of kind 'proxy'"
    lease = acquire("proxy", ttl=5)
    assert lease.resource.kind == "proxy"
    lease.release()


def test_names_that_differ_in_case_or_trailing_space_do_not_collide() -> None:
    Resource.objects.create(kind="proxy", name="p1")
    Resource.objects.create(kind="PROXY", name="p1")
    Resource.objects.create(kind="proxy", name="P1")
    Resource.objects.create(kind="proxy", name="p1 ")
    assert Resource.objects.filter(kind="proxy", name="p1").count() == 1
    assert sorted(Resource.objects.filter(kind="proxy").values_list("name", flat=True)) == ["P1", "p1", "p1 "]
    with pytest.raises(IntegrityError), transaction.atomic():
        Resource.objects.create(kind="proxy", name="p1")  # the exact same pair still collides


def test_the_audit_trail_filters_kinds_exactly() -> None:
    LeaseEvent.objects.create(at="2026-01-01T00:00:00Z", event="granted", kind="proxy", name="a")
    LeaseEvent.objects.create(at="2026-01-01T00:00:00Z", event="granted", kind="PROXY", name="a")
    assert LeaseEvent.objects.filter(kind="proxy").count() == 1


def test_the_check_passes_on_the_migrated_tables() -> None:
    assert check_exact_collation(databases=["default"]) == []
    assert inexact_columns(connection, Resource._meta.db_table, ["kind", "name"]) == {}


def test_the_check_warns_when_a_column_is_case_blind_again() -> None:
    table = Resource._meta.db_table
    width = Resource._meta.get_field("kind").max_length
    if connection.vendor == "postgresql":
        # PostgreSQL's defaults are exact; a case-insensitive ICU collation is not.
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE COLLATION IF NOT EXISTS rl_test_ci (provider = icu, locale = 'und-u-ks-level2', "
                "deterministic = false)"
            )
            cursor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "kind" TYPE varchar({width}) COLLATE rl_test_ci')
        try:
            (warning,) = check_exact_collation(databases=["default"])
        finally:
            with connection.cursor() as cursor:
                # Back as the migration made it (a narrower column broke later tests' long kinds).
                cursor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "kind" TYPE varchar({width}) COLLATE "default"')
                cursor.execute("DROP COLLATION rl_test_ci")
        assert warning.id == "resource_lease.W010" and "kind (rl_test_ci)" in warning.msg
        assert check_exact_collation(databases=["default"]) == []
        return
    if connection.vendor == "mysql":
        # What a hand-made ALTER TABLE (or a table created before the migration) leaves.
        loose = collation_sql(connection, table, [Resource._meta.get_field("kind")], collation="utf8mb4_unicode_ci")
        exact = collation_sql(connection, table, [Resource._meta.get_field("kind")])
        with connection.cursor() as cursor:
            for sql in loose:
                cursor.execute(sql)
        try:
            (warning,) = check_exact_collation(databases=["default"])
            Resource.objects.create(kind="proxy", name="p1")
            with pytest.raises(IntegrityError), transaction.atomic():
                Resource.objects.create(kind="PROXY", name="p1")  # what the migration prevents
        finally:
            with connection.cursor() as cursor:
                for sql in exact:
                    cursor.execute(sql)
        assert warning.id == "resource_lease.W010"
        assert "kind (utf8mb4_unicode_ci)" in warning.msg and "name" not in warning.msg.split("compares")[1][:30]
        assert check_exact_collation(databases=["default"]) == []
    else:  # SQLite: a table whose kind column is COLLATE NOCASE
        with connection.cursor() as cursor:
            cursor.execute('CREATE TABLE "rl_loose" ("id" integer PRIMARY KEY, "kind" varchar(100) COLLATE NOCASE)')
        try:
            assert inexact_columns(connection, "rl_loose", ["kind"]) == {"kind": "NOCASE"}
        finally:
            with connection.cursor() as cursor:
                cursor.execute('DROP TABLE "rl_loose"')
