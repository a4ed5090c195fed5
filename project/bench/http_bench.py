"""The ``http`` scenario: leases over HTTP (docs/http.md) against Python callers on the same
database in the same run, and against etcd's JSON gateway when one answers.

A uvicorn server of the project serves the API. For each number of clients (8 and 64), driver
processes (``project.bench.http_driver``) run acquire + release cycles for the window on a
pool of ``cycle_pool`` resources: over HTTP (each cycle two requests, a new connection each,
as ``LeaseClient`` makes them), as Python callers (``acquire()`` and ``release()`` on the
database), and through etcd's ``/v3/lock/lock`` and ``unlock`` (one lock name per client
modulo the pool's size, under one etcd lease per client) when etcd answers at ``ETCD_URL``
(default http://127.0.0.1:2379). Then the hand-off gap: two clients pass one resource back and
forth, the gap from the holder's release call to the long-polling waiter's grant, over HTTP
and in Python. It prints figures; it judges nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.bench.liveness import _env
from project.bench.stats import percentile
from project.bench.targets import seed
from project.bench.workers import BASE_DIR, WorkerError

if TYPE_CHECKING:
    from project.bench.scenarios import Context

PREFIX = "bench-http-"
#: Driver processes at most per point (the rest are threads in them).
MAX_PROCESSES = 8


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):  # noqa: S310
            return True
    except (urllib.error.URLError, OSError):
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _server(db_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [sys.executable, "-m", "uvicorn", "project.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--lifespan", "off", "--log-level", "error", "--no-access-log"]
    proc = subprocess.Popen(argv, env=_env(db_url), cwd=BASE_DIR)
    api = f"http://127.0.0.1:{port}/lease/api/"
    deadline = time.monotonic() + 60
    while not _answers(api + "openapi.json"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise WorkerError("the uvicorn server of the http scenario did not start")
        time.sleep(0.1)
    return proc, api


def _drivers(mode: str, clients: int, *, env: dict[str, str], duration: float, **options: Any) -> dict[str, Any]:
    """``clients`` threads over at most MAX_PROCESSES driver processes, started together."""
    import json

    n = min(clients, MAX_PROCESSES)
    shares = [clients // n + (1 if i < clients % n else 0) for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="lease-bench-http-") as tmp:
        go = Path(tmp) / "go"
        argv = [sys.executable, "-m", "project.bench.http_driver", mode, "--duration", str(duration), "--go", str(go)]
        for name, value in options.items():
            argv += [f"--{name}", str(value)]
        procs = [
            subprocess.Popen(
                [*argv, "--threads", str(share)], env=env, cwd=BASE_DIR, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            for share in shares
        ]
        for proc in procs:
            assert proc.stderr is not None
            line = proc.stderr.readline()
            if b"ready" not in line:
                raise WorkerError(f"a {mode} driver failed to start: {line[:300]!r}")
        go.touch()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=duration + 120)
            if proc.returncode:
                raise WorkerError(f"a {mode} driver failed: {err[-300:]!r}")
            results.append(json.loads(out.splitlines()[-1]))
    cycles = sum(r.get("cycles", 0) for r in results)
    return {
        "clients": clients,
        "processes": n,
        "cycles": cycles,
        "cycles_per_s": round(cycles / duration, 1) if duration else None,
        "errors": sum(r.get("errors", 0) for r in results),
        "messages": [m for r in results for m in r.get("messages", [])][:3],
        "gaps_ms": [g for r in results for g in r.get("gaps_ms", [])],
    }


def http(ctx: Context) -> dict[str, Any]:
    from resource_lease.models import ApiToken, IdempotencyKey, Resource, Waiter

    plan, alias = ctx.plan, ctx.target.alias
    pool_kind, one_kind = f"{PREFIX}pool", f"{PREFIX}one"
    seed(ctx.target, pool_kind, plan.cycle_pool)
    seed(ctx.target, one_kind, 1)
    token = ApiToken(name=f"bench-{ctx.run_id}"[:64])
    text = token.set_new_secret()
    token.save(using=alias)
    etcd_url = os.environ.get("ETCD_URL", "http://127.0.0.1:2379")
    etcd = _answers(etcd_url + "/version")
    ctx.say(f"  http: etcd at {etcd_url}: {'answers' if etcd else 'does not answer (left out)'}")
    server, api = _server(ctx.target.url)
    env = {**_env(ctx.target.url), "RESOURCE_LEASE_TOKEN": text}
    try:
        points = []
        for clients in plan.http_clients:
            point: dict[str, Any] = {"clients": clients}
            for mode in ("http", "python", *(("etcd",) if etcd else ())):
                url = etcd_url if mode == "etcd" else api
                ctx.settle()
                figures = _drivers(
                    mode, clients, env=env, duration=plan.http_duration, url=url, kind=pool_kind, pool=plan.cycle_pool
                )
                figures.pop("gaps_ms")
                point[mode] = figures
                ctx.say(
                    f"  http: {clients} clients, {mode}: {figures['cycles_per_s']} cycles/s ({figures['errors']} errors)"
                )
            points.append(point)
        handoff = {}
        for mode in ("handoff-http", "handoff-python"):
            figures = _drivers(mode, 1, env=env, duration=0, url=api, kind=one_kind, rounds=plan.http_rounds)
            gaps = figures["gaps_ms"]
            handoff[mode.removeprefix("handoff-")] = {
                "rounds": len(gaps),
                "gap_p50_ms": round(percentile(gaps, 50) or 0.0, 2),
                "gap_p99_ms": round(percentile(gaps, 99) or 0.0, 2),
            }
            ctx.say(f"  http: hand-off {mode}: p50 {handoff[mode.removeprefix('handoff-')]['gap_p50_ms']} ms")
        return {"pool": plan.cycle_pool, "etcd": etcd, "points": points, "handoff": handoff}
    finally:
        server.kill()
        server.wait(30)
        Resource.objects.using(alias).filter(kind__startswith=PREFIX).delete()
        Waiter.objects.using(alias).filter(kind__startswith=PREFIX).delete()
        IdempotencyKey.objects.using(alias).filter(token=token).delete()
        ApiToken.objects.using(alias).filter(pk=token.pk).delete()


def summary(doc: dict[str, Any]) -> list[str]:
    lines = [
        "| database | clients | HTTP cycles/s | Python cycles/s | etcd lock cycles/s | HTTP errors |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    gaps = ["", "| database | hand-off gap HTTP p50 / p99 ms | Python p50 / p99 ms |", "| --- | --- | --- |"]
    for db in doc["databases"]:
        result = db.get("result")
        if not result:
            continue
        for point in result["points"]:
            etcd = point.get("etcd", {}).get("cycles_per_s", "-")
            lines.append(
                f"| {db['label']} | {point['clients']} | {point['http']['cycles_per_s']} |"
                f" {point['python']['cycles_per_s']} | {etcd} | {point['http']['errors']} |"
            )
        h, p = result["handoff"]["http"], result["handoff"]["python"]
        gaps.append(
            f"| {db['label']} | {h['gap_p50_ms']} / {h['gap_p99_ms']} | {p['gap_p50_ms']} / {p['gap_p99_ms']} |"
        )
    return lines + gaps


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Cycles per second by client count: HTTP, Python and etcd side by side, a column per database."""
    from project.bench.report import _figure, _no_data, _save

    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 1, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        ax = axes[0][col]
        if "result" not in db:
            _no_data(ax, db)
            continue
        points = db["result"]["points"]
        modes = [m for m in ("http", "python", "etcd") if points and m in points[0]]
        width = 0.8 / max(1, len(modes))
        for i, mode in enumerate(modes):
            xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(points))]
            ax.bar(xs, [max(p[mode]["cycles_per_s"], 0.1) for p in points], width, label=mode)
        ax.set_xticks(range(len(points)))
        ax.set_xticklabels([f"{p['clients']} clients" for p in points])
        ax.set_ylabel("acquire + release cycles per second", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(db["label"])
        ax.legend(fontsize=8)
    return _save(fig, path)
