"""Sticky sessions' named operations (``db/sessions.py``'s statements), a part of
``db.operations.Operations``: ``ops(using).sessions.read_binding(...)``, ``.bind(...)``. Both are
repeatable: a read, and an upsert that writes the same binding again."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from resource_lease.db.answers import Answer
from resource_lease.db.base import Dialect
from resource_lease.db.connections import run_repeatable


@dataclass(frozen=True)
class Binding:
    """A live binding as read (``resource`` 0: its resource was deleted), with its resource's
    state and the database's clock when read."""

    resource: int
    name: str
    enabled: bool
    quarantined_until: dt.datetime | None
    data: Any
    now: dt.datetime
    cooled_until: dt.datetime | None


@dataclass(frozen=True)
class SessionOperations:
    alias: str

    def read_binding(self, *, kind: str, session: str, idle: float, target: str | None) -> Binding | None:
        """The binding of ``session`` in ``kind`` if it lives (its last grant less than ``idle``
        seconds ago, database clock), with its resource's state; None if none lives."""
        params = {"kind": kind, "session": session, "idle": float(idle), "target": target or ""}

        def read(d: Dialect, c: Any) -> Binding | None:
            row = d.execute(c, "BINDING_READ", params, answer=Answer.FIRST)
            if row is None:
                return None
            pk, name, enabled, quarantined, data, now, cooled = row
            return Binding(
                int(pk or 0),
                name or "",
                bool(enabled),
                None if quarantined is None else d.to_datetime(quarantined),
                json.loads(data) if isinstance(data, (str, bytes)) else data,
                d.to_datetime(now),
                None if cooled is None else d.to_datetime(cooled),
            )

        return run_repeatable(self.alias, read, what=f"reading the binding of session {session!r}")

    def bind(self, *, kind: str, session: str, pk: int) -> None:
        """Bind ``session`` in ``kind`` to the resource ``pk`` now."""

        def bind(d: Dialect, c: Any) -> None:
            d.execute(c, "BIND", {"kind": kind, "session": session, "pk": pk})

        run_repeatable(self.alias, bind, what=f"binding session {session!r}")
