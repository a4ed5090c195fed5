"""What planning costs a waiter's look on PostgreSQL: the server's CPU per look, by plan_cache_mode.

    python scripts/device/plan_cost.py [--looks 3000] [--modes auto,force_generic_plan]

Runs a waiter's look (``LOOK_ANY``, as ``db.line`` sends it, prepared by psycopg after five
runs) ``--looks`` times on the engine's connection, once per ``plan_cache_mode`` given (set on
the session first), and prints the server's CPU per look (its backend's, from /proc: the
server must run on this machine), the client's, and how PostgreSQL planned it (generic and
custom plans, from ``pg_prepared_statements``). ``auto`` is PostgreSQL's default; the engine's
sessions use ``force_generic_plan`` (docs/pitfalls.md#prepared-statements).

Run from the repository root with DATABASE_URL set to a PostgreSQL database (PYTHONPATH=.,
DJANGO_SETTINGS_MODULE defaults to project.settings).
"""

from __future__ import annotations

import argparse
import os
import time


def _backend_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--looks", type=int, default=3000)
    parser.add_argument("--modes", default="auto,force_generic_plan")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from resource_lease.db import statements
    from resource_lease.db.connections import close_connections, lease_connection

    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    for mode in args.modes.split(","):
        close_connections()  # a new session: nothing prepared yet
        conn = lease_connection("default")
        dialect = conn.dialect
        sql = statements.fill(dialect.statement("LOOK_ANY", None, target=""), limit=str(statements.LINE_ROOM))
        ahead = ("plan-cost", 10**9, 0, 0, 10**9)
        params = (10**9, *ahead, *ahead, "plan-cost", "plan-cost", "", "plan-cost")
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), set_config('plan_cache_mode', %s, false)", [mode])
            pid = cursor.fetchone()[0]
            ticks, cpu = _backend_ticks(pid), time.process_time()
            for _ in range(args.looks):
                dialect.run_repeated(cursor, sql, params)
                cursor.fetchall()
            ticks, cpu = _backend_ticks(pid) - ticks, time.process_time() - cpu
            cursor.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                ["SELECT (SELECT COUNT(*) FROM%"],
            )
            generic, custom = cursor.fetchall()[0]
        print(
            f"{mode}: server {ticks * tick_us / args.looks:.0f} us per look, client {cpu * 1e6 / args.looks:.0f} us;"
            f" {generic} generic plans, {custom} custom"
        )
    close_connections()


if __name__ == "__main__":
    main()
