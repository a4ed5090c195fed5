"""``manage.py demo_waiting`` (the main job's waiting part), small, on the test database: the
pool's processes served in line with no GPU held twice, an rwlock's writes never overlapping
another turn, and a counter added to at once with no update lost (the demo checks each itself
and fails with a CommandError otherwise)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_waiting_demo_serves_in_line_keeps_writes_apart_and_loses_no_update() -> None:
    out = run_demo("demo_waiting", "--workers", "3", "--pool", "1", "--seconds", "1")
    assert "a GPU held by two processes at once: 0 times" in out
    assert "turns overlapping a write: 0;" in out
    assert re.search(r"added 1, 100 times each, all at once: 300 \(expected 300\)", out), out
    turns = re.search(r"turns per process: \[(\d+), (\d+), (\d+)\]", out)
    assert turns and min(int(n) for n in turns.groups()) > 0, out
