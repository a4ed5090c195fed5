"""Operators' view of groups and barriers: the admin pages (with the kick action) and
``manage.py inspect_groups [--json]``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from django.core.management import call_command

from resource_lease import DoubleBarrier, Group
from resource_lease.models import Resource

pytestmark = pytest.mark.django_db(transaction=True)

MEMBERS = "/admin/resource_lease/groupmember/"
BARRIERS = "/admin/resource_lease/barrieroverview/"


@pytest.fixture
def scene() -> Any:
    """Group "recs" with a and b (b has data); a barrier "nightly" of size 1 that a is inside."""
    a = Group("recs", ttl=30, member="a").join()
    b = Group("recs", ttl=30, member="b", data={"ip": "10.0.0.7"}).join()
    barrier = DoubleBarrier("nightly", 1, ttl=30, member="a")
    barrier.enter(timeout=10)
    yield a, b, barrier
    barrier.leave(timeout=10)
    a.leave()
    b.leave()


def test_the_members_page_lists_live_members_with_their_data(scene: Any, staff: Any) -> None:
    html = staff("view_resource").get(MEMBERS).content.decode()
    assert "recs" in html and "10.0.0.7" in html and "rl-held" in html
    assert "@barrier" not in html  # only group rows
    assert "kick_action" not in html  # viewers cannot kick


def test_kick_force_releases_a_member_and_it_joins_again_by_itself(scene: Any, staff: Any) -> None:
    a, b, _ = scene
    row = Resource.objects.get(kind="@group:recs", name="b")
    response = staff(superuser=True).post(
        MEMBERS, {"action": "kick_action", "_selected_action": [str(row.pk)], "index": "0"}, follow=True
    )
    assert "Kicked 1 member" in response.content.decode()
    assert a.members() == ["a"]
    deadline = time.monotonic() + 30  # b's process is alive: its next renewal fails, it joins again
    while a.members() != ["a", "b"]:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_the_barriers_page_shows_round_cohort_and_who_is_inside(scene: Any, staff: Any) -> None:
    html = staff("view_resource").get(BARRIERS).content.decode()
    assert "nightly" in html and "1 inside" in html
    assert staff().get(BARRIERS).status_code == 403


def test_inspect_groups_json(scene: Any, capsys: Any) -> None:
    call_command("inspect_groups", "--json")
    report = json.loads(capsys.readouterr().out)
    (group,) = report["groups"]
    assert group["name"] == "recs" and group["size"] == 2
    assert [m["member"] for m in group["members"]] == ["a", "b"]
    assert group["members"][1]["data"] == {"ip": "10.0.0.7"} and group["members"][0]["time_left"] > 0
    (barrier,) = report["barriers"]
    assert barrier["name"] == "nightly" and barrier["round"] == 1
    assert barrier["cohort"] == barrier["inside"] == ["a"] and barrier["waiting"] == []


def test_inspect_groups_table(scene: Any, capsys: Any) -> None:
    call_command("inspect_groups")
    out = capsys.readouterr().out
    assert "group recs: 2 live members" in out and "barrier nightly: round 1" in out and "inside: a" in out


def test_inspect_groups_with_nothing(capsys: Any) -> None:
    call_command("inspect_groups")
    assert "No group or barrier" in capsys.readouterr().out


def test_the_pipeline_demo_computes_every_user_once_with_a_worker_killed_and_replaced() -> None:
    """``manage.py demo_pipeline`` (the main job's pipeline) on the test database."""
    from tests.conftest import REPO, worker_env

    done = subprocess.run(
        [sys.executable, "manage.py", "demo_pipeline", "--workers", "3", "--users", "300", "--ttl", "2"],
        env=worker_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "users computed: 300 of 300; twice: 0; never: 0" in done.stdout, done.stdout
    assert "Every user was computed exactly once" in done.stdout
