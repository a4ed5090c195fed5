"""Pool policies for operators: the admin page (validated as ``pool_policy()``, permissions),
``manage.py pool_policy``, and each resource's health in the resource admin and
``inspect_pool --json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from html import unescape
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from resource_lease import acquire, pool_policy
from resource_lease.models import PoolPolicy, Resource

pytestmark = pytest.mark.django_db(transaction=True)

FORM = {
    "kind": "proxy",
    "error_threshold": "2",
    "error_decay": "0.5",
    "backoff_base": "30",
    "backoff_cap": "600",
    "target_rate_n": "",
    "target_rate_per": "",
    "cooldown": "0",
    "session_idle": "600",
    "max_uses": "",
    "max_age": "",
    "_save": "Save",
}


def test_the_admin_adds_and_edits_a_policy_in_force_for_pool_policy(admin_client: Client) -> None:
    response = admin_client.post("/admin/resource_lease/poolpolicy/add/", FORM)
    assert response.status_code == 302, unescape(response.content.decode())
    policy = pool_policy("proxy")
    assert policy.error_threshold == 2.0 and policy.backoff == (30.0, 600.0) and policy.target_rate is None
    row = PoolPolicy.objects.get(kind="proxy")
    response = admin_client.post(
        f"/admin/resource_lease/poolpolicy/{row.pk}/change/", {**FORM, "target_rate_n": "10", "target_rate_per": "60"}
    )
    assert response.status_code == 302
    assert pool_policy("proxy").target_rate == (10, 60.0)
    listing = unescape(admin_client.get("/admin/resource_lease/poolpolicy/").content.decode())
    assert "30 s to 600 s" in listing and "10 per 60 s" in listing


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backoff_base": "900"}, "backoff base must be <= its cap"),
        ({"error_threshold": "0"}, "error_threshold must be > 0"),
        ({"error_decay": "1"}, "error_decay must be in [0, 1)"),
        ({"target_rate_n": "10"}, "target_rate n and per go together"),
        ({"kind": "@lock"}, "kind must not start with '@'"),
    ],
)
def test_the_admin_refuses_a_bad_policy_naming_it_and_saves_nothing(admin_client: Client, changes, message) -> None:
    response = admin_client.post("/admin/resource_lease/poolpolicy/add/", {**FORM, **changes})
    assert response.status_code == 200
    assert message in unescape(response.content.decode())
    assert not PoolPolicy.objects.exists()


def test_the_policy_page_respects_model_permissions(staff: Callable[..., Client]) -> None:
    viewer = staff("view_poolpolicy")
    assert viewer.get("/admin/resource_lease/poolpolicy/").status_code == 200
    assert viewer.post("/admin/resource_lease/poolpolicy/add/", FORM).status_code == 403
    assert not PoolPolicy.objects.exists()
    assert staff().get("/admin/resource_lease/poolpolicy/").status_code == 403


def test_the_command_shows_and_changes_a_policy() -> None:
    out = StringIO()
    call_command("pool_policy", "proxy", "--json", stdout=out)
    assert json.loads(out.getvalue())["backoff"] == [60.0, 3600.0]
    assert not PoolPolicy.objects.exists()
    out = StringIO()
    call_command(
        "pool_policy",
        "proxy",
        "--backoff",
        "5",
        "50",
        "--target-rate",
        "10",
        "60",
        "--max-uses",
        "9",
        "--json",
        stdout=out,
    )
    shown = json.loads(out.getvalue())
    assert shown["backoff"] == [5.0, 50.0] and shown["target_rate"] == [10, 60.0] and shown["max_uses"] == 9
    call_command("pool_policy", "proxy", "--no-max-uses", "--no-target-rate", stdout=StringIO())
    assert pool_policy("proxy").max_uses is None and pool_policy("proxy").target_rate is None
    text = StringIO()
    call_command("pool_policy", "proxy", stdout=text)
    assert "backoff: (5.0, 50.0)" in text.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backoff", "60", "30"], "backoff base must be <= its cap"),
        (["--error-threshold", "-1"], "error_threshold must be > 0"),
        (["--max-uses", "0"], "max_uses must be an integer >= 1"),
        (["--target-rate", "x", "60"], "target_rate must be an integer and seconds"),
    ],
)
def test_the_command_refuses_bad_values_and_writes_nothing(args, message) -> None:
    with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call_command("pool_policy", "proxy", *args, stdout=StringIO())
    assert not PoolPolicy.objects.exists()


def test_each_resource_s_health_in_inspect_pool_and_the_admin(make_pool, admin_client: Client) -> None:
    make_pool("proxy", 2)
    pool_policy("proxy", error_threshold=1, backoff=(600, 600))
    with acquire("proxy") as lease:
        lease.report("error")
        name = lease.resource.name
    out = StringIO()
    call_command("inspect_pool", "--json", stdout=out)
    resources = {r["name"]: r for r in json.loads(out.getvalue())["resources"]}
    assert (resources[name]["health_score"], resources[name]["backoff_level"]) == (1.0, 1)
    assert resources[name]["state"] == "quarantined" and resources[name]["quarantined_until"]
    assert resources[name]["quarantine_reason"].startswith("automatic: error reported by")
    other = next(n for n in resources if n != name)
    assert (resources[other]["health_score"], resources[other]["backoff_level"]) == (0.0, 0)
    table = StringIO()
    call_command("inspect_pool", stdout=table)
    assert "HEALTH" in table.getvalue() and "1 L1" in table.getvalue()
    row = Resource.objects.get(name=name)
    page = unescape(admin_client.get(f"/admin/resource_lease/resource/{row.pk}/change/").content.decode())
    assert "Health (written by lease.report(); restore resets it)" in page
    assert '<div class="readonly">1</div>' in page.split("field-backoff_level", 1)[1][:1000]
