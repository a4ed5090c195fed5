"""Settings for fault workers: the test settings, plus the faults a scenario injects into
the user's own Django connection (never the engine's), chosen through the environment.

- ``FAULTS_USER_INIT_COMMAND``: the MySQL ``init_command`` of the user's connection (e.g. a
  session time zone that is not UTC).
- ``FAULTS_USER_ISOLATION``: the MySQL isolation level of the user's connection.
- ``FAULTS_LEASE_SETTINGS``: JSON merged into ``RESOURCE_LEASE``.
"""

from __future__ import annotations

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, RESOURCE_LEASE

_options = DATABASES["default"].setdefault("OPTIONS", {})
if os.environ.get("FAULTS_USER_INIT_COMMAND"):
    _options["init_command"] = os.environ["FAULTS_USER_INIT_COMMAND"]
if os.environ.get("FAULTS_USER_ISOLATION"):
    _options["isolation_level"] = os.environ["FAULTS_USER_ISOLATION"]
if os.environ.get("FAULTS_LEASE_SETTINGS"):
    RESOURCE_LEASE.update(json.loads(os.environ["FAULTS_LEASE_SETTINGS"]))
