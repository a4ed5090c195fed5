"""The app's models, one module per concern, all importable from here as before.

``resource``   ``Resource``, its ``ResourceQuerySet`` and the lease states (``free_q`` ...)
``events``     ``LeaseEvent``, the audit trail
``dispenser``  ``DispenserItem``
``topics``     ``Topic``, ``ConfigEntry``
``proxies``    the admin's proxies of ``Resource``: ``PoolOverview``, ``LockRow``,
               ``SemaphoreSlot``, ``ElectionRow``, ``GroupMember``, ``BarrierOverview``
"""

from __future__ import annotations

from resource_lease.models.dispenser import DispenserItem
from resource_lease.models.events import LeaseEvent
from resource_lease.models.proxies import (
    BarrierOverview,
    ElectionRow,
    GroupMember,
    LockRow,
    PoolOverview,
    SemaphoreSlot,
)
from resource_lease.models.resource import (
    COORDINATION_PREFIX,
    DISABLED,
    EXPIRED,
    FREE,
    HELD,
    NEVER,
    QUARANTINED,
    STATES,
    Resource,
    ResourceQuerySet,
    expired_q,
    free_q,
    live_q,
    quarantined_q,
    state_annotations,
)
from resource_lease.models.resource import _never as _never  # migration 0001 names resource_lease.models._never
from resource_lease.models.topics import ConfigEntry, Topic

__all__ = [
    "COORDINATION_PREFIX",
    "DISABLED",
    "EXPIRED",
    "FREE",
    "HELD",
    "NEVER",
    "QUARANTINED",
    "STATES",
    "BarrierOverview",
    "ConfigEntry",
    "DispenserItem",
    "ElectionRow",
    "GroupMember",
    "LeaseEvent",
    "LockRow",
    "PoolOverview",
    "Resource",
    "ResourceQuerySet",
    "SemaphoreSlot",
    "Topic",
    "expired_q",
    "free_q",
    "live_q",
    "quarantined_q",
    "state_annotations",
]
