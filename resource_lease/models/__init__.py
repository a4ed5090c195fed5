"""The app's models, one module per concern, all importable from here as before.

``resource``   ``Resource``, its ``ResourceQuerySet`` and the lease states (``free_q`` ...)
``events``     ``LeaseEvent``, the audit trail
``dispenser``  ``DispenserItem``
``topics``     ``Topic``, ``ConfigEntry``
``counters``   ``Counter``
``elections``  ``LeadershipTerm``, the log of an election's terms
``line``       ``Waiter``, a caller's place in the line of waiters
``api``        ``ApiToken``, ``IdempotencyKey``: the HTTP API's (docs/http.md)
``policy``     ``PoolPolicy``, how a pool learns (``pool_policy``)
``cooldowns``  ``Cooldown``, a resource's cooldown for one target (``acquire(target=...)``)
``sessions``   ``SessionBinding``, a sticky session's resource (``acquire(session=...)``)
``proxies``    the admin's proxies of ``Resource``: ``PoolOverview``, ``LockRow``,
               ``SemaphoreSlot``, ``RwLockRow``, ``ElectionRow``, ``GroupMember``, ``BarrierOverview``
"""

from __future__ import annotations

from resource_lease.models.api import ApiToken, IdempotencyKey
from resource_lease.models.cooldowns import TARGET_MAX, Cooldown
from resource_lease.models.counters import Counter
from resource_lease.models.dispenser import DispenserItem
from resource_lease.models.elections import LeadershipTerm
from resource_lease.models.events import LeaseEvent
from resource_lease.models.line import Waiter
from resource_lease.models.policy import PoolPolicy
from resource_lease.models.proxies import (
    BarrierOverview,
    ElectionRow,
    GroupMember,
    LockRow,
    PoolOverview,
    RwLockRow,
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
from resource_lease.models.sessions import SessionBinding
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
    "TARGET_MAX",
    "ApiToken",
    "BarrierOverview",
    "ConfigEntry",
    "Cooldown",
    "Counter",
    "DispenserItem",
    "ElectionRow",
    "GroupMember",
    "IdempotencyKey",
    "LeadershipTerm",
    "LeaseEvent",
    "LockRow",
    "PoolOverview",
    "PoolPolicy",
    "Resource",
    "ResourceQuerySet",
    "RwLockRow",
    "SemaphoreSlot",
    "SessionBinding",
    "Topic",
    "Waiter",
    "expired_q",
    "free_q",
    "live_q",
    "quarantined_q",
    "state_annotations",
]
