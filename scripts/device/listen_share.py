"""How PostgreSQL's CPU splits between LISTEN backends and the others, while a benchmark runs.

    python scripts/device/listen_share.py DATABASE SECONDS [--every 3]

Every ``--every`` seconds, for ``SECONDS``: the backends connected to ``DATABASE`` (by
``pg_stat_activity``), split by their last statement (a LISTEN or UNLISTEN: a process's LISTEN
connection, ``db/listen.py``; anything else: the others), and the CPU ticks each group spent
over the slice (from /proc: the server must run on this machine). Run it beside
``lease_bench --scenario waiting`` or ``scripts/device/tail_probe.py``: a release's NOTIFY
makes every listening backend of the database read the queue (PostgreSQL 15), which the
LISTEN group's ticks show. Slices with fewer than ``--least`` backends are skipped (between
windows).

Needs psycopg and a server on 127.0.0.1:5432 reachable as ``postgres`` (``--url`` to change).
"""

from __future__ import annotations

import argparse
import time

import psycopg


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None  # gone meanwhile
    return int(fields[11]) + int(fields[12])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("database")
    parser.add_argument("seconds", type=float)
    parser.add_argument("--every", type=float, default=3.0)
    parser.add_argument("--least", type=int, default=8)
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with psycopg.connect(args.url, autocommit=True) as conn:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            rows = conn.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [args.database],
            ).fetchall()
            if len(rows) < args.least:
                time.sleep(1)
                continue
            groups = {pid: "listen" if query.startswith(("LISTEN", "UNLISTEN")) else "others" for pid, query in rows}
            before = {pid: _ticks(pid) for pid in groups}
            time.sleep(args.every)
            after = {pid: _ticks(pid) for pid in groups}
            spent: dict[str, list[int]] = {"listen": [0, 0], "others": [0, 0]}
            for pid, group in groups.items():
                first, last = before[pid], after[pid]
                if first is not None and last is not None:
                    spent[group][0] += 1
                    spent[group][1] += last - first
            print(
                time.strftime("%H:%M:%S"),
                "  ".join(f"{group}: {n} backends, {ticks} ticks" for group, (n, ticks) in spent.items()),
                flush=True,
            )


if __name__ == "__main__":
    main()
