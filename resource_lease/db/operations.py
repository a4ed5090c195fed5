"""The engine's operations on one database alias, by name: ``ops(alias).renew(...)``.

One method per statement (or per short sequence of them), typed, so that no caller outside
``db/`` writes SQL, hands a statement in as a lambda, or reads through the ORM on its own
connection where the engine's is meant (docs/pitfalls.md#own-connection). Each method knows
what a lost connection means for its statement (docs/pitfalls.md#unknown-outcome):

- *repeatable* (reads, renewals, idempotent writes): run once more on a new connection
  (``connections.run_repeatable``);
- *settled by its token* (grants, claims, outcomes): never run blindly again; the token the
  statement wrote is read back (``find_grant``, ``ITEMS_CLAIMED``, ``ITEMS_COUNT_TOKEN``).

Every statement runs on the engine's own connection of the calling thread, in autocommit
(``db/connections.py``), and is one of the dialect's rendered statements (``dialect.sql``).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from resource_lease.db.answers import Answer
from resource_lease.db.base import Dialect, Row, some_kinds
from resource_lease.db.connections import Disconnected, LockWaitTimeout, lease_connection, run, run_once, run_repeatable
from resource_lease.db.cooldown_operations import CooldownOperations
from resource_lease.db.health_operations import HealthOperations
from resource_lease.db.item_operations import Claimed, ItemOperations
from resource_lease.db.line import ANY, BY_ID, BY_NAME, NEWCOMER, READ, Ask, Turn
from resource_lease.db.line_operations import LineOperations
from resource_lease.db.session_operations import SessionOperations
from resource_lease.db.term_operations import TermOperations
from resource_lease.exceptions import LeaseDatabaseError, OutcomeUnknown

logger = logging.getLogger("resource_lease")

T = TypeVar("T")


class Operations:
    """The named operations on ``alias`` (see the module's docstring): the leases', topics',
    configs' and counters' here, and those of the other statement sets as parts, each in its
    module: ``items`` the dispenser's (``db/item_operations.py``), ``line`` the line of
    waiters' (``db/line_operations.py``), ``terms`` the leadership log's
    (``db/term_operations.py``), ``health`` shared health's (``db/health_operations.py``),
    ``cooldowns`` targets' cooldowns' (``db/cooldown_operations.py``), ``sessions`` sticky
    sessions' (``db/session_operations.py``)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.items = ItemOperations(alias)
        self.line = LineOperations(alias)
        self.terms = TermOperations(alias)
        self.health = HealthOperations(alias)
        self.cooldowns = CooldownOperations(alias)
        self.sessions = SessionOperations(alias)

    def __repr__(self) -> str:
        return f"<Operations on {self.alias!r}>"

    @property
    def dialect(self) -> Dialect:
        return lease_connection(self.alias).dialect

    # -- grants: settled by their token --------------------------------------------------------

    def grant(self, ask: Ask, turn: Turn = NEWCOMER) -> tuple[Row | None, bool]:
        """Run the ``ask``'s grant statement once, as ``turn``, under a fresh token: (the
        granted row or None, whether its outcome was unknown and was settled by reading the
        token back). A statement rolled back after the bounded lock wait granted nothing."""
        token = secrets.token_hex(16)
        kind = ask.kind
        statement = self._grant_statement(ask, turn)
        try:
            row = run(self.alias, lambda d, c: statement(d, c, token), what=f"granting a resource of kind {kind!r}")
        except LockWaitTimeout as exc:
            # Nothing granted this attempt; the caller's own timeout decides whether to try again.
            logger.info("acquire of %r waited out the lock wait timeout: %s", kind, exc)
            return None, False
        except Disconnected as exc:
            # The connection died with the outcome unknown (maybe during COMMIT): read the
            # grant back by its token, never run the statement blindly again.
            logger.warning("connection lost while granting %r; settling by reading back: %s", kind, exc)
            row = run_repeatable(
                self.alias, lambda d, c: d.leases.find_grant(c, kind=kind, token=token), what="settling a grant"
            )
            return row, True
        return row, False

    def _grant_statement(self, ask: Ask, turn: Turn) -> Callable[[Dialect, Any, str], Row | None]:
        """The ``ask``'s statement as ``(dialect, cursor, token) -> row``: any free row (this
        thread's probes, then the scan: ``db/picking.py``), a chosen row, a named row, or an
        rwlock's read or write grant."""
        if ask.rows == ANY:
            picker = lease_connection(self.alias).picker
            return lambda d, c, token: picker.grant_any(d, c, ask, token=token, turn=turn)
        if ask.rows == BY_ID:
            return lambda d, c, token: d.leases.grant(c, ask, pk=ask.pk, token=token, turn=turn, line=ask.line)
        if ask.rows == BY_NAME:
            return lambda d, c, token: d.leases.grant_named(c, ask, name=ask.name, token=token, turn=turn)
        if ask.rows == READ:
            return lambda d, c, token: d.rw.grant_read(c, ask, name=ask.name, token=token, turn=turn)
        return lambda d, c, token: d.rw.grant_write(c, ask, name=ask.name, token=token, turn=turn)

    # -- a grant of ours ---------------------------------------------------------------------------

    def renew(self, *, pk: int, holder: str, fence: int, ttl: float) -> dt.datetime | None:
        """Extend a live grant of ours (repeatable); the new expiry, or None if not ours."""
        return run_repeatable(
            self.alias,
            lambda d, c: d.leases.renew(c, pk=pk, holder=holder, fence=fence, ttl=ttl),
            what=f"renewing resource {pk}",
        )

    def is_held(self, *, pk: int, holder: str, fence: int) -> bool:
        return run_repeatable(
            self.alias,
            lambda d, c: d.leases.is_held(c, pk=pk, holder=holder, fence=fence),
            what=f"checking resource {pk}",
        )

    def release(self, *, pk: int, holder: str, fence: int) -> bool:
        """Give a grant back: True if it was ours and is free now (or handed to a waiter).
        An answer lost with the connection is settled: run again, and if that finds nothing
        to release, read back whether the first one did (``was_released``)."""
        return self.release_to_line(pk=pk, holder=holder, fence=fence)[0]

    def release_to_line(self, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        """``release``, and the place in line the release handed the row to (PostgreSQL:
        ``LineStatements.hands_off``), 0 if none or not known (a settled answer)."""
        what = f"releasing resource {pk}"

        def release(d: Dialect, c: Any) -> tuple[bool, int]:
            return d.line.release_to_line(c, pk=pk, holder=holder, fence=fence)

        def settle(d: Dialect, c: Any) -> tuple[bool, int]:
            released = release(d, c)
            return released if released[0] else (d.leases.was_released(c, pk=pk, holder=holder, fence=fence), 0)

        try:
            return run(self.alias, release, what=what)
        except Disconnected:
            return run_repeatable(self.alias, settle, what=what)

    def write_data(self, *, pk: int, holder: str, fence: int, data: str) -> bool:
        """A fenced write of a live grant's payload (JSON text): True if written, False if the
        grant is not ours (nothing written). An answer lost with the connection is asked again
        (the same write, harmless while the grant is ours); if the grant is no longer ours by
        then, the first one may have been written before it ended: ``OutcomeUnknown``, never
        "nothing written" (a leader's state saved while its successor was elected, through a
        failover: docs/pitfalls.md#unknown-outcome)."""
        what = f"writing resource {pk}'s data"

        def write(d: Dialect, c: Any) -> bool:
            return bool(d.leases.write_data(c, pk=pk, holder=holder, fence=fence, data=data))

        try:
            return run(self.alias, write, what=what)
        except Disconnected as lost:
            try:
                if run_repeatable(self.alias, write, what=what):
                    return True
                why = "when asked again the grant was no longer ours"
            except LeaseDatabaseError as failed:  # not "nothing written": the first may have been
                why = f"it could not be asked again ({failed})"
            raise OutcomeUnknown(
                f"{what}: the connection to {self.alias!r} was lost during the fenced write, and {why}:"
                f" the first write may or may not have been applied: {lost}"
            ) from lost.cause

    # -- rows by kind and name -----------------------------------------------------------------------

    def kind_exists(self, kind: str) -> bool:
        return run_repeatable(self.alias, lambda d, c: d.leases.kind_exists(c, kind), what=f"looking up kind {kind!r}")

    def some_kinds(self, limit: int = 5) -> list[str]:
        """Up to ``limit`` of the pools' kinds, sorted (coordination rows left out)."""
        return run_repeatable(self.alias, lambda d, c: some_kinds(d, c, limit=limit), what="listing the kinds")

    def insert_missing(self, kind: str, names: Sequence[str], *, data: str = "{}") -> None:
        run_repeatable(
            self.alias,
            lambda d, c: d.leases.insert_missing(c, kind=kind, names=names, data=data),
            what=f"creating {kind} rows",
        )

    def read_named(self, kind: str, names: Sequence[str] | None = None) -> tuple[list[Any], dt.datetime | None]:
        """The rows of ``kind`` (only ``names`` if given) as Resources, and the database's
        clock of that read."""

        def read(d: Dialect, c: Any) -> tuple[list[Any], dt.datetime | None]:
            rows, now = d.leases.read_named(c, kind=kind, names=names)
            return [d.to_resource(row) for row in rows], None if now is None else d.to_datetime(now)

        return run_repeatable(self.alias, read, what=f"reading {kind}")

    def limit_slots(self, kind: str, *, below: str) -> int:
        return run_repeatable(
            self.alias,
            lambda d, c: d.leases.limit_slots(c, kind=kind, below=below),
            what=f"setting the slots of {kind}",
        )

    # -- notifications and configuration: statements of db/topics.py ---------------------------------

    def notify(self, topic: str, payload: str, channel: str) -> int:
        """Create or bump ``topic`` with ``payload`` (JSON text); its new version. Repeated
        after a lost answer (the version may then move by two; a watcher sees the latest)."""
        params = {"name": topic, "payload": payload, "channel": channel}
        return run_repeatable(
            self.alias, lambda d, c: d.run_bump(c, d.sql["TOPIC_NOTIFY"], params), what=f"notify({topic!r})"
        )

    def read_topic(self, topic: str) -> tuple[int, str | None] | None:
        """``(version, payload JSON text)`` of ``topic``, None if it was never notified."""

        def read(d: Dialect, c: Any) -> tuple[int, str | None] | None:
            row = d.execute(c, "TOPIC_READ", {"name": topic}, answer=Answer.FIRST)
            return None if row is None else (int(row[0]), row[1])

        return run_repeatable(self.alias, read, what=f"read topic {topic!r}")

    def declare_config(self, namespace: str, keys: Sequence[tuple[str, str, str]]) -> dict[str, str]:
        """Record each key's ``(key, type name, default JSON text)`` (its value stays; a key
        declared before keeps its type); the declared types read back, ``{key: type name}``."""

        def declare(d: Dialect, c: Any) -> dict[str, str]:
            for key, type_name, default in keys:
                params = {"namespace": namespace, "key": key, "type": type_name, "default": default}
                d.execute(c, "CONFIG_DECLARE", params)
            return _types(d, c, namespace)

        return run_repeatable(self.alias, declare, what=f"Config({namespace!r}) declaring its keys")

    def config_types(self, namespace: str) -> dict[str, str]:
        """``{key: type name}`` of every declared key of ``namespace``."""
        return run_repeatable(
            self.alias, lambda d, c: _types(d, c, namespace), what=f"Config({namespace!r}) reading its types"
        )

    def retype_config(self, namespace: str, key: str, *, type_name: str, default: str) -> bool:
        """Change a declared key's type and default; False if the key was never declared."""
        params = {"namespace": namespace, "key": key, "type": type_name, "default": default}

        def retype(d: Dialect, c: Any) -> bool:
            return bool(d.execute(c, "CONFIG_RETYPE", params, answer=Answer.COUNT))

        return run_repeatable(self.alias, retype, what=f"Config.retype({namespace!r}, {key!r})")

    def set_config(
        self, namespace: str, key: str, *, type_name: str, default: str, value: str | None, channel: str
    ) -> int:
        """Store ``value`` (JSON text; None: back to the default) and raise the key's
        version; the new version."""
        params = {
            "namespace": namespace,
            "key": key,
            "type": type_name,
            "default": default,
            "value": value,
            "channel": channel,
        }
        return run_repeatable(
            self.alias,
            lambda d, c: d.run_bump(c, d.sql["CONFIG_SET"], params),
            what=f"storing config {namespace!r}:{key!r}",
        )

    def compare_and_set_config(
        self, namespace: str, key: str, *, version: int, value: str | None, channel: str
    ) -> bool:
        """Store ``value`` (JSON text; None: back to the default) only if the key's version is
        still ``version``; whether it was (the version is then one more). Never repeated: a
        lost answer raises ``OutcomeUnknown`` (a second run would be refused by the first's
        success)."""
        params = {"namespace": namespace, "key": key, "version": version, "value": value, "channel": channel}
        what = f"Config({namespace!r}).compare_and_set({key!r})"
        return run_once(self.alias, lambda d, c: d.run_conditional(c, d.sql["CONFIG_CAS"], params), what=what)

    def read_config(self, namespace: str) -> list[tuple[str, str | None, int]]:
        """``(key, value JSON text or None, version)`` of every stored key of ``namespace``."""

        def read(d: Dialect, c: Any) -> list[tuple[str, str | None, int]]:
            rows = d.execute(c, "CONFIG_READ", {"namespace": namespace}, answer=Answer.ROWS)
            return [(str(k), v, int(n)) for k, v, n in rows]

        return run_repeatable(self.alias, read, what=f"Config({namespace!r}) reading")

    # -- counters: statements of db/counters.py ---------------------------------------------------

    def add_counter(self, name: str, n: int) -> int | None:
        """Add ``n`` to counter ``name`` (created at 0 first); the new value, or None if it
        would leave BIGINT (nothing changed). Never repeated: a lost answer raises
        ``OutcomeUnknown``."""
        params = {"name": name, "n": n}
        return run_once(
            self.alias, lambda d, c: d.run_add(c, d.sql["COUNTER_ADD"], params), what=f"counter({name!r}).add({n})"
        )

    def read_counter(self, name: str) -> int:
        """The value of counter ``name`` (0 if it was never added to)."""

        def read(d: Dialect, c: Any) -> int:
            value = d.execute(c, "COUNTER_READ", {"name": name}, answer=Answer.VALUE)
            return 0 if value is None else int(value)

        return run_repeatable(self.alias, read, what=f"counter({name!r}).value()")


def _types(d: Dialect, c: Any, namespace: str) -> dict[str, str]:
    rows = d.execute(c, "CONFIG_TYPES", {"namespace": namespace}, answer=Answer.ROWS)
    return {str(k): str(t) for k, t in rows}


_ops: dict[str, Operations] = {}


def ops(alias: str) -> Operations:
    """The named operations on ``alias`` (one object per alias; it holds no connection)."""
    found = _ops.get(alias)
    if found is None:
        found = _ops[alias] = Operations(alias)
    return found


__all__ = ["Claimed", "Operations", "ops"]
