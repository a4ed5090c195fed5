"""The audit trail: lease events stored as ``LeaseEvent`` rows without slowing the lease path.

With ``RESOURCE_LEASE["AUDIT"]`` on, receivers of the engine's signals (grant, release,
loss) and of the pool operations (quarantine, restore, force release) append a small record
to an in-memory queue: no I/O in the thread that leases. A daemon thread writes the queue in
batches every ``AUDIT_FLUSH_INTERVAL`` seconds (sooner when a batch fills up) on its own
connection, which it closes after every round so it holds none while idle. What is still
queued is written when the process exits normally (``atexit``) and by ``flush()``.

What this costs and what it may lose:

- a process killed with SIGKILL (or ``os._exit``) loses the events of its last
  ``AUDIT_FLUSH_INTERVAL`` seconds;
- if the database refuses the writes, events wait in memory (up to ``AUDIT_MAX_BUFFERED``,
  then new ones are dropped) and the failure and every drop are logged, never silent;
- an event's ``at`` is on the database's clock, like everything else about a lease: the event
  is stamped with the process's monotonic clock when it happens, and the writer maps that to
  the database's clock read just before the batch is stored (``database_now()``), so a
  client whose wall clock is hours off still writes true times; the error is the latency of
  that one read (docs/pitfalls.md#database-clock).
"""

from __future__ import annotations

import atexit
import contextvars
import datetime as dt
import getpass
import logging
import os
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

from resource_lease import signals
from resource_lease.bulk import insert_many
from resource_lease.conf import lease_settings
from resource_lease.display import format_duration
from resource_lease.forking import at_fork, fork_gate
from resource_lease.models import LeaseEvent, Resource

logger = logging.getLogger("resource_lease.audit")

#: Rows per INSERT, and the queue length that wakes the writer before its interval is up.
BATCH_SIZE = 500

_actor: contextvars.ContextVar[str] = contextvars.ContextVar("resource_lease_audit_actor", default="")

# (database alias, LeaseEvent field values; "at" as time.monotonic() until stored)
Pending = tuple[str, dict[str, Any]]


def code_actor() -> str:
    """The actor of an operator's action called from code outside ``acting_as`` (a script, a
    shell, a job calling ``pool.quarantine``): ``"code: <user>@<host>:<pid>"``, so the trail's
    BY column says which process did it rather than ``-``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        user = f"uid {os.getuid()}"
    return f"code: {user}@{socket.gethostname()}:{os.getpid()}"[:150]


@contextmanager
def acting_as(actor: str) -> Iterator[None]:
    """Record ``actor`` (e.g. ``"admin:alice"``) on the events of pool operations run inside."""
    token = _actor.set(str(actor)[:150])
    try:
        yield
    finally:
        _actor.reset(token)


class AuditWriter:
    """The queue of events not yet stored, and the daemon thread that stores them."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        # Also run in a forked child: it must not write (nor wait for) its parent's events
        # (docs/pitfalls.md#fork).
        self._pending: deque[Pending] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._start_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._dropped = 0
        self._failures = 0

    # -- the lease path: quick, no I/O ----------------------------------------------

    def record(self, using: str, **fields: Any) -> None:
        """Queue one event (LeaseEvent field values but ``at``) for the writer thread; it is
        stamped now, and stored with this moment on the database's clock."""
        if len(self._pending) >= int(lease_settings.AUDIT_MAX_BUFFERED):
            self._dropped += 1  # reported (approximately, no lock on this path) by the writer
            return
        fields["at"] = time.monotonic()
        self._pending.append((using, fields))
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._start()
        elif len(self._pending) >= BATCH_SIZE:
            self._wake.set()

    def pending(self) -> int:
        """How many events wait to be stored."""
        return len(self._pending)

    # -- the writer thread --------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._stopping.is_set() or (self._thread is not None and self._thread.is_alive()):
                return
            self._thread = threading.Thread(target=self._run, name="resource_lease-audit", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wake.wait(float(lease_settings.AUDIT_FLUSH_INTERVAL))
                self._wake.clear()
                self._write(close=True)
        except Exception:  # never a writer that dies quietly
            logger.exception("the audit trail's writer thread stopped on an unexpected error")
            raise
        finally:
            with fork_gate.inside():
                connections.close_all()  # this thread's own connections only

    def _write(self, *, close: bool) -> int:
        """Store everything queued, batch by batch; a refused batch goes back to the queue."""
        written = 0
        # Inside the fork gate: a fork waits for the round (docs/pitfalls.md#fork).
        with fork_gate.inside(), self._write_lock:
            try:
                while self._pending:
                    batch: list[Pending] = []
                    while self._pending and len(batch) < BATCH_SIZE:
                        batch.append(self._pending.popleft())
                    refused = self._store(batch)
                    written += len(batch) - len(refused)
                    if refused:
                        self._pending.extendleft(reversed(refused))
                        break
                else:
                    if self._failures:
                        logger.info("audit trail: storing events works again after %d failed rounds", self._failures)
                        self._failures = 0
            finally:
                if close:
                    # Hold no connection while idle (nor across a server's wait_timeout:
                    # docs/pitfalls.md#dropped-connections).
                    connections.close_all()
            if self._dropped:
                dropped, self._dropped = self._dropped, 0
                logger.error(
                    "audit trail: dropped %d events: more than AUDIT_MAX_BUFFERED (%s) were waiting to be stored",
                    dropped,
                    lease_settings.AUDIT_MAX_BUFFERED,
                )
        return written

    def _store(self, batch: list[Pending]) -> list[Pending]:
        by_alias: dict[str, list[Pending]] = defaultdict(list)
        for item in batch:
            by_alias[item[0]].append(item)
        refused: list[Pending] = []
        for alias, items in by_alias.items():
            try:
                insert_many(LeaseEvent, _on_database_clock(items, alias), using=alias)
            except Exception:  # the database's error is logged; the events are kept for the next round
                self._failures += 1
                if self._failures == 1:
                    logger.exception("audit trail: storing %d events on %r failed; will retry", len(items), alias)
                else:
                    logger.warning("audit trail: storing events on %r failed again (%d rounds)", alias, self._failures)
                refused.extend(items)
                try:  # the next round starts on a fresh connection
                    connections[alias].close()
                except Exception:  # a broken connection, or no such alias: nothing to close
                    logger.debug("closing the audit connection to %r failed", alias, exc_info=True)
        return refused

    # -- on demand and at exit ------------------------------------------------------------

    def flush(self) -> int:
        """Store every queued event now, in the calling thread (on its Django connection).

        Waits for a batch the writer thread may be storing, so events queued before the call
        are in the database when it returns, unless the database refused them (then they stay
        queued and the failure is logged). Returns how many events this call stored.
        """
        return self._write(close=False)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the writer thread after a last round, then store what is left (run at exit)."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join(timeout)
        if self._pending:
            self._write(close=True)


def _on_database_clock(items: list[Pending], alias: str) -> list[dict[str, Any]]:
    """The events' field values with ``at`` moved from this process's monotonic clock to the
    database's (one clock read per batch; the queued events keep their monotonic stamps, so a
    batch that is refused and stored later still gets its true times)."""
    from resource_lease.pool import database_now

    now = database_now(alias)
    mono_now = time.monotonic()
    return [{**fields, "at": now - dt.timedelta(seconds=mono_now - fields["at"])} for _, fields in items]


writer = AuditWriter()


def _at_exit() -> None:
    writer.shutdown()


def _after_fork_in_child() -> None:
    writer._reset()


atexit.register(_at_exit)
at_fork(after_in_child=_after_fork_in_child)


def flush() -> int:
    """Store the queued audit events now (see ``AuditWriter.flush``)."""
    return writer.flush()


# -- receivers ------------------------------------------------------------------------------


def _on_granted(sender: Any, lease: Any, **kwargs: Any) -> None:
    if not lease_settings.AUDIT:
        return
    resource = lease.resource
    took_over = bool(resource.took_over)
    writer.record(
        lease.using,
        event=LeaseEvent.TAKEN_OVER if took_over else LeaseEvent.GRANTED,
        kind=lease.kind,
        name=resource.name,
        resource_id=resource.pk,
        holder=lease.holder,
        fence=lease.fence,
        previous_holder=resource.previous_holder if took_over else "",
        expires_at=lease.expires_at,
        waited=lease.waited,
    )


def _on_released(sender: Any, lease: Any, released: bool, **kwargs: Any) -> None:
    if not lease_settings.AUDIT:
        return
    writer.record(
        lease.using,
        event=LeaseEvent.RELEASED if released else LeaseEvent.RELEASE_REFUSED,
        kind=lease.kind,
        name=lease.resource.name,
        resource_id=lease.resource.pk,
        holder=lease.holder,
        fence=lease.fence,
        detail="" if released else "the lease had expired or been taken by another holder",
    )


def _on_lost(sender: Any, lease: Any, reason: str, **kwargs: Any) -> None:
    if not lease_settings.AUDIT:
        return
    writer.record(
        lease.using,
        event=LeaseEvent.LOST,
        kind=lease.kind,
        name=lease.resource.name,
        resource_id=lease.resource.pk,
        holder=lease.holder,
        fence=lease.fence,
        detail=str(reason)[:500],
    )


def _on_not_granted(
    sender: Any, kind: str, outcome: str, seconds: float, using: str, holder: str = "", **kwargs: Any
) -> None:
    if not lease_settings.AUDIT or outcome != "timeout":
        return  # an error is the caller's exception (and the log's), not a lease event
    writer.record(using, event=LeaseEvent.TIMED_OUT, kind=kind, name="", holder=holder[:255], waited=seconds)


def _record_operation(event: str, resources: list[Resource], using: str, detail: str = "") -> None:
    if not lease_settings.AUDIT:
        return
    actor = _actor.get() or code_actor()
    cut_off = event == LeaseEvent.FORCE_RELEASED
    for resource in resources:
        writer.record(
            using,
            event=event,
            kind=resource.kind,
            name=resource.name,
            resource_id=resource.pk,
            # A force release names the holder it cut off; for a quarantine or a restore the
            # row's last holder (often long gone) is no part of it: the actor did it.
            holder=resource.holder if cut_off else "",
            fence=resource.fence,
            actor=actor,
            detail=detail[:500],
        )


def _on_quarantined(
    sender: Any,
    resources: list[Resource],
    using: str,
    reason: str,
    seconds: float | None = None,
    until: dt.datetime | None = None,
    **kwargs: Any,
) -> None:
    length = f"for {format_duration(seconds)}" if seconds is not None else f"until {until:%Y-%m-%d %H:%M:%S %Z}"
    _record_operation(LeaseEvent.QUARANTINED, resources, using, f"{length}: {reason}" if reason else length)


def _on_restored(sender: Any, resources: list[Resource], using: str, **kwargs: Any) -> None:
    _record_operation(LeaseEvent.RESTORED, resources, using)


def _on_force_released(sender: Any, resources: list[Resource], using: str, **kwargs: Any) -> None:
    _record_operation(LeaseEvent.FORCE_RELEASED, resources, using)


def connect_receivers() -> None:
    """Connect the audit trail to the engine's signals (done by the app's ``ready()``)."""
    for signal, receiver in (
        (signals.lease_granted, _on_granted),
        (signals.lease_released, _on_released),
        (signals.lease_lost, _on_lost),
        (signals.lease_not_granted, _on_not_granted),
        (signals.resources_quarantined, _on_quarantined),
        (signals.resources_restored, _on_restored),
        (signals.resources_force_released, _on_force_released),
    ):
        signal.connect(receiver, sender=Resource, dispatch_uid=f"resource_lease.audit.{receiver.__name__}")
