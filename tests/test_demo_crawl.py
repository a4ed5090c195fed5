"""``manage.py demo_crawl`` (the main job's pool that learns), on the test database: crawler
processes against the local simulator, a plain pool and a pool with targets, reports and a
policy; the demo itself fails (a CommandError) if the second pool learned a cooldown for a pair
no site bans, or wasted as large a share as the first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_crawl_demo_learns_each_ban_and_wastes_less() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "demo_crawl",
            "--crawlers",
            "2",
            "--proxies",
            "8",
            "--sites",
            "2",
            "--seconds",
            "2",
        ],
        cwd=REPO,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "Crawl demo OK." in out
    assert "plain acquire()" in out and "targets, reports, target_rate" in out
