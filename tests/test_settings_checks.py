"""RESOURCE_LEASE values checked once, at start-up, each error naming its setting (E010,
E011); an SQLite lease database not set up for several processes warned about (W011)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from resource_lease import LeaseError, acquire
from resource_lease.checks import check_setting_values, check_settings, check_sqlite_concurrency
from resource_lease.conf import RULES, LeaseSettings, lease_settings
from resource_lease.db.settings import database_from_url
from tests.conftest import REPO

BAD = [
    ("TTL", "30", "must be a number of seconds, got '30'"),
    ("TTL", 0, "must be > 0 seconds"),
    ("TTL", float("nan"), "must be finite"),
    ("TTL", True, "must be a number of seconds"),
    ("DATABASE", 5, "must be a database alias"),
    ("RENEW_FRACTION", 1, "must be > 0 and < 1"),
    ("RENEW_FRACTION", 1.5, "must be > 0 and < 1"),
    ("RENEW_FRACTION", 0, "must be > 0 and < 1"),
    ("SAFETY_MARGIN", -0.1, "must be >= 0 and < 1"),
    ("SAFETY_MARGIN_MAX", -1, "must be >= 0 seconds"),
    ("BACKOFF_BASE", -0.5, "must be > 0 seconds"),
    ("BACKOFF_MAX", "1s", "must be a number of seconds"),
    ("LINE_POLL", 0, "must be > 0 seconds"),
    ("LINE_POLL_MAX", float("inf"), "must be finite"),
    ("TRANSIENT_RETRIES", -1, "must be >= 0"),
    ("TRANSIENT_RETRIES", 2.5, "must be a whole number"),
    ("LOCK_WAIT_TIMEOUT", float("inf"), "must be finite"),
    ("QUARANTINE_SECONDS", 1e12, "must be at most 1e+09 seconds"),
    ("DISPENSER_TTL", 0, "must be > 0 seconds"),
    ("PROBE_REFRESH", -0.5, "must be >= 0 seconds"),
    ("AUDIT", "yes", "must be True or False"),
    ("PREPARED_STATEMENTS", 1, "must be True or False"),
    ("AUDIT_FLUSH_INTERVAL", 0, "must be > 0 seconds"),
    ("AUDIT_MAX_BUFFERED", 0, "must be >= 1"),
    ("AUDIT_RETENTION_DAYS", -30, "must be > 0 days"),
    ("DATA_KEYS", "region", "must be a list or tuple of keys"),
    ("DATA_KEYS", ["region", "url"], "must not name 'url'"),
    ("DATA_KEYS", ["a", "b", "c", "d", "e"], "must name at most 4 keys"),
    ("DATA_KEYS", ['re"gion'], "must hold non-empty strings"),
]


def test_every_setting_has_a_rule() -> None:
    assert set(RULES) == LeaseSettings.known_keys()
    assert {key for key, _, _ in BAD} == LeaseSettings.known_keys()


@pytest.mark.parametrize(("key", "value", "says"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_a_bad_value_is_an_error_naming_the_setting(key: str, value: Any, says: str) -> None:
    with override_settings(RESOURCE_LEASE={key: value}):
        errors = check_setting_values()
        assert [e.id for e in errors] == ["resource_lease.E010"]
        assert errors[0].msg.startswith(f"RESOURCE_LEASE[{key!r}] {says}")
        # A process that runs no checks (a Celery worker) gets the same sentence at the read.
        with pytest.raises(LeaseError, match=re.escape(f"RESOURCE_LEASE[{key!r}] {says}")):
            getattr(lease_settings, key)


def test_good_values_pass() -> None:
    good = {"TTL": 10, "RENEW_FRACTION": 0.5, "SAFETY_MARGIN": 0, "SAFETY_MARGIN_MAX": 0, "TRANSIENT_RETRIES": 0}
    with override_settings(RESOURCE_LEASE=good):
        assert check_setting_values() == []
        assert lease_settings.TTL == 10


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"RENEW_FRACTION": 0.95}, ["RENEW_FRACTION", "SAFETY_MARGIN"]),
        ({"RENEW_FRACTION": 0.6, "SAFETY_MARGIN": 0.5}, ["RENEW_FRACTION", "SAFETY_MARGIN"]),
        ({"BACKOFF_BASE": 2, "BACKOFF_MAX": 1}, ["BACKOFF_MAX", "BACKOFF_BASE"]),
        ({"LINE_POLL": 2, "LINE_POLL_MAX": 1}, ["LINE_POLL_MAX", "LINE_POLL"]),
    ],
)
def test_values_that_do_not_fit_together_are_an_error_naming_both(values: dict, names: list[str]) -> None:
    with override_settings(RESOURCE_LEASE=values):
        (error,) = check_setting_values()
    assert error.id == "resource_lease.E011"
    for name in names:
        assert f"RESOURCE_LEASE[{name!r}]" in error.msg


@override_settings(RESOURCE_LEASE={"DATABASE": 5})
def test_the_other_checks_survive_a_bad_database_value() -> None:
    assert check_settings() == []  # E010 reports it; E003 does not crash on it
    assert [e.id for e in check_setting_values()] == ["resource_lease.E010"]


@pytest.mark.django_db
def test_acquire_with_a_bad_ttl_setting_names_the_setting(make_pool: Any) -> None:
    make_pool("proxy", 1)
    with override_settings(RESOURCE_LEASE={"TTL": "30"}), pytest.raises(LeaseError, match=r"RESOURCE_LEASE\['TTL'\]"):
        acquire("proxy")


def test_manage_py_check_fails_naming_the_setting(tmp_path: Path) -> None:
    settings_module = tmp_path / "bad_settings.py"
    settings_module.write_text("from tests.settings import *\nRESOURCE_LEASE = {'TTL': '30', 'RENEW_FRACTION': 1}\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bad_settings", "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "resource_lease.E010" in proc.stderr and "RESOURCE_LEASE['TTL'] must be a number" in proc.stderr
    assert "RESOURCE_LEASE['RENEW_FRACTION'] must be > 0 and < 1" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- SQLite shared by several processes -------------------------------------------------------


def _sqlite(tmp_path: Path, **options: Any) -> dict[str, Any]:
    return {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "x.sqlite3"), "OPTIONS": options}
    }


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_without_wal_timeout_or_immediate_is_a_warning_with_the_fix(tmp_path: Path) -> None:
    with override_settings(DATABASES=_sqlite(tmp_path, timeout=0)):
        (warning,) = check_sqlite_concurrency()
    assert warning.id == "resource_lease.W011"
    assert "not in WAL mode" in warning.msg and "busy timeout of 0s" in warning.msg and "IMMEDIATE" in warning.msg
    assert '"transaction_mode": "IMMEDIATE"' in warning.hint and "journal_mode=WAL" in warning.hint


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_sqlite_set_up_for_several_processes_passes(tmp_path: Path) -> None:
    conf = database_from_url(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    with override_settings(DATABASES={"default": conf}):
        assert check_sqlite_concurrency() == []
    # Only IMMEDIATE missing: one problem named, not three.
    options = {k: v for k, v in conf["OPTIONS"].items() if k != "transaction_mode"}
    with override_settings(DATABASES=_sqlite(tmp_path, **options)):
        (warning,) = check_sqlite_concurrency()
    assert "IMMEDIATE" in warning.msg
    assert "not in WAL mode" not in warning.msg and "busy timeout" not in warning.msg


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_sqlite_file_already_in_wal_mode_needs_no_init_command(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "x.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL").fetchone()
    db.close()
    with override_settings(DATABASES=_sqlite(tmp_path, transaction_mode="IMMEDIATE")):
        assert check_sqlite_concurrency() == []


# -- the settings' shape, at first use (a Celery worker or a script runs no checks) ------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("user", "says"),
    [
        ({"TTl": 5}, r"unknown key 'TTl' \(did you mean 'TTL'\?\)"),
        ({"TTL": 5, "RENEW_FRACTON": 0.3}, r"unknown key 'RENEW_FRACTON' \(did you mean 'RENEW_FRACTION'\?\)"),
        ({"COLOUR": "blue"}, r"unknown key 'COLOUR' \(known keys: AUDIT, "),
        (["TTL", 5], r"RESOURCE_LEASE must be a dict, got list"),
        ("TTL=5", r"RESOURCE_LEASE must be a dict, got str"),
    ],
)
def test_a_typo_or_a_non_dict_fails_the_first_use_naming_the_key(make_pool: Any, user: Any, says: str) -> None:
    make_pool("proxy", 1)
    with override_settings(RESOURCE_LEASE=user), pytest.raises(ImproperlyConfigured, match=says):
        acquire("proxy")
    assert acquire("proxy").release()  # nothing was written: the resource is free


def test_the_system_check_suggests_the_close_match() -> None:
    with override_settings(RESOURCE_LEASE={"TTl": 5}):
        (message,) = check_settings()
    assert message.id == "resource_lease.E004" and "did you mean 'TTL'?" in (message.hint or "")


def test_a_script_with_a_typo_fails_instead_of_using_the_defaults(tmp_path: Path) -> None:
    settings_module = tmp_path / "typo_settings.py"
    settings_module.write_text("from tests.settings import *\nRESOURCE_LEASE = {'TTl': 5}\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "typo_settings", "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    code = "import django; django.setup()\nfrom resource_lease.conf import lease_settings\nprint(lease_settings.TTL)\n"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout  # before: printed 30.0, the default
    assert "LeaseConfigError: RESOURCE_LEASE has an unknown key 'TTl' (did you mean 'TTL'?)" in proc.stderr
