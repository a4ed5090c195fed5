"""What one NOTIFY costs the PostgreSQL server as more processes LISTEN, on other channels.

    DATABASE_URL=postgres://... python scripts/device/notify_fanout.py [--listeners 0,16,64]

For each count K, K processes each LISTEN on a channel of their own and read what comes; one
more connection then sends 3,000 ``pg_notify`` on a channel nobody listens to, and the script
reads the CPU of the server's processes on this machine (``/proc``) before and after. The line
of waiters sends one NOTIFY per hand-off to its waiter's process channel
(``line.wakeups``), and a release or a look of every waiting process keeps its LISTEN in force:
this says what that costs the server at a given number of waiting processes, whatever the
channel (docs/benchmarks.md, ninth session). Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from typing import Any

import psycopg

NOTIFIES = 3000


def _listener(dsn: str, channel: str, ready: Any, stop: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'LISTEN "{channel}"')
        ready.set()
        while not stop.is_set():
            for _ in conn.notifies(timeout=0.2):
                pass


def _server_cpu_ms() -> int:
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() not in ("postgres", "postmaster"):
                    continue
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except OSError:
            continue  # a process that ended meanwhile
    return ticks * 1000 // os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listeners", default="0,16,64", help="listening processes, comma-separated")
    args = parser.parse_args()
    dsn = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    for count in (int(each) for each in args.listeners.split(",")):
        stop = mp.Event()
        procs = []
        for i in range(count):
            ready = mp.Event()
            proc = mp.Process(target=_listener, args=(dsn, f"fanout_{i}", ready, stop))
            proc.start()
            ready.wait()
            procs.append(proc)
        with psycopg.connect(dsn, autocommit=True) as conn:
            time.sleep(0.5)
            before, started = _server_cpu_ms(), time.monotonic()
            for _ in range(NOTIFIES):
                conn.execute("SELECT pg_notify('fanout_nobody', 'x')")
            took = time.monotonic() - started
            time.sleep(0.3)  # the listeners' backends read the queue
            spent = _server_cpu_ms() - before
        stop.set()
        for proc in procs:
            proc.join()
        print(
            f"{count:4d} processes listening elsewhere: the server's CPU {spent / NOTIFIES * 1000:.0f} us"
            f" per NOTIFY, {took / NOTIFIES * 1e6:.0f} us of wall time each"
        )


if __name__ == "__main__":
    main()
