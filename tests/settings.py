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

# The processes a test starts (tests/conftest.py's worker_env says so) serve no page: the admin
# stays installed (its tables, the demo's migrations) but is not discovered, so the app's own
# admin modules and their imports are never loaded. A child starts on less CPU that way, and
# starting children is what a full run spends most of its CPU on.
if os.environ.get("RESOURCE_LEASE_TEST_CHILD"):
    INSTALLED_APPS = [
        "django.contrib.admin.apps.SimpleAdminConfig" if app == "django.contrib.admin" else app
        for app in INSTALLED_APPS
    ]
    ROOT_URLCONF = "tests.child_urls"

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

# An alias whose database answers only after a while (tests/test_database_late.py's child
# process): the test database, reached through a port the test starts forwarding later
# (SQLite: through a directory link the test creates later).
if os.environ.get("RESOURCE_LEASE_TEST_LATE"):
    _late = {**DATABASES["default"], "OPTIONS": {**DATABASES["default"]["OPTIONS"]}}
    if _late["ENGINE"].endswith("sqlite3"):
        _late["NAME"] = os.path.join(os.environ["RESOURCE_LEASE_TEST_LATE"], os.path.basename(str(_late["NAME"])))
    else:
        _late["HOST"], _late["PORT"] = "127.0.0.1", os.environ["RESOURCE_LEASE_TEST_LATE"]
    DATABASES["late"] = _late
