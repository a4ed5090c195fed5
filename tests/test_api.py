"""The HTTP API in-process (Django's test client: the views under WSGI, each in an event loop
of its own) on each database: the contract's answers, tokens, idempotency keys, and bad input
that changes nothing. tests/test_api_servers.py runs the same views in uvicorn processes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from resource_lease.api.tokens import create_token, revoke_token
from resource_lease.db.operations import ops
from resource_lease.health import pool_policy
from resource_lease.models import ApiToken, IdempotencyKey, Resource

API = "/lease/api/"


class Api:
    """A client of the API with one token."""

    def __init__(self, token: str | None) -> None:
        headers = {} if token is None else {"HTTP_AUTHORIZATION": f"Bearer {token}"}
        self.client = Client(**headers)

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> Any:
        data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
        return self.client.post(API + path, data, content_type="application/json")

    def get(self, path: str) -> Any:
        return self.client.get(API + path)


@pytest.fixture
def api(make_pool: Callable[..., Any]) -> Callable[..., Api]:
    make_pool("gpu", 2)
    made: dict[str, int] = {}

    def make(name: str = "alice", kinds: str = "") -> Api:
        made[name] = made.get(name, 0)
        _, text = create_token(name, kinds)
        return Api(text)

    return make


def test_acquire_renew_read_release(api: Callable[..., Api]) -> None:
    alice = api()
    answer = alice.post("leases", {"kind": "gpu", "ttl": 10, "holder": "job-1"})
    assert answer.status_code == 201
    lease = answer.json()
    assert set(lease) == {
        "id",
        "kind",
        "name",
        "data",
        "fence",
        "expires_at",
        "holder",
        "ttl",
        "target",
        "session",
        "rebound",
    }
    assert lease["target"] is None
    assert lease["kind"] == "gpu" and lease["ttl"] == 10 and lease["expires_at"].endswith("Z")
    assert lease["holder"].startswith("http:alice:job-1:")
    row = Resource.objects.get(kind="gpu", name=lease["name"])
    assert (row.holder, row.fence) == (lease["holder"], lease["fence"])

    renewed = alice.post(f"leases/{lease['id']}/renew", {"ttl": 20})
    assert renewed.status_code == 200 and renewed.json()["ttl"] == 20
    assert renewed.json()["expires_at"] > lease["expires_at"]
    read = alice.get(f"leases/{lease['id']}")
    assert read.status_code == 200 and read.json()["held"] is True

    pools = alice.get("pools").json()["pools"]
    assert pools == [{"kind": "gpu", "free": 1, "held": 1, "quarantined": 0, "disabled": 0, "waiting": 0}]

    assert alice.post(f"leases/{lease['id']}/release").json() == {"released": True}
    assert alice.post(f"leases/{lease['id']}/release").json() == {"released": False}
    gone = alice.post(f"leases/{lease['id']}/renew")
    assert gone.status_code == 410 and gone.json()["field"] == "id"
    assert alice.get(f"leases/{lease['id']}").json()["held"] is False


def test_none_in_time_is_423_with_retry_after_and_no_kind_is_404(api: Callable[..., Api]) -> None:
    alice = api()
    for _ in range(2):
        assert alice.post("leases", {"kind": "gpu", "ttl": 30}).status_code == 201
    locked = alice.post("leases", {"kind": "gpu", "wait": 0.2})
    assert locked.status_code == 423
    assert 1 <= int(locked["Retry-After"]) <= 60
    missing = alice.post("leases", {"kind": "tpu"})
    assert missing.status_code == 404 and missing.json()["field"] == "kind"


def _failures(reason: str) -> float:
    prometheus_client = pytest.importorskip("prometheus_client")
    value = prometheus_client.REGISTRY.get_sample_value("resource_lease_api_auth_failures_total", {"reason": reason})
    return value or 0.0


def test_tokens_401_and_403(api: Callable[..., Api]) -> None:
    alice, bob, cpu_only = api("alice"), api("bob"), api("cpu-only", kinds="cpu")
    unknown, missing = _failures("unknown"), _failures("missing")
    assert Api(None).post("leases", {"kind": "gpu"}).status_code == 401
    assert Api("rl_not-a-token").post("leases", {"kind": "gpu"}).status_code == 401
    assert Api(None).get("pools")["WWW-Authenticate"].startswith("Bearer")
    assert (_failures("unknown"), _failures("missing")) == (unknown + 1, missing + 2)
    refused = cpu_only.post("leases", {"kind": "gpu"})
    assert refused.status_code == 403 and refused.json()["field"] == "kind"
    assert cpu_only.get("pools").json() == {"pools": []}

    lease = alice.post("leases", {"kind": "gpu"}).json()
    for path in (f"leases/{lease['id']}/renew", f"leases/{lease['id']}/release", f"leases/{lease['id']}/report"):
        assert bob.post(path, {"outcome": "ok"}).status_code == 403
    assert bob.get(f"leases/{lease['id']}").status_code == 403
    assert Resource.objects.get(name=lease["name"]).holder == lease["holder"]  # untouched

    tampered = lease["id"][:-2] + ("AA" if not lease["id"].endswith("AA") else "BB")
    assert alice.post(f"leases/{tampered}/renew").status_code == 404

    assert revoke_token("alice")
    assert alice.post(f"leases/{lease['id']}/renew").status_code == 401
    assert ApiToken.objects.get(name="alice").last_used_at is not None


def test_idempotency_key_never_grants_twice(api: Callable[..., Api]) -> None:
    alice, bob = api("alice"), api("bob")
    first = alice.post("leases", {"kind": "gpu", "idempotency_key": "job-7"})
    again = alice.post("leases", {"kind": "gpu", "idempotency_key": "job-7"})
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert (again.json()["name"], again.json()["fence"]) == (first.json()["name"], first.json()["fence"])
    assert Resource.objects.live().filter(kind="gpu").count() == 1
    # Another token's key of the same text is another key.
    assert bob.post("leases", {"kind": "gpu", "idempotency_key": "job-7"}).status_code == 201
    other = alice.post("leases", {"kind": "gpu", "where": {"url": "x"}, "idempotency_key": "job-7"})
    assert other.status_code == 400 and other.json()["field"] == "idempotency_key"
    assert alice.post(f"leases/{first.json()['id']}/release").json() == {"released": True}
    after = alice.post("leases", {"kind": "gpu", "idempotency_key": "job-7"})
    assert after.status_code == 410 and after.json()["field"] == "idempotency_key"
    assert Resource.objects.live().filter(kind="gpu").count() == 1  # bob's only


def test_a_grant_whose_answer_was_lost_is_found_by_the_retry(api: Callable[..., Api]) -> None:
    """A server that granted and died before answering (or recording the grant): the retry
    with the key finds the grant by its holder and answers it."""
    from resource_lease.api import bodies, keys

    alice = api("alice")
    token = ApiToken.objects.get(name="alice")
    body = bodies.AcquireBody.of(json.dumps({"kind": "gpu", "idempotency_key": "lost"}).encode())
    claim = keys.claim(token, body)
    assert claim.state == "claimed"
    from resource_lease.lease import acquire

    lease = acquire("gpu", holder=claim.holder, ttl=30)  # granted; then the server died
    IdempotencyKey.objects.filter(pk=claim.row).update(
        claimed_until=Resource.objects.get(pk=lease.resource.pk).acquired_at
    )
    retried = alice.post("leases", {"kind": "gpu", "idempotency_key": "lost"})
    assert retried.status_code == 201
    assert (retried.json()["name"], retried.json()["fence"]) == (lease.resource.name, lease.fence)
    assert Resource.objects.live().filter(kind="gpu").count() == 1


def test_a_session_keeps_its_resource_over_http(api: Callable[..., Api]) -> None:
    alice = api()
    first = alice.post("leases", {"kind": "gpu", "session": "acct-42"}).json()
    assert (first["session"], first["rebound"]) == ("acct-42", False)
    alice.post(f"leases/{first['id']}/release", {})
    for _ in range(3):
        again = alice.post("leases", {"kind": "gpu", "session": "acct-42"}).json()
        assert again["name"] == first["name"], again
        alice.post(f"leases/{again['id']}/release", {})
    bad = alice.post("leases", {"kind": "gpu", "session": "s" * 201})
    assert bad.status_code == 400 and bad.json()["field"] == "session"


def test_a_target_and_its_cooldown_over_http(api: Callable[..., Api]) -> None:
    """A lease for a target; its release with a cooldown keeps the resource from that target
    only (423 for it, 201 for another); a report of "blocked" with retry_after cools it down
    for its target without quarantining it; a cooldown on a lease without a target, or a bad
    target, is 400 naming the field, with nothing written."""
    from resource_lease.models import Cooldown

    alice = api()
    Resource.objects.filter(kind="gpu").exclude(name="gpu-0").delete()
    bad = alice.post("leases", {"kind": "gpu", "target": "x" * 201})
    assert bad.status_code == 400 and bad.json()["field"] == "target"
    lease = alice.post("leases", {"kind": "gpu", "target": "shop.example"}).json()
    assert lease["target"] == "shop.example"
    assert alice.post(f"leases/{lease['id']}/release", {"cooldown": 30}).json() == {"released": True}
    assert alice.post("leases", {"kind": "gpu", "target": "shop.example"}).status_code == 423
    other = alice.post("leases", {"kind": "gpu", "target": "news.example"})
    assert other.status_code == 201
    blocked = alice.post(f"leases/{other.json()['id']}/report", {"outcome": "blocked", "retry_after": 30})
    assert blocked.status_code == 200
    row = Resource.objects.get(kind="gpu")
    assert row.quarantined_until is None and row.health_score == 1.0
    assert sorted(Cooldown.objects.values_list("target", flat=True)) == ["news.example", "shop.example"]
    alice.post(f"leases/{other.json()['id']}/release", {})
    plain = alice.post("leases", {"kind": "gpu"}).json()
    refused = alice.post(f"leases/{plain['id']}/release", {"cooldown": 5})
    assert refused.status_code == 400 and refused.json()["field"] == "cooldown"
    assert ops("default").is_held(pk=row.pk, holder=plain["holder"], fence=plain["fence"])
    assert Cooldown.objects.count() == 2


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_release_over_http_counts_the_use_from_the_release(
    api: Callable[..., Api], make_pool: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """Under the policy's target_rate a release over HTTP moves its grant's time to the
    release, as ``Lease.release`` does: the window ends ``per`` after the release (negative
    control: a release that only cools leaves it at grant + ``per``)."""
    import datetime as dt

    from resource_lease import targets
    from resource_lease.models import Cooldown
    from resource_lease.pool import database_now

    make_pool("proxy", 1)
    pool_policy("proxy", target_rate=(1, 60))
    if variant == "negative-control":
        monkeypatch.setattr(targets, "used_elsewhere", lambda grant, seconds, rate, now: None)
    alice = api()
    lease = alice.post("leases", {"kind": "proxy", "target": "api.example"}).json()
    granted_until = Cooldown.objects.get(target="api.example").until
    time.sleep(0.5)
    released_at = database_now()
    assert alice.post(f"leases/{lease['id']}/release", {}).json() == {"released": True}
    until = Cooldown.objects.get(target="api.example").until
    if variant == "engine":
        assert until >= released_at + dt.timedelta(seconds=60), (until, released_at)
    else:
        assert until == granted_until < released_at + dt.timedelta(seconds=60)
    assert alice.post("leases", {"kind": "proxy", "target": "api.example"}).status_code == 423


def test_a_report_over_http_is_the_leases_report_fenced_and_judged_by_the_granted_level(
    api: Callable[..., Api], make_pool: Callable[..., Any]
) -> None:
    make_pool("flaky", 1)
    pool_policy("flaky", error_threshold=2, backoff=(0.3, 0.6))
    alice = api()
    lease = alice.post("leases", {"kind": "flaky"}).json()
    pk = Resource.objects.get(kind="flaky").pk
    first = alice.post(f"leases/{lease['id']}/report", {"outcome": "error"})
    assert (first.status_code, first.json()) == (200, {})
    assert Resource.objects.get(pk=pk).health_score == 1.0
    assert alice.post(f"leases/{lease['id']}/report", {"outcome": "blocked"}).status_code == 200
    tripped = Resource.objects.get(pk=pk)
    assert tripped.backoff_level == 1 and tripped.quarantined_until is not None
    assert alice.post(f"leases/{lease['id']}/release").json() == {"released": True}
    # A report from a grant no longer held is refused, and changes nothing.
    late = alice.post(f"leases/{lease['id']}/report", {"outcome": "error"})
    assert late.status_code == 410 and late.json()["field"] == "id"
    after = Resource.objects.get(pk=pk)
    assert (after.health_score, after.backoff_level) == (tripped.health_score, tripped.backoff_level)
    # Once the backoff is over the next grant is a probation grant (level 1 as granted, carried
    # by its id): its "ok" makes the resource healthy again.
    deadline = time.monotonic() + 30
    while (probation := alice.post("leases", {"kind": "flaky", "wait": 1})).status_code != 201:
        assert time.monotonic() < deadline, probation.json()
    assert alice.post(f"leases/{probation.json()['id']}/report", {"outcome": "ok"}).status_code == 200
    healthy = Resource.objects.get(pk=pk)
    assert (healthy.health_score, healthy.backoff_level) == (0.0, 0)


def test_openapi_document(api: Callable[..., Api]) -> None:
    document = Client().get(API + "openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {"/leases", "/leases/{id}/renew", "/leases/{id}/release", "/pools"} <= set(document["paths"])


def test_lease_token_command(transactional_db: None, capsys: pytest.CaptureFixture[str]) -> None:
    call_command("lease_token", "create", "ci", "--kinds", "gpu,proxy")
    text = capsys.readouterr().out.strip()
    token = ApiToken.objects.get(name="ci")
    assert text.startswith("rl_") and text not in (token.digest, token.prefix) and token.kind_list() == ["gpu", "proxy"]
    call_command("lease_token", "list", "--json")
    assert json.loads(capsys.readouterr().out)[0]["name"] == "ci"
    call_command("lease_token", "revoke", "ci")
    assert ApiToken.objects.get(name="ci").revoked
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="name"):
        call_command("lease_token", "create", "bad name!")
    with pytest.raises(CommandError, match="no active token"):
        call_command("lease_token", "revoke", "ci")


def test_admin_makes_shows_and_revokes_tokens_and_marks_http_leases(
    api: Callable[..., Api], admin_client: Client
) -> None:
    made = admin_client.post("/admin/resource_lease/apitoken/add/", {"name": "ops", "kinds": "gpu"}, follow=True)
    assert made.status_code == 200
    shown = [str(m) for m in made.context["messages"]]
    (text,) = [word for m in shown for word in m.split() if word.startswith("rl_")]
    token = ApiToken.objects.get(name="ops")
    assert token.digest != text and text not in token.digest
    lease = Api(text).post("leases", {"kind": "gpu"}).json()  # the shown text works
    listing = admin_client.get("/admin/resource_lease/apitoken/").content.decode()
    assert "ops" in listing and token.prefix in listing and text not in listing
    assert "over HTTP, token ops" in admin_client.get("/admin/resource_lease/resource/").content.decode()
    out = StringIO()
    call_command("inspect_pool", "--json", stdout=out)
    (row,) = [r for r in json.loads(out.getvalue())["resources"] if r["name"] == lease["name"]]
    assert row["over_http"] is True
    admin_client.post(
        "/admin/resource_lease/apitoken/", {"action": "revoke", "_selected_action": [token.pk]}, follow=True
    )
    assert ApiToken.objects.get(name="ops").revoked
    assert Api(text).get("pools").status_code == 401
    assert admin_client.get(f"/admin/resource_lease/apitoken/{token.pk}/delete/").status_code == 403
