"""``manage.py demo_http`` (the main job's lease over HTTP), on the test database: clients of
a uvicorn server served in line with no GPU held twice, and a lost lease's command stopped
(the demo checks each itself and fails with a CommandError otherwise)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_http_demo_serves_clients_in_line_and_stops_a_lost_leases_command() -> None:
    proc = subprocess.run(
        [sys.executable, "manage.py", "demo_http", "--clients", "3", "--gpus", "1", "--hold", "0.3"],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "a GPU held by two clients at once: 0 times; fences in order per GPU: True" in out
    assert "exit status 143 (SIGTERM)" in out
