"""The admin at 1400 px, in headless Chromium, with the long values a crawler farm really has
(proxy URLs with users and passwords, Celery task holders, tracebacks, member data): every
list fits the page without a horizontal scrollbar, times are shown to the second by the
database's clock, the resource's own page has its operator buttons, and a quarantine in the
audit trail names the operator who did it.

Screenshots: artifacts/screenshots/layout-*.png (looked at, and described, in issue 22).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from admin_interface.models import Theme
from django.contrib import admin
from django.contrib.auth.models import User
from django.core.management import call_command

from project.demo.theme import install as install_theme
from resource_lease import Config, Dispenser, Election, Group, acquire, audit, counter, lock, rwlock, semaphore
from resource_lease.admin import ResourceAdmin
from resource_lease.api.tokens import create_token
from resource_lease.audit import acting_as
from resource_lease.db.operations import ops
from resource_lease.health import pool_policy
from resource_lease.models import Resource, Waiter
from resource_lease.pool import database_now, force_release, quarantine
from tests.test_browser import SCREENSHOTS
from tests.test_browser import page as browser_page  # noqa: F401  (the fixture, renamed)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1400
HOST = "crawler-eu-west-1a-17.compute.internal"
TASK = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
TASK_HOLDER = f"{HOST}:412345:ThreadPoolExecutor-0_3 task {TASK}"
PROXY_URL = "http://scraper-account-0042:s3cret-passw0rd@residential-eu.proxy-provider.example.com:31280"
ERROR = (
    "ConnectionError: HTTPSConnectionPool(host='shop.example.com', port=443): Max retries exceeded with url:"
    " /catalogue/category/books/mystery_3/index.html?page=17&sort=price (Caused by ProxyError('Unable to connect"
    " to proxy', RemoteDisconnected('Remote end closed connection without response')))"
)
SECONDS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


@pytest.fixture
def page(browser_page: Any) -> Any:  # noqa: F811  (the fixture imported above)
    """test_browser's headless Chromium tab, 1400 px wide."""
    browser_page.set_viewport_size({"width": WIDTH, "height": 900})
    return browser_page


@pytest.fixture
def kept(audit_on: Callable[..., Any]) -> Iterator[list[Any]]:
    """The crawler farm (``farm()``), with the audit trail on; let go after the test."""
    install_theme(Theme)
    audit_on(AUDIT_FLUSH_INTERVAL=60)
    things = farm()
    try:
        yield things
    finally:
        let_go(things)


def farm() -> list[Any]:
    """A crawler farm's state: what the admin pages show. Returns what must stay referenced."""
    kept: list[Any] = []
    Resource.objects.bulk_create(
        [
            Resource(kind="proxy", name=f"residential-eu-{i:02d}", data={"url": PROXY_URL, "region": "eu"})
            for i in range(8)
        ]
    )
    kept += [acquire("proxy", ttl=600, holder=f"{TASK_HOLDER[:-4]}{i:04d}") for i in range(3)]
    # A proxy none of them holds (which ones an acquire takes is random: its probe).
    spare = Resource.objects.filter(kind="proxy").exclude(pk__in=[lease.resource.pk for lease in kept])
    with acting_as("admin:operator"):
        quarantine([spare.order_by("name")[0].pk], reason="403 from the target site", seconds=3600)
    victim = acquire("proxy", ttl=600, holder=f"{HOST}:999:MainThread")
    with acting_as("admin:operator"):
        force_release(Resource.objects.filter(pk=victim.resource.pk))
    kept.append(lock("rebuild-search-index-for-the-eu-catalogue", ttl=600, holder=TASK_HOLDER, lock_delay=15))
    catalogue = rwlock("product-catalogue-of-the-eu-shop")
    kept += [catalogue.read(ttl=600, holder=f"{TASK_HOLDER}-r{i}") for i in range(2)]
    kept.append(rwlock("price-list-of-the-eu-shop").write(ttl=600, holder=TASK_HOLDER))
    counter("crawl:pages-fetched-from-shop.example.com").add(1234567)
    kept += [
        semaphore("exports-to-the-data-warehouse", slots=3, ttl=600, holder=f"{TASK_HOLDER}-{i}") for i in range(2)
    ]
    election = Election("celery-beat:crawler-farm-production", ttl=600, holder=f"{HOST}:412345")
    election.campaign(timeout=0)
    election.save_state({"entries": {"crawl-every-minute": {"last_run_at": "2026-11-24T23:59:00+00:00"}}})
    kept.append(election)
    group = Group(
        "recommender-nightly-cohort",
        ttl=600,
        member="worker-a",
        data={"host": HOST, "pid": 412345, "queues": ["crawl", "index", "recs"], "started": "2026-11-25T00:00:00Z"},
    )
    group.join()
    kept.append(group)
    d = Dispenser("shop.example.com", ttl=600, max_attempts=1)
    d.put(
        {f"https://shop.example.com/catalogue/category/books/mystery_3/page-{i}.html": {"depth": 3} for i in range(4)}
    )
    items = d.assign(f"{HOST}:412345", 4)
    d.fail(f"{HOST}:412345", items[:2], ERROR)
    params = Config("crawler", defaults={"max_pages": 1000, "user_agent": "Mozilla/5.0 (compatible; FarmBot/2.1)"})
    params.set("max_pages", 800)
    # Two crawlers in the proxies' line (as a waiter's place is written: Dialect.encode_where).
    now = database_now("default")
    for i, where in enumerate([{"region": "eu", "tier": 1}, None]):
        Waiter.objects.create(
            kind="proxy",
            holder=f"{TASK_HOLDER[:-4]}{9000 + i:04d}",
            priority=5 - i,
            filter=None if where is None else json.loads(ops("default").dialect.encode_where(where)),
            token=f"layout-{i}",
            since=now,
            expires_at=now + dt.timedelta(seconds=600),
        )
    audit.writer.flush()
    return kept


def login(page: Any, live_server: Any, path: str) -> None:
    User.objects.create_superuser("operator", "operator@example.com", "correct horse")
    page.goto(f"{live_server.url}/admin/login/?next={path}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{path}")


def overflow(page: Any) -> dict[str, int]:
    """How far the page, and the result list inside its scrolling box, are wider than shown."""
    return page.evaluate(
        """() => {
            const doc = document.documentElement;
            const box = document.querySelector('#changelist .results') || document.querySelector('#content-main');
            const table = document.querySelector('#result_list') || box;
            return {page: doc.scrollWidth - doc.clientWidth, list: table.scrollWidth - box.clientWidth};
        }"""
    )


LISTS = [
    ("resources", "/admin/resource_lease/resource/"),
    ("locks", "/admin/resource_lease/lockrow/"),
    ("semaphores", "/admin/resource_lease/semaphoreslot/"),
    ("elections", "/admin/resource_lease/electionrow/"),
    ("lease_events", "/admin/resource_lease/leaseevent/"),
    ("dispenser_items", "/admin/resource_lease/dispenseritem/"),
    ("group_members", "/admin/resource_lease/groupmember/"),
    ("config_entries", "/admin/resource_lease/configentry/"),
    ("overview", "/admin/resource_lease/pooloverview/"),
    ("waiters", "/admin/resource_lease/waiter/"),
    ("rwlocks", "/admin/resource_lease/rwlockrow/"),
    ("leadership_terms", "/admin/resource_lease/leadershipterm/"),
    ("counters", "/admin/resource_lease/counter/"),
    ("api_tokens", "/admin/resource_lease/apitoken/"),
    ("pool_policies", "/admin/resource_lease/poolpolicy/"),
]


def test_every_list_fits_1400_px_with_a_crawler_farm_s_values(live_server: Any, page: Any, kept: list[Any]) -> None:
    create_token(f"{HOST}-scrapy-fleet", "proxy,gpu,crawler-accounts-eu-west")
    pool_policy("proxy", error_threshold=3.0, backoff=(60, 3600), max_uses=50_000, max_age=86_400)
    login(page, live_server, "/admin/")
    found = {}
    for name, path in LISTS:
        page.goto(f"{live_server.url}{path}")
        page.screenshot(path=SCREENSHOTS / f"layout-{name}.png", full_page=True)
        found[name] = overflow(page)
    assert found == {name: {"page": 0, "list": 0} for name, _ in LISTS}

    # Times to the second (UTC), not "Nov. 25, 2026, 12:43 p.m.".
    page.goto(f"{live_server.url}/admin/resource_lease/leaseevent/")
    times = page.locator("#result_list tbody td.field-at, #result_list tbody th.field-at").all_inner_texts()
    assert times and all(SECONDS.fullmatch(t.strip()) for t in times), times
    assert "(UTC)" in page.locator("#result_list thead").inner_text().upper()
    # A quarantine names the operator who did it, not the resource's last (dead) holder.
    row = page.locator("#result_list tbody tr").filter(has=page.locator(".rl-badge", has_text="Quarantined"))
    assert row.locator("td.field-by").inner_text() == "admin:operator"
    assert HOST not in row.inner_text()
    forced = page.locator("#result_list tbody tr").filter(has=page.locator(".rl-badge", has_text="Force-released"))
    assert forced.locator("td.field-by").inner_text() == "admin:operator"
    assert f"cut off {HOST}:999:MainThread" in forced.locator("td.field-detail_display").inner_text()
    page.goto(f"{live_server.url}/admin/resource_lease/configentry/")
    updated = page.locator("#result_list tbody td.field-updated_at").all_inner_texts()
    assert updated and all(SECONDS.fullmatch(t.strip()) for t in updated), updated


def test_a_resource_s_page_has_its_operations_and_times_to_the_second(
    live_server: Any, page: Any, kept: list[Any]
) -> None:
    held = next(thing for thing in kept if getattr(thing, "kind", "") == "proxy")
    path = f"/admin/resource_lease/resource/{held.resource.pk}/change/"
    login(page, live_server, path)
    page.screenshot(path=SCREENSHOTS / "layout-resource_change.png", full_page=True)
    assert overflow(page)["page"] == 0
    for field in ("acquired_at", "renewed_at", "created_at"):
        text = page.locator(f".field-{field} .readonly").inner_text().strip()
        assert SECONDS.fullmatch(text), (field, text)
    assert SECONDS.fullmatch(page.locator(".field-busy_before_display .readonly").inner_text().strip())
    tools = page.locator(".object-tools").inner_text().upper()
    assert "FORCE RELEASE" in tools and "QUARANTINE" in tools and "RESTORE" not in tools

    page.click("button.rl-tool:has-text('Force release')")
    page.wait_for_url(f"**{path}")
    assert "Force-released 1 resource" in page.locator(".messagelist").inner_text()
    assert page.locator(".field-state_badge .rl-badge").inner_text() == "free"
    assert not held.is_held()

    page.click(".object-tools a:has-text('Quarantine')")
    page.fill("#id_reason", "407 from the proxy")
    page.screenshot(path=SCREENSHOTS / "layout-resource_quarantine.png", full_page=True)
    page.click("input[name=apply]")
    page.wait_for_url(f"**{path}")
    assert "Quarantined 1 resource for 1 hour: 407 from the proxy" in page.locator(".messagelist").inner_text()
    assert page.locator(".field-state_badge .rl-badge").inner_text() == "quarantined"
    page.screenshot(path=SCREENSHOTS / "layout-resource_change_quarantined.png", full_page=True)
    audit.writer.flush()
    page.reload()
    events = page.locator(".field-recent_events").inner_text()
    assert "Quarantined admin:operator for 1h 00m: 407 from the proxy" in events, events

    page.click("button.rl-tool:has-text('Restore')")
    page.wait_for_url(f"**{path}")
    assert "Restored 1 resource" in page.locator(".messagelist").inner_text()
    assert page.locator(".field-state_badge .rl-badge").inner_text() == "free"


def let_go(kept: list[Any]) -> None:
    for thing in kept:
        if isinstance(thing, Group):
            thing.leave()
        elif isinstance(thing, Election):
            thing.resign()
        else:
            thing.release()


@pytest.fixture
def seeded_proxies(tmp_path: Any, settings: Any) -> Iterator[list[Any]]:
    """Proxies loaded as ``seed_proxies`` loads them (named ``user@host:port``, the URL with its
    password), each with a region (a column and a filter: ``DATA_KEYS``), some leased by
    Celery tasks; let go after the test."""
    settings.RESOURCE_LEASE = {**settings.RESOURCE_LEASE, "DATA_KEYS": ("region",)}
    install_theme(Theme)
    lines = [f"http://crawl{i}:pw-{i:04d}-long-secret@10.20.{i // 10}.{i}:8080" for i in range(10, 40)]
    source = tmp_path / "proxies.txt"
    source.write_text("\n".join(lines) + "\n")
    call_command("seed_proxies", str(source), stdout=io.StringIO())
    for i, resource in enumerate(Resource.objects.filter(kind="proxy").order_by("name")):
        resource.data = {**resource.data, "region": ("eu", "us", "ap")[i % 3]}
        resource.save(update_fields=["data"])
    kept: list[Any] = [acquire("proxy", ttl=600, holder=f"{TASK_HOLDER[:-4]}{i:04d}") for i in range(4)]
    try:
        yield kept
    finally:
        let_go(kept)


def test_the_resources_list_fits_with_proxies_named_as_seed_proxies_names_them(
    live_server: Any, page: Any, seeded_proxies: list[Any]
) -> None:
    path = "/admin/resource_lease/resource/"
    login(page, live_server, path)
    assert Resource.objects.filter(name="crawl10@10.20.1.10:8080").exists()
    page.screenshot(path=SCREENSHOTS / "layout-resources_seeded.png", full_page=True)
    assert overflow(page) == {"page": 0, "list": 0}
    # The whole URL is on screen (masked), not behind a scrollbar.
    cell = page.locator("#result_list tbody td.field-url_display").first
    box, table = cell.bounding_box(), page.locator("#changelist .results").bounding_box()
    assert box and table and box["x"] + box["width"] <= table["x"] + table["width"] + 1
    assert "***" in cell.inner_text()
    assert page.locator("#result_list thead th.column-data_key_0").inner_text().strip().upper() == "REGION"

    # The region's filter, clicked (a drop-down list or links, as the theme says).
    dropdown = page.locator("#changelist-filter select").filter(has=page.locator("option", has_text="eu"))
    if dropdown.count():
        with page.expect_navigation():
            dropdown.select_option(label="eu")
    else:
        page.click("#changelist-filter a:text-is('eu')")
    page.wait_for_url("**data.region=eu**")
    regions = page.locator("#result_list tbody td.field-data_key_0").all_inner_texts()
    assert regions and set(regions) == {"eu"}, regions
    assert len(regions) == 10
    page.screenshot(path=SCREENSHOTS / "layout-resources_seeded_eu.png", full_page=True)
    assert overflow(page) == {"page": 0, "list": 0}


def test_negative_control_unbroken_names_push_the_url_behind_a_scrollbar(
    live_server: Any, page: Any, seeded_proxies: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The names as Django shows a plain field: no place to wrap in "crawl10@10.20.1.10:8080".
    monkeypatch.setattr(ResourceAdmin, "name_display", admin.display(description="name", ordering="name")(str_name))
    path = "/admin/resource_lease/resource/"
    login(page, live_server, path)
    page.screenshot(path=SCREENSHOTS / "layout-resources_seeded_unbroken.png", full_page=True)
    assert overflow(page)["list"] > 0


def str_name(self: Any, obj: Resource) -> str:
    return obj.name
