"""A real Scrapy crawl through ``LeasedProxyMiddleware`` (tests/test_scrapy.py).

    python -m tests.procs.scrapy_crawl --kind K --sites site-0.test,site-1.test --pages 12 --out FILE
        [--no-report] [--reactor asyncio|default] [--delay S --ttl S] [--sessions]

Fetches ``http://<site>/p/<i>`` for every site and page through proxies leased from K, retrying
403 and 429 (each retry leases anew). Writes one JSON document to ``--out``: the pages fetched
(url, status, proxy, resource) and the crawl's stats.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tests.procs import setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--sites", required=True)
    parser.add_argument("--pages", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument("--reactor", choices=["asyncio", "default"], default="asyncio")
    parser.add_argument("--delay", type=float, default=0.0, help="each page answered after this many seconds")
    parser.add_argument("--ttl", type=float, default=60.0)
    parser.add_argument("--sessions", action="store_true", help="each site's requests in the session 'acct-<site>'")
    args = parser.parse_args()
    setup()

    import scrapy
    from scrapy.crawler import CrawlerProcess

    pages: list[dict[str, Any]] = []
    query = f"?delay={args.delay:g}" if args.delay else ""
    # Interleaved: the scheduler's queue is last in, first out, and both sites should be crawled at once.
    urls = [f"http://{site}/p/{i}{query}" for i in range(args.pages) for site in args.sites.split(",")]

    class Pages(scrapy.Spider):
        name = "pages"

        async def start(self) -> Any:
            if not args.sessions:
                for url in urls:
                    yield scrapy.Request(url, callback=self.parse)
                return
            # A session per site: its first page alone (as a log-in would be), the rest once
            # it is answered, so the session is bound before its pages run at once.
            for site in args.sites.split(","):
                yield scrapy.Request(
                    self.url(site, 0), callback=self.parse, meta={"resource_lease_session": f"acct-{site}"}
                )

        def url(self, site: str, page: int) -> str:
            return f"http://{site}/p/{page}{query}"

        def parse(self, response: scrapy.http.Response) -> Any:
            session = response.meta.get("resource_lease_session")
            if session is not None and response.url.split("?")[0].endswith("/p/0"):
                site = session.removeprefix("acct-")
                for page in range(1, args.pages):
                    yield scrapy.Request(
                        self.url(site, page), callback=self.parse, meta={"resource_lease_session": session}
                    )
            pages.append(
                {
                    "url": response.url,
                    "status": response.status,
                    "proxy": response.meta.get("proxy"),
                    "resource": response.meta.get("resource_lease_name"),
                }
            )

    reactor = (
        "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
        if args.reactor == "asyncio"
        else "twisted.internet.epollreactor.EPollReactor"
    )
    process = CrawlerProcess(
        {
            "DOWNLOADER_MIDDLEWARES": {"resource_lease.contrib.scrapy.LeasedProxyMiddleware": 740},
            "RESOURCE_LEASE_KIND": args.kind,
            "RESOURCE_LEASE_REPORT": not args.no_report,
            "RESOURCE_LEASE_TIMEOUT": 20,
            "RESOURCE_LEASE_TTL": args.ttl,
            "TWISTED_REACTOR": reactor,
            "CONCURRENT_REQUESTS": 8,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
            "RETRY_HTTP_CODES": [403, 429],
            "RETRY_TIMES": 8,
            "DOWNLOAD_TIMEOUT": 10,
            "ROBOTSTXT_OBEY": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
        },
        install_root_handler=True,
    )
    crawler = process.create_crawler(Pages)
    process.crawl(crawler)
    process.start()
    stats = {k: v for k, v in (crawler.stats.get_stats() if crawler.stats else {}).items() if isinstance(v, int)}
    with open(args.out, "w") as out:
        json.dump({"pages": pages, "stats": stats}, out)


if __name__ == "__main__":
    main()
