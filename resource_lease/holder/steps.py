"""A ``ResourceHolder``'s steps, each one a user may override: ``is_valid()`` (required),
``search()`` and ``candidates()`` (which rows to try) and ``lock(candidate)`` (the grant of one
row), and the one attempt that runs them with the caller's turn in the kind's line
(``resource_lease.line``). ``holder/state.py``'s state machine builds on them.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterable, Iterator

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTransform

from resource_lease import signals
from resource_lease.db.line import ANY, BY_ID, Ask
from resource_lease.db.operations import ops
from resource_lease.lease import Lease, making, require_kind
from resource_lease.line.granting import Grantor, newcomer
from resource_lease.models import Resource

#: How many rows of a ``search()`` result one attempt tries to lock before backing off.
SEARCH_LIMIT = 20


class HolderSteps(metaclass=abc.ABCMeta):
    """The overridable steps and one attempt with them (see the module's docstring)."""

    _kind: str
    _ttl: float
    _using: str
    _where: dict[str, object] | None
    #: The wait's grantor while an attempt runs in the kind's line (``lock()`` grants with
    #: it, as the caller's turn); None: outside a wait (as a newcomer).
    _grant: Grantor[Lease] | None
    holder: str

    # -- to override ---------------------------------------------------------------

    @abc.abstractmethod
    def is_valid(self) -> bool:
        """Whether ``self.resource`` works; False quarantines it. May set ``invalid_reason``.

        Required: the one abstract method (a subclass without it cannot be instantiated:
        ``TypeError`` naming ``is_valid``); ``return True`` when every resource is fine.

        Called with the candidate leased (so nobody else probes it at the same time). An
        exception is not taken as "invalid": it is raised to the caller of ``acquire()`` or
        ``fix()`` (the thread logs it and retries), so a bug cannot quarantine a whole pool.
        """

    def search(self) -> Iterable[Resource] | None:
        """Candidate rows for the lock step, best first; None uses the engine's acquire.

        Override to narrow the pool, starting from ``candidates()``, e.g.
        ``return self.candidates().filter(data__region="eu")``. Rows need not be free any
        more by the time they are locked: ``lock()`` decides. At most ``SEARCH_LIMIT`` rows
        of the result are tried per attempt.
        """
        return None

    def candidates(self) -> QuerySet[Resource]:
        """Free, enabled, unquarantined resources of ``kind`` (with the holder's ``where``),
        least recently used first (by the database's clock), for ``search()`` to narrow."""
        found = Resource.objects.using(self._using).free(self._kind)
        for i, (key, value) in enumerate((self._where or {}).items()):
            if value is not None:  # a narrowing hint only: the lock step's statement decides
                found = found.alias(**{f"_where{i}": KeyTransform(key, "data")}).filter(**{f"_where{i}": value})
        return found.order_by("busy_before", "pk")

    def lock(self, candidate: Resource) -> Lease | None:
        """Lease ``candidate`` if it is still free: one conditional UPDATE on its id (free by the
        database's clock, enabled, not quarantined) whose matched-row count decides a race;
        ``search()`` only proposes (docs/pitfalls.md#snapshot-reads, docs/pitfalls.md#found-rows).

        The grant is the engine's (fence + 1, holder, token, expiry = database now + ttl), so
        the ``Lease`` renews, releases and fences exactly like one from ``acquire()``.
        It honours the line of waiters (``resource_lease.line``): a candidate a waiter ahead of
        this holder could take is not granted. Returns None if another holder got there first.
        """
        grant = self._grant or newcomer(self._using, making(alias=self._using))
        lease = grant(self._ask(rows=BY_ID, pk=candidate.pk))
        if lease is not None:
            signals.lease_granted.send(sender=Resource, lease=lease)
        return lease

    def _grab(self, grant: Grantor[Lease], *, give_up_if_empty: bool) -> Lease | None:
        """One attempt with the wait's ``grant`` (as the caller's turn in line): the engine's
        acquire, or lock the first free row ``search()`` found."""
        self._grant = grant
        try:
            found = self.search()
            if found is None:
                lease = grant(self._ask())
                if lease is not None:
                    signals.lease_granted.send(sender=Resource, lease=lease)
                    return lease
            else:
                for candidate in _first(found, SEARCH_LIMIT):
                    lease = self.lock(candidate)
                    if lease is not None:
                        return lease
        finally:
            self._grant = None
        if give_up_if_empty:
            require_kind(self._using, self._kind)
        return None

    def _ask(self, *, rows: str = ANY, pk: int = 0) -> Ask:
        """What the holder asks for: any free row of its kind (or the row ``pk``) matching its
        ``where``, for its ttl."""
        return Ask(self._kind, self.holder, self._ttl, where=self._where, where_sql=self._where_sql(), rows=rows, pk=pk)

    def _where_sql(self) -> str | None:
        """The holder's ``where`` as its database compares it (``Dialect.encode_where``)."""
        return None if self._where is None else ops(self._using).dialect.encode_where(self._where)


def _first(found: Iterable[Resource], limit: int) -> Iterator[Resource]:
    if isinstance(found, QuerySet) and not found.query.is_sliced:
        found = found[:limit]
    return itertools.islice(iter(found), limit)
