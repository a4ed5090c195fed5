"""Final table of scripts/device/run.sh: key figures from lease_bench's JSON and cycle_cost's log.

python3 scripts/device/summarize.py RESULTS_DIR OUT_DIR   (standard library only)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def f(value: object, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) for row in rows]
    return out


def waiting(path: Path, title: str) -> list[str]:
    doc = json.loads(path.read_text())
    rows = []
    for db in doc["databases"]:
        if "result" not in db:
            rows.append([title, "ERROR", db.get("error", "?")[:60], "", "", "", "", "", ""])
            continue
        for point in db["result"]["points"]:
            c = point["case"]
            case = f"{c['processes']} on {'lock' if c['what'] == 'lock' else 'pool ' + str(c['slots'])}"
            for name, r in point["results"].items():
                if name == "unwaited":
                    rows.append(
                        [case, name, "", "", "", "", "", f(r.get("client_cpu_ms_per_grant")), f(r["grants"], 0)]
                    )
                    continue
                rows.append(
                    [
                        case,
                        name,
                        f(r.get("utilisation")),
                        f(r.get("jain"), 3),
                        f(r.get("worst_wait_s"), 3),
                        f(r.get("worst_x_fair")),
                        f(r.get("gap_p50_ms")) + " / " + f(r.get("gap_p99_ms")),
                        f(r.get("client_cpu_ms_per_grant")),
                        f(r["grants"], 0),
                    ]
                )
    window = doc["databases"][0].get("result", {}).get("window_s") if doc["databases"] else None
    rounds = doc["databases"][0].get("result", {}).get("rounds") if doc["databases"] else None
    head = [f"{title} (window {window} s x {rounds} rounds; {doc['meta']['machine'].get('cpus')} CPUs)"]
    return head + table(
        ["case", "contender", "util", "Jain", "worst s", "worst/fair", "gap p50/p99 ms", "cpu ms/grant", "grants"],
        rows,
    )


def cycle(path: Path, title: str) -> list[str]:
    doc = json.loads(path.read_text())
    rows = []
    for db in doc["databases"]:
        if "result" not in db:
            rows.append(["ERROR", db.get("error", "?")[:60], "", "", "", "", ""])
            continue
        for point in db["result"]["points"]:
            for name, r in point["results"].items():
                rows.append(
                    [
                        f"P={point['processes']}",
                        name,
                        f(r["cycles_per_s"], 0),
                        f(r.get("x_floor")),
                        f(r.get("x_lease_floor")),
                        f(r.get("p50_ms")) + " / " + f(r.get("p99_ms")),
                        f(r.get("client_cpu_ms_per_cycle")),
                        f((r.get("server_per_cycle") or {}).get("server_cpu_ms")),
                    ]
                )
    return [title] + table(
        ["point", "contender", "cycles/s", "x floor", "x lease floor", "p50/p99 ms", "cpu ms/cyc", "srv ms/cyc"], rows
    )


def main() -> None:
    results, out = Path(sys.argv[1]), Path(sys.argv[2])
    lines: list[str] = []
    for sub, title in (
        ("waiting", "WAITING (this checkout)"),
        ("waiting_before", "WAITING with --before t3 (70ca3fa)"),
    ):
        path = results / sub / "waiting.json"
        if path.exists():
            try:
                lines += waiting(path, title) + [""]
            except Exception as exc:  # noqa: BLE001
                lines += [f"{title}: unreadable JSON: {exc!r}", ""]
        else:
            lines += [f"{title}: no result", ""]
    log = out / "20-cycle_cost.log"
    if log.exists():
        text = log.read_text(errors="replace").splitlines()
        start = next((i for i, line in enumerate(text) if line.startswith("cycle_cost on")), None)
        lines += ["CYCLE_COST"] + (text[start : start + 7] if start is not None else ["  no table in the log"]) + [""]
    else:
        lines += ["CYCLE_COST: no result", ""]
    path = results / "cycle" / "cycle.json"
    if path.exists():
        try:
            lines += cycle(path, "CYCLE scenario (lease_bench --scenario cycle)") + [""]
        except Exception as exc:  # noqa: BLE001
            lines += [f"cycle: unreadable JSON: {exc!r}", ""]
    else:
        lines += ["CYCLE scenario: no result", ""]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
