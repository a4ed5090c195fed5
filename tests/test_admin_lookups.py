"""No oracle in the admin's lists: a changelist accepts only the lookups of its own filters
and links (``resource_lease/admin/lookups.py``).

Django accepts any lookup on a model's own fields, so a user who may only view could read
a masked proxy password one character at a time (``?data__url__regex=^http://alice:S``: the
row shows or not). Here every admin of the app, for every JSON and token column of its
model, is asked such lookups with a value that matches a planted secret and one that does
not: the two answers must be the same. The negative control runs the same probes with
Django's own ``lookup_allowed`` and sees the oracle on every list that shows such a row.
The app's own filters and links (each filter choice, the overview's and the dispensers'
links) are followed and still work.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from html import unescape
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.admin import ModelAdmin, site
from django.contrib.auth.models import Permission
from django.db import models
from django.test import Client, RequestFactory

from resource_lease import Config, Dispenser, Election, Group, acquire, lock, named, notify, rwlock, semaphore
from resource_lease.admin.base import AppAdmin
from resource_lease.admin.lookups import AllowListLookups
from resource_lease.db.operations import ops
from resource_lease.models import Resource, Waiter
from resource_lease.pool import database_now

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "S3cret-pw"
SECRET_URL = f"http://alice:{SECRET}@10.20.1.1:8080"
SECRET_DATA = {"url": SECRET_URL, "secret": SECRET}


def app_admins() -> list[tuple[type[models.Model], ModelAdmin[Any]]]:
    return sorted(
        ((model, admin) for model, admin in site._registry.items() if model._meta.app_label == "resource_lease"),
        key=lambda pair: pair[0]._meta.model_name or "",
    )


def secret_fields(model: type[models.Model]) -> list[str]:
    """Every JSON column (payloads, results, data, filters) and token column of ``model``."""
    return [
        f.name
        for f in model._meta.get_fields()
        if isinstance(f, models.JSONField) or (isinstance(f, models.Field) and f.name.endswith("token"))
    ]


def changelist(model: type[models.Model]) -> str:
    return f"/admin/{model._meta.app_label}/{model._meta.model_name}/"


@pytest.fixture(autouse=True)
def _forget_created_rows() -> None:
    named._known.clear()  # each test starts on an empty table


@pytest.fixture
def secrets() -> Iterator[None]:
    """One row of every admin's list carries SECRET in its JSON columns, and a live token."""
    Resource.objects.bulk_create(
        [
            Resource(kind="proxy", name="crawl10@10.20.1.1:8080", data=SECRET_DATA),
            Resource(kind="proxy", name="crawl11@10.20.1.2:8080", data={"url": "http://bob:other@10.20.1.2:8080"}),
            Resource(kind="gpu", name="gpu-0"),
        ]
    )
    kept: list[Any] = [acquire("proxy", ttl=600, holder="crawler-1")]
    kept.append(lock("rebuild-index", ttl=600, holder="host-a", auto_renew=False))
    kept.append(semaphore("exports", 2, ttl=600, holder="exporter", auto_renew=False))
    kept.append(rwlock("catalogue").write(ttl=600, holder="writer"))
    election = Election("beat", ttl=600, holder="host-b")
    election.campaign(timeout=0)
    election.save_state(SECRET_DATA)
    member = Group("recs", ttl=600, member="a", data=SECRET_DATA)
    member.join()
    # Coordination rows carry the secret too (a lock's data is empty otherwise).
    Resource.objects.filter(kind__in=("@lock", "@rwlock")).update(data=SECRET_DATA)
    Resource.objects.filter(kind__startswith="@semaphore:").update(data=SECRET_DATA)
    d = Dispenser("crawl", ttl=600)
    d.put({"k1": SECRET_DATA, "k2": {"url": "http://bob:other@10.20.1.2:8080"}})
    claimed = d.assign("w1", limit=2)
    d.done("w1", [i for i in claimed if i.key == "k1"], result=SECRET_DATA)
    other = Dispenser("other", ttl=600)
    other.put(["x"])
    other.assign("w2")
    notify("proxies", SECRET_DATA)
    Config("crawler", defaults={"proxy": SECRET_DATA}).set("proxy", SECRET_DATA)
    now = database_now("default")
    Waiter.objects.create(
        kind="proxy",
        holder="waiting-crawler",
        filter=json.loads(ops("default").dialect.encode_where({"secret": SECRET})),
        token="f00dfeed" * 4,
        since=now,
        expires_at=now + dt.timedelta(seconds=600),
    )
    try:
        yield
    finally:
        member.leave()
        election.resign()
        for thing in kept:
            thing.release()


@pytest.fixture
def viewer(staff: Any) -> Client:
    """A staff user who may view every model of the app, and change none."""
    perms = Permission.objects.filter(content_type__app_label="resource_lease", codename__startswith="view_")
    client: Client = staff(*perms.values_list("codename", flat=True))
    return client


def probes(admin: ModelAdmin[Any], field: str) -> list[tuple[str, str, str]]:
    """(lookup, a value that matches a row of the admin's list, one that matches none)."""
    model = admin.model
    if isinstance(model._meta.get_field(field), models.JSONField):
        return [
            (f"{field}__url__regex", "^http://alice:S", "^http://alice:Q"),
            (f"{field}__url__startswith", "http://alice:S", "http://alice:Q"),
            (f"{field}__url__contains", "alice:S3", "alice:Q"),
            (f"{field}__secret", SECRET, "Q"),
            (f"{field}__secret__exact", SECRET, "Q"),
            (f"{field}__has_key", "secret", "nothing"),
            (f"{field}__icontains", SECRET, "Qq~"),
            (f"{field}__contains", SECRET, "Qq~"),
            (f"{field}__regex", "S3cret", "Qq~"),
            (f"{field}__startswith", '{"', "Qq~"),
            (f"{field}__isnull", "False", "True"),
        ]
    shown = admin.get_queryset(RequestFactory().get("/"))
    stored = shown.exclude(**{field: ""}).values_list(field, flat=True).first()
    assert stored, f"no {model.__name__}.{field} planted"
    return [
        (field, stored, "~"),
        (f"{field}__exact", stored, "~"),
        (f"{field}__startswith", stored[:2], "~"),
        (f"{field}__regex", f"^{stored[:2]}", "^~"),
        (f"{field}__contains", stored[2:5], "~"),
        (f"{field}__in", stored, "~"),
    ]


def answer(client: Client, url: str, params: dict[str, str]) -> tuple[Any, ...]:
    """What a lookup tells the user: the status, where it redirects, and which rows it lists."""
    try:
        response = client.get(url, params)
    except Exception as exc:  # noqa: BLE001  (Django's own rule: some lookups fail the page)
        return ("error", type(exc).__name__)
    html = response.content.decode() if response.status_code == 200 else ""
    table = re.search(r'<table id="result_list".*?</table>', html, flags=re.S)
    rows = re.findall(r"<tr[ >]", table.group(0)) if table else []
    paginator = re.search(r'<p class="paginator">(.*?)</p>', html, flags=re.S)
    return (
        response.status_code,
        response.get("Location", ""),
        len(rows),
        re.sub(r"<[^>]+>|\s+", " ", paginator.group(1)).strip() if paginator else "",
    )


def oracles(client: Client) -> dict[tuple[str, str], list[str]]:
    """Per (admin's model, column): the lookups whose answer depends on the secret."""
    found: dict[tuple[str, str], list[str]] = {}
    for model, admin in app_admins():
        url = changelist(model)
        for field in secret_fields(model):
            for lookup, hit, miss in probes(admin, field):
                if answer(client, url, {lookup: hit}) != answer(client, url, {lookup: miss}):
                    found.setdefault((str(model._meta.model_name), field), []).append(lookup)
    return found


#: Every list showing a row with a planted secret (the overview pages have no list).
LEAKY = {
    ("configentry", "default"),
    ("configentry", "value"),
    ("dispenseritem", "claim_token"),
    ("dispenseritem", "payload"),
    ("dispenseritem", "result"),
    ("electionrow", "data"),
    ("electionrow", "grant_token"),
    ("groupmember", "data"),
    ("groupmember", "grant_token"),
    ("lockrow", "data"),
    ("lockrow", "grant_token"),
    ("resource", "data"),
    ("resource", "grant_token"),
    ("rwlockrow", "data"),
    ("rwlockrow", "grant_token"),
    ("semaphoreslot", "data"),
    ("semaphoreslot", "grant_token"),
    ("topic", "payload"),
    ("waiter", "filter"),
    ("waiter", "token"),
}


def test_every_admin_of_the_app_has_the_allow_list() -> None:
    admins = app_admins()
    assert len(admins) >= 15
    for model, admin in admins:
        assert isinstance(admin, AppAdmin), model
        assert type(admin).lookup_allowed is AllowListLookups.lookup_allowed, f"{model} overrides lookup_allowed"
        secret = set(secret_fields(model))
        assert not {lookup.split("__")[0] for lookup in admin.extra_lookups} & secret, model


def test_no_lookup_on_a_json_or_token_column_tells_anything(secrets: None, viewer: Client) -> None:
    assert oracles(viewer) == {}
    # A refused lookup is Django's refusal: 400, before any query (no 500 on SQLite either).
    response = viewer.get(changelist(Resource), {"data__url__contains": "alice"})
    assert response.status_code == 400


def test_negative_control_django_s_own_rule_is_the_oracle(
    secrets: None, viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(AllowListLookups, "lookup_allowed", ModelAdmin.lookup_allowed)
    found = oracles(viewer)
    assert set(found) == LEAKY
    assert "data__url__regex" in found[("resource", "data")]
    # The password, one character at a time, for a user who may only view (its first three).
    url, known = changelist(Resource), "^http://alice:"
    for _ in SECRET[:3]:
        known += next(
            re.escape(c)
            for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-"
            if "crawl10@" in unescape(viewer.get(url, {"data__url__regex": known + re.escape(c)}).content.decode())
        )
    assert known.replace("\\", "") == f"^http://alice:{SECRET[:3]}"


def links(html: str, path: str) -> set[str]:
    """The page's links to the app's changelists that carry a query string (a filter's choices
    are links, or options of a drop-down list with the theme's list_filter_dropdown)."""
    found = set()
    for href in re.findall(r'href="([^"]+)"', html) + re.findall(r'<option [^>]*value="([^"]+)"', html):
        href = unescape(href)
        parts = urlsplit(href)
        if parts.query and (parts.path in ("", path) or parts.path.startswith("/admin/resource_lease/")):
            found.add(href if parts.path else f"{path}{href}")
    return found


def test_the_app_s_own_filters_and_links_keep_working(secrets: None, staff: Any) -> None:
    client = staff(superuser=True)
    followed: set[str] = set()
    pages = ["/admin/resource_lease/pooloverview/", "/admin/resource_lease/barrieroverview/"]
    pages += [changelist(model) for model, _ in app_admins()]
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, (page, response.status_code)
        html = response.content.decode()
        for href in links(html, page) - followed:
            followed.add(href)
            response = client.get(href)
            assert response.status_code == 200, (page, href, response.status_code)
            assert "?e=1" not in response.get("Location", ""), href
    # Among them: each filter's choices, the overview's links to a kind, its state and its
    # line, the dispensers' counts.
    queries = {urlsplit(href).query for href in followed}
    for expected in (
        "kind__exact=proxy",
        "kind=proxy",
        "state=held",
        "dispenser__exact=crawl",
        "dispenser=crawl",
        "worker=w1",
        "enabled__exact=1",
    ):
        assert any(expected in q for q in queries), (expected, sorted(queries))
    assert any(href.startswith("/admin/resource_lease/waiter/?kind__exact=proxy") for href in followed), followed
