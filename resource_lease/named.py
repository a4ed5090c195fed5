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
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from resource_lease.db.connections import lease_connection, run_repeatable
from resource_lease.lease import Lease, OnLost, attempt_grant
from resource_lease.models import COORDINATION_PREFIX, Resource


def row_kind(family: str, name: str | None = None) -> str:
    """The kind of a coordination row: ``@lock`` for a family of single rows keyed by name,
    ``@group:<name>`` for a family whose rows (members, slots) belong to one name."""
    return f"{COORDINATION_PREFIX}{family}" if name is None else f"{COORDINATION_PREFIX}{family}:{name}"


# (alias, kind, name) of rows this process has created or seen: a hint that saves the insert
# on every grant, never trusted for a decision (a row an operator deleted is made again).
_known: set[tuple[str, str, str]] = set()
_known_lock = threading.Lock()


def ensure(alias: str, kind: str, names: Iterable[str], *, data: dict[str, Any] | None = None) -> None:
    """Create the rows ``(kind, name)`` that do not exist yet (free, fence 0)."""
    with _known_lock:
        missing = sorted({n for n in names if (alias, kind, n) not in _known})
    if not missing:
        return
    payload = json.dumps(data or {})
    run_repeatable(
        alias,
        lambda d, c: d.insert_missing(c, kind=kind, names=missing, data=payload),
        what=f"creating {kind} rows",
    )
    with _known_lock:
        _known.update((alias, kind, n) for n in missing)


def forget(alias: str, kind: str, name: str) -> None:
    """Stop assuming the row exists (it was found missing: an operator deleted it)."""
    with _known_lock:
        _known.discard((alias, kind, name))


def try_grant(
    alias: str, kind: str, name: str, *, holder: str, ttl: float, on_lost: OnLost | None = None
) -> Lease | None:
    """One attempt at granting the row ``(kind, name)``, created first if need be; the
    Lease, or None if the row is held by someone else (or disabled).

    A miss on a row that no longer exists (an operator deleted it, a test flushed the
    table) is not taken for "held": the row is made again and granted at once.
    """

    def statement(d: Any, c: Any, token: str) -> Any:
        return d.grant_named(c, kind=kind, name=name, holder=holder, token=token, ttl=ttl)

    ensure(alias, kind, [name])
    lease = attempt_grant(kind, ttl=ttl, holder=holder, alias=alias, on_lost=on_lost, statement=statement)
    if lease is None and name not in read(alias, kind, [name]).rows:
        forget(alias, kind, name)
        ensure(alias, kind, [name])
        lease = attempt_grant(kind, ttl=ttl, holder=holder, alias=alias, on_lost=on_lost, statement=statement)
    return lease


@dataclass(frozen=True)
class Snapshot:
    """Rows of one kind as read in one statement, with the database's clock of that read."""

    rows: dict[str, Resource]
    now: dt.datetime

    def is_live(self, row: Resource) -> bool:
        """Granted and not given back, and unexpired at ``now`` (the database's clock)."""
        return bool(row.grant_token) and row.busy_before > self.now

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
    rows, now = run_repeatable(alias, lambda d, c: d.read_named(c, kind=kind, names=names), what=f"reading {kind}")
    dialect = lease_connection(alias).dialect
    resources = [dialect.to_resource(row) for row in rows]
    return Snapshot(rows={r.name: r for r in resources}, now=dialect.to_datetime(now))


def write_data(lease: Lease, data: dict[str, Any]) -> bool:
    """Store ``data`` in the leased row's payload if the lease is still ours and live (a
    fenced write: holder, fence and expiry checked by the database in the same statement).
    True if written; False if the lease was lost (nothing written)."""
    payload = json.dumps(data)
    pk, holder, fence = lease.resource.pk, lease.holder, lease.fence
    written = run_repeatable(
        lease.using,
        lambda d, c: d.write_data(c, pk=pk, holder=holder, fence=fence, data=payload),
        what=f"writing {lease.resource}'s data",
    )
    if written:
        lease.resource.data = data
    return bool(written)
