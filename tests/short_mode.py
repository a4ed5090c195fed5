"""CI's short mode (``CI=1``, set by ``.ci/run``): what runs on one backend only there.

The three backends run in parallel on the same two cores, so CI's time is their sum. A test
whose subject does not depend on the database (a broker's redelivery, a checker catching a
deliberately broken primitive) runs on SQLite only in the short mode, and on every backend
otherwise (``scripts/test`` without ``CI``).
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

SHORT = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

#: The backend that runs them in the short mode.
ONE_BACKEND = "sqlite"


def once_across_backends(what: str) -> None:
    """In the short mode, skip ``what`` unless this is the backend that runs it."""
    if SHORT and connection.vendor != ONE_BACKEND:
        pytest.skip(f"{what} does not depend on the database: CI's short mode (CI=1) runs it on {ONE_BACKEND} only")


#: The server backends of the short mode's split (``on_one_server``), by Django vendor.
SERVERS = ("postgresql", "mysql")


def on_one_server(what: str, index: int) -> None:
    """In the short mode, skip ``what`` on the server backend that does not run it: the
    ``index``-th of a set of alike runs goes to one server backend (alternating, PostgreSQL
    first) and to SQLite; outside the short mode every backend runs every one."""
    runs_on = SERVERS[index % len(SERVERS)]
    if SHORT and connection.vendor in SERVERS and connection.vendor != runs_on:
        pytest.skip(
            f"{what}: CI's short mode (CI=1) runs it on {runs_on} and {ONE_BACKEND};"
            " every backend runs it outside the short mode"
        )
