"""The admin's pages over the lease table: proxies of ``Resource`` with no data of their own.

``PoolOverview`` (the pools), and one page per family of coordination rows: ``LockRow``,
``SemaphoreSlot``, ``RwLockRow``, ``ElectionRow`` (a manager that selects the family's kinds),
``GroupMember`` and ``BarrierOverview``.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import models

from resource_lease.models.resource import COORDINATION_PREFIX, Resource


class PoolOverview(Resource):
    """The admin's pool overview page (per kind: total, free, held, quarantined, utilisation).

    A proxy of ``Resource`` with no data of its own, so the page has an entry on the admin
    index like any model.
    """

    class Meta:
        proxy = True
        verbose_name = "pool overview"
        verbose_name_plural = "pool overview"


class _CoordinationManager(models.Manager["Resource"]):
    """The coordination rows of one family: kind equal to ``kind``, or starting with ``prefix``."""

    def __init__(self, *, kind: str = "", prefix: str = "") -> None:
        super().__init__()
        self.kind, self.prefix = kind, prefix

    def get_queryset(self) -> models.QuerySet[Resource]:
        queryset = super().get_queryset()
        return queryset.filter(kind=self.kind) if self.kind else queryset.filter(kind__startswith=self.prefix)


class LockRow(Resource):
    """The admin's page of named locks (``resource_lease.lock``): the rows of kind ``@lock``."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(kind=f"{COORDINATION_PREFIX}lock")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "lock"
        verbose_name_plural = "locks"


class SemaphoreSlot(Resource):
    """The admin's page of semaphores (``resource_lease.semaphore``): one row per slot, of kind
    ``@semaphore:<name>``."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(prefix=f"{COORDINATION_PREFIX}semaphore:")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "semaphore slot"
        verbose_name_plural = "semaphores"


class ElectionRow(Resource):
    """The admin's page of leader elections: the rows of kind ``@election``, whose ``data`` is
    the hand-over state the last leader saved."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(kind=f"{COORDINATION_PREFIX}election")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "election"
        verbose_name_plural = "elections"


class RwLockRow(Resource):
    """The admin's page of read/write locks (``resource_lease.rwlock``): the rows of kind
    ``@rwlock``, held by one writer or by ``readers`` readers."""

    objects: ClassVar[_CoordinationManager] = _CoordinationManager(kind=f"{COORDINATION_PREFIX}rwlock")  # type: ignore[assignment]

    class Meta:
        proxy = True
        verbose_name = "read/write lock"
        verbose_name_plural = "read/write locks"


class GroupMember(Resource):
    """The admin's page of group members: the ``@group:<name>`` rows (a proxy, no data of its own)."""

    class Meta:
        proxy = True
        verbose_name = "group member"
        verbose_name_plural = "group members"


class BarrierOverview(Resource):
    """The admin's page of barriers: round, frozen cohort, who is inside and who waits."""

    class Meta:
        proxy = True
        verbose_name = "barrier"
        verbose_name_plural = "barriers"
