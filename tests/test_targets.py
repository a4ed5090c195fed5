"""Targets and cooldowns (``acquire(kind, target=...)``, docs/learning.md#targets), on the real
database, with real processes where the line of waiters is involved:

- a cooldown keeps a resource from its target only, and ends by the database's clock, never
  early; a report of "blocked" with retry_after cools the resource down for the lease's
  target instead of quarantining it for everyone;
- a waiter whose target every free row is cooling down for looks again when the first
  cooldown ends (no release tells it): served then, with the fallback poll far above the
  test's deadline (negative control: a look that ignores the cooldown's end is never served);
- a waiter never holds up the rows it may not take: a waiter for another target behind it is
  served at once when such a row frees up (negative controls: a grant statement that counts
  every waiter ahead, and on PostgreSQL a release that tells the first waiter whatever its
  target);
- target_rate=(n, per): at most n grants of one resource for one target in any per seconds;
  a release moves its grant's time to the release, so the window counts each use from its end
  (negative control: a release that keeps the grant's time ends the window before it);
- four processes cycling one target with a cooldown never get a resource back before its
  cooldown ends (negative control: the same without the cooldown shows such grants);
- bad input is a ValueError naming it, with nothing written.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from resource_lease import NoResourceAvailable, aacquire, acquire, pool_policy
from resource_lease.db.connections import lease_connection
from resource_lease.models import Cooldown, Resource
from resource_lease.pool import database_now
from tests.conftest import worker_env
from tests.procs.target_worker import blind

pytestmark = pytest.mark.django_db(transaction=True)


def never_poll(**extra: str) -> dict[str, str]:
    """A child's environment in which it looks again at most every 120 s unless told: far
    above every deadline here, so a waiter nobody tells (and whose look does not say when to
    look again) is never served (PostgreSQL; elsewhere a waiter looks every LINE_POLL)."""
    return worker_env(RESOURCE_LEASE_LINE_POLL_MAX="120", **extra)


def cooldown_of(lease: Any) -> Cooldown:
    return Cooldown.objects.get(resource_id=lease.resource.pk, target=lease.target)


def test_a_cooldown_keeps_a_resource_from_its_target_only(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", target="shop.example", ttl=30)
    assert lease.target == "shop.example"
    before = database_now()
    assert lease.release(cooldown=30) is True
    until = Cooldown.objects.get(target="shop.example").until
    assert before.timestamp() + 29 < until.timestamp() < database_now().timestamp() + 30.5
    with pytest.raises(NoResourceAvailable, match="not cooling down for 'shop.example'"):
        acquire("proxy", target="shop.example", timeout=0)
    other = acquire("proxy", target="news.example", timeout=0)  # another target: unaffected
    assert other.resource.pk == lease.resource.pk
    other.release()
    plain = acquire("proxy", timeout=0)  # no target: unaffected
    assert plain.target is None
    plain.release()
    # A cooldown only moves later: a shorter one leaves the longer one in force.
    again = acquire("proxy", target="news.example", timeout=0)
    again.release(cooldown=60)
    later = Cooldown.objects.get(target="news.example").until
    again = acquire("proxy", target="other.example", timeout=0)
    again.release()
    assert Cooldown.objects.get(target="news.example").until == later


def test_a_targeted_grant_probes_the_sample_and_a_probe_respects_the_cooldown(make_pool) -> None:
    """A grant for a target probes the thread's sample of free rows (one statement by primary
    key, with the cooldown test in it) before any scan; a row cooling down for that target is
    a miss for it alone: it stays in the sample, and another target's probe takes it."""
    make_pool("proxy", 1)
    acquire("proxy", target="shop.example", ttl=30).release(cooldown=30)
    picker = lease_connection().picker
    probes, hits = picker.probes, picker.probe_hits
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", target="shop.example", timeout=0)
    assert picker.probes > probes and picker.probe_hits == hits  # probed, and refused by the cooldown
    assert [row[0] for row in picker.kinds["proxy"].rows] != []  # still in the sample for others
    probes = picker.probes
    other = acquire("proxy", target="news.example", timeout=0)
    assert (picker.probes, picker.probe_hits) == (probes + 1, hits + 1)  # granted by its probe
    other.release()


def test_the_policys_cooldown_is_a_targeted_releases_default(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", cooldown=20)
    with acquire("proxy", target="a.example", ttl=30):
        pass  # released on exit, with the policy's cooldown
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", target="a.example", timeout=0)
    acquire("proxy", timeout=0).release()  # an untargeted release sets nothing
    assert list(Cooldown.objects.values_list("target", flat=True)) == ["a.example"]


def test_a_report_of_blocked_cools_the_resource_down_for_its_target_only(make_pool) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", target="shop.example", ttl=30)
    lease.report("blocked", retry_after=40)
    row = Resource.objects.get(pk=lease.resource.pk)
    assert row.quarantined_until is None and row.health_score == 1.0  # a failure, not a quarantine
    assert cooldown_of(lease).until.timestamp() > database_now().timestamp() + 39
    lease.release()
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", target="shop.example", timeout=0)
    acquire("proxy", target="news.example", timeout=0).release()
    # Without a target, "blocked" with retry_after quarantines the resource for everyone.
    plain = acquire("proxy", timeout=0)
    plain.report("blocked", retry_after=40)
    assert Resource.objects.get(pk=plain.resource.pk).quarantined_until is not None


def test_a_stale_lease_cools_nothing_down(make_pool) -> None:
    from resource_lease import LeaseLost
    from resource_lease.pool import force_release

    make_pool("proxy", 1)
    lease = acquire("proxy", target="shop.example", ttl=30)
    force_release(Resource.objects.filter(pk=lease.resource.pk))
    with pytest.raises(LeaseLost):
        lease.report("blocked", retry_after=40)
    assert lease.release(cooldown=30) is False
    assert not Cooldown.objects.exists()


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_cooldown_ends_by_the_database_clock_and_its_waiter_is_served_then(
    make_pool, monkeypatch: pytest.MonkeyPatch, settings: Any, variant: str
) -> None:
    """The waiter is in line behind a cooldown of 1.5 s; nobody releases anything. Served when
    the cooldown ends by the database's clock (its grant's clock is past the cooldown's end),
    though it would look again only after 120 s unless its look said when. Negative control:
    a look that does not say when the first cooldown ends leaves it unserved (PostgreSQL, where
    a waiter relies on being told; elsewhere it looks every LINE_POLL)."""
    if variant == "negative-control" and connection.vendor != "postgresql":
        pytest.skip("elsewhere than on PostgreSQL a waiter looks every LINE_POLL: no wake-up to miss")
    make_pool("proxy", 1)
    settings.RESOURCE_LEASE = {**settings.RESOURCE_LEASE, "LINE_POLL_MAX": 120.0}
    if variant == "negative-control":
        import dataclasses

        from resource_lease.line import places

        real_look = places.look
        monkeypatch.setattr(places, "look", lambda *a, **k: dataclasses.replace(real_look(*a, **k), cooled_at=None))
    acquire("proxy", target="shop.example", ttl=30).release(cooldown=1.5)
    until = Cooldown.objects.get(target="shop.example").until
    if variant == "negative-control":
        with pytest.raises(NoResourceAvailable):
            acquire("proxy", target="shop.example", ttl=30, timeout=4)
        return
    lease = acquire("proxy", target="shop.example", ttl=30, timeout=10)
    assert lease.resource.acquired_at >= until  # never early, by the database's clock
    lease.release()


@pytest.fixture
def waiter(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = spawn_worker("tests.procs.target_worker", *args, env=env or never_poll(), stdout=subprocess.PIPE)
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "ready"
        return proc

    yield start


def answer(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    # Not communicate(timeout=...): it reads the pipe itself, past what readline() has
    # already buffered (the "ready" line's read may have taken this one too).
    proc.wait(timeout=timeout)
    assert proc.stdout is not None
    out = proc.stdout.read()
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def wait_for_places(n: int, kind: str = "proxy") -> None:
    from resource_lease.models import Waiter

    deadline = time.monotonic() + 30
    while Waiter.objects.filter(kind=kind).count() < n:
        assert time.monotonic() < deadline, "the waiters took no place in line"
        time.sleep(0.02)


def test_a_waiter_never_holds_up_a_newcomer_from_the_rows_it_may_not_take(make_pool, waiter, monkeypatch) -> None:
    """One resource, cooling down for a; a waiter for a in line. A newcomer without a target
    is granted the resource at once; negative control: a grant statement that counts every
    waiter ahead (the waiter for a among them) refuses it."""
    make_pool("proxy", 1)
    acquire("proxy", target="a", ttl=30).release(cooldown=60)
    blocked = waiter("wait", "--kind", "proxy", "--target", "a", "--timeout", "8")
    wait_for_places(1)
    newcomer = acquire("proxy", timeout=0)
    newcomer.release()
    blind(lease_connection("default").dialect, monkeypatch.setitem)
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", timeout=0)
    assert answer(blocked)["event"] == "refused"


@pytest.mark.parametrize("variant", ["engine", "blind-grant", "blind-tell"])
def test_a_waiter_behind_one_whose_target_a_freed_row_cools_for_is_served_at_once(
    make_pool, waiter, monkeypatch: pytest.MonkeyPatch, variant: str
) -> None:
    """Two resources, both held; the first cooling down for a. A waiter for a takes its place,
    then one for b. The first resource is released: the waiter for b is served at once (by a
    release that tells it, on PostgreSQL; by its look elsewhere), though the waiter for a is
    ahead of it. Negative controls: the waiter for b's grant counts the waiter for a
    (blind-grant), or the release tells the first waiter whatever its target (blind-tell,
    PostgreSQL): the waiter for b is not served."""
    if variant == "blind-tell" and connection.vendor != "postgresql":
        pytest.skip("only PostgreSQL's releases tell waiters their turn")
    one, two = make_pool("proxy", 2)
    first = acquire("proxy", target="a", ttl=30)
    first.release(cooldown=60)
    held = [acquire("proxy", ttl=30, timeout=0), acquire("proxy", ttl=30, timeout=0)]
    cooling = next(lease for lease in held if lease.resource.pk == first.resource.pk)
    other = next(lease for lease in held if lease is not cooling)
    env = never_poll(RESOURCE_LEASE_TEST_BLIND_COOLS="1") if variant == "blind-grant" else None
    # The waiter for a outlives the waiter for b's timeout with room to spare (a loaded machine):
    # it is served only once ``other`` is released, after for_b has answered.
    for_a = waiter("wait", "--kind", "proxy", "--target", "a", "--timeout", "20")
    wait_for_places(1)
    for_b = waiter("wait", "--kind", "proxy", "--target", "b", "--timeout", "6", env=env)
    wait_for_places(2)
    if variant == "blind-tell":
        dialect = lease_connection("default").dialect
        blind = re.sub(
            r" AND NOT EXISTS \(SELECT FROM \S+ c WHERE c\.target = w\.target .*? c\.until > statement_timestamp\(\)\)",
            "",
            dialect.sql["RELEASE"],
        )
        assert blind != dialect.sql["RELEASE"]
        monkeypatch.setitem(dialect.sql, "RELEASE", blind)
    time.sleep(0.5)  # both have looked and sleep (the fallback poll: 120 s)
    cooling.release()
    got = answer(for_b)
    if variant == "engine":
        assert got["event"] == "granted" and got["resource"] == cooling.resource.name, got
    else:
        assert got["event"] == "refused", got
    other.release()
    got_a = answer(for_a)
    assert got_a["event"] == "granted", got_a  # the other resource, free now


def test_target_rate_caps_grants_per_resource_per_target_in_any_window(make_pool) -> None:
    make_pool("proxy", 1)
    pool_policy("proxy", target_rate=(2, 3))
    grants = []
    for _ in range(2):
        lease = acquire("proxy", target="api.example", ttl=30)
        grants.append(lease.resource.acquired_at)
        lease.release()
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", target="api.example", timeout=0)
    acquire("proxy", target="other.example", timeout=0).release()  # another target: its own count
    third = acquire("proxy", target="api.example", ttl=30, timeout=10)  # waits for the window
    assert (third.resource.acquired_at - grants[0]).total_seconds() >= 3  # no 3 s hold more than 2
    third.release()
    # Negative control: without the cap the same grants follow each other at once.
    pool_policy("proxy", target_rate=None)
    for _ in range(3):
        acquire("proxy", target="free.example", timeout=0).release()


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_target_rate_counts_a_use_from_its_release(make_pool, variant: str) -> None:
    """A site counts the request when it arrives, after the grant: the window of the policy's
    target_rate must end ``per`` seconds after the use ended (the release), not after the
    grant, or the next grant's request reaches the site inside its window (429)."""
    make_pool("proxy", 1)
    pool_policy("proxy", target_rate=(1, 60))
    lease = acquire("proxy", target="api.example", ttl=30)
    granted_until = cooldown_of(lease).until
    # Counted at the grant: ``per`` seconds from it (the count's statement runs just after it).
    assert 60 <= (granted_until - lease.resource.acquired_at).total_seconds() < 60.4
    if variant == "negative-control":
        lease.counted = None  # a release that keeps the grant's time
    time.sleep(0.5)  # the holder's request goes out
    released_at = database_now()
    assert lease.release()
    until = cooldown_of(lease).until
    if variant == "engine":
        assert until >= released_at + dt.timedelta(seconds=60), (until, released_at)
    else:
        assert until == granted_until < released_at + dt.timedelta(seconds=60)
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", target="api.example", timeout=0)


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_processes_cycling_one_target_never_get_a_resource_back_before_its_cooldown(
    make_pool, spawn_worker, variant: str
) -> None:
    make_pool("proxy", 2)
    args = ["cycle", "--kind", "proxy", "--target", "t", "--seconds", "3", "--cooldown", "0.3"]
    if variant == "negative-control":
        args.append("--no-cooldown")
    procs = [spawn_worker("tests.procs.target_worker", *args, stdout=subprocess.PIPE) for _ in range(4)]
    grants = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        grants += json.loads(out.strip().splitlines()[-1])["grants"]
    early = []
    by_resource: dict[str, list[tuple[float, float]]] = {}
    for name, at, before_release in grants:
        by_resource.setdefault(name, []).append((at, before_release))
    for name, uses in by_resource.items():
        uses.sort()
        for (_, released), (next_at, _) in zip(uses, uses[1:], strict=False):
            if next_at < released + 0.3:
                early.append((name, round(next_at - released, 3)))
    print(f"targets {variant}: {len(grants)} grants, {len(early)} within a cooldown")
    assert len(grants) >= 8
    if variant == "engine":
        assert early == []
    else:
        assert early, "the negative control found every grant after a cooldown: the check cannot fail"


def test_where_priority_and_fences_work_with_a_target(make_pool) -> None:
    rows = make_pool("proxy", 2)
    Resource.objects.filter(pk=rows[0].pk).update(data={"region": "eu"})
    Resource.objects.filter(pk=rows[1].pk).update(data={"region": "us"})
    lease = acquire("proxy", target="t", where={"region": "eu"}, ttl=30)
    fence = lease.fence
    lease.release(cooldown=60)
    with pytest.raises(NoResourceAvailable):
        acquire("proxy", target="t", where={"region": "eu"}, timeout=0)
    again = acquire("proxy", target="u", where={"region": "eu"}, priority=5, timeout=0)
    assert again.resource.pk == rows[0].pk and again.fence > fence
    again.release()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"target": ""}, "target must be a non-empty string"),
        ({"target": "   "}, "target must be a non-empty string"),
        ({"target": 5}, "target must be a non-empty string"),
        ({"target": "x" * 201}, "target must be at most 200 characters"),
    ],
)
def test_a_bad_target_is_refused_naming_it(make_pool, kwargs: dict[str, Any], named: str) -> None:
    make_pool("proxy", 1)
    with pytest.raises(ValueError, match=named):
        acquire("proxy", **kwargs)
    assert not Resource.objects.filter(grant_token__gt="").exists()


@pytest.mark.parametrize(
    ("cooldown", "named"),
    [(0, "cooldown must be > 0"), (-1, "cooldown must be > 0"), (float("inf"), "cooldown must be finite"),
     (float("nan"), "cooldown must be finite"), ("5", "cooldown must be a number of seconds")],
)  # fmt: skip
def test_a_bad_cooldown_is_refused_naming_it_and_the_lease_stays_held(make_pool, cooldown: Any, named: str) -> None:
    make_pool("proxy", 1)
    lease = acquire("proxy", target="t", ttl=30)
    with pytest.raises(ValueError, match=named):
        lease.release(cooldown=cooldown)
    assert lease.is_held() and not Cooldown.objects.exists()
    assert lease.release() is True
    untargeted = acquire("proxy", timeout=0)
    with pytest.raises(ValueError, match="was not acquired with a target"):
        untargeted.release(cooldown=5)
    assert untargeted.is_held()
    untargeted.release()


@pytest.mark.asyncio
async def test_the_asyncio_twins_take_a_target_and_a_cooldown(make_pool) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(make_pool)("proxy", 1)
    lease = await aacquire("proxy", target="t", ttl=30)
    assert lease.target == "t"
    assert await lease.arelease(cooldown=30) is True
    with pytest.raises(NoResourceAvailable):
        await aacquire("proxy", target="t", timeout=0)


def test_operators_see_each_resources_cooldowns(make_pool, admin_client) -> None:
    """``inspect_pool`` (table and --json) and the resource's admin page show the targets a
    resource is cooling down for, with the time left by the database's clock."""
    import io

    from django.core.management import call_command

    make_pool("proxy", 2)
    lease = acquire("proxy", target="shop.example", ttl=30)
    lease.release(cooldown=120)
    out = io.StringIO()
    call_command("inspect_pool", "--json", stdout=out)
    shown = {r["name"]: r["cooldowns"] for r in json.loads(out.getvalue())["resources"]}
    assert [c["target"] for c in shown[lease.resource.name]] == ["shop.example"]
    assert 110 < shown[lease.resource.name][0]["left"] <= 120
    assert all(not cooling for name, cooling in shown.items() if name != lease.resource.name)
    table = io.StringIO()
    call_command("inspect_pool", stdout=table)
    assert "cooling for shop.example" in table.getvalue()
    page = admin_client.get(f"/admin/resource_lease/resource/{lease.resource.pk}/change/")
    assert page.status_code == 200 and "shop.example" in page.content.decode()
