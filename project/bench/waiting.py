"""Scenario "waiting": processes that wait for a scarce lock or pool, against the peers.

Three cases (``Plan.waiting_cases``): 8 processes on one lock holding 5 ms, 16 on a pool of
4 holding 20 ms, 64 on a pool of 40 holding 50 ms. Each contender (``wait_task.WAITS``) runs
each case for ``waiting_duration`` seconds, the contenders taking turns case by case, so a
noisy neighbour hurts them alike. Every worker process connects and makes one acquisition
before the window (``wait_task.WaitTask.prepare``; the engine's also has its LISTEN in force,
as kazoo's client has its session): the window measures processes that ask again, not every
process's first call at the same instant. Per case and contender:

- utilisation: the share of the window the lock (every slot of the pool) was held, counted
  from the grant's return to the release being sent (so a slow wake-up counts against it);
- Jain's fairness index over the grants each process got;
- the worst wait (a caller still waiting at the window's end counts with its wait so far),
  and the same divided by the fair wait: (P - S) x window / grants, what a caller waits if
  everyone takes turns at the rate achieved;
- the hand-off gap: from each release to the next grant (any process), p50 and p99;
- for the engine: statements its waiters sent per second of waiting, per waiter (what a
  waiter costs the database), and the line's own counters (looks, attempts, wake-ups);
- the client CPU per grant (every thread of the waiting processes), and the server's: the
  CPU of the database's processes on this machine for the engine (``vendor.server_cpu_ms``), of
  ZooKeeper's JVM for kazoo, of redis-server for the Redis locks, per grant (0 where that
  server runs elsewhere).

The ``unwaited`` reference runs the engine's workers of the same case on a pool of their own
with a row for every process, so that nobody waits: the same number of processes on the same
cores, holding as long, each cycle a grant and a release that find a row free. Its client CPU
per grant is what a cycle costs under that load without a line, the baseline of the engine's
waited cycle in the same run (on a machine with fewer cores than processes every cycle costs
more CPU than ``cycle_cost``'s, measured in one quiet process). Its utilisation, worst wait
and gaps are left out: nobody waited.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from project.bench import vendor
from project.bench.report import _f
from project.bench.stats import jain, percentile
from project.bench.targets import KIND_PREFIX, kind_for, seed
from project.bench.workers import Workers, run_window


@dataclass(frozen=True)
class Case:
    name: str
    what: str  # "lock" or "pool"
    processes: int
    slots: int
    hold: float


CASES = {
    "lock8": Case("lock8", "lock", 8, 1, 0.005),
    "pool16x4": Case("pool16x4", "pool", 16, 4, 0.020),
    "pool64x40": Case("pool64x40", "pool", 64, 40, 0.050),
}
SMOKE_CASES = {
    "lock3": Case("lock3", "lock", 3, 1, 0.005),
    "pool4x2": Case("pool4x2", "pool", 4, 2, 0.010),
}

ZOOKEEPER = os.environ.get("LEASE_BENCH_ZOOKEEPER", "127.0.0.1:2181")
ZK_SERVER = Path("/usr/share/zookeeper/bin/zkServer.sh")


def zookeeper(say: Any) -> str | None:
    """The local ZooKeeper's address, started first if it is installed but down; None (and
    why, said) when it cannot run here."""
    host, _, port = ZOOKEEPER.rpartition(":")
    if _answers(host, int(port)):
        return ZOOKEEPER
    if not ZK_SERVER.exists():
        say(
            f"  leaving out ZooKeeper: nothing answers on {ZOOKEEPER} and it is not installed (apt-get install zookeeperd)"
        )
        return None
    subprocess.run([str(ZK_SERVER), "start"], capture_output=True, timeout=60, check=False)
    for _ in range(60):
        if _answers(host, int(port)):
            return ZOOKEEPER
        subprocess.run(["sleep", "0.5"], check=False)
    say(f"  leaving out ZooKeeper: {ZK_SERVER} start did not make {ZOOKEEPER} answer")
    return None


def _answers(host: str, port: int) -> bool:
    # A TCP connection only: ZooKeeper 3.5+ answers the "ruok" word only where it is allowed.
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


#: The engine on a pool with a row for every process (see the module's docstring).
UNWAITED = "unwaited"


def contenders(*, before: bool, zookeeper_up: bool, redis_url: str | None) -> list[str]:
    names = ["engine", UNWAITED]
    if before:
        names.append("before")
    if zookeeper_up:
        names.append("zookeeper")
    if redis_url:
        names += ["redis-lock", "redis-py"]
    return names


#: The local server processes of each peer, by the name /proc/<pid>/stat gives them.
PEER_SERVERS = {"zookeeper": ("java",), "redis-lock": ("redis-server",), "redis-py": ("redis-server",)}


def server_cpu_ms(contender: str, target: Any) -> float:
    """CPU (ms) the server ``contender`` talks to has spent so far on this machine: the
    database's processes for the engine, the peer's own server otherwise (0 for SQLite)."""
    return vendor.server_cpu_ms(PEER_SERVERS.get(contender, vendor.SERVER_PROCESSES.get(target.vendor, ())))


def measure(
    *,
    case: Case,
    contender: str,
    workers: Workers,
    spec: dict[str, Any],
    duration: float,
    target: Any,
) -> dict[str, Any]:
    """One window of one contender on one case: its figures (see the module's docstring)."""
    procs = workers.ensure(case.processes)
    readings: list[float] = []
    results = run_window(
        procs, [spec] * case.processes, duration, on_ready=lambda: readings.append(server_cpu_ms(contender, target))
    )
    server = server_cpu_ms(contender, target) - readings[0]
    start = min((a[0] for r in results for a in r["acquisitions"]), default=0.0)
    figures = summarise(case, results, duration, start, contender)
    figures["server_cpu_ms_per_grant"] = server / figures["grants"] if figures["grants"] else None
    return figures


def summarise(case: Case, results: list[dict[str, Any]], duration: float, start: float, name: str) -> dict[str, Any]:
    stop = start + duration
    grants = [len(r["acquisitions"]) for r in results]
    total = sum(grants)
    held = sum(max(0.0, min(rel, stop) - max(grant, start)) for r in results for _, grant, rel in r["acquisitions"])
    waits = [grant - asked for r in results for asked, grant, _ in r["acquisitions"]]
    waits += [stop - r["pending"] for r in results if r["pending"] is not None]
    releases = sorted(rel for r in results for _, _, rel in r["acquisitions"])
    granted = sorted(grant for r in results for _, grant, _ in r["acquisitions"])
    gaps = []
    i = 0
    for released in releases:
        while i < len(granted) and granted[i] < released:
            i += 1
        if i < len(granted):
            gaps.append(granted[i] - released)
    fair_wait = (case.processes - case.slots) * duration / total if total else None
    waited = sum(waits)
    statements = sum(r["waiting_statements"] for r in results)
    client_cpu = 1000 * sum(r.get("cpu", 0.0) for r in results) / total if total else None
    if name == UNWAITED:
        # Nobody waited (a row for every process): only what a cycle costs the client.
        return {"contender": name, "grants": total, "client_cpu_ms_per_grant": client_cpu, "line": {}}
    line: dict[str, int] = {}
    for r in results:
        for key, value in r["line"].items():
            line[key] = line.get(key, 0) + value
    worst = max(waits, default=0.0)
    return {
        "contender": name,
        "grants": total,
        "utilisation": held / (case.slots * duration),
        "jain": jain(grants),
        "worst_wait_s": worst,
        "worst_x_fair": worst / fair_wait if fair_wait else None,
        "fair_wait_s": fair_wait,
        "gap_p50_ms": _ms(percentile(gaps, 50)),
        "gap_p99_ms": _ms(percentile(gaps, 99)),
        "wait_p50_ms": _ms(percentile(waits, 50)),
        "wait_p99_ms": _ms(percentile(waits, 99)),
        # Statements the engine's waiters sent while waiting (grant attempts, looks, places,
        # renewals), per second of waiting of one waiter.
        "statements_per_waiter_s": statements / waited if waited and name in ("engine", "before") else None,
        # The waiting processes' CPU (every thread) per grant: a waited cycle's client cost.
        "client_cpu_ms_per_grant": client_cpu,
        "line": line,
        "grants_per_process": sorted(grants),
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def waiting(ctx: Any) -> dict[str, Any]:
    """Scenario "waiting" (see the module's docstring)."""
    plan = ctx.plan
    cases = SMOKE_CASES if plan.waiting_duration < 1 else CASES
    if plan.waiting_cases is not None:
        cases = {name: case for name, case in {**CASES, **SMOKE_CASES}.items() if name in plan.waiting_cases}
    zk = zookeeper(ctx.say) if plan.peers else None
    redis_url = ctx.redis_url if plan.peers else None
    names = contenders(before=plan.before is not None, zookeeper_up=zk is not None, redis_url=redis_url)
    points = []
    try:
        for case in cases.values():
            kind = kind_for(f"waiting:{case.name}")
            if case.what == "pool":
                seed(ctx.target, kind, case.slots)
            unwaited = kind_for(f"waiting:{case.name}:{UNWAITED}")
            seed(ctx.target, unwaited, case.processes)
            spec = {
                "task": "wait",
                "what": case.what,
                "case": case.name,
                "kind": kind,
                "name": f"{KIND_PREFIX}{ctx.run_id}:{case.name}",
                "slots": case.slots,
                "hold": case.hold,
                "ttl": 30.0,
                "run_id": ctx.run_id,
                "zookeeper": zk,
                "redis_url": redis_url,
            }
            results: dict[str, list[dict[str, Any]]] = {}
            for r in range(plan.waiting_rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    if case.what == "pool" and name in ("redis-lock", "redis-py"):
                        continue  # they have no semaphore
                    ctx.settle()
                    pool = ctx.before_pool() if name == "before" else ctx.workers
                    figures = measure(
                        case=case,
                        contender=name,
                        workers=pool,
                        spec=_unwaited(spec, unwaited) if name == UNWAITED else {**spec, "contender": name},
                        duration=plan.waiting_duration,
                        target=ctx.target,
                    )
                    results.setdefault(name, []).append(figures)
                    if name == UNWAITED:
                        ctx.say(
                            f"  {case.name} {name}: client CPU {figures['client_cpu_ms_per_grant']:.2f} ms/grant,"
                            f" server {_f(figures['server_cpu_ms_per_grant'], 2)}"
                        )
                        continue
                    ctx.say(
                        f"  {case.name} {name}: utilisation {figures['utilisation']:.2f},"
                        f" Jain {figures['jain']:.3f}, worst wait {figures['worst_wait_s']:.3f}s,"
                        f" gap p50 {figures['gap_p50_ms']} ms, CPU per grant client"
                        f" {_f(figures['client_cpu_ms_per_grant'], 2)} server {_f(figures['server_cpu_ms_per_grant'], 2)} ms"
                    )
            points.append({"case": case.__dict__, "results": {n: _mean(runs) for n, runs in results.items()}})
    finally:
        ctx.close_before()
    return {
        "window_s": plan.waiting_duration,
        "rounds": plan.waiting_rounds,
        "contenders": names,
        "zookeeper": zk,
        "before": None if plan.before is None else str(plan.before),
        "points": points,
    }


def _unwaited(spec: dict[str, Any], kind: str) -> dict[str, Any]:
    """The engine's spec of a case on its own pool with a row for every process (``acquire``,
    a lock case too: nobody waits, so a lock and a pool's row cost the same statements)."""
    return {**spec, "contender": "engine", "what": "pool", "kind": kind}


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several rounds of one contender on one case: figures averaged, the worst wait the worst."""
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[-1])
    for key in (
        "utilisation",
        "jain",
        "gap_p50_ms",
        "gap_p99_ms",
        "statements_per_waiter_s",
        "worst_x_fair",
        "client_cpu_ms_per_grant",
        "server_cpu_ms_per_grant",
    ):
        values = [run[key] for run in runs if run.get(key) is not None]
        merged[key] = sum(values) / len(values) if values else None
    if "worst_wait_s" in merged:
        merged["worst_wait_s"] = max(run["worst_wait_s"] for run in runs)
    merged["grants"] = sum(run["grants"] for run in runs)
    merged["rounds"] = runs
    return merged
