"""project/bench/crawl_site.py, the crawl simulator the Scrapy test and ``lease_bench --scenario
crawl`` run against: bans fixed by ``--seed``, 429 past the rate, every answer logged."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from project.bench.crawl_site import Simulator, banned_proxies
from tests.conftest import REPO


def _get(proxy_url: str, url: str) -> tuple[int, str | None]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    try:
        with opener.open(url, timeout=10) as response:
            response.read()
            return int(response.status), None
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code, exc.headers.get("Retry-After")


def test_each_site_bans_a_fixed_quarter_of_the_proxies() -> None:
    bans = banned_proxies(40, 8, seed=1)
    assert bans == banned_proxies(40, 8, seed=1)  # the same bans every time
    assert bans != banned_proxies(40, 8, seed=2)
    assert list(bans) == [f"site-{s}.test" for s in range(8)]
    assert all(len(proxies) == 10 and len(set(proxies)) == 10 for proxies in bans.values())


def test_the_simulator_answers_as_the_site_bans_rate_limits_and_logs(tmp_path: Path) -> None:
    with Simulator(str(tmp_path / "answers.log"), proxies=4, sites=2, seed=1, rate=3, per=60).start(
        cwd=str(REPO)
    ) as sim:
        banned = sim.banned["site-0.test"]
        [free] = [i for i in range(4) if i not in banned and i not in sim.banned["site-1.test"]][:1]
        statuses = [_get(sim.proxy_urls[free], f"http://site-0.test/p/{i}") for i in range(4)]
        forbidden = _get(sim.proxy_urls[banned[0]], "http://site-0.test/p/1")
        other_site = _get(sim.proxy_urls[free], "http://site-1.test/p/1")  # its own count
        unknown = _get(sim.proxy_urls[free], "http://elsewhere.test/")
    assert [s for s, _ in statuses] == [200, 200, 200, 429]
    retry_after = statuses[-1][1]
    assert retry_after is not None and 1 <= int(retry_after) <= 60
    assert forbidden == (403, None)
    assert other_site == (200, None)
    assert unknown == (404, None)
    log = sim.log()
    assert [(proxy, site, status) for _, proxy, site, status in log] == [
        *[(free, "site-0.test", s) for s, _ in statuses],
        (banned[0], "site-0.test", 403),
        (free, "site-1.test", 200),
        (free, "elsewhere.test", 404),
    ]
