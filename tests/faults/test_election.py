"""Elections under faults: candidates whose wall clocks are hours off (libfaketime), and a
MySQL session time zone not UTC on their own connections.

Leadership is judged by the database server's clock only, and a leader trusts it by its
monotonic clock; so candidates at +5h, -7h and on time hand leadership over as if their
clocks agreed: never two leaders (the leadership ledger of tests/leadership.py), the
hand-over state passed exactly. SIGKILL and SIGSTOP of a leader are in tests/test_election.py
and tests/test_leader_only.py, on every database.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests import leadership
from tests.conftest import worker_env
from tests.faults.harness import LIBFAKETIME, duration, faketime_env

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not LIBFAKETIME.exists(), reason=f"libfaketime is not installed ({LIBFAKETIME})"),
]

USER_TZ = "SET time_zone = '+05:45'"


@pytest.fixture(autouse=True)
def _not_sqlite() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's clock is each client's own wall clock: skewed clients disagree by design")


def test_election_with_skewed_client_clocks(
    spawn_worker: Callable[..., subprocess.Popen[str]], tmp_path: Path, figures: Callable[..., Any]
) -> None:
    """Four candidates at +5h, -7h, +0 and +0 (each leading 0.4 s, then resigning): one that
    judged expiry by its own clock would take a live leadership (+5h) or never take one (-7h)."""
    seconds = duration(6.0)
    procs = []
    for offset in ("+5h", "-7h", "+0", "+0"):
        env = faketime_env(offset)
        if connection.vendor == "mysql":
            env |= {"DJANGO_SETTINGS_MODULE": "tests.faults.settings", "FAULTS_USER_INIT_COMMAND": USER_TZ}
        args = ["--name", tmp_path.name, "--dir", str(tmp_path), "--ttl", "2", "--seconds", str(seconds)]
        procs.append(spawn_worker("tests.procs.campaigner", *args, "--lead", "0.4", env=worker_env(**env)))
    for proc in procs:
        assert proc.wait(timeout=seconds + 90) == 0
    verdict = leadership.check(tmp_path)
    leaders = {worker for worker, lines in leadership.events(tmp_path).items() if any(f[1] == "ELECTED" for f in lines)}
    figures(
        "5-clocks-election",
        seconds=seconds,
        candidates=4,
        leaderships=verdict.leaderships,
        candidates_that_led=len(leaders),
        violations=verdict.violations,
    )
    assert verdict.leaderships >= 5, "too few hand-overs for the check to mean anything"
    assert verdict.violations == 0, verdict.summary()
    assert len(leaders) >= 3, "skewed candidates never led: they judged expiry by their own clocks"
