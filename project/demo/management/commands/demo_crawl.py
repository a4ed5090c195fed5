"""The crawl demo: crawlers share proxies on sites that ban some of them and rate-limit all of
them, once with a plain pool and once with a pool that learns (docs/learning.md).

    python manage.py demo_crawl [--crawlers 4] [--proxies 12] [--sites 3] [--seconds 5]

A local simulator (``project.bench.crawl_site``) plays the proxies and the sites on
127.0.0.1: each site bans a fixed quarter of the proxies (403) and answers 429 to a proxy that
asks it more than 10 times a minute. ``--crawlers`` processes fetch pages of random sites for
``--seconds``, first with ``acquire(kind)`` alone (the pool knows only free or taken), then
with ``acquire(kind, target=site)``, ``lease.report(...)`` and a policy whose ``target_rate``
is the sites' rule. The summary gives each run's useful answers and wasted requests, and what
the second pool learned: a ban's cooldown for each (proxy, site) pair a site banned that a
crawler tried, and for no other pair (the demo fails if it learned a wrong one, or if the pool
that learns wasted as large a share of its requests as the plain pool).

It runs on the embedded SQLite by default, and on MariaDB or PostgreSQL with DATABASE_URL.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.arguments import positive, positive_int
from project.bench.crawl_bench import PER, RATE, SEED, figures_of, run_crawlers
from project.bench.crawl_site import Simulator
from project.bench.liveness import _env
from project.bench.targets import url_from_alias
from project.bench.workers import BASE_DIR

KIND = "demo-proxy"


class Command(BaseCommand):
    help = "Crawlers on proxies that sites ban and rate-limit: a plain pool, then a pool that learns."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--crawlers", type=positive_int, default=4, help="crawler processes (default 4)")
        parser.add_argument("--proxies", type=positive_int, default=12, help="proxies (default 12)")
        parser.add_argument("--sites", type=positive_int, default=3, help="sites (default 3)")
        parser.add_argument("--seconds", type=positive, default=5.0, help="seconds of each run (default 5)")

    def handle(self, *args: Any, crawlers: int, proxies: int, sites: int, seconds: float, **options: Any) -> None:
        from resource_lease import pool_policy
        from resource_lease.models import Cooldown, PoolPolicy, Resource
        from resource_lease.pool import database_now

        self.stdout.write(
            f"Crawl demo: {crawlers} crawlers, {proxies} proxies, {sites} sites (each bans a quarter of the"
            f" proxies, and answers 429 past {RATE} requests a minute per proxy), {seconds:g} s per run."
        )
        env = _env(url_from_alias("default"))
        site_names = [f"site-{s}.test" for s in range(sites)]
        outcome: dict[str, dict[str, Any]] = {}
        learned: set[tuple[int, str]] = set()
        banned: set[tuple[int, str]] = set()
        try:
            for mode in ("plain", "pool"):
                with tempfile.TemporaryDirectory(prefix="demo-crawl-") as tmp:
                    sim = Simulator(
                        str(Path(tmp) / "answers.log"), proxies=proxies, sites=sites, seed=SEED, rate=RATE, per=PER
                    )
                    sim.start(cwd=str(BASE_DIR))
                    try:
                        Resource.objects.filter(kind=KIND).delete()
                        PoolPolicy.objects.filter(kind=KIND).delete()
                        Resource.objects.bulk_create(
                            Resource(kind=KIND, name=f"proxy-{i:02d}", data={"url": url})
                            for i, url in enumerate(sim.proxy_urls)
                        )
                        if mode == "pool":
                            pool_policy(KIND, error_threshold=3.0, backoff=(30, 600), target_rate=(RATE, PER))
                        results = run_crawlers(
                            mode,
                            crawlers,
                            env=env,
                            duration=seconds,
                            sites=",".join(site_names),
                            kind=KIND,
                            proxies=",".join(sim.proxy_urls),
                        )
                        answers = len(sim.log())
                        if mode == "pool":
                            index = {
                                row.pk: i for i, row in enumerate(Resource.objects.filter(kind=KIND).order_by("name"))
                            }
                            # A ban's cooldown (the site's Retry-After, else 10 minutes) outlasts
                            # any of target_rate's (at most PER seconds): the bans learned.
                            longer = database_now() + dt.timedelta(seconds=PER + 1)
                            learned = {
                                (index[pk], target)
                                for pk, target in Cooldown.objects.filter(
                                    resource__kind=KIND, until__gt=longer
                                ).values_list("resource_id", "target")
                            }
                            banned = {(i, site) for site, indices in sim.banned.items() for i in indices}
                    finally:
                        sim.stop()
                outcome[mode] = figures_of(results, seconds, answers)
        finally:
            Resource.objects.filter(kind=KIND).delete()
            PoolPolicy.objects.filter(kind=KIND).delete()
        self._summary(outcome, learned, banned)

    def _summary(
        self, outcome: dict[str, dict[str, Any]], learned: set[tuple[int, str]], banned: set[tuple[int, str]]
    ) -> None:
        self.stdout.write("")
        self.stdout.write(f"  {'pool':<38} {'requests':>9} {'useful':>7} {'403':>5} {'429':>5} {'wasted':>7}")
        for mode, label in (("plain", "plain acquire()"), ("pool", "targets, reports, target_rate")):
            f = outcome[mode]
            share = f["wasted_share"] or 0.0
            self.stdout.write(
                f"  {label:<38} {f['requests']:>9} {f['ok']:>7} {f['forbidden']:>5} {f['too_many']:>5} {share:>7.1%}"
            )
        wrong = learned - banned
        self.stdout.write("")
        self.stdout.write(
            f"The pool that learns cooled {len(learned)} (proxy, site) pairs down for a ban, of the {len(banned)}"
            f" the sites ban: each cost it one request, and a proxy banned by one site kept serving the others."
        )
        if not outcome["pool"]["too_many"]:
            self.stdout.write(f"target_rate kept every proxy within each site's {RATE} requests a minute: no 429.")
        if wrong:
            raise CommandError(f"it cooled down pairs no site bans: {sorted(wrong)[:5]}")
        plain, learning = outcome["plain"], outcome["pool"]
        if (learning["wasted_share"] or 0.0) >= (plain["wasted_share"] or 1.0):
            raise CommandError("the pool that learns wasted as large a share of its requests as the plain pool")
        self.stdout.write(self.style.SUCCESS("Crawl demo OK."))
