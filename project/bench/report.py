"""Writing what the benchmark measured: JSON per scenario, a summary table, a PNG per scenario.

A scenario's document is ``{"scenario", "title", "meta", "databases": [{"key", "label",
"result" | "error"}]}``; the plots and the table are drawn from it alone, so they can be
redrawn from saved JSON (``lease_bench --replot DIR``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

Doc = dict[str, Any]

STYLE: dict[str, dict[str, Any]] = {
    "engine": {"color": "tab:blue", "marker": "o", "linewidth": 2.4, "label": "resource_lease (engine)"},
    "floor": {
        "color": "black",
        "marker": "s",
        "linestyle": "--",
        "linewidth": 1.4,
        "label": "floor: 2 PK UPDATEs of holder",
    },
    "lease-floor": {
        "color": "dimgray",
        "marker": "x",
        "linestyle": ":",
        "linewidth": 1.4,
        "label": "lease floor: 2 PK UPDATEs moving busy_before",
    },
    "before": {
        "color": "tab:cyan",
        "marker": "o",
        "linestyle": "-.",
        "linewidth": 1.6,
        "label": "resource_lease before (--before)",
    },
    "original": {"color": "tab:red", "marker": "^", "linewidth": 1.6, "label": "original SELECT+UPDATE"},
    "redis": {"color": "tab:green", "marker": "D", "linewidth": 1.4, "label": "redis-py Lock"},
    "getlock": {"color": "tab:purple", "marker": "v", "linewidth": 1.4, "label": "GET_LOCK"},
}


def machine() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_average_at_start": [round(v, 2) for v in load] if load else None,
        "wake_cpu_us": wake_cpu_us(),
    }


def wake_cpu_us(rounds: int = 2000) -> float:
    """Microseconds of a thread's own CPU to block and be woken by another thread, here (the
    median of three runs of ``rounds`` ping-pongs): what the machine charges for a switch.
    A waited grant blocks its waiter at least four times (a place, a look, the wait, the
    hand-off's NOTIFY to its LISTEN thread), so its client CPU is bounded below by this: 16-36
    us on the project's 2-core VM (docs/benchmarks.md, eighth session)."""
    return round(sorted(_ping_pong(rounds) for _ in range(3))[1], 1)


def _ping_pong(rounds: int) -> float:
    ping, pong = threading.Event(), threading.Event()

    def answer() -> None:
        for _ in range(rounds):
            ping.wait()
            ping.clear()
            pong.set()

    other = threading.Thread(target=answer, name="lease-bench-pong", daemon=True)
    other.start()
    started = time.thread_time()
    for _ in range(rounds):
        ping.set()
        pong.wait()
        pong.clear()
    took = time.thread_time() - started
    other.join()
    return took / rounds * 1e6


def wake_figure(host: dict[str, Any]) -> str:
    """``wake_cpu_us`` as the summary says it ('not measured' in JSON from before it was)."""
    value = host.get("wake_cpu_us")
    return "(not measured)" if value is None else f"{value:g} us"


def write_json(doc: Doc, out: Path) -> Path:
    path = out / f"{doc['scenario']}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


# -- the summary table ----------------------------------------------------------------------


def _f(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [
        "  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths, strict=True)))
    ]
    for row in rows:
        lines.append(
            "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    return lines


def _cycle_rows(doc: Doc, point_key: str) -> list[list[str]]:
    rows = []
    for db in doc["databases"]:
        if "result" not in db:
            continue
        for point in db["result"]["points"]:
            for name, r in point["results"].items():
                rows.append(
                    [
                        db["label"],
                        f"{'P' if point_key == 'processes' else 'N'}={point[point_key]:,}",
                        name,
                        _f(r["cycles_per_s"], 0),
                        _f(r.get("x_floor"), 2),
                        _f(r.get("x_lease_floor"), 2),
                        _f(r["p50_ms"], 2),
                        _f(r["p99_ms"], 2),
                        _f(r["lost_per_cycle"], 2),
                        _f(r["statements_per_cycle"], 2),
                        _f(r.get("client_cpu_ms_per_cycle"), 2),
                        _f((r.get("server_per_cycle") or {}).get("server_cpu_ms"), 2),
                        _f(r["cycles"]),
                    ]
                )
    return rows


CYCLE_HEADER = [
    "database",
    "point",
    "contender",
    "cycles/s",
    "x floor",
    "x lease floor",
    "p50 ms",
    "p99 ms",
    "lost/cyc",
    "stmts/cyc",
    "cpu ms/cyc",
    "srv cpu ms/cyc",
    "cycles",
]


def summary_lines(doc: Doc) -> list[str]:
    """The scenario's part of the printed summary."""
    scenario = doc["scenario"]
    lines = [doc["title"], "-" * len(doc["title"])]
    ok = [db for db in doc["databases"] if "result" in db]
    if scenario == "cycle":
        lines += _table(CYCLE_HEADER, _cycle_rows(doc, "processes"))
    elif scenario == "pool":
        procs = ok[0]["result"]["processes"] if ok else "?"
        lines.append(f"({procs} processes; point N = resources in the pool)")
        lines += _table(CYCLE_HEADER, _cycle_rows(doc, "size"))
    elif scenario == "scarcity":
        header = [
            "database",
            "workers/res",
            "utilisation",
            "Jain",
            "grants/s",
            "ideal/s",
            "wait p50 ms",
            "wait p99 ms",
            "waiter q/s",
            "q/grant",
        ]
        rows = []
        for db in ok:
            r = db["result"]
            rows.append(
                [
                    db["label"],
                    f"{r['workers']}/{r['resources']}",
                    _f(r["utilisation"], 3),
                    _f(r["jain"], 3),
                    _f(r["grants_per_s"], 0),
                    _f(r["ideal_grants_per_s"], 0),
                    _f(r["wait"]["p50_ms"], 1),
                    _f(r["wait"]["p99_ms"], 1),
                    _f(r["waiting_queries_per_s"], 0),
                    _f(r["queries_per_grant"], 2),
                ]
            )
        lines += _table(header, rows)
    elif scenario == "waiting":
        from project.bench import waiting_report

        lines += waiting_report.summary(doc)
    elif scenario == "liveness":
        from project.bench import liveness

        lines += liveness.summary(doc)
    elif scenario == "http":
        from project.bench import http_bench

        lines += http_bench.summary(doc)
    elif scenario == "crawl":
        from project.bench import crawl_bench

        lines += crawl_bench.summary(doc)
    elif scenario == "crash":
        header = [
            "database",
            "ttl s",
            "kills",
            "lease left p50",
            "regrant p50 s",
            "regrant max s",
            "after expiry min/p50/max s",
            "early",
        ]
        rows = []
        for db in ok:
            r = db["result"]
            left = [e["lease_left_at_kill_s"] for e in r["events"]]
            a = r["after_expiry_s"]
            rows.append(
                [
                    db["label"],
                    _f(r["ttl_s"], 2),
                    _f(len(r["events"])),
                    _f(sorted(left)[len(left) // 2] if left else None, 2),
                    _f(r["regranted_after_s"]["p50"], 2),
                    _f(r["regranted_after_s"]["max"], 2),
                    f"{_f(a['min'], 2)} / {_f(a['p50'], 2)} / {_f(a['max'], 2)}",
                    _f(r["granted_early"]),
                ]
            )
        lines += _table(header, rows)
    elif scenario == "renewal":
        header = [
            "database",
            "leases/ttl",
            "renewals/s",
            "expected/s",
            "queries/s",
            "q/renewal",
            "p50 ms",
            "p99 ms",
            "max ms",
            "late p99 ms",
            "lost",
            "errors",
        ]
        rows = []
        for db in ok:
            r = db["result"]
            rows.append(
                [
                    db["label"],
                    f"{r['leases']}/{r['ttl_s']:g}s",
                    _f(r["renewals_per_s"], 0),
                    _f(r["expected_renewals_per_s"], 0),
                    _f(r["queries_per_s"], 0),
                    _f(r["queries_per_renewal"], 2),
                    _f(r["latency"]["p50_ms"], 2),
                    _f(r["latency"]["p99_ms"], 2),
                    _f(r["latency"]["max_ms"], 2),
                    _f(r.get("lateness", {}).get("p99_ms"), 1),
                    _f(r["leases_lost"]),
                    _f(r["errors"]),
                ]
            )
        lines += _table(header, rows)
    for db in doc["databases"]:
        if "error" in db:
            lines.append(f"{db['label']}: FAILED: {db['error'].strip().splitlines()[-1]}")
    return lines + [""]


# -- plots ----------------------------------------------------------------------------------


def _figure(columns: int, rows: int, title: str, meta: dict[str, Any]) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 3.9 * rows if rows > 1 else 5.0
    fig, axes = plt.subplots(rows, columns, figsize=(5.6 * columns, height), squeeze=False)
    when = meta.get("date", "")[:16].replace("T", " ")
    host = meta.get("machine", {})
    fig.suptitle(f"{title}\n{host.get('host', '')}, {host.get('cpus', '?')} CPUs, {when} UTC", fontsize=11)
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _no_data(ax: Any, db: dict[str, Any]) -> None:
    ax.set_title(db["label"])
    ax.text(0.5, 0.5, "failed: see the JSON", ha="center", va="center", transform=ax.transAxes)


def _plot_curves(doc: Doc, path: Path, x_key: str, x_label: str, log_x: int) -> Path:
    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 2, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        top, bottom = axes[0][col], axes[1][col]
        if "result" not in db:
            _no_data(top, db)
            continue
        points = db["result"]["points"]
        xs = [p[x_key] for p in points]
        for name in db["result"]["contenders"]:
            style = dict(STYLE.get(name, {"label": name}))
            label = style.pop("label")
            top.plot(xs, [p["results"][name]["cycles_per_s"] for p in points], label=label, **style)
            p99 = [p["results"][name]["p99_ms"] for p in points]
            p50 = [p["results"][name]["p50_ms"] for p in points]
            bottom.plot(xs, p99, label=f"{label} p99", **style)
            faint = {k: v for k, v in style.items() if k not in ("linestyle", "linewidth")}
            bottom.plot(xs, p50, linestyle=":", linewidth=1, alpha=0.7, **faint)
        for ax in (top, bottom):
            ax.set_xscale("log", base=log_x)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:,}" for x in xs])
            ax.grid(True, which="major", alpha=0.3)
            ax.set_xlabel(x_label)
        top.set_yscale("log")
        top.set_ylabel("cycles / s (all processes)")
        top.set_title(db["label"])
        bottom.set_yscale("log")
        bottom.set_ylabel("acquire latency, ms (solid p99, dotted p50)")
        if col == 0:
            top.legend(fontsize=8, loc="best")
    return _save(fig, path)


def plot_cycle(doc: Doc, path: Path) -> Path:
    return _plot_curves(doc, path, "processes", "processes (P), pool of 40", 2)


def plot_pool(doc: Doc, path: Path) -> Path:
    procs = next((db["result"]["processes"] for db in doc["databases"] if "result" in db), "?")
    return _plot_curves(doc, path, "size", f"resources in the pool ({procs} processes)", 10)


def plot_scarcity(doc: Doc, path: Path) -> Path:
    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 2, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        top, bottom = axes[0][col], axes[1][col]
        if "result" not in db:
            _no_data(top, db)
            continue
        r = db["result"]
        grants = r["grants_per_worker"]
        top.bar(range(len(grants)), grants, color="tab:blue", width=0.9)
        mean = sum(grants) / len(grants) if grants else 0
        top.axhline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.1f}")
        top.set_title(
            f"{db['label']}\nutilisation {r['utilisation']:.0%}, Jain {r['jain']:.3f}, "
            f"{r['workers']} workers / {r['resources']} resources"
        )
        top.set_xlabel("worker (sorted by grants)")
        top.set_ylabel("grants")
        top.legend(fontsize=8)
        cdf = r["wait_cdf_ms"]
        if cdf:
            ys = [i / (len(cdf) - 1) if len(cdf) > 1 else 1.0 for i in range(len(cdf))]
            bottom.plot(cdf, ys, color="tab:blue", linewidth=2)
            bottom.set_xscale("symlog", linthresh=1)
        wait = r["wait"]
        bottom.set_title(
            f"acquire wait: p50 {_f(wait['p50_ms'], 1)} ms, p99 {_f(wait['p99_ms'], 1)} ms; "
            f"waiters send {r['waiting_queries_per_s']:.0f} q/s",
            fontsize=9,
        )
        bottom.set_xlabel("wait for a grant, ms")
        bottom.set_ylabel("fraction of grants")
        bottom.grid(True, alpha=0.3)
    return _save(fig, path)


def plot_crash(doc: Doc, path: Path) -> Path:
    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 1, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        ax = axes[0][col]
        if "result" not in db:
            _no_data(ax, db)
            continue
        r = db["result"]
        ttl = r["ttl_s"]
        xs = [e["lease_left_at_kill_s"] for e in r["events"]]
        ys = [e["regranted_after_s"] for e in r["events"]]
        ax.scatter(xs, ys, color="tab:blue", zorder=3, label="a killed holder's resource")
        top = max([ttl * 1.1, *xs, *ys])
        ax.plot(
            [0, top], [0, top], color="black", linestyle="--", linewidth=1, label="regranted the instant it expired"
        )
        ax.axhline(ttl, color="tab:red", linestyle=":", linewidth=1.2, label=f"ttl = {ttl:g} s")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top * 1.05)
        ax.set_xlabel("lease time left when the holder was killed, s")
        ax.set_ylabel("SIGKILL until another worker held it, s")
        a = r["after_expiry_s"]
        ax.set_title(
            f"{db['label']}\nafter expiry: p50 {_f(a['p50'], 2)} s, max {_f(a['max'], 2)} s; early: {r['granted_early']}"
        )
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def plot_renewal(doc: Doc, path: Path) -> Path:
    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 2, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        top, bottom = axes[0][col], axes[1][col]
        if "result" not in db:
            _no_data(top, db)
            continue
        r = db["result"]
        bucket = r["timeline_bucket_s"]
        timeline = r["timeline_per_s"]
        top.step(
            [i * bucket for i in range(len(timeline))], timeline, where="post", color="tab:blue", label="renewals / s"
        )
        top.axhline(r["expected_renewals_per_s"], color="black", linestyle="--", linewidth=1, label="leases / (ttl/3)")
        top.set_title(
            f"{db['label']}\n{r['leases']} leases, ttl {r['ttl_s']:g} s: {r['queries_per_s']:.0f} queries/s, "
            f"{r['leases_lost']} lost"
        )
        top.set_xlabel("time in the window, s")
        top.set_ylabel("renewals / s")
        top.legend(fontsize=8)
        top.grid(True, alpha=0.3)
        cdf = r["latency_cdf_ms"]
        if cdf:
            ys = [i / (len(cdf) - 1) if len(cdf) > 1 else 1.0 for i in range(len(cdf))]
            bottom.plot(cdf, ys, color="tab:blue", linewidth=2)
            bottom.set_xscale("log")
        lat = r["latency"]
        late = r.get("lateness", {})
        bottom.set_title(
            f"renew() latency: p50 {_f(lat['p50_ms'], 2)} ms, p99 {_f(lat['p99_ms'], 2)} ms; "
            f"started late by p99 {_f(late.get('p99_ms'), 1)} ms",
            fontsize=9,
        )
        bottom.set_xlabel("renew() call, ms")
        bottom.set_ylabel("fraction of renewals")
        bottom.grid(True, alpha=0.3)
    return _save(fig, path)


PLOTS: dict[str, Callable[[Doc, Path], Path]] = {
    "cycle": plot_cycle,
    "pool": plot_pool,
    "scarcity": plot_scarcity,
    "crash": plot_crash,
    "renewal": plot_renewal,
}


def plot(doc: Doc, out: Path) -> Path:
    if doc["scenario"] == "waiting":
        from project.bench import waiting_report

        return waiting_report.plot(doc, out / "waiting.png")
    if doc["scenario"] == "liveness":
        from project.bench import liveness

        return liveness.plot(doc, out / "liveness.png")
    if doc["scenario"] == "http":
        from project.bench import http_bench

        return http_bench.plot(doc, out / "http.png")
    if doc["scenario"] == "crawl":
        from project.bench import crawl_bench

        return crawl_bench.plot(doc, out / "crawl.png")
    return PLOTS[doc["scenario"]](doc, out / f"{doc['scenario']}.png")
