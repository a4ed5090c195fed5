"""``manage.py demo_crawl`` (the main job's pool that learns), on the test database: crawler
processes against the local simulator, a plain pool and a pool with targets, reports and a
policy; the demo itself fails (a CommandError) if the second pool learned a cooldown for a pair
no site bans, or wasted as large a share as the first."""

from __future__ import annotations

import pytest

from tests.conftest import run_demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_crawl_demo_learns_each_ban_and_wastes_less() -> None:
    out = run_demo("demo_crawl", "--crawlers", "2", "--proxies", "8", "--sites", "2", "--seconds", "2")
    assert "Crawl demo OK." in out
    assert "plain acquire()" in out and "targets, reports, target_rate" in out
