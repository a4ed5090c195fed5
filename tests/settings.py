"""Test settings: the demo project's, plus what makes tests fast and worker processes find
the test database (pytest-django creates it; children are told its name)."""

from __future__ import annotations

import os

from project.settings import *  # noqa: F403
from project.settings import DATABASES, RESOURCE_LEASE

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Tests of the audit trail turn it on themselves; elsewhere a writer thread would hold a
# connection to the test database while it is dropped.
RESOURCE_LEASE = {**RESOURCE_LEASE, "AUDIT": False}

# Worker processes started by a test connect to that test's database.
_test_db = os.environ.get("RESOURCE_LEASE_TEST_DB_NAME")
if _test_db:
    DATABASES["default"]["NAME"] = _test_db
