"""One crawler process of the ``crawl`` scenario (project/bench/crawl_bench.py): a plain urllib
HTTP client that fetches pages of random sites through proxies for DURATION seconds once GO
exists, then prints what it saw as one JSON line.

    python -m project.bench.crawl_driver MODE --sites a,b --duration S --go FILE --seed N
        [--kind K] [--proxies URL,URL,...]

MODE says how the crawler chooses a proxy:

- ``pool``: ``acquire(kind, target=site)``, then ``lease.report()`` (200 ok; 403 and 429
  blocked, with the Retry-After the site gave, else BAN_COOLDOWN; a network error error) and
  ``release()``: the pool with targets, reports and a policy;
- ``plain``: ``acquire(kind)`` and ``release()``, nothing else: today's pool;
- ``peer``: no pool; the proxy list in this process, and scrapy-rotating-proxies' algorithm
  (``Rotation`` below): a random proxy among those not known dead; any answer other than
  200/301/302, or a network error, marks the proxy dead for a full-jitter exponential backoff
  (base 300 s, cap 3600 s, doubling with each failure in a row); a 200 marks it good; dead
  proxies come back every 5 s once their backoff is over; with none left, all come back.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

#: Seconds a proxy stays off a site that answered 403 without Retry-After (pool mode): longer
#: than any run, as a site's ban is.
BAN_COOLDOWN = 600.0
#: Seconds a crawler waits in line for a proxy for its site before trying another site.
ACQUIRE_TIMEOUT = 1.0
#: With --acquire-timeout 0: seconds to pause after as many refused attempts in a row as there
#: are sites.
IDLE = 0.05
#: Seconds an HTTP request may take.
HTTP_TIMEOUT = 5.0


_openers: dict[str, urllib.request.OpenerDirector] = {}


def fetch(proxy_url: str, site: str, page: int) -> tuple[int, float | None]:
    """GET http://<site>/p/<page> through the HTTP proxy with urllib: (status, Retry-After
    seconds); status 0 for a network error."""
    opener = _openers.get(proxy_url)
    if opener is None:
        opener = _openers[proxy_url] = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    try:
        with opener.open(f"http://{site}/p/{page}", timeout=HTTP_TIMEOUT) as response:
            response.read()
            return int(response.status), None
    except urllib.error.HTTPError as exc:
        exc.read()
        header = exc.headers.get("Retry-After")
        try:
            return exc.code, float(header) if header else None
        except ValueError:
            return exc.code, None
    except (OSError, http.client.HTTPException):
        return 0, None


# -- the peer: scrapy-rotating-proxies' algorithm, written from its documented behaviour ----------


def _backoff(failures: int, base: float = 300.0, cap: float = 3600.0) -> float:
    """Full jitter over min(cap, base * 2 ** failures)."""
    top = cap if failures > math.log2(cap / base) else base * 2**failures
    return random.uniform(0, top)


class Rotation:
    """Per-process ban memory: each proxy good, dead (until a time) or unchecked."""

    REANIMATE_EVERY = 5.0

    def __init__(self, proxies: list[str]) -> None:
        self.unchecked = set(proxies)
        self.good: set[str] = set()
        self.dead: dict[str, float] = {}  # proxy -> when it may be tried again
        self.failures = dict.fromkeys(proxies, 0)
        self._next_reanimation = time.monotonic() + self.REANIMATE_EVERY

    def pick(self) -> str:
        now = time.monotonic()
        if now >= self._next_reanimation:
            self._next_reanimation = now + self.REANIMATE_EVERY
            for proxy, until in list(self.dead.items()):
                if until <= now:
                    del self.dead[proxy]
                    self.unchecked.add(proxy)
        available = sorted(self.unchecked | self.good)
        if not available:  # every one dead: all of them are unchecked again
            self.unchecked.update(self.dead)
            self.dead.clear()
            available = sorted(self.unchecked)
        return random.choice(available)

    def mark_dead(self, proxy: str) -> None:
        self.unchecked.discard(proxy)
        self.good.discard(proxy)
        self.dead[proxy] = time.monotonic() + _backoff(self.failures[proxy])
        self.failures[proxy] += 1

    def mark_good(self, proxy: str) -> None:
        self.unchecked.discard(proxy)
        self.dead.pop(proxy, None)
        self.good.add(proxy)
        self.failures[proxy] = 0


# -- the loop ---------------------------------------------------------------------------------------


def crawl(args: argparse.Namespace) -> dict[str, Any]:
    sites = args.sites.split(",")
    counts: dict[str, float] = dict.fromkeys(
        (
            "requests",
            "ok",
            "forbidden",
            "too_many",
            "errors",
            "other",
            "no_proxy",
            "refused_reports",
            "acquire_seconds",
            "finish_seconds",
        ),
        0,
    )
    rotation = Rotation(args.proxies.split(",")) if args.mode == "peer" else None
    if args.mode != "peer":
        from resource_lease.exceptions import LeaseLost, NoResourceAvailable
        from resource_lease.lease import acquire
    page = refused = 0

    def count(status: int) -> None:
        counts["requests"] += 1
        key = {200: "ok", 403: "forbidden", 429: "too_many", 0: "errors"}.get(status, "other")
        counts[key] += 1

    if args.mode != "peer":
        # Connected before the start, as a crawler that has been running is: the first grant
        # is not also the first connection (the peer's first request has none to make).
        from resource_lease.db.connections import lease_connection

        lease_connection().ensure()
    go = Path(args.go)
    sys.stderr.write("ready\n")
    sys.stderr.flush()
    while not go.exists():
        time.sleep(0.01)
    end = time.monotonic() + args.duration
    while time.monotonic() < end:
        site = random.choice(sites)
        page += 1
        if rotation is not None:
            proxy = rotation.pick()
            status, _ = fetch(proxy, site, page)
            count(status)
            if status in (200, 301, 302):
                rotation.mark_good(proxy)
            else:
                rotation.mark_dead(proxy)
            continue
        started = time.monotonic()
        try:
            if args.mode == "pool":
                lease = acquire(args.kind, target=site, ttl=30, timeout=args.acquire_timeout)
            else:
                lease = acquire(args.kind, ttl=30, timeout=args.acquire_timeout)
        except NoResourceAvailable:
            counts["no_proxy"] += 1
            refused += 1
            if args.acquire_timeout == 0 and refused % len(sites) == 0:
                time.sleep(IDLE)  # one attempt per site: none had a proxy just now
            counts["acquire_seconds"] += time.monotonic() - started
            continue
        refused = 0
        counts["acquire_seconds"] += time.monotonic() - started
        status, retry_after = fetch(lease.resource.data["url"], site, page)
        count(status)
        started = time.monotonic()
        if args.mode == "pool":
            try:
                if status == 200:
                    lease.report("ok")
                elif status in (403, 429):
                    lease.report("blocked", retry_after=retry_after or BAN_COOLDOWN)
                elif status == 0:
                    lease.report("error")
            except LeaseLost:
                counts["refused_reports"] += 1
        lease.release()
        counts["finish_seconds"] += time.monotonic() - started
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["pool", "plain", "peer"])
    parser.add_argument("--sites", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--go", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind")
    parser.add_argument("--proxies", default="")
    parser.add_argument(
        "--acquire-timeout",
        type=float,
        default=ACQUIRE_TIMEOUT,
        help="seconds to wait in line for a proxy for the site; 0: one attempt, then the next site",
    )
    args = parser.parse_args()
    random.seed(args.seed)
    if args.mode != "peer":
        import django

        django.setup()
    result = crawl(args)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    if args.mode != "peer":
        from resource_lease.db.connections import close_connections

        close_connections()


if __name__ == "__main__":
    main()
