"""What every fault worker shares (tests/faults, run as a ``Child`` of tests/faults/harness.py):
events as JSON lines on stdout, commands on stdin (``serve``), and probes and fault switches
on the engine's own connections, set by the test through the environment.

- every new engine session is reported (``session``: its server-side id, isolation level and
  time zone), so a test can end exactly that session from the server side;
- every renewal is reported (``renewed`` with the new local deadline, ``renew_refused``);
- ``FAULTS_WAIT_TIMEOUT=<s>``: the server drops the engine's sessions after that many idle
  seconds (MySQL ``wait_timeout``, PostgreSQL ``idle_session_timeout``), per session only;
- ``FAULTS_ISOLATION=repeatable-read``: the engine's sessions run under REPEATABLE READ
  instead of the READ COMMITTED the engine sets;
- ``FAULTS_NO_SETTLE=1``: a broken engine that does not settle an acquire whose answer was
  lost (a negative control);
- ``FAULTS_HAND_OUT_LATE=1``: a broken engine that hands out a grant (and reports a renewal
  successful) whose answer came back after the lease's local deadline (a negative control);
- ``FAULTS_READ_HANDED=1``: a waiter reads every grant a release handed it
  (``CLAIM_HANDED``), as it does when the release's NOTIFY came late or not at all, instead of
  taking it as the NOTIFY described it (PostgreSQL);
- ``FAULTS_NO_LEAVE_RETRY=1``: a broken engine whose keeper does not leave a place its waiter
  could not (the database was away as it left): the place stays until its ttl (a negative
  control).

Times (``t``, ``deadline``) are the host's monotonic clock, shared by every process.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

_out = threading.Lock()


def emit(ev: str, **fields: Any) -> None:
    line = json.dumps({"ev": ev, "t": time.monotonic(), "pid": os.getpid(), **fields}, default=str)
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def serve(run: Callable[[str, list[str]], Any], *, on_exit: Callable[[], object] = lambda: None) -> NoReturn:
    """Answer the commands on stdin, one per line (``<id> <command> [args]``): each with a
    ``reply`` event carrying ``run(command, args)``'s result, or its error as data. ``exit``
    (``on_exit()`` first) or the end of input ends the process, without waiting for daemon
    threads (a renewal thread) at interpreter shutdown."""
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        ident, command, rest = int(words[0]), words[1], words[2:]
        try:
            if command == "exit":
                on_exit()
                result = None
            else:
                result = run(command, rest)
        except Exception as exc:  # noqa: BLE001  (every error is reported, as data)
            emit("reply", id=ident, cmd=command, ok=False, error=error_text(exc))
            continue
        emit("reply", id=ident, cmd=command, ok=True, result=result)
        if command == "exit":
            break
    sys.stdout.flush()
    os._exit(0)


def setup() -> None:
    """Django set-up for a worker, then the probes."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.faults.settings")
    from tests.procs import setup as django_setup

    django_setup()
    _probe_sessions()
    _probe_renewals()
    if os.environ.get("FAULTS_NO_SETTLE"):
        _never_settle()
    if os.environ.get("FAULTS_READ_HANDED"):
        import resource_lease.line.handoff

        resource_lease.line.handoff.HANDED_UNREAD_MIN = float("inf")
    if os.environ.get("FAULTS_NO_LEAVE_RETRY"):
        import resource_lease.line.leaving

        resource_lease.line.leaving.retry = lambda place: None  # type: ignore[assignment]
    if os.environ.get("FAULTS_HAND_OUT_LATE"):
        import resource_lease.lease

        resource_lease.lease.arrived_dead = lambda lease: False  # type: ignore[assignment]


def _never_settle() -> None:
    """The negative control of the unknown-outcome scenario: an engine that, after losing the
    connection during an acquire, does not read the grant back (finds nothing)."""
    from resource_lease.db.grants import LeaseStatements

    LeaseStatements.find_grant = lambda self, cursor, *, kind, token: None  # type: ignore[method-assign]


def _probe_sessions() -> None:
    from django.db import connections

    from resource_lease.db import dialect_class

    dialect = dialect_class(connections["default"].vendor)
    original = dialect.setup_session
    idle = os.environ.get("FAULTS_WAIT_TIMEOUT")
    repeatable = os.environ.get("FAULTS_ISOLATION") == "repeatable-read"

    def setup_session(self: Any, raw_connection: Any, lock_wait_timeout: float) -> None:
        original(self, raw_connection, lock_wait_timeout)
        cursor = raw_connection.cursor()
        try:
            if self.vendor == "mysql":
                if idle:
                    cursor.execute("SET SESSION wait_timeout = %s", (max(1, round(float(idle))),))
                if repeatable:
                    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("SELECT CONNECTION_ID(), @@session.tx_isolation, @@session.time_zone")
                row = cursor.fetchone()
            elif self.vendor == "postgresql":
                if idle:
                    cursor.execute(
                        "SELECT set_config('idle_session_timeout', %s, false)", (f"{float(idle) * 1000:.0f}ms",)
                    )
                if repeatable:
                    cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute(
                    "SELECT pg_backend_pid(), current_setting('transaction_isolation'), current_setting('TimeZone')"
                )
                row = cursor.fetchone()
            else:
                row = (None, None, None)
        finally:
            cursor.close()
        emit("session", thread=threading.current_thread().name, session=row[0], isolation=row[1], tz=row[2])

    dialect.setup_session = setup_session  # type: ignore[method-assign]


def _probe_renewals() -> None:
    from resource_lease.exceptions import LeaseLost
    from resource_lease.lease import Lease

    original = Lease.renew

    def renew(self: Lease, ttl: float | None = None) -> Any:
        sent = time.monotonic()
        try:
            expiry = original(self, ttl)
        except LeaseLost as exc:
            emit("renew_refused", pk=self.resource.pk, fence=self.fence, error=str(exc), t_sent=sent)
            raise
        except Exception as exc:
            emit("renew_failed", pk=self.resource.pk, fence=self.fence, error=error_text(exc), t_sent=sent)
            raise
        emit(
            "renewed",
            pk=self.resource.pk,
            fence=self.fence,
            expires_at=expiry,
            t_sent=sent,
            deadline=self._deadline,
            thread=threading.current_thread().name,
        )
        return expiry

    Lease.renew = renew  # type: ignore[method-assign]
