"""Rows created on demand and leased like a resource: what locks, semaphores, elections,
groups and barriers stand on.

Each of them is one or more rows of the lease table whose kind carries a reserved prefix
(``@lock``, ``@semaphore:<name>``, ``@election``, ``@group:<name>``, ...), so pools never
see them and ``acquire()`` refuses such kinds. A row is created the first time its name is
used, race-safely (``INSERT ... ON CONFLICT DO NOTHING`` or its MySQL form: two processes
using a new name at once create one row, and neither sees an IntegrityError), and from then
on it is granted, renewed, released and fenced by exactly the statements that lease a
resource: one conditional UPDATE decides, judged by the database's clock, and the fence goes
up by one on every grant.

``KeptRow`` is such a row held for as long as a recipe wants it: renewed by the keeper and
taken again after every loss, with the recipe told (``on_gained``, ``on_lost``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from resource_lease.backoff import Backoff
from resource_lease.db import json_text
from resource_lease.db.line import BY_NAME, Ask
from resource_lease.db.operations import ops
from resource_lease.exceptions import LeaseError, LeaseLost
from resource_lease.forking import at_fork
from resource_lease.keeper import keeper
from resource_lease.lease import Lease, OnLost, granted, making
from resource_lease.line.granting import Grantor, Make, newcomer
from resource_lease.models import COORDINATION_PREFIX, Resource

logger = logging.getLogger("resource_lease")


def row_kind(family: str, name: str | None = None) -> str:
    """The kind of a coordination row: ``@lock`` for a family of single rows keyed by name,
    ``@group:<name>`` for a family whose rows (members, slots) belong to one name."""
    return f"{COORDINATION_PREFIX}{family}" if name is None else f"{COORDINATION_PREFIX}{family}:{name}"


# (alias, kind, name) of rows this process has created or seen: a hint that saves the insert
# on every grant, never trusted for a decision (a row an operator deleted is made again).
_known: set[tuple[str, str, str]] = set()
_known_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # Another thread of the parent's may have held it at the fork: it would never be released.
    global _known_lock
    _known_lock = threading.Lock()


at_fork(after_in_child=_after_fork_in_child)


def ensure(alias: str, kind: str, names: Iterable[str], *, data: dict[str, Any] | None = None) -> None:
    """Create the rows ``(kind, name)`` that do not exist yet (free, fence 0)."""
    with _known_lock:
        missing = sorted({n for n in names if (alias, kind, n) not in _known})
    if not missing:
        return
    ops(alias).insert_missing(kind, missing, data=json_text.dumps(data or {}))
    with _known_lock:
        _known.update((alias, kind, n) for n in missing)


def forget(alias: str, kind: str, name: str) -> None:
    """Stop assuming the row exists (it was found missing: an operator deleted it)."""
    with _known_lock:
        _known.discard((alias, kind, name))


def try_grant(
    alias: str,
    kind: str,
    name: str,
    *,
    holder: str,
    ttl: float,
    on_lost: OnLost | None = None,
    lock_delay: float = 0.0,
    grant: Grantor[Lease] | None = None,
) -> Lease | None:
    """One attempt at granting the row ``(kind, name)``, created first if need be; the
    Lease, or None if the row is held by someone else (or disabled, or a waiter in the row's
    line is ahead: ``resource_lease.line``). ``grant``: a wait's, which grants as its turn in
    line and makes its own lease (default: as a newcomer, a ``Lease`` with ``on_lost``).

    A miss on a row that no longer exists (an operator deleted it, a test flushed the
    table) is not taken for "held": the row is made again and granted at once.
    """
    ask = Ask(kind, holder, ttl, rows=BY_NAME, name=name, lock_delay=lock_delay)
    if grant is None:
        grant = newcomer(alias, making(alias=alias, on_lost=on_lost))
    ensure(alias, kind, [name])
    lease = grant(ask)
    if lease is None and name not in read(alias, kind, [name]).rows:
        forget(alias, kind, name)
        ensure(alias, kind, [name])
        lease = grant(ask)
    return lease


@dataclass(frozen=True)
class Snapshot:
    """Rows of one kind as read in one statement, with the database's clock of that read."""

    rows: dict[str, Resource]
    now: dt.datetime

    def is_live(self, row: Resource) -> bool:
        """Granted and not given back, and unexpired at ``now`` (the database's clock)."""
        return bool(row.grant_token) and row.busy_before > self.now

    def delayed_until(self, row: Resource) -> dt.datetime | None:
        """When the lock delay of ``row`` ends, while it runs at ``now``: its grant expired
        without being given back less than its ``lock_delay`` ago; None otherwise."""
        if not row.grant_token or not row.lock_delay or row.busy_before > self.now:
            return None
        until = row.busy_before + dt.timedelta(seconds=row.lock_delay)
        return until if until > self.now else None

    def live(self, name: str) -> Resource | None:
        row = self.rows.get(name)
        return row if row is not None and self.is_live(row) else None

    def live_names(self) -> list[str]:
        """Names of the live rows, in Python's sorted() order (the same for every reader)."""
        return sorted(name for name, row in self.rows.items() if self.is_live(row))


def read(alias: str, kind: str, names: Sequence[str] | None = None) -> Snapshot:
    """The rows of ``kind`` (only ``names`` if given) and the database's clock, on the
    engine's own connection (never a snapshot of the caller's open transaction: see
    docs/pitfalls.md#snapshot-reads)."""
    resources, now = ops(alias).read_named(kind, names)
    assert now is not None  # a read of no names is never asked for
    return Snapshot(rows={r.name: r for r in resources}, now=now)


def write_data(lease: Lease, data: dict[str, Any]) -> bool:
    """Store ``data`` in the leased row's payload if the lease is still ours and live (a
    fenced write: holder, fence and expiry checked by the database in the same statement).
    True if written; False if the lease was lost (nothing written). ``OutcomeUnknown`` if
    the answer was lost with the connection and the lease was gone when asked again (the
    write may have landed before it ended)."""
    written = ops(lease.using).write_data(
        pk=lease.resource.pk, holder=lease.holder, fence=lease.fence, data=json_text.dumps(data)
    )
    if written:
        lease.resource.data = data
    return bool(written)


class KeptRow:
    """The row ``(kind, name)`` held for ``holder``, renewed by the keeper, and taken again
    whenever it is lost, until ``stop()``: what an election's candidate, a group's member and
    a barrier's member stand on. A recipe says what to do when the row is gained and lost:

    - ``on_gained(lease)`` runs after each grant, before anyone is told; returning False
      gives the grant back (a group's fenced write of its data failed: the grant was lost
      at once) and the next attempt comes as usual; raising gives the grant back too, and
      the error goes on to the caller of ``take()``;
    - ``on_lost(lease, reason)`` runs once per lost grant, ordered with the owner's other
      callbacks, off the keeper's thread (``keeper.dispatch``).

    With ``warn_when_taken``, a row found held by another holder after a loss is said once.
    ``take()`` is one attempt, in the caller's thread; ``keep()`` hands the row to the keeper,
    which then tries again after every loss (first waiting ``pause_after_loss`` seconds, so
    that others get their turn), with backoff while the row is held by someone else.
    ``give_back()`` releases the current grant but keeps trying; ``stop()`` ends it all.
    """

    def __init__(
        self,
        using: str,
        kind: str,
        name: str,
        *,
        holder: str,
        ttl: float,
        owner: object,
        on_gained: Callable[[Lease], bool] | None = None,
        on_lost: Callable[[Lease, str], None] | None = None,
        pause_after_loss: float = 0.0,
        warn_when_taken: bool = False,
        what: str = "",
    ) -> None:
        self.using, self.kind, self.name, self.holder, self.ttl = using, kind, name, holder, ttl
        self.owner = owner
        self.what = what or f"{kind} {name!r}"
        self._on_gained = on_gained
        self._on_lost = on_lost
        self._pause = pause_after_loss
        self._lock = threading.RLock()
        self._lease: Lease | None = None
        self._kept = False
        self._backoff = Backoff()
        self._failing = False
        self._resume_at = 0.0  # after a loss, no new attempt before this (monotonic)
        # Say once per loss when another holder has the row (a group member's name taken).
        self._warn_when_taken = warn_when_taken
        self._warned = False

    def __repr__(self) -> str:
        return f"<KeptRow {self.what} holder={self.holder!r}{' held' if self.lease else ''}>"

    @property
    def lease(self) -> Lease | None:
        """The grant as far as this process knows (not released, not known lost), or None."""
        lease = self._lease
        return None if lease is None or lease.released or lease.lost else lease

    def take(self, *, auto_renew: bool = True, grant: Grantor[Lease] | None = None) -> Lease | None:
        """One attempt at the row (no-op while a grant is held); the grant, made this row's
        lease and renewed by the keeper unless ``auto_renew=False``, or None if someone else
        holds it (or waits ahead). ``grant``: a wait's in the row's line (``resource_lease.line``),
        whose lease is made by ``making()``; default: as a newcomer."""
        current = self.lease
        if current is not None:
            return current
        if grant is None:
            grant = newcomer(self.using, self.making(adopt=False))
        lease = try_grant(
            self.using, self.kind, self.name, holder=self.holder, ttl=self.ttl, on_lost=self._lost, grant=grant
        )
        return None if lease is None else self._adopt(lease, auto_renew=auto_renew)

    def making(self, *, adopt: bool = True) -> Make[Lease]:
        """How a lease of this row is made of a grant of it: ``adopt=False`` for a grant
        ``take`` then adopts (``line.Wait.make`` of a wait whose attempt is ``take``); else
        adopted at once, ``on_gained`` told first (``line.Wait.handed``: a row a release
        handed to the wait's place, which no ``take`` sees)."""
        make = making(alias=self.using, on_lost=self._lost)
        if not adopt:
            return make

        def made(ask: Ask, row: Sequence[Any], sent_at: float) -> Lease | None:
            lease = make(ask, row, sent_at)
            return None if lease is None else self._adopt(lease)

        return made

    def _adopt(self, lease: Lease, *, auto_renew: bool = True) -> Lease | None:
        """A grant of the row made this row's lease, ``on_gained`` told first (refused: given
        back, None), renewed by the keeper unless ``auto_renew=False``."""
        lease.callback_owner = self.owner
        if not self._gained(lease):
            lease.release()
            return None
        with self._lock:
            self._lease = lease
        return granted(lease, auto_renew=auto_renew)

    def _gained(self, lease: Lease) -> bool:
        """``on_gained(lease)``. If it raises, the grant is given back before the error goes
        on: an attempt that fails holds nothing (issue 37: a group's join whose data write
        failed left a member in ``members()`` until its ttl)."""
        if self._on_gained is None:
            return True
        try:
            return self._on_gained(lease)
        except BaseException:
            try:
                lease.release()
            except Exception:  # the error of on_gained is the one to raise; the grant expires
                logger.warning("%s: giving back a grant after a failed start failed", self.what, exc_info=True)
            raise

    def keep(self) -> None:
        """From now on, take the row again after every loss (in the keeper's thread)."""
        with self._lock:
            self._kept = True
            self._backoff = Backoff()
        keeper().schedule(self, 0.0, step="keep_step", hold=True)  # until stop(), kept or not

    def give_back(self) -> tuple[Lease | None, bool]:
        """Release the current grant (a kept row is taken again after ``pause_after_loss``):
        the lease (None if there was none), and whether the release found it ours."""
        with self._lock:
            lease, self._lease = self._lease, None
            self._resume_at = time.monotonic() + self._pause
        return lease, lease is not None and lease.release()

    def stop(self) -> tuple[Lease | None, bool]:
        """Stop keeping the row and release it (as ``give_back``)."""
        with self._lock:
            self._kept = False
        keeper().cancel(self)
        return self.give_back()

    def _lost(self, lease: Lease) -> None:
        # The lease's on_lost (dispatched: off the keeper's thread when the keeper noticed).
        with self._lock:
            if self._lease is lease:
                self._lease = None
                self._resume_at = time.monotonic() + self._pause
        if self._on_lost is not None:
            self._on_lost(lease, lease.lost_reason)
        keeper().wake(self)

    def keep_step(self) -> float | None:
        """The keeper's step: trust checks while held, attempts while not."""
        with self._lock:
            if not self._kept:
                return None
            lease = self._lease
        if lease is not None and not lease.released:
            try:
                lease.check()  # past the local deadline (a pause): lost now, loudly
            except LeaseLost:
                return self._pause
            return min(1.0, self.ttl / 4)
        wait = self._resume_at - time.monotonic()
        if wait > 0:
            return wait
        try:
            lease = self.take()
        except LeaseError as exc:
            if not self._failing:
                logger.warning("%s: taking the row again failed, retrying: %s", self.what, exc)
            self._failing = True
            return self._backoff.next()
        self._failing = False
        with self._lock:
            if not self._kept and lease is not None:  # stopped while we were taking it
                self._lease = None
                stale = lease
            else:
                stale = None
        if stale is not None:
            stale.release()
            return None
        if lease is None:
            if self._warn_when_taken and not self._warned:
                row = read(self.using, self.kind, [self.name]).live(self.name)
                if row is not None and row.holder != self.holder:
                    logger.warning("%s is held by %s; waiting to take it again", self.what, row.holder)
                    self._warned = True
            return self._backoff.next()
        self._backoff = Backoff()
        self._warned = False
        return min(1.0, self.ttl / 4)
