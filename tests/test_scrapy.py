"""``resource_lease.contrib.scrapy.LeasedProxyMiddleware`` with a real Scrapy crawl.

A crawl (tests/procs/scrapy_crawl.py, its own process) fetches pages of two sites through the
local simulator (project/bench/crawl_site.py: 8 proxy ports, each site banning a quarter of
them), the pool's resources pointing at its ports. What the crawl saw, what the simulator
logged and what the database holds afterwards are compared; nothing is timed.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from scrapy.http import HtmlResponse, Response, TextResponse
from scrapy.settings import Settings

from project.bench.crawl_site import Simulator
from resource_lease.contrib.scrapy import LeasedProxyMiddleware, Verdicts, proxy_url, retry_after_seconds
from resource_lease.models import Cooldown, Resource
from resource_lease.pool import HELD, database_now, with_state
from resource_lease.sessions import bind
from tests.conftest import REPO, spawn

KIND = "scrapy-test"
PROXIES = 8
#: Each site bans 2 of the 8 proxies (seed 1: site-0 bans 2 and 4, site-1 bans 1 and 2).
SITES = 2
PAGES = 20


@pytest.fixture
def simulator(tmp_path: Path, transactional_db: None) -> Iterator[Simulator]:
    sim = Simulator(str(tmp_path / "simulator.log"), proxies=PROXIES, sites=SITES, seed=1)
    sim.start(cwd=str(REPO))
    try:
        Resource.objects.bulk_create(
            Resource(kind=KIND, name=f"proxy-{i}", data={"url": url}) for i, url in enumerate(sim.proxy_urls)
        )
        yield sim
    finally:
        sim.stop()


def _crawl(sim: Simulator, tmp_path: Path, *args: str, pages: int = PAGES, kind: str = KIND) -> dict[str, Any]:
    out, log = tmp_path / "crawl.json", tmp_path / "crawl.log"
    with open(log, "w") as stream:
        proc = spawn(
            "tests.procs.scrapy_crawl",
            *("--kind", kind, "--sites", ",".join(sim.sites), "--pages", str(pages), "--out", str(out), *args),
            stdout=stream,
            stderr=subprocess.STDOUT,
        )
        try:
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert proc.returncode == 0, log.read_text()[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    result["log"] = log.read_text()
    return result


def _held() -> int:
    return with_state(Resource.objects.filter(kind=KIND)).filter(state=HELD).count()


def _long_cooldowns() -> set[tuple[int, str]]:
    """(proxy index, site) of every cooldown with over 200 s left: a blocked report's 300 s
    (RESOURCE_LEASE_BLOCKED_RETRY_AFTER, the simulator's 403 giving no Retry-After)."""
    now = database_now()
    rows = Cooldown.objects.filter(resource__kind=KIND).values_list("resource__name", "target", "until")
    return {
        (int(name.removeprefix("proxy-")), target)
        for name, target, until in rows
        if until > now + dt.timedelta(seconds=200)
    }


def test_a_crawl_goes_through_leased_proxies_reports_each_response_and_leaves_nothing_held(
    simulator: Simulator, tmp_path: Path
) -> None:
    crawl = _crawl(simulator, tmp_path)
    stats, pages, answers = crawl["stats"], crawl["pages"], simulator.log()
    urls = {r.data["url"]: r.name for r in Resource.objects.filter(kind=KIND)}

    # Every page was fetched, each through a proxy of the pool, named as leased.
    assert sorted(p["url"] for p in pages) == sorted(f"http://{s}/p/{i}" for s in simulator.sites for i in range(PAGES))
    assert all(p["status"] == 200 and urls[p["proxy"]] == p["resource"] for p in pages)
    # Every request went through a lease, and the simulator answered each one.
    assert stats["resource_lease/leased"] == stats["downloader/request_count"] == len(answers)
    # Each answer was reported: 200 ok, 403 (and 429, should a proxy be sent to one site more
    # than 10 times in the minute) blocked.
    statuses = collections.Counter(status for _, _, _, status in answers)
    assert set(statuses) <= {200, 403, 429}, statuses
    assert stats["resource_lease/report/ok"] == statuses[200]
    assert stats.get("resource_lease/report/blocked", 0) == statuses[403] + statuses[429]
    assert statuses[403] > 0

    # A blocked report is recorded: the error score of exactly the proxies that were blocked
    # (an "ok" halves a score, never to zero).
    blocked = {proxy for _, proxy, _, status in answers if status in (403, 429)}
    scores = dict(Resource.objects.filter(kind=KIND).values_list("name", "health_score"))
    assert {name for name, score in scores.items() if score > 0} == {f"proxy-{i}" for i in blocked}

    # The cooldown for the site that blocked it held: no proxy was sent to a site that had
    # banned it twice (the proxy is leased to one request at a time, reported before released).
    banned_hits = collections.Counter((proxy, site) for _, proxy, site, status in answers if status == 403)
    assert max(banned_hits.values()) == 1, banned_hits
    # ... and for that site only: a proxy banned by one site went on serving the other after its
    # 403 (a quarantine of the whole proxy would have kept it from both).
    blocked_at = {(proxy, site): t for t, proxy, site, status in answers if status == 403}
    served_after = {
        (proxy, site)
        for (proxy, site), t in blocked_at.items()
        if any(p == proxy and s != site and status == 200 and u > t for u, p, s, status in answers)
    }
    assert served_after, (blocked_at, answers)
    # The cooldowns in the database: for exactly the pairs that were answered 403.
    assert _long_cooldowns() == set(banned_hits)

    # Without sessions, each site's pages went through several proxies (the control of the
    # session test below).
    for site in simulator.sites:
        assert len({p["proxy"] for p in pages if f"//{site}/" in p["url"]}) > 1

    # Nothing is left held.
    assert _held() == 0


def test_requests_of_one_session_go_through_the_sessions_proxy(simulator: Simulator, tmp_path: Path) -> None:
    # 8 pages a site, each site's requests in a session of their own ("acct-<site>"); fewer than
    # the site's 10 a minute, so only a ban moves a session to another proxy.
    # site-0's session starts bound to a proxy site-0 bans: its first answer is a 403, and the
    # session moves to another proxy for good.
    first = simulator.banned["site-0.test"][0]
    bind(connection.alias, KIND, "acct-site-0.test", Resource.objects.get(kind=KIND, name=f"proxy-{first}").pk)
    crawl = _crawl(simulator, tmp_path, "--sessions", pages=8)
    pages, answers = crawl["pages"], simulator.log()
    assert next(a for a in answers if a[2] == "site-0.test")[1:] == (first, "site-0.test", 403)

    assert len(pages) == 8 * SITES
    for site in simulator.sites:
        served = {p["proxy"] for p in pages if f"//{site}/" in p["url"]}
        assert len(served) == 1, (site, served)  # every page of the session through one proxy
        [proxy] = served
        assert simulator.proxy_of(int(proxy.rsplit(":", 1)[1])) not in simulator.banned[site]
    # A session bound first to a proxy its site bans was moved once, never back.
    banned_hits = collections.Counter((proxy, site) for _, proxy, site, status in answers if status == 403)
    assert all(n == 1 for n in banned_hits.values())
    assert crawl["stats"].get("resource_lease/rebound", 0) == len(banned_hits)
    assert _held() == 0


def test_negative_control_without_reports_banned_proxies_keep_being_sent_to_the_sites_that_ban_them(
    simulator: Simulator, tmp_path: Path
) -> None:
    # The default (epoll) reactor here, the asyncio one above: the middleware works on both.
    crawl = _crawl(simulator, tmp_path, "--no-report", "--reactor", "default")
    answers = simulator.log()

    banned_hits = collections.Counter((proxy, site) for _, proxy, site, status in answers if status == 403)
    assert max(banned_hits.values()) > 1, banned_hits  # what the test above shows never happens with reports
    assert "resource_lease/report/blocked" not in crawl["stats"]
    assert not Resource.objects.filter(kind=KIND, health_score__gt=0).exists()
    assert _long_cooldowns() == set()
    assert crawl["stats"]["resource_lease/leased"] == len(answers)
    assert _held() == 0


def test_a_download_longer_than_the_ttl_keeps_its_lease_and_its_report_counts(
    simulator: Simulator, tmp_path: Path
) -> None:
    # Pages answered after 5 s, leases of 3 s: renewed in the background (every ttl/3) while the
    # download runs, so the report after it is accepted (a lost lease's report is refused).
    crawl = _crawl(simulator, tmp_path, "--delay", "5", "--ttl", "3", pages=2)
    stats = crawl["stats"]

    assert len(crawl["pages"]) == 2 * SITES
    assert stats["resource_lease/leased"] == stats["downloader/request_count"]
    assert "resource_lease/report/refused" not in stats
    reported = sum(stats.get(f"resource_lease/report/{o}", 0) for o in ("ok", "blocked", "error"))
    assert reported == stats["downloader/response_count"]
    used = {p["resource"] for p in crawl["pages"]}
    assert all(Resource.objects.filter(kind=KIND, name__in=used).values_list("renewed_at", flat=True))
    assert _held() == 0


def test_a_kind_without_proxies_drops_each_request_at_once_and_the_crawl_ends(
    simulator: Simulator, tmp_path: Path
) -> None:
    crawl = _crawl(simulator, tmp_path, pages=2, kind="scrapy-test-none")

    assert crawl["pages"] == [] and simulator.log() == []  # nothing went out without a proxy
    assert crawl["stats"]["resource_lease/no_proxy"] == 2 * SITES  # once each: no kind, no waiting
    assert "there are no resources of kind 'scrapy-test-none'" in crawl["log"]


# -- judging responses, and the settings ------------------------------------------------------------


def _response(status: int, body: bytes = b"<html>fine</html>", **headers: str) -> Response:
    return HtmlResponse("http://site-0.test/p/1", status=status, body=body, headers=headers)


def test_responses_are_judged_by_status_retry_after_and_ban_markers() -> None:
    verdicts = Verdicts.from_settings(Settings({"RESOURCE_LEASE_BAN_MARKERS": ["g-recaptcha"]}))

    assert verdicts.outcome(_response(200)) == ("ok", None)
    assert verdicts.outcome(_response(404)) == ("ok", None)  # the proxy brought the site's answer
    assert verdicts.outcome(_response(500)) == ("ok", None)
    assert verdicts.outcome(_response(407)) == ("error", None)  # the proxy refused us
    assert verdicts.outcome(_response(403)) == ("blocked", 300.0)  # RESOURCE_LEASE_BLOCKED_RETRY_AFTER
    assert verdicts.outcome(_response(429, **{"Retry-After": "42"})) == ("blocked", 42.0)
    assert verdicts.outcome(_response(200, b'<div class="G-reCAPTCHA"></div>')) == ("blocked", 300.0)
    # Markers are looked for in text only.
    binary = Response("http://site-0.test/a.bin", status=200, body=b"g-recaptcha")
    assert verdicts.outcome(binary) == ("ok", None)
    assert isinstance(_response(200), TextResponse)

    without = Verdicts.from_settings(Settings({"RESOURCE_LEASE_BLOCKED_RETRY_AFTER": 0}))
    assert without.outcome(_response(403)) == ("blocked", None)
    assert without.outcome(_response(200, b"g-recaptcha")) == ("ok", None)  # no markers by default


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    assert retry_after_seconds(b"120") == 120.0
    assert retry_after_seconds("0") == 1.0  # a cooldown is > 0
    assert retry_after_seconds("Sat, 28 Nov 2026 12:01:00 GMT", now=1795867200.0) == 60.0
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("nan") is None


def test_the_proxy_url_comes_from_the_resources_data() -> None:
    assert proxy_url({"url": "http://u:p@10.0.0.1:8080"}) == "http://u:p@10.0.0.1:8080"
    assert proxy_url({"url": "HTTPS://10.0.0.1:8443"}) == "HTTPS://10.0.0.1:8443"
    assert proxy_url({"url": "10.0.0.1:3128"}) == "http://10.0.0.1:3128"
    assert proxy_url({"url": "socks5://10.0.0.1:1080"}) is None  # Scrapy speaks no SOCKS
    assert proxy_url({"url": ""}) is None
    assert proxy_url({"n": 1}) is None
    assert proxy_url(None) is None


class _Crawler:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = Settings(settings)
        self.stats = None


@pytest.mark.parametrize(
    "settings, message",
    [
        ({}, "RESOURCE_LEASE_KIND is not set"),
        ({"RESOURCE_LEASE_KIND": ""}, "RESOURCE_LEASE_KIND"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_TTL": 0}, "RESOURCE_LEASE_TTL"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_TIMEOUT": "soon"}, "RESOURCE_LEASE_TIMEOUT"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_WHERE": {"region": ["eu"]}}, "RESOURCE_LEASE_WHERE"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_BLOCKED_CODES": [403, 999]}, "RESOURCE_LEASE_BLOCKED_CODES"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_ERROR_CODES": [403]}, "share \\[403\\]"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_BAN_MARKERS": [""]}, "RESOURCE_LEASE_BAN_MARKERS"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_THREADS": 0}, "RESOURCE_LEASE_THREADS"),
        ({"RESOURCE_LEASE_KIND": "proxy", "RESOURCE_LEASE_NO_PROXY_RETRIES": -1}, "RESOURCE_LEASE_NO_PROXY_RETRIES"),
    ],
)
def test_bad_settings_are_a_clear_error_at_start(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LeasedProxyMiddleware.from_crawler(_Crawler(settings))  # type: ignore[arg-type]


def test_the_middleware_can_be_switched_off() -> None:
    from scrapy.exceptions import NotConfigured

    with pytest.raises(NotConfigured):
        LeasedProxyMiddleware.from_crawler(_Crawler({"RESOURCE_LEASE_ENABLED": False}))  # type: ignore[arg-type]
