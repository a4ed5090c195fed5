"""Test settings: the demo project's, plus what makes tests fast and worker processes find
the test database (pytest-django creates it; children are told its name)."""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, RESOURCE_LEASE

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests of the audit trail turn it on themselves; elsewhere a writer thread would hold a
# connection to the test database while it is dropped.
RESOURCE_LEASE = {**RESOURCE_LEASE, "AUDIT": False}

# The processes a test starts (tests/conftest.py's worker_env says so) need no admin: without it
# and what serves only it, a child starts on about a quarter less CPU (0.6 s instead of 0.8 s
# here), and starting children is what a full run spends most of its CPU on.
ADMIN_ONLY = (
    "admin_interface",
    "colorfield",
    "django.contrib.admin",
    "django.contrib.staticfiles",
    "django.contrib.messages",
)
if os.environ.get("RESOURCE_LEASE_TEST_CHILD"):
    INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in ADMIN_ONLY]

# Worker processes started by a test connect to that test's database.
_test_db = os.environ.get("RESOURCE_LEASE_TEST_DB_NAME")
if _test_db:
    DATABASES["default"]["NAME"] = _test_db

# A second alias whose server never answers (tests/test_database_down.py's child process):
# the same vendor as the test database, on a port nothing listens on (SQLite: a file in a
# directory that does not exist).
if os.environ.get("RESOURCE_LEASE_TEST_DOWN_ALIAS"):
    _down = {**DATABASES["default"], "HOST": "127.0.0.1", "PORT": "1", "OPTIONS": {**DATABASES["default"]["OPTIONS"]}}
    if _down["ENGINE"].endswith("sqlite3"):
        _down["NAME"] = "/nonexistent-resource-lease-dir/down.sqlite3"
    else:
        _down["NAME"] = "down"
        _down["OPTIONS"]["connect_timeout"] = 5
    DATABASES["down"] = _down
