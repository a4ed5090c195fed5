"""A lease holder the fault scenarios drive: events out, commands in.

    python -m tests.procs.holder --kind K --ttl T [--auto-renew] [--timeout S]
    python -m tests.procs.holder --lock NAME | --semaphore NAME --slots N --ttl T ...

It acquires one resource (or takes the named lock, or a slot of the semaphore) at start and
reports ``acquired``; then it answers commands on stdin (instrument.py's ``serve``):

- ``renew [ttl]``, ``is_held``, ``check``, ``release``: the Lease methods;
- ``fenced_write NOTE``: ``with lease.fenced():`` write NOTE into the resource's data;
- ``fenced_pause SECONDS NOTE``: the same, sleeping inside the transaction first (reports
  ``in_fenced`` when the fence has been checked and the row is locked);
- ``after_check SECONDS COMMAND ...``: run COMMAND, pausing SECONDS right after the lease's
  local check passed (reports ``checked``): the window in which a process paused there
  must be refused by the database itself;
- ``acquire [timeout]``: acquire again (after a loss or a release); ``state``: lost flag, reason, renewal thread;
- ``flush_audit``: store the audit events still queued (``resource_lease.audit.flush()``);
- ``pool_state``: the leased row's state and time left (``pool.with_state``, on the user's
  connection); ``line_stats``: what its waiting did (``resource_lease.line.stats``) and the
  places its keeper has yet to leave; ``clocks``: this process's wall clock, the database's, the user connection's
  session time zone offset, and the ids the database system checks report; ``exit``.

``on_lost`` reports ``lost``; instrument.py reports sessions and renewals.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from tests.procs.instrument import emit, error_text, serve, setup


class Holder:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lease: Any = None

    def on_lost(self, lease: Any) -> None:
        emit("lost", pk=lease.resource.pk, fence=lease.fence, reason=lease.lost_reason, deadline=lease._deadline)

    def acquire(self, timeout: float | None = None) -> dict[str, Any]:
        from resource_lease import acquire
        from resource_lease.pool import database_now

        sent = time.monotonic()
        options: dict[str, Any] = {
            "ttl": self.args.ttl,
            "timeout": self.args.timeout if timeout is None else timeout,
            "auto_renew": self.args.auto_renew,
            "on_lost": self.on_lost,
        }
        if self.args.lock:
            from resource_lease import lock

            lease = lock(self.args.lock, **options)
        elif self.args.semaphore:
            from resource_lease import semaphore

            lease = semaphore(self.args.semaphore, self.args.slots, **options)
        else:
            lease = acquire(self.args.kind, **options)
        received = time.monotonic()
        self.lease = lease
        row = lease.resource
        fields = {
            "pk": row.pk,
            "fence": lease.fence,
            "holder": lease.holder,
            "expires_at": lease.expires_at,
            "ttl_by_db": (lease.expires_at - database_now(lease.using)).total_seconds(),
            "took_over": row.took_over,
            "previous_holder": row.previous_holder,
            "t_sent": sent,
            "deadline": lease._deadline,
        }
        emit("acquired", **fields, t_recv=received)
        return fields

    def fenced_write(self, note: str, pause: float = 0.0) -> dict[str, Any]:
        from resource_lease.models import Resource

        lease = self.lease
        with lease.fenced():
            emit("in_fenced", pk=lease.resource.pk, fence=lease.fence)
            if pause:
                time.sleep(pause)
            Resource.objects.filter(pk=lease.resource.pk).update(data={"fence": lease.fence, "note": note})
        return {"fence": lease.fence, "note": note}

    def after_check(self, pause: float, command: str, args: list[str]) -> Any:
        lease = self.lease
        original = type(lease).check
        checked = threading.Event()

        def check() -> None:
            original(lease)
            if threading.current_thread() is threading.main_thread() and not checked.is_set():
                checked.set()
                emit("checked", pk=lease.resource.pk, fence=lease.fence)
                time.sleep(pause)

        lease.check = check
        try:
            return self.run(command, args)
        except Exception as exc:  # noqa: BLE001  (every error is reported, as data)
            # Raised after the local check had passed: the database refused.
            emit("after_check", checked=checked.is_set(), error=error_text(exc))
            raise
        finally:
            del lease.check

    def clocks(self) -> dict[str, Any]:
        import datetime as dt

        from django.core import checks
        from django.db import connection

        from resource_lease.pool import database_now

        offset = None
        if connection.vendor == "mysql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())")
                (offset,) = cursor.fetchone()
        found = checks.run_checks(databases=["default"], tags=[checks.Tags.database])
        return {
            "wall": dt.datetime.now(dt.UTC),
            "db_now": database_now(),
            "user_session_offset": offset,
            "checks": sorted(message.id or "" for message in found),
        }

    def run(self, command: str, args: list[str]) -> Any:
        lease = self.lease
        if command == "after_check":
            return self.after_check(float(args[0]), args[1], args[2:])
        if command == "renew":
            expiry = lease.renew(float(args[0])) if args else lease.renew()
            return {"expires_at": expiry, "deadline": lease._deadline}
        if command == "is_held":
            return lease.is_held()
        if command == "check":
            lease.check()
            return True
        if command == "flush_audit":
            from resource_lease import audit

            return {"stored": audit.flush()}
        if command == "release":
            sent = time.monotonic()
            return {"released": lease.release(), "t_sent": sent}
        if command == "fenced_write":
            return self.fenced_write(args[0] if args else "")
        if command == "fenced_pause":
            return self.fenced_write(args[1] if len(args) > 1 else "", pause=float(args[0]))
        if command == "acquire":
            return self.acquire(float(args[0]) if args else None)
        if command == "state":
            from resource_lease.renewal import renewer

            thread = renewer().thread
            return {
                "lost": lease.lost,
                "reason": lease.lost_reason,
                "renewer_alive": thread is not None and thread.is_alive(),
                "threads": sorted(t.name for t in threading.enumerate()),
            }
        if command == "pool_state":
            from resource_lease.models import Resource
            from resource_lease.pool import with_state

            row = with_state(Resource.objects.filter(pk=lease.resource.pk)).get()
            left = row.time_left.total_seconds() if row.time_left is not None else None
            return {"state": row.state, "time_left": left}
        if command == "clocks":
            return self.clocks()
        if command == "line_stats":
            from resource_lease.line import leaving, stats

            return stats.as_dict() | {"leaves_pending": leaving.pending()}
        raise ValueError(f"unknown command {command!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="")
    parser.add_argument("--lock", default="", help="hold this named lock instead of a resource of --kind")
    parser.add_argument("--semaphore", default="", help="hold a slot of this semaphore (of --slots slots)")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--auto-renew", action="store_true")
    args = parser.parse_args()
    setup()
    emit("ready")
    holder = Holder(args)
    try:
        holder.acquire()
    except Exception as exc:  # noqa: BLE001  (every error is reported, as data)
        emit("acquire_failed", error=error_text(exc))
        sys.exit(2)
    serve(holder.run)


if __name__ == "__main__":
    main()
