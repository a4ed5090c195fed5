"""The waiting scenario's part of the summary table and its plot (project/bench/waiting.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LABELS = {
    "engine": "resource_lease (line)",
    "before": "resource_lease before (the --before checkout)",
    "zookeeper": "kazoo on ZooKeeper",
    "redis-lock": "python-redis-lock",
    "redis-py": "redis-py Lock (0.1 s poll)",
    "unwaited": "resource_lease, nobody waits (a row per process)",
}
COLORS = {
    "engine": "tab:blue",
    "before": "tab:gray",
    "zookeeper": "tab:orange",
    "redis-lock": "tab:green",
    "redis-py": "tab:olive",
}
HEADER = [
    "database",
    "case",
    "contender",
    "util",
    "Jain",
    "worst wait s",
    "worst/fair",
    "gap p50 ms",
    "gap p99 ms",
    "grants",
    "stmts/waiter/s",
    "client cpu ms/grant",
    "server cpu ms/grant",
]


def _case(point: dict[str, Any]) -> str:
    c = point["case"]
    what = "lock" if c["what"] == "lock" else f"pool {c['slots']}"
    return f"{c['processes']} on {what}, hold {c['hold'] * 1000:g} ms"


def summary(doc: dict[str, Any]) -> list[str]:
    from project.bench.report import _f, _table

    rows = []
    for db in doc["databases"]:
        if "result" not in db:
            continue
        for point in db["result"]["points"]:
            for name, r in point["results"].items():
                rows.append(
                    [
                        db["label"],
                        _case(point),
                        name,
                        _f(r.get("utilisation"), 2),
                        _f(r.get("jain"), 3),
                        _f(r.get("worst_wait_s"), 3),
                        _f(r.get("worst_x_fair"), 2),
                        _f(r.get("gap_p50_ms"), 2),
                        _f(r.get("gap_p99_ms"), 2),
                        _f(r["grants"]),
                        _f(r.get("statements_per_waiter_s"), 1),
                        _f(r.get("client_cpu_ms_per_grant"), 2),
                        _f(r.get("server_cpu_ms_per_grant"), 2),
                    ]
                )
    return _table(HEADER, rows)


def plot(doc: dict[str, Any], path: Path) -> Path:
    from project.bench.report import _figure, _no_data, _save

    dbs = doc["databases"]
    fig, axes = _figure(len(dbs), 3, doc["title"], doc["meta"])
    for col, db in enumerate(dbs):
        if "result" not in db:
            _no_data(axes[0][col], db)
            continue
        points = db["result"]["points"]
        names = [name for name in db["result"]["contenders"] if name != "unwaited"]  # nobody waited
        width = 0.8 / max(1, len(names))
        for row, (key, label, log) in enumerate(
            [
                ("utilisation", "utilisation (share of the window held)", False),
                ("jain", "Jain's fairness index", False),
                ("gap_p50_ms", "hand-off gap p50, ms (release to next grant)", True),
            ]
        ):
            ax = axes[row][col]
            for i, name in enumerate(names):
                xs, ys = [], []
                for j, point in enumerate(points):
                    value = point["results"].get(name, {}).get(key)
                    if value is not None and (not log or value > 0):
                        xs.append(j + (i - (len(names) - 1) / 2) * width)
                        ys.append(value)
                ax.bar(xs, ys, width, label=LABELS.get(name, name), color=COLORS.get(name))
            ax.set_xticks(range(len(points)))
            ax.set_xticklabels([_case(p) for p in points], fontsize=8)
            ax.set_ylabel(label, fontsize=9)
            if log:
                ax.set_yscale("log")
            else:
                ax.set_ylim(0, 1.05)
            ax.grid(True, axis="y", alpha=0.3)
            if row == 0:
                ax.set_title(db["label"])
                ax.legend(fontsize=7)
    return _save(fig, path)
