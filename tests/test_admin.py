"""The admin, through Django's test client: list, filters, actions, permissions, overview."""

from __future__ import annotations

import json
import re
from html import unescape
from typing import Any

import pytest
from django.conf import settings
from django.contrib.admin import site
from django.contrib.admin.models import LogEntry
from django.db import connection
from django.db.models import F
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from resource_lease import LeaseLost, acquire, audit
from resource_lease.admin import ResourceAdmin
from resource_lease.models import LeaseEvent, Resource
from resource_lease.pool import quarantine

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/resource_lease/resource/"
OVERVIEW = "/admin/resource_lease/pooloverview/"
EVENTS = "/admin/resource_lease/leaseevent/"


def rows(html: str) -> dict[str, str]:
    """The list's rows by resource name (the row's HTML, without its line-break hints)."""
    html = html.replace("<wbr>", "")
    found = {}
    for row in re.findall(r"<tr[^>]*>.*?</tr>", html, flags=re.S):
        name = re.search(r'<th class="field-name_display"><a [^>]*>([^<]+)</a>', row)
        if name:
            found[name.group(1)] = row
    return found


def state_of(row: str) -> str:
    match = re.search(r'class="rl-badge rl-(\w+)"', row)
    assert match, row
    return match.group(1)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def act(client: Client, action: str, resources: list[Resource], **extra: str) -> Any:
    data = {"action": action, "_selected_action": [str(r.pk) for r in resources], "index": "0", **extra}
    return client.post(LIST, data, follow=True)


@pytest.fixture
def pool(make_pool: Any) -> dict[str, Any]:
    """proxy-0 held, proxy-1 quarantined, proxy-2 free, proxy-3 expired; gpu-0 free."""
    make_pool("proxy", 4)
    make_pool("gpu", 1)
    Resource.objects.filter(name="proxy-0").update(data={"url": "socks5://alice:hunter2@10.0.0.1:1080"})
    for name, holder, ttl in (("proxy-3", "vanished", 60), ("proxy-0", "crawler-1", 120)):
        Resource.objects.exclude(name=name).update(enabled=False)  # steer the acquire
        lease = acquire("proxy", ttl=ttl, holder=holder)
        Resource.objects.update(enabled=True)
    # proxy-3's lease ran out unreleased: its expiry set back to its grant (the database's
    # clock). Not a 0.2 s ttl: on a loaded machine its grant answered in 0.24 s, too late to be
    # trusted, and acquire() rightly handed nothing out (docs/pitfalls.md#late-answers).
    Resource.objects.filter(name="proxy-3").update(busy_before=F("acquired_at"))
    quarantine(Resource.objects.filter(name="proxy-1"), reason="slow exit", seconds=3600)
    return {"lease": lease}


def test_the_list_shows_state_holder_fence_time_left_and_a_masked_url(pool: dict[str, Any], staff: Any) -> None:
    response = staff(superuser=True).get(LIST)
    html = response.content.decode()
    by_name = rows(html)

    assert {name: state_of(row) for name, row in by_name.items()} == {
        "proxy-0": "held",
        "proxy-1": "quarantined",
        "proxy-2": "free",
        "proxy-3": "expired",
        "gpu-0": "free",
    }
    held = by_name["proxy-0"]
    assert "crawler-1" in held
    assert f'<td class="field-fence">{pool["lease"].fence}</td>' in held
    assert re.search(r'rl-time">(1m \d\ds|2m 00s) left<', held)  # 120 s by the database's clock, under the state
    assert "socks5://alice:***@10.0.0.1:1080" in held
    assert "hunter2" not in html
    assert "slow exit" in by_name["proxy-1"] and re.search(r"(59m \d\ds|1h 00m) left", by_name["proxy-1"])
    assert "vanished" in by_name["proxy-3"]
    assert "States and times left by the database&#x27;s clock" in html or "database's clock" in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state=held", {"proxy-0"}),
        ("state=free", {"proxy-2", "gpu-0"}),
        ("state=quarantined", {"proxy-1"}),
        ("state=expired", {"proxy-3"}),
        ("kind__exact=gpu", {"gpu-0"}),
        ("kind__exact=proxy&state=free", {"proxy-2"}),
        ("q=crawler-1", {"proxy-0"}),
        ("q=proxy-2", {"proxy-2"}),
    ],
)
def test_filters_and_search(pool: dict[str, Any], staff: Any, query: str, expected: set[str]) -> None:
    response = staff(superuser=True).get(f"{LIST}?{query}")
    assert response.status_code == 200
    assert set(rows(response.content.decode())) == expected


def test_force_release_frees_a_held_resource_and_its_holder_loses_it(pool: dict[str, Any], staff: Any) -> None:
    lease = pool["lease"]
    free = Resource.objects.get(name="proxy-2")

    response = act(staff(superuser=True), "force_release_action", [lease.resource, free])

    assert messages_of(response) == ["Force-released 1 resource; 1 of the 2 selected had no live lease."]
    assert state_of(rows(response.content.decode())["proxy-0"]) == "free"
    assert not lease.is_held()
    with pytest.raises(LeaseLost):
        lease.renew()


def test_force_release_cuts_off_the_holder_of_a_quarantined_resource(pool: dict[str, Any], staff: Any) -> None:
    client = staff(superuser=True)
    lease = pool["lease"]
    act(client, "quarantine_action", [lease.resource], apply="1", duration="900", reason="bad exit IP")
    response = act(client, "force_release_action", [lease.resource])
    assert messages_of(response) == ["Force-released 1 resource."]
    assert not lease.is_held()
    with pytest.raises(LeaseLost):
        lease.renew()


def test_quarantine_asks_for_a_time_and_a_reason_first(pool: dict[str, Any], staff: Any) -> None:
    client = staff(superuser=True)
    targets = list(Resource.objects.filter(name__in=["proxy-0", "proxy-2"]))

    form = act(client, "quarantine_action", targets)
    assert form.templates[0].name == "admin/resource_lease/resource/quarantine.html"
    assert "Quarantine for" in form.content.decode()
    assert Resource.objects.filter(quarantined_until__isnull=False).count() == 1  # nothing yet

    missing_reason = act(client, "quarantine_action", targets, apply="1", duration="900", reason="")
    assert "This field is required" in missing_reason.content.decode()
    assert Resource.objects.filter(quarantined_until__isnull=False).count() == 1

    done = act(client, "quarantine_action", targets, apply="1", duration="900", reason="bad exit IP")
    [message] = messages_of(done)
    assert message.startswith("Quarantined 2 resources for 15 minutes: bad exit IP. 1 is leased right now")
    by_name = rows(done.content.decode())
    assert state_of(by_name["proxy-0"]) == state_of(by_name["proxy-2"]) == "quarantined"
    assert "bad exit IP" in by_name["proxy-2"]
    assert pool["lease"].is_held()  # the holder keeps it until it releases


def test_restore_ends_a_quarantine(pool: dict[str, Any], staff: Any) -> None:
    targets = list(Resource.objects.filter(name__in=["proxy-1", "proxy-2"]))
    response = act(staff(superuser=True), "restore_action", targets)
    assert messages_of(response) == ["Restored 1 resource; 1 of the 2 selected were not quarantined."]
    assert state_of(rows(response.content.decode())["proxy-1"]) == "free"
    assert acquire("proxy", ttl=5, timeout=0).release()


def test_staff_without_change_permission_can_look_but_not_act(pool: dict[str, Any], staff: Any) -> None:
    client = staff("view_resource")
    lease = pool["lease"]
    page = client.get(LIST)
    assert page.status_code == 200
    assert "force_release_action" not in page.content.decode()
    assert client.get(OVERVIEW).status_code == 200

    before = list(Resource.objects.order_by("pk").values())
    everything = list(Resource.objects.all())
    for action, extra in (
        ("force_release_action", {}),
        ("quarantine_action", {"apply": "1", "duration": "900", "reason": "nope"}),
        ("restore_action", {}),
    ):
        response = act(client, action, everything, **extra)
        assert response.status_code == 200
        assert messages_of(response) in ([], ["No action selected."])  # the actions are not offered

    assert list(Resource.objects.order_by("pk").values()) == before
    assert lease.is_held()
    change = client.post(f"{LIST}{lease.resource.pk}/change/", {"kind": "x", "name": "y", "data": "{}"})
    assert change.status_code == 403


def test_staff_without_view_permission_sees_no_overview(pool: dict[str, Any], staff: Any) -> None:
    client = staff("view_leaseevent")
    assert client.get(OVERVIEW).status_code == 403
    assert client.get(LIST).status_code == 403
    assert "Pool overview" not in client.get("/admin/").content.decode()


def test_machine_fields_are_read_only_and_saving_never_undoes_a_grant(
    pool: dict[str, Any], staff: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = staff(superuser=True)
    url = f"{LIST}{Resource.objects.get(name='proxy-2').pk}/change/"
    form = client.get(url).content.decode()
    for field in ("holder", "fence", "busy_before", "quarantined_until", "took_over"):
        assert f'name="{field}"' not in form
    for field in ("kind", "name", "data", "enabled"):
        assert f'name="{field}"' in form

    # The admin loads the row, then a worker takes the resource before the admin saves it.
    stale = ResourceAdmin(Resource, site).get_queryset(None).get(name="proxy-2")  # type: ignore[arg-type]
    monkeypatch.setattr(ResourceAdmin, "get_object", lambda *args, **kwargs: stale)
    Resource.objects.exclude(name="proxy-2").update(enabled=False)
    lease = acquire("proxy", ttl=60, holder="worker-9")
    Resource.objects.update(enabled=True)
    assert lease.resource.name == "proxy-2"

    response = client.post(
        url,
        {"kind": "proxy", "name": "proxy-2", "data": '{"url": "http://10.0.0.2:3128"}', "enabled": "on"}
        | {"holder": "intruder", "fence": "0", "busy_before_0": "2000-01-01", "busy_before_1": "00:00:00"},
    )
    assert response.status_code == 302

    saved = Resource.objects.get(name="proxy-2")
    assert saved.data == {"url": "http://10.0.0.2:3128"}
    assert (saved.holder, saved.fence) == ("worker-9", lease.fence)  # not the stale copy's
    assert lease.is_held() and lease.release()


def test_the_overview_counts_each_kind_and_is_linked_from_the_index(pool: dict[str, Any], staff: Any) -> None:
    client = staff(superuser=True)
    index = client.get("/admin/").content.decode()
    assert f'href="{OVERVIEW}"' in index and "Pool overview" in index
    assert 'href="/admin/resource_lease/pooloverview/"' in client.get(LIST).content.decode()

    response = client.get(OVERVIEW)
    assert response.status_code == 200
    kinds = {row["kind"]: row for row in response.context["kinds"]}
    proxy = kinds["proxy"]
    assert proxy["total"] == 4
    assert [count for count, _, _ in proxy["cells"]] == [1, 1, 1, 1, 0]  # free held expired quarantined disabled
    assert proxy["utilisation"] == 33  # 1 held of the 3 in service
    assert kinds["gpu"]["utilisation"] == 0
    assert response.context["totals"]["total"] == 5
    html = response.content.decode()
    assert "?kind__exact=proxy&amp;state=held" in html
    assert "the audit trail is off" in html


def test_the_overview_and_the_events_list_show_recent_lease_events(pool: dict[str, Any], staff: Any) -> None:
    client = staff(superuser=True)
    lease = pool["lease"]
    with override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "AUDIT": True}):
        act(client, "force_release_action", [lease.resource])
        audit.flush()
        overview = client.get(OVERVIEW).content.decode()
        events = client.get(EVENTS)
        change = client.get(f"{LIST}{lease.resource.pk}/change/").content.decode()

    event = LeaseEvent.objects.get()
    assert (event.event, event.name, event.holder, event.actor) == (
        "force_released",
        "proxy-0",
        "crawler-1",
        "admin:user0",
    )
    assert "Force-released" in overview and "crawler-1" in overview and "admin:user0" in overview
    assert events.status_code == 200 and "Force-released" in events.content.decode()
    assert "Force-released" in change  # the resource's own recent events
    assert client.get(f"{EVENTS}add/").status_code == 403


def test_the_demo_admin_is_themed(staff: Any) -> None:
    from admin_interface.models import Theme

    from project.demo.theme import install

    install(Theme)  # the migration did it; an earlier test's flush may have undone it
    install(Theme)  # twice: still one theme, and active
    assert list(Theme.objects.filter(active=True).values_list("name", flat=True)) == ["Resource leases"]
    page = staff(superuser=True).get("/admin/").content.decode()
    assert re.search(r"<title>\s*Site administration \| Resource leases\s*</title>", page)


# -- the change form never shows a stored password --------------------------------------

PASSWORD = "Tr0ub4dor-3"
SECRET_URL = f"socks5://alice:{PASSWORD}@10.0.0.1:1080"
MASKED_URL = "socks5://alice:***@10.0.0.1:1080"


@pytest.fixture
def secret(transactional_db: None) -> Resource:
    """A proxy whose URL carries a password, and another key in its payload."""
    return Resource.objects.create(kind="proxy", name="alice@10.0.0.1:1080", data={"url": SECRET_URL, "region": "eu"})


def change_url(resource: Resource) -> str:
    return f"{LIST}{resource.pk}/change/"


def textarea(html: str, name: str = "data") -> str:
    """The text of the form's ``name`` textarea, as the browser would send it back."""
    match = re.search(rf'<textarea name="{name}"[^>]*>(.*?)</textarea>', html, flags=re.S)
    assert match, html
    return unescape(match.group(1)).strip()


def save(client: Client, resource: Resource, data: Any, *, enabled: bool = True) -> Any:
    """POST the change form as the operator would, ``data`` as JSON text (or an object to dump)."""
    form = {"kind": resource.kind, "name": resource.name, "data": data if isinstance(data, str) else json.dumps(data)}
    if enabled:
        form["enabled"] = "on"
    return client.post(change_url(resource), form)


def last_change_message(resource: Resource) -> str:
    entry = LogEntry.objects.filter(object_id=str(resource.pk)).latest("action_time")
    return entry.get_change_message()


def test_the_change_form_sends_the_payload_with_the_password_masked(secret: Resource, staff: Any) -> None:
    client = staff(superuser=True)
    with override_settings(RESOURCE_LEASE={**settings.RESOURCE_LEASE, "AUDIT": True}):
        acquire("proxy", ttl=60, holder="crawler-1")
        act(client, "force_release_action", [secret])
        act(client, "quarantine_action", [secret], apply="1", duration="900", reason="bad exit IP")
        audit.flush()
        page = client.get(change_url(secret))
    html = page.content.decode()

    assert page.status_code == 200
    assert json.loads(textarea(html)) == {"url": MASKED_URL, "region": "eu"}
    assert "Force-released" in html and "bad exit IP" in html  # the recent events are there
    assert "leave *** to keep the stored one" in html
    assert 'name="initial-data"' not in html  # changes are judged against the masked payload kept here
    assert PASSWORD not in html
    for other in (f"{LIST}{secret.pk}/history/", OVERVIEW, EVENTS, f"{LIST}?q=alice", LIST):
        response = client.get(other)
        assert response.status_code == 200, other
        assert PASSWORD not in response.content.decode(), other
    assert Resource.objects.get(pk=secret.pk).data == {"url": SECRET_URL, "region": "eu"}


def test_staff_who_may_only_view_see_the_payload_masked_too(secret: Resource, staff: Any) -> None:
    page = staff("view_resource").get(change_url(secret))
    html = page.content.decode()
    assert page.status_code == 200
    assert "<textarea" not in html  # read-only
    assert MASKED_URL in html and "region" in html
    assert PASSWORD not in html


def test_saving_the_masked_payload_unchanged_keeps_the_password_and_writes_nothing(
    secret: Resource, staff: Any
) -> None:
    client = staff(superuser=True)
    shown = textarea(client.get(change_url(secret)).content.decode())

    with CaptureQueriesContext(connection) as queries:
        response = save(client, secret, shown)

    assert response.status_code == 302
    assert Resource.objects.get(pk=secret.pk).data == {"url": SECRET_URL, "region": "eu"}
    assert last_change_message(secret) == "No fields changed."
    assert not [q["sql"] for q in queries if re.search(r"UPDATE\W+resource_lease_resource\W", q["sql"])]

    # Another field changed, the payload sent back masked: only that field is written.
    assert save(client, secret, shown, enabled=False).status_code == 302
    saved = Resource.objects.get(pk=secret.pk)
    assert (saved.enabled, saved.data) == (False, {"url": SECRET_URL, "region": "eu"})
    assert last_change_message(secret) == "Changed Enabled."


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        pytest.param(
            {"url": MASKED_URL, "region": "us", "weight": 3},
            {"url": SECRET_URL, "region": "us", "weight": 3},
            id="other keys edited: the password stays",
        ),
        pytest.param(
            {"url": "http://alice:***@10.0.0.1:1080", "region": "eu"},
            {"url": f"http://alice:{PASSWORD}@10.0.0.1:1080", "region": "eu"},
            id="new scheme, same user@host:port: the password stays",
        ),
        pytest.param(
            {"url": "socks5://alice:n3w-pw@10.0.0.1:1080", "region": "eu"},
            {"url": "socks5://alice:n3w-pw@10.0.0.1:1080", "region": "eu"},
            id="a typed password replaces it",
        ),
        pytest.param(
            {"url": "socks5://bob:pw-of-bob@10.0.0.2:1080"},
            {"url": "socks5://bob:pw-of-bob@10.0.0.2:1080"},
            id="a new address with its password",
        ),
        pytest.param({"region": "eu"}, {"region": "eu"}, id="url removed: the password goes with it"),
    ],
)
def test_saving_an_edited_payload(secret: Resource, staff: Any, sent: dict[str, Any], stored: dict[str, Any]) -> None:
    client = staff(superuser=True)
    response = save(client, secret, sent)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Resource.objects.get(pk=secret.pk).data == stored
    assert last_change_message(secret) == "Changed Data."


@pytest.mark.parametrize(
    ("sent_url", "why"),
    [
        ("socks5://alice:***@10.0.0.9:1080", "the user, host or port changed"),
        ("socks5://alice:***@10.0.0.1:1081", "the user, host or port changed"),
        ("socks5://bob:***@10.0.0.1:1080", "the user, host or port changed"),
        ("socks5://10.0.0.1:1080", None),  # no password at all: accepted, see below
    ],
)
def test_a_masked_password_cannot_be_carried_to_another_address(
    secret: Resource, staff: Any, sent_url: str, why: str | None
) -> None:
    client = staff(superuser=True)
    response = save(client, secret, {"url": sent_url, "region": "eu"})
    if why is None:
        assert response.status_code == 302
        assert Resource.objects.get(pk=secret.pk).data == {"url": sent_url, "region": "eu"}
        return
    html = response.content.decode()
    assert response.status_code == 200
    [error] = response.context["adminform"].form.errors["data"]
    assert error.startswith('data["url"]: the password is still the mask *** but') and why in error
    assert "stored: alice@10.0.0.1:1080" in error
    assert re.search(r'<ul class="errorlist"[^>]*><li>data\[&quot;url&quot;\]: the password is still the mask', html)
    assert json.loads(textarea(html))["url"] == sent_url  # what was typed, to correct
    assert PASSWORD not in html
    assert Resource.objects.get(pk=secret.pk).data == {"url": SECRET_URL, "region": "eu"}


def test_a_mask_where_no_password_is_stored_is_refused(make_pool: Any, staff: Any) -> None:
    [plain] = make_pool("proxy", 1)  # http://10.0.0.0:8080, no password
    response = save(staff(superuser=True), plain, {"url": "http://alice:***@10.0.0.0:8080"})
    assert response.status_code == 200
    [error] = response.context["adminform"].form.errors["data"]
    assert error == (
        'data["url"]: the password *** stands for the stored one, and the stored URL has none: type the password'
    )
    assert Resource.objects.get(pk=plain.pk).data == {"url": "http://10.0.0.0:8080"}


def test_the_add_form_takes_the_password_as_typed(transactional_db: None, staff: Any) -> None:
    client = staff(superuser=True)
    form = client.get(f"{LIST}add/").content.decode()
    assert textarea(form) == "{}" and "keep the stored one" not in form

    data = {"url": SECRET_URL, "region": "eu"}
    response = client.post(
        f"{LIST}add/", {"kind": "proxy", "name": "alice@10.0.0.1:1080", "data": json.dumps(data), "enabled": "on"}
    )
    assert response.status_code == 302
    created = Resource.objects.get(name="alice@10.0.0.1:1080")
    assert created.data == data
    assert PASSWORD not in client.get(change_url(created)).content.decode()


def test_saving_a_masked_payload_never_undoes_a_grant(
    secret: Resource, staff: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The admin loads the row, then a worker takes the resource before the admin saves it.
    stale = ResourceAdmin(Resource, site).get_queryset(None).get(pk=secret.pk)  # type: ignore[arg-type]
    monkeypatch.setattr(ResourceAdmin, "get_object", lambda *args, **kwargs: stale)
    lease = acquire("proxy", ttl=60, holder="worker-9")

    response = save(staff(superuser=True), secret, {"url": MASKED_URL, "region": "us"})

    assert response.status_code == 302
    saved = Resource.objects.get(pk=secret.pk)
    assert saved.data == {"url": SECRET_URL, "region": "us"}
    assert (saved.holder, saved.fence) == ("worker-9", lease.fence)  # not the stale copy's
    assert lease.is_held() and lease.release()


def test_change_form_says_never_leased_instead_of_the_epoch(pool: dict[str, Any], staff: Any) -> None:
    client = staff(superuser=True)
    never = Resource.objects.get(name="proxy-2")
    assert never.fence == 0
    page = client.get(change_url(never)).content.decode()
    assert "never leased" in page and "1970" not in page
    held = pool["lease"].resource
    page = client.get(change_url(held)).content.decode()
    assert "never leased" not in page and str(pool["lease"].expires_at.year) in page


BAD_KINDS = ["@lock", "@semaphore:x", "@group:crawlers", "k" * 101, "   "]


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_the_resource_form_refuses_every_kind_the_api_refuses(
    transactional_db: None, staff: Any, make_pool: Any, kind: str
) -> None:
    with pytest.raises(ValueError) as refused:
        acquire(kind, timeout=0)
    api_says = str(refused.value) if kind.strip() else "This field is required."  # Django strips blanks first
    client = staff(superuser=True)
    fields = {"name": "alice@10.0.0.1:1080", "data": "{}", "enabled": "on"}
    response = client.post(f"{LIST}add/", {"kind": kind, **fields})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["kind"] == [api_says]
    [existing] = make_pool("proxy", 1)
    response = client.post(change_url(existing), {"kind": kind, **{**fields, "name": existing.name}})
    assert response.context["adminform"].form.errors["kind"] == [api_says]
    assert list(Resource.objects.values_list("kind", "name")) == [("proxy", "proxy-0")], "nothing written"


def test_negative_control_without_the_api_s_check_the_form_saves_a_lock_s_kind(
    transactional_db: None, staff: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resource_lease.admin.resources import ResourceForm

    monkeypatch.delattr(ResourceForm, "clean_kind")
    response = staff(superuser=True).post(f"{LIST}add/", {"kind": "@lock", "name": "x", "data": "{}", "enabled": "on"})
    assert response.status_code == 302
    assert Resource.objects.filter(kind="@lock", name="x").exists()


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("name", "n" * 256, "Ensure this value has at most 255 characters"),
        ("data", '{"a": NaN}', "NaN"),
        ("data", '{"a": "x\\u0000y"}', "NUL"),
    ],
)
def test_the_resource_form_refuses_names_and_payloads_the_seeding_commands_refuse(
    transactional_db: None, staff: Any, field: str, value: str, problem: str
) -> None:
    fields = {"kind": "proxy", "name": "alice@10.0.0.1:1080", "data": "{}", "enabled": "on", field: value}
    response = staff(superuser=True).post(f"{LIST}add/", fields)
    assert response.status_code == 200
    assert problem in " ".join(response.context["adminform"].form.errors[field])
    assert not Resource.objects.exists()
