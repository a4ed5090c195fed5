"""The liveness scenario: how fast each primitive that waits is woken at release.

For each number of processes P and each row (a primitive that waits, sync or asyncio), P
contender processes (``project.bench.liveness_contender``, one-by-one mode: started once per
P, each row measured alone) take the primitive ``cycles`` times each, holding it ``hold``
seconds. From their grant log: grants per second (over the span from the first grant to the
last release) and the release-to-grant gap (a release, and the next grant that had asked
before it) at p50 and p99, and each row's grants per second against ``lock()``'s at the same
P. A primitive that sleeps through releases (woken only by its fallback look,
``LINE_POLL_MAX``) shows as an order of magnitude below ``lock()``: it prints, it does not
judge (tests/test_liveness.py is the check).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from project.bench.stats import percentile
from project.bench.workers import BASE_DIR

if TYPE_CHECKING:
    from project.bench.scenarios import Context

#: The rows measured (those of the matrix whose primitive differs, sync and asyncio).
ROWS = (
    "lock",
    "acquire",
    "semaphore",
    "rwlock-write",
    "rwlock-mixed",
    "election",
    "holder",
    "synchronized",
    "alock",
    "aacquire",
    "arwlock-write",
    "arwlock-mixed",
)
PREFIX = "bench-live-"


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        RESOURCE_LEASE_AUDIT="0",
        PYTHONPATH=str(BASE_DIR) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _seed(alias: str) -> None:
    from resource_lease.models import Resource

    Resource.objects.using(alias).filter(kind__startswith=PREFIX).delete()
    for kind in ("acquire", "aacquire", "holder"):
        Resource.objects.using(alias).create(kind=f"{PREFIX}{kind}", name=f"{kind}-0")


def _clean(alias: str) -> None:
    from resource_lease.models import Resource, Waiter

    Resource.objects.using(alias).filter(kind__startswith=PREFIX).delete()
    Resource.objects.using(alias).filter(name__startswith=PREFIX).delete()
    Waiter.objects.using(alias).filter(kind__startswith=PREFIX).delete()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def summarise(lines: list[str], row: str) -> dict[str, Any]:
    """Grants per second and the release-to-grant gaps of one row's log lines."""
    grants = []
    errors = 0
    messages: list[str] = []
    for line in lines:
        name, _, rest = line.partition(" ")
        if name != row:
            continue
        fields = rest.split()
        if fields[1] == "error":
            errors += 1
            messages.append(rest[:300])
            continue
        grants.append(tuple(int(f) for f in fields[1:4]))
    grants.sort(key=lambda g: g[1])
    gaps = [(nxt[1] - cur[2]) / 1e6 for cur, nxt in zip(grants, grants[1:], strict=False) if nxt[0] < cur[2] <= nxt[1]]
    span = (max(g[2] for g in grants) - grants[0][1]) / 1e9 if grants else 0.0
    return {
        "grants": len(grants),
        "errors": errors,
        "error_messages": messages[:3],
        "grants_per_s": round(len(grants) / span, 1) if span > 0 else 0.0,
        "gap_p50_ms": _round(percentile(gaps, 50)),
        "gap_p99_ms": _round(percentile(gaps, 99)),
        "gaps": len(gaps),
    }


def run_point(
    url: str, alias: str, processes: int, *, cycles: int, hold: float, rows: tuple[str, ...]
) -> dict[str, Any]:
    """P contender processes, each row measured alone, one after the other."""
    _seed(alias)
    with tempfile.TemporaryDirectory(prefix="lease-bench-liveness-") as tmp:
        out, go = Path(tmp) / "grants.log", Path(tmp) / "go"
        argv = ["--rows", ",".join(rows), "--cycles", str(cycles), "--hold", str(hold), "--prefix", PREFIX]
        argv += ["--out", str(out), "--go", str(go), "--one-by-one", "--timeout", "120"]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "project.bench.liveness_contender", "--index", str(i), *argv],
                env=_env(url),
                cwd=BASE_DIR,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(processes)
        ]
        try:
            for proc in procs:
                assert proc.stdout is not None
                line = proc.stdout.readline().strip()
                if line != "READY":
                    raise RuntimeError(f"a liveness contender did not start: {line!r}")
            for row in rows:
                go.with_name(f"go.{row}").touch()
                for proc in procs:
                    assert proc.stdout is not None
                    while (line := proc.stdout.readline().strip()) != f"ROW-DONE {row}":
                        if not line and proc.poll() is not None:
                            raise RuntimeError(f"a liveness contender exited during {row}")
                time.sleep(0.2)  # the last releases and their places settle
            for proc in procs:
                proc.wait(timeout=60)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        lines = out.read_text().splitlines() if out.exists() else []
    _clean(alias)
    result = {row: summarise(lines, row) for row in rows}
    lock_rate = result.get("lock", {}).get("grants_per_s") or 0.0
    for figures in result.values():
        figures["vs_lock"] = round(figures["grants_per_s"] / lock_rate, 2) if lock_rate else None
    return result


def liveness(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    rows = tuple(plan.liveness_rows or ROWS)
    points = []
    for processes in plan.liveness_processes:
        cycles = max(3, plan.liveness_grants // processes)
        ctx.say(f"  liveness: {processes} processes, {cycles} cycles each, rows {', '.join(rows)}")
        figures = run_point(
            ctx.target.url, ctx.target.alias, processes, cycles=cycles, hold=plan.liveness_hold, rows=rows
        )
        points.append({"processes": processes, "cycles": cycles, "hold": plan.liveness_hold, "rows": figures})
    return {"points": points}


def summary(doc: dict[str, Any]) -> list[str]:
    """The scenario's table: a line per database, processes and row."""
    lines = [
        "| database | processes | row | grants/s | vs lock() | gap p50 ms | gap p99 ms | grants |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for entry in doc["databases"]:
        for point in entry.get("result", {}).get("points", []):
            for row, f in point["rows"].items():
                lines.append(
                    f"| {entry['label']} | {point['processes']} | {row} | {f['grants_per_s']:.0f} |"
                    f" {f['vs_lock'] if f['vs_lock'] is not None else '-'} | {f['gap_p50_ms'] if f['gap_p50_ms'] is not None else '-'} |"
                    f" {f['gap_p99_ms'] if f['gap_p99_ms'] is not None else '-'} | {f['grants']} |"
                )
    return lines


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Grants per second per row (bars by process count), log scale, a column per database."""
    from project.bench.report import _figure, _no_data, _save

    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 1, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        ax = axes[0][col]
        if "result" not in db:
            _no_data(ax, db)
            continue
        points = db["result"]["points"]
        rows = list(points[0]["rows"]) if points else []
        width = 0.8 / max(1, len(points))
        for i, point in enumerate(points):
            xs = [j + (i - (len(points) - 1) / 2) * width for j in range(len(rows))]
            ys = [max(point["rows"][row]["grants_per_s"], 0.1) for row in rows]
            ax.bar(xs, ys, width, label=f"{point['processes']} processes")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(rows, fontsize=8, rotation=45, ha="right")
        ax.set_ylabel("grants per second (log)", fontsize=9)
        ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(db["label"])
        ax.legend(fontsize=7)
    return _save(fig, path)
