"""Settings for worker processes of the Patroni tests (tests/test_patroni.py): DATABASE_URL
lists the cluster's three nodes with ``target_session_attrs=read-write``.
``RESOURCE_LEASE_PATRONI_LINE_POLL`` (seconds) sets both LINE_POLL and LINE_POLL_MAX: with a
minute, a waiter in line is served promptly only if a release's NOTIFY wakes it, which is how
the tests tell that the LISTEN connection found the new primary after a failover."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import RESOURCE_LEASE

_poll = os.environ.get("RESOURCE_LEASE_PATRONI_LINE_POLL")
if _poll:
    RESOURCE_LEASE = {**RESOURCE_LEASE, "LINE_POLL": float(_poll), "LINE_POLL_MAX": float(_poll)}
