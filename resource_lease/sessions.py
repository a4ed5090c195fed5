"""Sticky sessions: ``acquire(kind, session="acct-42")`` grants the resource bound to the
session while the binding lives (``session_idle`` seconds, the kind's policy, since its last
grant, by the database's clock).

The binding is a row of ``models.SessionBinding`` (kind, session, resource, last_used), read
and written by the statements of ``db/sessions.py``. A session's call reads it first (``bound``): a live binding to a resource that can serve the call
(enabled, not quarantined, matching its ``where=``, not cooling down for its target) makes the
call wait for that resource in the resource's own line (the line of the row's name, which a
release of the row tells first and, on PostgreSQL, hands to first); any other case is an
ordinary grant from the pool, which then binds the session to what it got (``bind``), and
``lease.rebound`` says whether a live binding moved. A bound resource that stops serving the
session while it waits (quarantined by its holder, say) is replaced at the waiter's next try.
Two callers binding one new session at the same moment each get a resource; the later binding
stands (an upsert; docs/learning.md#sessions).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from resource_lease.db.clock import DbNow
from resource_lease.db.operations import ops
from resource_lease.models import SessionBinding
from resource_lease.validation import where_matches


@dataclass(frozen=True)
class Bound:
    """A session's binding as a call finds it: the bound resource (``pk`` 0: none live, or
    it was deleted) and its name, whether it can serve this call, and whether a live binding
    existed (a grant of another resource then moves it: ``lease.rebound``)."""

    pk: int = 0
    name: str = ""
    usable: bool = False
    existed: bool = False


def bound(alias: str, kind: str, session: str, *, idle: float, where: Any, target: str | None) -> Bound:
    """The live binding of ``session`` in ``kind``, judged for a call with ``where`` and
    ``target`` (one read, by the database's clock: ``db/sessions.py``'s BINDING_READ)."""
    found = ops(alias).sessions.read_binding(kind=kind, session=session, idle=idle, target=target)
    if found is None:
        return Bound()
    if not found.resource:
        return Bound(existed=True)  # its resource was deleted
    usable = (
        found.enabled
        and (found.quarantined_until is None or found.quarantined_until <= found.now)
        and where_matches(where, found.data)
        and found.cooled_until is None
    )
    return Bound(found.resource, found.name, usable, True)


def still_usable(alias: str, kind: str, session: str, pk: int, *, where: Any, target: str | None) -> bool:
    """Whether the bound resource ``pk`` can still serve the session's call (a waiter's try
    that found it taken asks: quarantined or disabled meanwhile, it is replaced)."""
    found = bound(alias, kind, session, idle=1e9, where=where, target=target)
    return found.pk == pk and found.usable


def bind(alias: str, kind: str, session: str, pk: int) -> None:
    """Bind ``session`` to the resource ``pk`` now (a new binding, or the old one moved)."""
    ops(alias).sessions.bind(kind=kind, session=session, pk=pk)


def live_bindings(pks: list[int], using: str, idle: dict[str, float]) -> dict[int, list[str]]:
    """The sessions bound to the resources ``pks`` whose binding still lives (``idle``: each
    kind's ``session_idle``), per resource (operators' views: the admin, ``inspect_pool``)."""
    found: dict[int, list[str]] = {}
    rows = (
        SessionBinding.objects.using(using)
        .filter(resource_id__in=pks)
        .annotate(now=DbNow())
        .order_by("session")
        .values_list("resource_id", "kind", "session", "last_used", "now")
    )
    for pk, kind, session, last_used, now in rows:
        if last_used > now - dt.timedelta(seconds=idle.get(kind, 600.0)):
            found.setdefault(pk, []).append(session)
    return found
