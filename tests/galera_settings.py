"""Settings for worker processes of the Galera tests: DATABASE_URL lists the cluster's nodes
(tests/test_galera.py starts each worker with its own order), and the alias ``other`` is the
same cluster through a different first node, so a lease taken through one node can be renewed
and released through another."""

from __future__ import annotations

import os

from resource_lease.db.settings import database_from_url
from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

_other = os.environ.get("RESOURCE_LEASE_GALERA_OTHER_URL")
if _other:
    DATABASES["other"] = database_from_url(_other)
