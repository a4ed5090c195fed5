"""The benchmark scenarios, each run against one database with a set of worker processes.

Every scenario returns a JSON-able dict of what it measured. Ratios are only ever taken
between figures of the same run: the contenders of a cycle benchmark take turns, window by
window, in an order that rotates each round, so a noisy neighbour hurts them alike.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from project.bench import vendor
from project.bench.crawl_bench import crawl
from project.bench.http_bench import http
from project.bench.liveness import liveness
from project.bench.stats import cdf_sample, jain, latency_summary, percentile
from project.bench.targets import KIND_PREFIX, Target, kind_for, seed
from project.bench.waiting import waiting
from project.bench.workers import Worker, Workers, go, prepare, run_window
from resource_lease.models import Resource
from resource_lease.pool import database_now


@dataclass(frozen=True)
class Plan:
    """Sizes and durations of a run (``FULL`` or ``SMOKE``, adjusted by the command's options)."""

    #: Seconds of one measurement window of the cycle benchmarks.
    duration: float = 1.5
    #: Interleaved rounds of every contender, per point of a curve.
    rounds: int = 3
    #: The lease ttl in the cycle benchmarks (long: nothing should expire there).
    ttl: float = 60.0
    processes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    cycle_pool: int = 40
    pool_sizes: tuple[int, ...] = (40, 1_000, 20_000, 100_000)
    pool_processes: int = 8
    scarcity_workers: int = 64
    scarcity_resources: int = 40
    scarcity_hold: float = 0.05
    scarcity_duration: float = 10.0
    crash_holders: int = 4
    crash_rounds: int = 3
    crash_ttl: float = 3.0
    renew_leases: int = 1_000
    renew_processes: int = 4
    renew_ttl: float = 9.0
    #: A whole number of renew intervals (ttl/3), so every lease renews equally often in it.
    renew_duration: float = 12.0
    #: Only these contenders in the cycle and pool scenarios (None: every one available).
    contenders: tuple[str, ...] | None = None
    #: The waiting scenario: seconds per window, rounds, a checkout measured as "before",
    #: and whether the peers (ZooKeeper, python-redis-lock, redis-py) take part.
    waiting_duration: float = 5.0
    waiting_rounds: int = 2
    #: Only these cases of the waiting scenario (None: every one; ``waiting.CASES``).
    waiting_cases: tuple[str, ...] | None = None
    before: str | None = None
    peers: bool = True
    #: The liveness scenario: process counts, grants per row and point (split between the
    #: processes), the hold, and only these rows (None: ``liveness.ROWS``).
    liveness_processes: tuple[int, ...] = (2, 8, 32)
    liveness_grants: int = 64
    liveness_hold: float = 0.005
    liveness_rows: tuple[str, ...] | None = None
    #: The http scenario: client counts, seconds per window, hand-off rounds.
    http_clients: tuple[int, ...] = (8, 64)
    http_duration: float = 3.0
    http_rounds: int = 30
    #: The crawl scenario: crawler processes, proxies, sites, seconds per contender.
    crawl_crawlers: int = 64
    crawl_proxies: int = 40
    crawl_sites: int = 8
    crawl_duration: float = 60.0

    def adjusted(self, **changes: Any) -> Plan:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


FULL = Plan()
#: Seconds, tiny sizes: keeps the code from rotting (CI runs it) and proves nothing about speed.
SMOKE = Plan(
    duration=0.25,
    rounds=1,
    processes=(1, 2),
    cycle_pool=8,
    pool_sizes=(8, 300),
    pool_processes=2,
    scarcity_workers=4,
    scarcity_resources=2,
    scarcity_hold=0.02,
    scarcity_duration=0.8,
    crash_holders=2,
    crash_rounds=1,
    crash_ttl=0.6,
    renew_leases=12,
    renew_processes=2,
    renew_ttl=0.6,
    renew_duration=0.8,
    waiting_duration=0.5,
    waiting_rounds=1,
    liveness_processes=(2,),
    liveness_grants=6,
    liveness_rows=("lock", "rwlock-write", "alock"),
    http_clients=(1,),
    http_duration=0.3,
    http_rounds=2,
    crawl_crawlers=4,
    crawl_proxies=8,
    crawl_sites=2,
    crawl_duration=1.0,
)


@dataclass
class Context:
    target: Target
    workers: Workers
    plan: Plan
    run_id: str
    redis_url: str | None
    profile_dir: Path | None = None
    #: PostgreSQL: VACUUM the lease table before each measured point (see vendor.vacuum).
    vacuum: bool = True
    say: Callable[[str], None] = field(default=lambda message: None)
    #: The workers whose resource_lease is ``plan.before``'s (made on first use).
    before_workers: Workers | None = None

    def before_pool(self) -> Workers:
        """Workers running the engine of the checkout ``plan.before`` (the 'before' contender)."""
        if self.before_workers is None:
            assert self.plan.before is not None
            self.before_workers = Workers(
                self.target.url, self.workers.log_path, audit=self.workers.audit, engine_path=str(self.plan.before)
            )
        return self.before_workers

    def close_before(self) -> None:
        if self.before_workers is not None:
            self.before_workers.close()
            self.before_workers = None

    def settle(self) -> None:
        """Between measured points: what autovacuum would have done by now."""
        if self.vacuum and vendor.vacuum(self.target):
            self.say("  vacuumed the lease table")


# -- cycles ---------------------------------------------------------------------------------


def contenders(ctx: Context) -> list[str]:
    """The contenders this database and machine offer (GET_LOCK is MySQL's; Redis may be absent)."""
    names = ["engine", "floor", "lease-floor", "original"]
    if ctx.plan.before is not None:
        names.insert(1, "before")  # the engine of an earlier checkout (``--before``), same calls
    if ctx.redis_url:
        names.append("redis")
    if vendor.has_get_lock(ctx.target):
        names.append("getlock")
    return _chosen(ctx, names)


def _chosen(ctx: Context, names: list[str]) -> list[str]:
    wanted = ctx.plan.contenders
    return names if wanted is None else [name for name in names if name in wanted]


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One window: the workers' results added up (rate: each worker's cycles over its own time)."""
    return {
        "cycles": sum(r["cycles"] for r in results),
        "rate": sum(r["cycles"] / r["elapsed"] for r in results if r["elapsed"] > 0),
        "latencies_us": [v for r in results for v in r["latencies_us"]],
        "lost": sum(r["lost"] for r in results),
        "statements": sum(r["statements"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "cpu": sum(r["cpu"] for r in results),
    }


def _summarise(
    windows: list[dict[str, Any]], floor: list[dict[str, Any]] | None, lease_floor: list[dict[str, Any]] | None
) -> dict[str, Any]:
    cycles = sum(w["cycles"] for w in windows)
    rates = [w["rate"] for w in windows]
    summary: dict[str, Any] = {
        "cycles_per_s": sum(rates) / len(rates),
        "round_rates": [round(r, 1) for r in rates],
        "cycles": cycles,
        **latency_summary([v for w in windows for v in w["latencies_us"]]),
        "lost_races": sum(w["lost"] for w in windows),
        "lost_per_cycle": sum(w["lost"] for w in windows) / cycles if cycles else None,
        "statements_per_cycle": sum(w["statements"] for w in windows) / cycles if cycles else None,
        "errors": sum(w["errors"] for w in windows),
        # CPU the worker processes spent per cycle (the server's is not in it).
        "client_cpu_ms_per_cycle": 1000 * sum(w["cpu"] for w in windows) / cycles if cycles else None,
        # Server counters (MariaDB: server-wide, so other clients add to them; PostgreSQL:
        # this database's), per cycle.
        "server_per_cycle": {
            name: round(sum(w["server"].get(name, 0) for w in windows) / cycles, 3) if cycles else None
            for name in windows[0]["server"]
        },
    }
    if floor:
        floor_rate = sum(w["rate"] for w in floor)
        summary["x_floor"] = sum(rates) / floor_rate if floor_rate else None
    if lease_floor:
        lease_floor_rate = sum(w["rate"] for w in lease_floor)
        summary["x_lease_floor"] = sum(rates) / lease_floor_rate if lease_floor_rate else None
    return summary


def _original_kind(kind: str) -> str:
    # The original algorithm gets a pool of its own, the same size: its compare-and-set reads
    # busy_before back and compares it for equality, which only holds for values it wrote
    # itself (on SQLite the engine stores milliseconds, the client's adapter microseconds).
    return f"{kind}:original"


def _seed_pools(ctx: Context, kind: str, size: int) -> list[int]:
    seed(ctx.target, _original_kind(kind), size)
    return seed(ctx.target, kind, size)


def _measure(
    ctx: Context, names: list[str], *, kind: str, pks: list[int], processes: int, point: str
) -> dict[str, dict[str, Any]]:
    """Every contender, ``plan.rounds`` windows each, taking turns; summaries by contender."""
    plan = ctx.plan
    workers = ctx.workers.ensure(processes)
    before = ctx.before_pool().ensure(processes) if "before" in names else []
    lock_names = [f"{KIND_PREFIX}{ctx.run_id}:{i}" for i in range(plan.cycle_pool)]
    windows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(plan.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            # "before" runs the engine's calls in workers importing the earlier checkout.
            pool = before if name == "before" else workers
            specs = []
            for i in range(processes):
                spec: dict[str, Any] = {
                    "task": "cycle",
                    "contender": "engine" if name == "before" else name,
                    # The original algorithm is slow on a large pool: one warm-up cycle is plenty.
                    "warmup": 1 if name == "original" else 2,
                    "options": {
                        "kind": _original_kind(kind) if name == "original" else kind,
                        "ttl": plan.ttl,
                        "pk": pks[i % len(pks)],
                        "names": lock_names,
                        "redis_url": ctx.redis_url,
                    },
                }
                if ctx.profile_dir is not None and name == "engine":
                    spec["profile"] = str(ctx.profile_dir / f"{ctx.target.key}-{point}-r{r}-w{i}.prof")
                specs.append(spec)
            pairs = list(zip(pool, specs, strict=True))
            prepare(pairs, timeout=120)
            counted = vendor.counters(ctx.target)
            start = time.monotonic() + 0.05
            go(pairs, start, start + plan.duration)
            window = _merge([worker.expect("done", plan.duration + 120)["result"] for worker in pool])
            after = vendor.counters(ctx.target)
            window["server"] = {key: after[key] - counted[key] for key in counted}
            windows[name].append(window)
            ctx.say(f"  {point} round {r + 1}/{plan.rounds} {name}: {windows[name][-1]['rate']:.0f} cycles/s")
    return {name: _summarise(windows[name], windows.get("floor"), windows.get("lease-floor")) for name in names}


def cycle_throughput(ctx: Context) -> dict[str, Any]:
    """Scenario 1: P processes acquire and release from a pool of 40, against the baselines."""
    plan = ctx.plan
    kind = kind_for("cycle")
    pks = _seed_pools(ctx, kind, plan.cycle_pool)
    names = contenders(ctx)
    points = []
    for processes in plan.processes:
        ctx.settle()
        try:
            results = _measure(ctx, names, kind=kind, pks=pks, processes=processes, point=f"P{processes}")
        finally:
            ctx.close_before()
        points.append({"processes": processes, "results": results})
    return {
        "pool": plan.cycle_pool,
        "contenders": names,
        "window_s": plan.duration,
        "rounds": plan.rounds,
        "points": points,
    }


def pool_size(ctx: Context) -> dict[str, Any]:
    """Scenario 2: the same cycles at growing pool sizes (engine flat, original not)."""
    plan = ctx.plan
    kind = kind_for("pool")
    names = _chosen(ctx, ["engine", "original", "floor", "lease-floor"])
    points = []
    for size in plan.pool_sizes:
        ctx.say(f"  seeding {size} resources")
        pks = _seed_pools(ctx, kind, size)
        ctx.settle()
        results = _measure(ctx, names, kind=kind, pks=pks, processes=plan.pool_processes, point=f"N{size}")
        points.append({"size": size, "results": results})
    return {
        "processes": plan.pool_processes,
        "contenders": names,
        "window_s": plan.duration,
        "rounds": plan.rounds,
        "points": points,
    }


# -- scarcity -------------------------------------------------------------------------------


def scarcity(ctx: Context) -> dict[str, Any]:
    """Scenario 3: more workers than resources, each holding a while and waiting when none is free."""
    plan = ctx.plan
    kind = kind_for("scarcity")
    seed(ctx.target, kind, plan.scarcity_resources)
    workers = ctx.workers.ensure(plan.scarcity_workers)
    ctx.settle()
    spec = {"task": "scarce", "kind": kind, "ttl": 30.0, "hold": plan.scarcity_hold}
    duration = plan.scarcity_duration
    results = run_window(workers, [spec] * len(workers), duration)
    grants = [r["grants"] for r in results]
    waits = [v for r in results for v in r["waits_us"]]
    held = sum(r["held"] for r in results)
    acquire_statements = sum(r["acquire_statements"] for r in results)
    return {
        "workers": len(workers),
        "resources": plan.scarcity_resources,
        "hold_s": plan.scarcity_hold,
        "duration_s": duration,
        "utilisation": held / (plan.scarcity_resources * duration),
        "jain": jain(grants),
        "grants": sum(grants),
        "grants_per_s": sum(grants) / duration,
        # If every resource were handed on the instant it came back.
        "ideal_grants_per_s": plan.scarcity_resources / plan.scarcity_hold,
        "wait": latency_summary(waits),
        "waiting_queries_per_s": acquire_statements / duration,
        "queries_per_grant": acquire_statements / sum(grants) if sum(grants) else None,
        "grants_per_worker": sorted(grants),
        "wait_cdf_ms": [round(v / 1000, 3) for v in cdf_sample(waits)],
    }


# -- crash recovery -------------------------------------------------------------------------


def _expiries(alias: str, fences: dict[int, int]) -> tuple[dict[int, dt.datetime], dt.datetime, float]:
    """Expiry of each lease still under its victim's fence, the database's now, and when."""
    t0 = time.monotonic()
    now = database_now(alias)
    rows = Resource.objects.using(alias).filter(pk__in=list(fences)).values_list("pk", "fence", "busy_before")
    expiries = {pk: busy_before for pk, fence, busy_before in rows if fence == fences[pk]}
    return expiries, now, (t0 + time.monotonic()) / 2


def crash_recovery(ctx: Context) -> dict[str, Any]:
    """Scenario 4: holders SIGKILLed; how long until a waiting worker holds their resource."""
    plan = ctx.plan
    kind = kind_for("crash")
    ttl = plan.crash_ttl
    seed(ctx.target, kind, plan.crash_holders)
    events: list[dict[str, Any]] = []
    for r in range(plan.crash_rounds):
        victims: list[Worker] = ctx.workers.spawn(plan.crash_holders)
        try:
            hold = {"task": "hold", "kind": kind, "ttl": ttl}
            held = prepare([(v, hold) for v in victims], timeout=60)
            fences = {answer["pk"]: answer["fence"] for answer in held}
            successors = ctx.workers.ensure(plan.crash_holders)
            grab = {"task": "grab", "kind": kind}
            pairs = [(w, grab) for w in successors]
            prepare(pairs, timeout=60)
            start = time.monotonic() + 0.05
            go(pairs, start, start + 3 * ttl + 10)
            # Kill at a random point of the renewal cycle (renewals come every ttl/3).
            time.sleep(random.uniform(0.2, 0.2 + ttl / 3))
            before = _expiries(ctx.target.alias, fences)
            killed_at = time.monotonic()
            for victim in victims:
                victim.proc.send_signal(signal.SIGKILL)
            # Read again once a renewal that was in flight at the kill has landed.
            time.sleep(0.02)
            after = _expiries(ctx.target.alias, fences)
            grants = [w.expect("done", 3 * ttl + 30)["result"] for w in successors]
            for w in successors:
                w.send({"release": True})
        finally:
            for victim in victims:
                victim.kill()
        for grant in grants:
            pk = grant["pk"]
            expiries, now, read_at = after if pk in after[0] else before
            remaining = (expiries[pk] - now).total_seconds() + (read_at - killed_at)
            regrant = grant["granted_at"] - killed_at
            events.append(
                {
                    "round": r,
                    "resource": pk,
                    "lease_left_at_kill_s": round(remaining, 4),
                    "regranted_after_s": round(regrant, 4),
                    "after_expiry_s": round(regrant - remaining, 4),
                    "took_over": grant["took_over"],
                }
            )
        ctx.say(f"  round {r + 1}/{plan.crash_rounds}: {len(grants)} resources regranted")
    late = [e["after_expiry_s"] for e in events]
    regrants = [e["regranted_after_s"] for e in events]
    return {
        "ttl_s": ttl,
        "holders": plan.crash_holders,
        "rounds": plan.crash_rounds,
        "events": events,
        "regranted_after_s": {"p50": percentile(regrants, 50), "max": max(regrants, default=None)},
        "after_expiry_s": {"min": min(late, default=None), "p50": percentile(late, 50), "max": max(late, default=None)},
        "granted_early": sum(1 for v in late if v < -0.05),
        "all_took_over": all(e["took_over"] for e in events),
    }


# -- renewal load ---------------------------------------------------------------------------


def renewal_load(ctx: Context) -> dict[str, Any]:
    """Scenario 5: many held leases renewed in the background every ttl/3."""
    plan = ctx.plan
    kind = kind_for("renewal")
    seed(ctx.target, kind, plan.renew_leases)
    n = plan.renew_processes
    shares = [plan.renew_leases // n + (1 if i < plan.renew_leases % n else 0) for i in range(n)]
    workers = ctx.workers.ensure(n)
    ctx.settle()
    specs = [{"task": "renew", "kind": kind, "ttl": plan.renew_ttl, "leases": share} for share in shares]
    duration = plan.renew_duration
    # Preparing takes a renew interval: the leases are taken evenly over it.
    results = run_window(workers, specs, duration, ready_timeout=600 + plan.renew_ttl)
    latencies = [v for r in results for v in r["latencies_us"]]
    lateness = [v for r in results for v in r["lateness_us"]]
    at = sorted(t for r in results for t in r["at"])
    bucket = max(0.1, duration / 40)
    timeline = [0] * max(1, math.ceil(duration / bucket - 1e-9))
    for t in at:
        timeline[min(int(t / bucket), len(timeline) - 1)] += 1
    renewals = sum(r["renewals"] for r in results)
    statements = sum(r["statements"] for r in results)
    return {
        "leases": plan.renew_leases,
        "processes": n,
        "ttl_s": plan.renew_ttl,
        "interval_s": plan.renew_ttl / 3,
        "duration_s": duration,
        "renewals": renewals,
        "renewals_per_s": renewals / duration,
        "expected_renewals_per_s": plan.renew_leases / (plan.renew_ttl / 3),
        "queries_per_s": statements / duration,
        "queries_per_renewal": statements / renewals if renewals else None,
        "errors": sum(r["errors"] for r in results),
        "leases_lost": sum(r["lost"] for r in results),
        "latency": latency_summary(latencies),
        # How long after it was due each renewal started (the renewal thread keeping up).
        "lateness": latency_summary(lateness),
        "latency_cdf_ms": [round(v / 1000, 3) for v in cdf_sample(latencies)],
        "timeline_bucket_s": bucket,
        "timeline_per_s": [round(c / bucket, 1) for c in timeline],
    }


#: name: (function, title)
SCENARIOS: dict[str, tuple[Callable[[Context], dict[str, Any]], str]] = {
    "cycle": (cycle_throughput, "Cycle throughput: acquire + release, pool of 40"),
    "pool": (pool_size, "Pool size: cycles/s as the pool grows"),
    "scarcity": (scarcity, "Scarcity: more workers than resources"),
    "crash": (crash_recovery, "Crash recovery: holders killed with SIGKILL"),
    "renewal": (renewal_load, "Renewal load: held leases renewed every ttl/3"),
    "waiting": (waiting, "Waiting: served in line, against ZooKeeper and Redis locks"),
    "liveness": (liveness, "Liveness: every primitive that waits, woken at release (grants/s, release-to-grant gap)"),
    "http": (http, "Lease over HTTP: cycles/s against Python callers and etcd's lock, and the long-poll hand-off gap"),
    "crawl": (crawl, "Crawl: shared proxies, sites that ban and rate-limit them"),
}
