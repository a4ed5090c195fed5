"""What one line NOTIFY costs each process that listens (PostgreSQL), docs/benchmarks.md.

Every process with a waiter on *any* line LISTENs on the line channel
(``resource_lease.wakeups``): a NOTIFY there wakes the LISTEN thread of every such process,
whether or not its waiters can use the row. Until 2026-11-26 every release of a marked row
sent one; since, a release tells its turn to the waiters it may serve, on their own
processes' channels (``db/postgresql.py``: ``TELL_TURNS``), and the line channel carries the
rare rest (readers of an rwlock, places without a channel). This measures what such a
NOTIFY costs, and so what the narrower one saves per listening process and release: P
listener processes, each with one waiter far back in a
line (woken, it counts the wake-up and sleeps again, as ``line.Waiting`` does) or a waiter of
another kind (its LISTEN thread alone works), while this process sends N notifications. The
figure is the listeners' CPU time (user + system, ``getrusage``) per notification and
listener: CPU time, not wall time, so a busy machine blurs it less.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/rl_bench python -m project.bench.notify_herd [N] [P]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time

#: The kind the notifications name (waiters of it are woken by each) and one they do not.
WOKEN, UNTOUCHED = "herd-proxy", "herd-other"


def listener(kind: str) -> None:
    """One listening process: a far-back waiter of ``kind``; its CPU between GO and DONE."""
    import django

    django.setup()
    from resource_lease.line.wakeups import Waker, board, listen, pushed

    waker = Waker()
    board().add(("default", kind, ""), waker)
    listen("default")
    while not pushed("default"):
        time.sleep(0.01)
    stop = threading.Event()
    woken = [0]

    def wait() -> None:
        while not stop.is_set():
            woken[0] += waker.wait(0.5)

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    sys.stdin.readline()  # GO
    before, seen = resource.getrusage(resource.RUSAGE_SELF), woken[0]
    # DONE <n>: every notification sent, n of them for this waiter's kind. The last ones are
    # heard within 0.5 s on a quiet machine; on a loaded one (CI's shards at their peak) the
    # LISTEN thread may take longer, so the count of this kind is waited for (10 s at most).
    expected = int(sys.stdin.readline().split()[1])
    heard_by = time.monotonic() + 10.0
    while woken[0] - seen < expected and time.monotonic() < heard_by:
        time.sleep(0.05)
    time.sleep(0.5)  # any more (a wake-up too many would show)
    after = resource.getrusage(resource.RUSAGE_SELF)
    stop.set()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    sys.stdout.write(f"{cpu:.6f} {woken[0] - seen}\n")
    sys.stdout.flush()


def measure(
    kind: str, notifications: int, listeners: int, env: dict[str, str] | None = None
) -> tuple[float, list[int]]:
    """CPU seconds per notification and listener, and the wake-ups each listener counted.
    ``env``: the listeners' environment (they must connect to this process's database: a
    NOTIFY reaches the LISTENs of its own database only)."""
    from django.db import connection

    from resource_lease.db.postgresql import LINE_CHANNEL

    if connection.vendor != "postgresql":
        raise SystemExit("notify_herd: DATABASE_URL must name a PostgreSQL database (only it has NOTIFY)")
    if env is None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "project.bench.notify_herd", "--listener", kind],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(listeners)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdin is not None
            if proc.stdout.readline().strip() != "READY":
                raise SystemExit("notify_herd: a listener did not start")
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        with connection.cursor() as cursor:
            for i in range(notifications):
                payload = json.dumps([WOKEN, f"row-{i % 40}"])
                cursor.execute("SELECT pg_notify(%s, %s)", [LINE_CHANNEL, payload])
        answers = []
        for proc in procs:
            assert proc.stdout is not None and proc.stdin is not None
            proc.stdin.write(f"DONE {notifications if kind == WOKEN else 0}\n")
            proc.stdin.flush()
            cpu, woken = proc.stdout.readline().split()
            answers.append((float(cpu), int(woken)))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return sum(cpu for cpu, _ in answers) / notifications / listeners, [woken for _, woken in answers]


def main(argv: list[str]) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    if argv[:1] == ["--listener"] and len(argv) == 2:
        listener(argv[1])
        return 0
    import django

    django.setup()
    try:
        notifications, listeners = (int(a) for a in (argv + ["2000", "8"][len(argv) :])[:2])
    except ValueError:
        sys.stderr.write(__doc__ or "")
        return 2
    if notifications < 1 or listeners < 1:
        sys.stderr.write("notify_herd: N and P must be at least 1\n")
        return 2
    for kind, what in ((WOKEN, "a waiter of the notified kind"), (UNTOUCHED, "a waiter of another kind")):
        per, woken = measure(kind, notifications, listeners)
        sys.stdout.write(
            f"{listeners} listeners, each with {what}: {per * 1e6:.0f} us of CPU per NOTIFY and listener"
            f" ({notifications} NOTIFYs; wake-ups counted per listener: {min(woken)}-{max(woken)})\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
