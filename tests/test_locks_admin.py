"""What operators see of locks, semaphores and elections: the admin pages (Django's test
client) and ``manage.py inspect_locks`` (its JSON parsed)."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import call_command

from resource_lease import LeaseLost, lock, named, semaphore
from resource_lease.models import Resource

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_created_rows():
    # Each test starts on an empty table: the process's hint of rows it created is stale.
    named._known.clear()


LOCKS = "/admin/resource_lease/lockrow/"
SEMAPHORES = "/admin/resource_lease/semaphoreslot/"
ELECTIONS = "/admin/resource_lease/electionrow/"


@pytest.fixture
def scene(make_pool, settings):
    """A pool resource, two locks (one held), a semaphore shrunk from 3 to 2 slots while all
    were held, and an election with a leader and hand-over state."""
    # Slots in order (exporter-i on slot i): acquire() probes free slots at random otherwise.
    settings.RESOURCE_LEASE = {"PROBE_REFRESH": 0}
    make_pool("proxy", 1)
    held = lock("rebuild-index", ttl=120, holder="host-a:11:main", auto_renew=False)
    lock("idle-lock", ttl=120, auto_renew=False).release()
    slots = [semaphore("exports", 3, ttl=120, holder=f"exporter-{i}", auto_renew=False) for i in range(3)]
    with pytest.raises(Exception):  # noqa: B017 - LockHeld: shrinking to 2 while 3 are held
        semaphore("exports", 2)
    leader = named.try_grant("default", "@election", "nightly-index", holder="host-b:22:main", ttl=120)
    assert leader is not None and named.write_data(leader, {"last_id": 42})
    yield {"lock": held, "slots": slots, "leader": leader}
    for lease in (held, *slots, leader):
        lease.release()


def body(response) -> str:
    return response.content.decode().replace("<wbr>", "")


def test_locks_page_shows_holder_fence_and_time_left_by_the_database_clock(staff, scene) -> None:
    response = staff(superuser=True).get(LOCKS)
    assert response.status_code == 200
    html = body(response)
    assert "rebuild-index" in html and "idle-lock" in html
    assert "host-a:11:main" in html
    assert 'class="rl-badge rl-held"' in html and 'class="rl-badge rl-free"' in html
    assert re.search(r'<div class="rl-note rl-time">(1m \d\ds|\d+s) left</div>', html)  # under the state
    assert "database's clock" in html
    assert "exports" not in html and "nightly-index" not in html and "proxy-0" not in html


def test_semaphores_page_shows_each_slot_and_the_retired_one(staff, scene) -> None:
    html = body(staff(superuser=True).get(SEMAPHORES))
    assert len(re.findall(r'class="field-semaphore"><a [^>]*>exports</a>', html)) == 3
    for i in range(3):
        assert f"exporter-{i}" in html
    assert ">retired</span>" in html  # slot 2, held but above the count now in force
    assert "rebuild-index" not in html


def test_elections_page_shows_leader_and_handover_state(staff, scene) -> None:
    html = body(staff(superuser=True).get(ELECTIONS))
    assert "nightly-index" in html and "host-b:22:main" in html
    assert "{&quot;last_id&quot;: 42}" in html


def test_force_release_frees_the_lock_and_the_holder_learns_it(staff, scene) -> None:
    held = scene["lock"]
    pk = held.resource.pk
    response = staff(superuser=True).post(
        LOCKS, {"action": "force_release_action", "_selected_action": [pk]}, follow=True
    )
    assert response.status_code == 200
    assert "Force-released 1 lock." in body(response)
    with pytest.raises(LeaseLost):
        held.renew()
    again = lock("rebuild-index", ttl=30, auto_renew=False)
    assert again.fence == held.fence + 1
    again.release()


def test_force_release_of_an_election_ends_the_leadership(staff, scene) -> None:
    leader = scene["leader"]
    staff(superuser=True).post(ELECTIONS, {"action": "force_release_action", "_selected_action": [leader.resource.pk]})
    assert not leader.is_held()
    assert not named.write_data(leader, {"last_id": 43})  # its fenced write is refused
    assert Resource.objects.get(kind="@election").data == {"last_id": 42}


def test_rows_are_read_only_and_cannot_be_added_or_deleted(staff, scene) -> None:
    client = staff(superuser=True)
    pk = scene["lock"].resource.pk
    page = client.get(f"{LOCKS}{pk}/change/")
    assert page.status_code == 200
    assert 'name="holder"' not in body(page) and 'name="name"' not in body(page)
    assert "host-a:11:main" in body(page)
    assert client.post(f"{LOCKS}{pk}/change/", {"name": "hijacked"}).status_code == 403
    assert client.get(f"{LOCKS}add/").status_code == 403
    assert client.get(f"{LOCKS}{pk}/delete/").status_code == 403
    assert Resource.objects.get(pk=pk).name == "rebuild-index"


def test_permissions_viewers_see_but_cannot_force_release(staff, scene) -> None:
    viewer = staff("view_resource")
    assert viewer.get(LOCKS).status_code == 200
    assert "force_release_action" not in body(viewer.get(LOCKS))
    viewer.post(LOCKS, {"action": "force_release_action", "_selected_action": [scene["lock"].resource.pk]})
    assert scene["lock"].is_held()
    assert staff().get(LOCKS).status_code == 403


def test_inspect_locks_json_lists_locks_semaphores_and_elections(scene) -> None:
    out = StringIO()
    call_command("inspect_locks", "--json", stdout=out)
    data = json.loads(out.getvalue())
    locks = {entry["name"]: entry for entry in data["locks"]}
    assert set(locks) == {"rebuild-index", "idle-lock"}
    busy = locks["rebuild-index"]
    assert busy["state"] == "held" and busy["holder"] == "host-a:11:main" and busy["fence"] == 1
    assert 60 < busy["time_left"] <= 120 and busy["expires_at"].endswith("Z")
    assert locks["idle-lock"]["state"] == "free" and locks["idle-lock"]["holder"] is None
    (exports,) = data["semaphores"]
    assert exports["name"] == "exports" and exports["slots"] == 2 and exports["held"] == 3
    assert sorted(h["holder"] for h in exports["holders"]) == ["exporter-0", "exporter-1", "exporter-2"]
    assert [h["slot"] for h in exports["holders"] if h["retired"]] == [2]
    (election,) = data["elections"]
    assert election["name"] == "nightly-index" and election["leader"] == "host-b:22:main"
    assert election["state_data"] == {"last_id": 42} and election["time_left"] > 60
    assert data["database_time"].endswith("Z")


def test_inspect_locks_table(scene) -> None:
    out = StringIO()
    call_command("inspect_locks", stdout=out)
    text = out.getvalue()
    assert "Locks: 2" in text and "Semaphores: 1" in text and "Elections: 1" in text
    assert re.search(r"rebuild-index\s+held\s+host-a:11:main\s+1\s+", text)
    assert "2:exporter-2" in text and "retired" in text
    assert '{"last_id": 42}' in text


def test_inspect_locks_with_nothing(transactional_db) -> None:
    out = StringIO()
    call_command("inspect_locks", "--json", stdout=out)
    assert json.loads(out.getvalue())["locks"] == []
    out = StringIO()
    call_command("inspect_locks", stdout=out)
    assert "Locks: 0" in out.getvalue()
