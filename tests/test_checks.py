"""System checks and settings: misconfiguration is reported, settings are read lazily."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from resource_lease import acquire
from resource_lease.checks import check_databases, check_settings, check_vendor_static
from resource_lease.db.settings import database_from_url


def ids(messages: list) -> list[str]:
    return [m.id for m in messages]


def test_clean_settings_pass() -> None:
    assert check_settings() == []
    assert check_vendor_static() == []


@override_settings(USE_TZ=False)
def test_use_tz_off_is_an_error() -> None:
    assert "resource_lease.E001" in ids(check_settings())


@override_settings(RESOURCE_LEASE={"TTL": 5, "TTLL": 5})
def test_unknown_setting_keys_are_an_error_naming_them() -> None:
    (message,) = check_settings()
    assert message.id == "resource_lease.E004"
    assert "TTLL" in message.msg


@override_settings(RESOURCE_LEASE={"DATABASE": "elsewhere"})
def test_lease_database_must_exist() -> None:
    assert "resource_lease.E003" in ids(check_settings())


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
@override_settings(DATABASES={"default": {"ENGINE": "django.db.backends.oracle", "NAME": "x"}})
def test_unsupported_database_is_an_error() -> None:
    assert "resource_lease.E002" in ids(check_vendor_static())


def _mysql(options: dict) -> dict:
    return {"default": {"ENGINE": "django.db.backends.mysql", "NAME": "x", "OPTIONS": options}}


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_mysql_client_flag_without_found_rows_is_a_warning() -> None:
    with override_settings(DATABASES=_mysql({"client_flag": 0x10000})):  # MULTI_STATEMENTS only
        (message,) = check_vendor_static()
    assert message.id == "resource_lease.W003" and "'default'" in message.msg
    with override_settings(DATABASES=_mysql({"client_flag": 0x10000 | 2})):  # with FOUND_ROWS
        assert check_vendor_static() == []
    with override_settings(DATABASES=_mysql({})):
        assert check_vendor_static() == []


@pytest.mark.django_db
def test_mysql_session_time_zone_not_utc_is_a_warning() -> None:
    if connection.vendor != "mysql":
        assert check_databases(databases=["default"]) == []
        return
    assert check_databases(databases=["default"]) == []
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+05:00'")
    try:
        assert ids(check_databases(databases=["default"])) == ["resource_lease.W001"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")


def test_settings_are_read_lazily(make_pool) -> None:
    make_pool("proxy", 1)
    with override_settings(RESOURCE_LEASE={"TTL": 7.5}):
        lease = acquire("proxy")
    assert lease.ttl == 7.5


def test_database_from_url_sets_up_each_vendor(tmp_path) -> None:
    mysql = database_from_url("mysql://u:p@db:3306/app")
    assert mysql["ENGINE"] == "django.db.backends.mysql"
    assert mysql["OPTIONS"]["init_command"] == "SET time_zone = '+00:00'"
    sqlite = database_from_url(f"sqlite:///{tmp_path}/app.sqlite3", test_dir=tmp_path)
    assert sqlite["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    assert "journal_mode=WAL" in sqlite["OPTIONS"]["init_command"]
    assert sqlite["TEST"]["NAME"] == str(tmp_path / "test_app.sqlite3")
    pg = database_from_url("postgres://u@db:5432/app")
    assert pg["ENGINE"] == "django.db.backends.postgresql"
