"""The dispensers' admin: counts per dispenser, items by state and worker, the two actions."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from resource_lease import Dispenser
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
