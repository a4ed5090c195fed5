"""A database that is down: every command and public entry point says so in one error that
names the alias and what failed (connecting, not settling a lost answer), never with a
driver's traceback. The alias ``down`` (tests/settings.py) has the test database's vendor on
a port nothing listens on; tests/procs/down.py makes every call in one child process."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO, worker_env
from tests.procs.down import CALLS, COMMANDS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def results(django_db_blocker: Any) -> dict[str, dict[str, Any]]:
    with django_db_blocker.unblock():
        env = worker_env(RESOURCE_LEASE_TEST_DOWN_ALIAS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.procs.down"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    # Commands by their place in COMMANDS (their file arguments are temporary files).
    found = {}
    for i, line in enumerate(proc.stdout.splitlines()):
        row = json.loads(line)
        found[row["call"] if "call" in row else str(i)] = row
    return found


@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=[f"{i}-{a[0]}" for i, a in enumerate(COMMANDS)])
def test_a_command_says_it_cannot_connect_naming_the_alias_without_a_traceback(
    results: dict[str, dict[str, Any]], index: int
) -> None:
    row = results[str(index)]
    assert row["status"] == 1, row
    assert row["stderr"].startswith("CommandError: cannot connect to database 'down' ("), row["stderr"]
    assert "Traceback" not in row["stderr"] and "Traceback" not in row["stdout"]


def test_a_wait_that_failed_so_is_observed_as_an_error(results: dict[str, dict[str, Any]]) -> None:
    # acquire() twice and the holder's acquire: their waits ended in DatabaseUnavailable.
    assert results["metrics"]["errors"] == 3


@pytest.mark.parametrize("name", list(CALLS))
def test_an_entry_point_raises_database_unavailable_naming_the_alias(
    results: dict[str, dict[str, Any]], name: str
) -> None:
    row = results[name]
    assert row["raised"] == "DatabaseUnavailable", row
    assert row["alias"] == "down"
    assert row["message"].startswith("cannot connect to database 'down' ("), row["message"]
    # Never reached, so there was no answer to lose nor a grant to settle.
    assert "settling" not in row["message"] and "lost the connection" not in row["message"]
