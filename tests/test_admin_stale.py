"""Rows that workers change are never saved whole from a stale page (issue 37, point 4).

Every admin page of a row the engine writes (a lock, semaphore slot, rwlock, election, group
member, place in line, topic, counter, leadership term, dispenser item) is read-only for
every user, a superuser too: no Save button, and a submitted form is refused (403) and
writes nothing. What an operator may do there is an action or a button that runs a
conditional UPDATE (force release, kick, retry, release a claim). A resource's own page
saves only the fields the operator edited (tests/test_admin.py); the dispenser item's
forced interleaving with a worker's done() is in tests/test_dispenser_admin.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin import site
from django.forms.models import model_to_dict
from django.test import RequestFactory

from resource_lease.models import Resource
from tests.test_admin_lookups import changelist, secrets  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)

WORKER_ROWS = (
    "lockrow",
    "semaphoreslot",
    "rwlockrow",
    "electionrow",
    "groupmember",
    "waiter",
    "topic",
    "counter",
    "leadershipterm",
    "dispenseritem",
)


@pytest.mark.usefixtures("secrets")
def test_the_pages_of_rows_workers_write_save_nothing(staff: Any) -> None:
    client = staff(superuser=True)
    admins = {model._meta.model_name: (model, admin) for model, admin in site._registry.items()}
    for name in WORKER_ROWS:
        model, admin = admins[name]
        row = admin.get_queryset(RequestFactory().get("/")).first()
        if row is None:
            assert name in ("counter", "leadershipterm"), f"no {name} row to look at"
            continue
        before = model_to_dict(model._default_manager.get(pk=row.pk))
        page = f"{changelist(model)}{row.pk}/change/"
        html = client.get(page).content.decode()
        assert 'name="_save"' not in html, name
        response = client.post(page, {"_save": "Save", **{k: "" for k in before}})
        assert response.status_code == 403, (name, response.status_code)
        assert model_to_dict(model._default_manager.get(pk=row.pk)) == before, name
    assert Resource.objects.filter(kind="proxy").exists()
