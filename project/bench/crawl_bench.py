"""The ``crawl`` scenario: crawlers sharing proxies against sites that ban and rate-limit them
(issue 40's measure; docs/benchmarks.md#crawl).

The local simulator (``project.bench.crawl_site``) plays ``crawl_proxies`` proxies and
``crawl_sites`` sites on 127.0.0.1: each site bans a fixed random quarter of the proxies (403)
and answers 429 (with Retry-After) to a proxy it has served 10 times in the last minute.
``crawl_crawlers`` crawler processes (``project.bench.crawl_driver``, plain urllib clients)
fetch pages of random sites for ``crawl_duration`` seconds, one contender after the other,
each on a fresh simulator (same seed, so the same bans) and a pool of its own:

- ``pool``: this pool with targets, reports and a policy (``pool_policy(kind,
  target_rate=(10, 60), error_threshold=<sites>, ...)``): ``acquire(kind, target=site)``,
  ``lease.report()``;
- ``plain``: ``acquire(kind)`` without target or report;
- ``peer``: no pool: per-process ban memory with exponential backoff, scrapy-rotating-proxies'
  algorithm (``crawl_driver.Rotation``).

Figures: useful responses (200) per second over the window, and the share of requests wasted
(403, 429 and network errors). It prints figures; it judges nothing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.bench.crawl_site import Simulator
from project.bench.liveness import _env
from project.bench.targets import kind_for
from project.bench.workers import BASE_DIR, WorkerError

if TYPE_CHECKING:
    from project.bench.scenarios import Context

MODES = ("pool", "plain", "peer")
LABELS = {
    "pool": "(a) pool: targets, reports, policy",
    "plain": "(b) plain acquire()",
    "peer": "(c) per-process ban memory (rotating-proxies)",
}
#: The sites' rule, and the policy that tells the pool of it.
RATE, PER = 10, 60.0
SEED = 1


def run_crawlers(mode: str, n: int, *, env: dict[str, str], duration: float, **options: str) -> list[dict[str, Any]]:
    """n crawler processes, started together once all are ready; their results."""
    with tempfile.TemporaryDirectory(prefix="lease-bench-crawl-") as tmp:
        go = Path(tmp) / "go"
        argv = [sys.executable, "-m", "project.bench.crawl_driver", mode, "--duration", str(duration), "--go", str(go)]
        for name, value in options.items():
            argv += [f"--{name}", value]
        procs = [
            subprocess.Popen(
                [*argv, "--seed", str(SEED * 1000 + i)],
                env=env,
                cwd=BASE_DIR,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for i in range(n)
        ]
        try:
            for proc in procs:
                assert proc.stderr is not None
                line = proc.stderr.readline()
                if b"ready" not in line:
                    raise WorkerError(f"a {mode} crawler failed to start: {line[:300]!r}")
            go.touch()
            results = []
            for proc in procs:
                out, err = proc.communicate(timeout=duration + 120)
                if proc.returncode:
                    raise WorkerError(f"a {mode} crawler failed: {err[-500:]!r}")
                results.append(json.loads(out.splitlines()[-1]))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
    return results


def figures_of(results: list[dict[str, Any]], duration: float, answers: int) -> dict[str, Any]:
    total = {key: sum(r[key] for r in results) for key in results[0]}
    requests = total["requests"]
    wasted = total["forbidden"] + total["too_many"] + total["errors"]
    figures: dict[str, Any] = {
        "useful_per_s": round(total["ok"] / duration, 1),
        "requests_per_s": round(requests / duration, 1),
        "wasted_share": round(wasted / requests, 4) if requests else None,
        "simulator_answers": answers,
        **{key: round(value, 2) if isinstance(value, float) else value for key, value in total.items()},
    }
    if requests and total["acquire_seconds"]:
        # Per request sent: the time spent getting a proxy (waits in line and attempts that
        # found none included), and the report and release after it.
        figures["acquire_ms_per_request"] = round(1000 * total["acquire_seconds"] / requests, 2)
        figures["finish_ms_per_request"] = round(1000 * total["finish_seconds"] / requests, 2)
    return figures


def crawl(ctx: Context) -> dict[str, Any]:
    from resource_lease import pool_policy
    from resource_lease.models import PoolPolicy, Resource

    plan, alias = ctx.plan, ctx.target.alias
    env = _env(ctx.target.url)
    sites = ",".join(f"site-{s}.test" for s in range(plan.crawl_sites))
    results: dict[str, Any] = {}
    kinds = []
    ceiling = 0.0
    try:
        for mode in MODES:
            kind = kind_for(f"crawl-{mode}")
            kinds.append(kind)
            with tempfile.TemporaryDirectory(prefix="lease-bench-crawl-") as tmp:
                sim = Simulator(
                    str(Path(tmp) / "answers.log"),
                    proxies=plan.crawl_proxies,
                    sites=plan.crawl_sites,
                    seed=SEED,
                    rate=RATE,
                    per=PER,
                )
                sim.start(cwd=str(BASE_DIR))
                try:
                    Resource.objects.using(alias).filter(kind=kind).delete()
                    Resource.objects.using(alias).bulk_create(
                        Resource(kind=kind, name=f"proxy-{i:02d}", data={"url": url})
                        for i, url in enumerate(sim.proxy_urls)
                    )
                    if mode == "pool":
                        # The sites' rate as the pool's target_rate. A site's ban cools the
                        # proxy down for that site (report "blocked" with a target); it is
                        # quarantined for every site only once its score reaches the number of
                        # sites (each ban adds 1, each success halves it): a proxy that fails
                        # everywhere. At 3, a proxy three of the eight sites ban (a third of
                        # them here) was at times quarantined for all, its other sites' answers
                        # lost (39.1 useful/s instead of 40 in one 60 s run on PostgreSQL).
                        pool_policy(
                            kind,
                            using=alias,
                            error_threshold=float(plan.crawl_sites),
                            error_decay=0.5,
                            backoff=(30, 600),
                            target_rate=(RATE, PER),
                        )
                    options = {"sites": sites, "kind": kind, "proxies": ",".join(sim.proxy_urls)}
                    ctx.settle()
                    started = time.monotonic()
                    outcome = run_crawlers(mode, plan.crawl_crawlers, env=env, duration=plan.crawl_duration, **options)
                    ctx.say(f"  crawl {mode}: {time.monotonic() - started:.1f}s")
                    # Proxies the pool's health quarantined at least once (their backoff level
                    # after the run): each is a proxy off every site for its backoff.
                    levels = Resource.objects.using(alias).filter(kind=kind).values_list("backoff_level", flat=True)
                finally:
                    sim.stop()
                results[mode] = figures_of(outcome, plan.crawl_duration, len(sim.log()))
                if mode == "pool":
                    results[mode]["quarantined_proxies"] = sum(1 for level in levels if level)
                # The most 200s the sites give in the window: each (proxy, site) pair not
                # banned, RATE answers per started window of PER seconds.
                pairs = sum(plan.crawl_proxies - len(banned) for banned in sim.banned.values())
                ceiling = pairs * RATE * math.ceil(plan.crawl_duration / PER) / plan.crawl_duration
            ctx.say(f"  crawl {mode}: {results[mode]['useful_per_s']} useful/s, wasted {results[mode]['wasted_share']}")
        return {
            "crawlers": plan.crawl_crawlers,
            "proxies": plan.crawl_proxies,
            "sites": plan.crawl_sites,
            "duration_s": plan.crawl_duration,
            "rate": [RATE, PER],
            "ceiling_useful_per_s": round(ceiling, 1),
            "results": results,
        }
    finally:
        Resource.objects.using(alias).filter(kind__in=kinds).delete()
        PoolPolicy.objects.using(alias).filter(kind__in=kinds).delete()


def summary(doc: dict[str, Any]) -> list[str]:
    lines = []
    for db in doc["databases"]:
        result = db.get("result")
        if not result:
            continue
        lines.append(
            f"{db['label']}: {result['crawlers']} crawlers, {result['proxies']} proxies, {result['sites']} sites,"
            f" {result['duration_s']:g} s each; the sites give at most {result.get('ceiling_useful_per_s', '?')}"
            " useful answers/s over such a window"
        )
        lines += [
            "| contender | useful/s | requests/s | wasted | 403 | 429 | errors | no proxy in 1 s"
            " | acquire ms/request | report+release ms/request |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for mode in MODES:
            r = result["results"].get(mode)
            if r is None:
                continue
            wasted = "-" if r["wasted_share"] is None else f"{100 * r['wasted_share']:.1f}%"
            lines.append(
                f"| {LABELS[mode]} | {r['useful_per_s']} | {r['requests_per_s']} | {wasted} | {r['forbidden']} |"
                f" {r['too_many']} | {r['errors']} | {r['no_proxy']} | {r.get('acquire_ms_per_request', '-')} |"
                f" {r.get('finish_ms_per_request', '-')} |"
            )
        lines.append("")
    return lines


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Useful responses per second and the wasted share, per contender, a column per database."""
    from project.bench.report import _figure, _no_data, _save

    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 2, doc["title"], doc["meta"])
    colors = {"pool": "tab:blue", "plain": "tab:gray", "peer": "tab:red"}
    for col, db in enumerate(dbs):
        top, bottom = axes[0][col], axes[1][col]
        if "result" not in db:
            _no_data(top, db)
            _no_data(bottom, db)
            continue
        results = db["result"]["results"]
        modes = [m for m in MODES if m in results]
        xs = range(len(modes))
        names = [LABELS[m].split(" ", 1)[0] + " " + m for m in modes]
        top.bar(xs, [results[m]["useful_per_s"] for m in modes], color=[colors[m] for m in modes])
        top.set_ylabel("useful responses per second", fontsize=9)
        if db["result"].get("ceiling_useful_per_s"):
            top.axhline(db["result"]["ceiling_useful_per_s"], color="black", linestyle="--", linewidth=1)
            top.set_ylim(0, 1.2 * db["result"]["ceiling_useful_per_s"])  # room above the line for its label
            top.text(0.01, 0.97, "dashed: the most the sites give", transform=top.transAxes, va="top", fontsize=8)
        top.set_title(db["label"])
        bottom.bar(xs, [100 * (results[m]["wasted_share"] or 0) for m in modes], color=[colors[m] for m in modes])
        bottom.set_ylabel("wasted requests (403, 429, errors), %", fontsize=9)
        for ax in (top, bottom):
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)
