"""Fork while holding an auto-renewed lease, and report what each side sees.

    python -m tests.procs.fork --kind K --ttl T --child-exit normal|_exit

The parent acquires with ``auto_renew=True``, waits for one background renewal, then forks.
The child reports ``child``: what ``release()``, ``renew()``, ``is_held()`` and ``check()`` do
on the inherited lease, whether a renewal thread exists, and the session id of a lease it
takes itself; then it exits (``normal``: through interpreter shutdown, which runs
destructors; ``_exit``: without). The parent waits for it, keeps renewing for a few
intervals, and reports ``parent``: its renewals after the fork, and whether any of its
engine sessions had to be opened again (which would mean the child closed them).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from tests.procs.instrument import emit, error_text, setup


def in_child(lease: Any, kind: str) -> dict[str, Any]:
    from resource_lease import acquire
    from resource_lease.renewal import renewer

    report: dict[str, Any] = {}
    try:
        lease.renew()
        report["renew"] = "renewed"
    except Exception as exc:  # noqa: BLE001  (the outcome is the report)
        report["renew"] = error_text(exc)
    try:
        lease.check()
        report["check"] = "trusted"
    except Exception as exc:  # noqa: BLE001
        report["check"] = error_text(exc)
    report["is_held"] = lease.is_held()
    report["release"] = lease.release()
    report["renewer"] = renewer().thread is not None
    report["threads"] = sorted(t.name for t in threading.enumerate())
    own = acquire(kind, ttl=5)
    report["own_fence"] = own.fence
    report["own_pk"] = own.resource.pk
    report["own_released"] = own.release()
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--child-exit", choices=["normal", "_exit"], required=True)
    args = parser.parse_args()
    setup()
    from django.db import connection

    from resource_lease import acquire

    connection.ensure_connection()  # the user's own connection is inherited too
    lease = acquire(args.kind, ttl=args.ttl, auto_renew=True)
    emit("acquired", pk=lease.resource.pk, fence=lease.fence, holder=lease.holder)
    interval = args.ttl / 3
    time.sleep(interval * 1.5)  # at least one background renewal, so the renewer has a session

    forked_at = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            emit("child", **in_child(lease, args.kind))
        except Exception as exc:  # noqa: BLE001
            emit("child", error=error_text(exc))
        sys.stdout.flush()
        if args.child_exit == "_exit":
            os._exit(0)
        sys.exit(0)

    _, status = os.waitpid(pid, 0)
    child_done = time.monotonic()
    time.sleep(interval * 3)  # renewals after the child is gone
    renewed = lease.renew()
    # The user's own Django connection is not the engine's to protect: a child that exits
    # through interpreter shutdown may close it (Django's advice: close connections before
    # forking). Reported, not judged.
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchall()
        user_connection = "ok"
    except Exception as exc:  # noqa: BLE001
        user_connection = error_text(exc)
    emit(
        "parent",
        child_status=status,
        forked_at=forked_at,
        child_done=child_done,
        renewed=renewed,
        is_held=lease.is_held(),
        lost=lease.lost,
        released=lease.release(),
        user_connection=user_connection,
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
