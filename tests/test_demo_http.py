"""``manage.py demo_http`` (the main job's lease over HTTP), on the test database: clients of
a uvicorn server served in line with no GPU held twice, and a lost lease's command stopped
(the demo checks each itself and fails with a CommandError otherwise)."""

from __future__ import annotations

import pytest

from tests.conftest import run_demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_http_demo_serves_clients_in_line_and_stops_a_lost_leases_command() -> None:
    out = run_demo("demo_http", "--clients", "3", "--gpus", "1", "--hold", "0.3")
    assert "a GPU held by two clients at once: 0 times; fences in order per GPU: True" in out
    assert "exit status 143 (SIGTERM)" in out
