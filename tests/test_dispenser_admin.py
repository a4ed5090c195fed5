"""The dispensers' admin: counts per dispenser, items by state and worker, the two actions."""

from __future__ import annotations

import re
import time
from html import unescape
from typing import Any

import pytest
from django.contrib.admin import ModelAdmin
from django.db import connection
from django.test import Client

from resource_lease import Dispenser
from resource_lease.admin import DispenserItemAdmin
from resource_lease.models import DispenserItem

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/admin/resource_lease/dispenseritem/"


def filled(ttl: float = 60) -> Dispenser:
    d = Dispenser("crawl", ttl=ttl, max_attempts=1)
    d.put(["a", "b", "c", "d", "e"])
    d.done("w1", d.assign("w1", limit=1))
    d.fail("w1", d.assign("w1", limit=1), "HTTP 502")
    d.assign("w2", limit=2)
    return d


def test_changelist_shows_each_dispensers_counts_and_items(admin_client: Client) -> None:
    filled()
    Dispenser("other").put(["x"])
    html = admin_client.get(URL).content.decode()
    assert "Dispensers" in html and "crawl" in html and "other" in html
    assert "HTTP 502" in html and "by the database" in html
    assert admin_client.get(URL, {"state": "assigned"}).content.decode().count('class="rl-badge rl-held"') == 2
    by_worker = admin_client.get(URL, {"worker": "w1"}).content.decode()
    assert "HTTP 502" in by_worker
    assert (
        by_worker.count('<td class="field-worker">w1</td>') == 2 and '<td class="field-worker">w2</td>' not in by_worker
    )


def test_an_expired_claim_shows_as_expired(admin_client: Client) -> None:
    filled(ttl=1)
    time.sleep(1.2)
    html = admin_client.get(URL, {"state": "expired"}).content.decode()
    assert html.count('class="rl-badge rl-expired"') == 2


def test_retry_failed_action(admin_client: Client) -> None:
    d = filled()
    ids = list(DispenserItem.objects.values_list("id", flat=True))
    response = admin_client.post(URL, {"action": "retry_failed_action", "_selected_action": ids}, follow=True)
    assert "1 failed item queued again" in response.content.decode()
    assert d.counts()["failed"] == 0


def test_release_claims_action(admin_client: Client) -> None:
    d = filled()
    ids = list(DispenserItem.objects.filter(worker="w2").values_list("id", flat=True)[:1])
    response = admin_client.post(URL, {"action": "release_claims_action", "_selected_action": ids}, follow=True)
    assert "2 claims released (workers: w2)" in response.content.decode()
    assert d.counts()["assigned"] == 0
    assert d.done("w2", ["c", "d"]) == 0, "the worker's outcome is refused once released"


def test_items_are_read_only(admin_client: Client) -> None:
    filled()
    item = DispenserItem.objects.first()
    assert item is not None
    assert admin_client.get(f"{URL}add/").status_code == 403
    html = admin_client.get(f"{URL}{item.pk}/change/").content.decode()
    assert 'name="state"' not in html


def _open_then_submit(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[int], Dispenser]:
    """An operator opens a claimed item's page and submits it; the worker's done() commits
    at the worst moment: after the admin read the row for the submit, before it writes it
    (or, where nothing is written, after the submit). Returns the submit's answer, what
    done() returned, and the dispenser."""
    d = Dispenser("crawl", ttl=60)
    d.put(["a"])
    (item,) = d.assign("w1")
    pk = DispenserItem.objects.get(key="a").pk
    assert client.get(f"{URL}{pk}/change/").status_code == 200
    calls: list[int] = []
    original = DispenserItemAdmin.save_model

    def save_model(self: Any, request: Any, obj: Any, form: Any, change: bool) -> None:
        calls.append(d.done("w1", [item], result={"pages": 7}))
        original(self, request, obj, form, change)

    monkeypatch.setattr(DispenserItemAdmin, "save_model", save_model)
    response = client.post(f"{URL}{pk}/change/", {"_save": "Save"})
    if not calls:  # nothing was saved
        calls.append(d.done("w1", [item], result={"pages": 7}))
    return response, calls, d


def test_an_item_s_page_cannot_save_the_row_over_a_worker_s_done(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    response, calls, d = _open_then_submit(admin_client, monkeypatch)
    assert response.status_code == 403  # the page is read-only: its Save writes nothing
    assert calls == [1]
    row = DispenserItem.objects.get(key="a")
    assert (row.state, row.result) == ("done", {"pages": 7}), "the worker's outcome is kept"
    assert d.assign("w2") == [], "and the item does not run again"
    html = admin_client.get(f"{URL}{row.pk}/change/").content.decode()
    assert 'name="_save"' not in html


def test_negative_control_the_old_whole_row_save_loses_the_worker_s_done(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite's single writer: the worker's done() cannot commit inside the admin's open transaction")
    # The page as it was: Django's change permission, so its Save writes the whole row back.
    monkeypatch.setattr(DispenserItemAdmin, "has_change_permission", ModelAdmin.has_change_permission)
    response, calls, _ = _open_then_submit(admin_client, monkeypatch)
    assert response.status_code == 302 and calls == [1], "the worker's done() was accepted"
    row = DispenserItem.objects.get(key="a")
    assert (row.state, row.result) == ("assigned", None), "the old save put back the claim the admin had read"


def _button(html: str, label: str) -> tuple[str, dict[str, str]]:
    """The action URL and hidden fields of the item page's button ``label``."""
    for form in re.findall(r'<form method="post" action="([^"]+)" class="rl-inline">(.*?)</form>', html, flags=re.S):
        if f">{label}</button>" in form[1]:
            fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form[1]))
            fields.pop("csrfmiddlewaretoken", None)
            return unescape(form[0]), fields
    raise AssertionError(f"no {label!r} button")


def test_an_item_s_buttons_retry_it_or_release_the_claim_the_page_showed(admin_client: Client) -> None:
    d = filled()
    failed = DispenserItem.objects.get(state="failed")
    url, fields = _button(admin_client.get(f"{URL}{failed.pk}/change/").content.decode(), "Retry")
    response = admin_client.post(url, fields, follow=True)
    assert "Queued again (attempts reset)." in response.content.decode()
    assert DispenserItem.objects.get(pk=failed.pk).state == "pending"

    claimed = DispenserItem.objects.filter(state="assigned").first()
    assert claimed is not None
    url, fields = _button(admin_client.get(f"{URL}{claimed.pk}/change/").content.decode(), "Release the claim")
    assert fields == {"worker": "w2", "fence": str(claimed.fence)}
    # Meanwhile w2 gives it back and w3 claims it: the page's claim is gone.
    assert d.release("w2", [claimed.key]) == 1
    d.assign("w3", limit=5)
    response = admin_client.post(url, fields, follow=True)
    assert "Not released: the claim of w2" in response.content.decode()
    assert DispenserItem.objects.get(pk=claimed.pk).worker == "w3"
    url, fields = _button(admin_client.get(f"{URL}{claimed.pk}/change/").content.decode(), "Release the claim")
    response = admin_client.post(url, fields, follow=True)
    assert "Claim of w3 given back to the pool." in response.content.decode()
    assert DispenserItem.objects.get(pk=claimed.pk).state == "pending"
    assert admin_client.get(url).status_code == 405


def test_release_items_action_gives_back_only_the_selected_claims(admin_client: Client) -> None:
    d = filled()
    one = DispenserItem.objects.filter(worker="w2").order_by("key").first()
    assert one is not None
    response = admin_client.post(URL, {"action": "release_items_action", "_selected_action": [one.pk]}, follow=True)
    assert "1 claim given back to the pool." in response.content.decode()
    assert d.counts()["assigned"] == 1


def test_only_users_who_may_change_items_get_the_buttons(staff: Any) -> None:
    filled()
    failed = DispenserItem.objects.get(state="failed")
    viewer = staff("view_dispenseritem")
    assert "rl-tool" not in viewer.get(f"{URL}{failed.pk}/change/").content.decode()
    assert viewer.post(f"{URL}{failed.pk}/retry/").status_code == 403
    assert DispenserItem.objects.get(pk=failed.pk).state == "failed"
