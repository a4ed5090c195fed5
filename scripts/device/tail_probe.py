"""Where the worst waits of a pool's line come from: P processes on a pool of S rows.

    python scripts/device/tail_probe.py [--processes 64] [--slots 40] [--hold 0.05]
                                        [--seconds 10] [--worst 8]

Each process takes ``acquire(kind, timeout=...)`` again and again for ``--seconds``, holding
each grant ``--hold`` seconds (as lease_bench's waiting scenario does). Each one records, per
grant, when it asked, when the LISTEN thread heard that a release handed its place a row (the
hand-off's NOTIFY, PostgreSQL), and when ``acquire`` returned (CLOCK_MONOTONIC, shared by the
machine's processes). It prints the wait's p50, p99 and worst, and for the worst waits:
when they asked (from the window's start), how long until the hand-off was heard, and how
long from then until ``acquire`` returned. A long first part is the line (the releases handed
others first); a long second part is the waiting process (its threads not scheduled, or its
claim). Also the line's counters summed over the processes.

Run from the repository root with DATABASE_URL set (PYTHONPATH=., DJANGO_SETTINGS_MODULE
defaults to project.settings). The patch only records times; it changes nothing the engine does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def worker(kind: str, start: float, stop: float, hold: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from resource_lease import acquire
    from resource_lease.exceptions import NoResourceAvailable
    from resource_lease.line import stats, wakeups

    heard: list[float] = []
    board = wakeups.board()
    wake_turn = board.wake_turn

    def recording(alias: str, place: int, handed: int | None = None, grant: object = None) -> bool:
        if handed is not None:
            heard.append(time.monotonic())
        return wake_turn(alias, place, handed, grant)

    board.wake_turn = recording  # type: ignore[method-assign]
    acquire(kind, ttl=30, timeout=60).release()  # connected before the start
    wakeups.listen("default")  # and listening, as lease_bench's workers (kazoo's session)
    while not wakeups.pushed("default") and time.monotonic() < start:
        time.sleep(0.005)
    time.sleep(max(0.0, start - time.monotonic()))
    out = []
    cpu = time.process_time()
    while (asked := time.monotonic()) < stop:
        heard.clear()
        try:
            lease = acquire(kind, ttl=30, timeout=stop - asked)
        except NoResourceAvailable:
            break
        got = time.monotonic()
        out.append([asked, heard[0] if heard else None, got])
        time.sleep(hold)
        lease.release()
    cpu = time.process_time() - cpu
    print(json.dumps({"pid": os.getpid(), "grants": out, "line": stats.as_dict(), "cpu": cpu}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--slots", type=int, default=40)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--worst", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from project.bench.vendor import server_cpu_ms
    from resource_lease.models import Resource

    kind = f"tail-probe-{os.getpid()}"
    Resource.objects.bulk_create(Resource(kind=kind, name=f"r{i}") for i in range(args.slots))
    start = time.monotonic() + 5 + args.processes * 0.6  # every process set up by then on 2 cores
    stop = start + args.seconds
    code = "import sys; sys.path.insert(0, '.'); from scripts.device.tail_probe import worker; worker(*sys.argv[1:2], *map(float, sys.argv[2:]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, kind, str(start), str(stop), str(args.hold)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(args.processes)
    ]
    time.sleep(max(0.0, start - time.monotonic()))
    server = server_cpu_ms(("postgres",))
    time.sleep(max(0.0, stop - time.monotonic()))
    server = server_cpu_ms(("postgres",)) - server  # over the window
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    Resource.objects.filter(kind=kind).delete()
    waits = sorted(
        ((got - asked, asked, heard, got, r["pid"]) for r in results for asked, heard, got in r["grants"]), reverse=True
    )
    total = len(waits)
    fair = (args.processes - args.slots) * args.seconds / total
    values = sorted(w[0] for w in waits)
    print(
        f"{total} grants; fair wait {fair * 1000:.1f} ms; wait p50 {values[total // 2] * 1000:.1f} ms,"
        f" p99 {values[int(total * 0.99)] * 1000:.1f} ms, worst {values[-1] * 1000:.1f} ms ({values[-1] / fair:.1f}x fair)"
    )
    print("worst waits: asked at (s from start), heard the hand-off after (ms), returned after that (ms), pid")
    for wait, asked, heard, got, pid in waits[: args.worst]:
        to_heard = "-" if heard is None else f"{(heard - asked) * 1000:.1f}"
        after = "-" if heard is None else f"{(got - heard) * 1000:.1f}"
        print(
            f"  {wait * 1000:8.1f} ms: asked at {asked - start:6.2f}, heard after {to_heard}, returned {after} later, pid {pid}"
        )
    steady = [w for w in waits if w[1] - start >= 1.0]
    if steady:
        print(
            f"asked a second or more after the start (the start's herd aside): worst {steady[0][0] * 1000:.1f} ms"
            f" ({steady[0][0] / fair:.1f}x fair), at {steady[0][1] - start:.2f} s"
        )
    late = [got - heard for _, _, heard, got, _ in waits if heard is not None]
    if late:
        late.sort()
        print(
            f"from the hand-off heard to acquire's return: p50 {statistics.median(late) * 1000:.2f} ms,"
            f" p99 {late[int(len(late) * 0.99)] * 1000:.2f} ms, worst {late[-1] * 1000:.1f} ms"
        )
    line: dict[str, int] = {}
    for r in results:
        for key, value in r["line"].items():
            line[key] = line.get(key, 0) + value
    print("line:", line)
    print(f"server CPU per grant (every postgres process of this machine, over the window): {server / total:.2f} ms")
    print(
        f"client CPU per grant (the {args.processes} processes, all threads): {sum(r['cpu'] for r in results) * 1000 / total:.2f} ms"
    )


if __name__ == "__main__":
    main()
