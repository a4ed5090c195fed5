"""The Django admin: one module per concern, each registering its own models.

- ``base``: what every page shares (``AppAdmin``: times to the second, and only the query-string
  lookups of its own filters and links, ``lookups``; the stylesheet, state badge and filter, the
  read-only base).
- ``lookups``: the changelists' allow-list of query-string lookups (no oracle on masked data).
- ``times``: every time to the second, in UTC (``SecondsAdmin``).
- ``resources``: the pool of resources (states, quarantine, force release).
- ``overview``: the pool overview (counts, waits and time-outs per kind) and the audit trail.
- ``groups``: group members (with a kick action) and barriers (round, cohort, who is inside).
- ``locks``: named locks, semaphores and leader elections (holders, fences, time left,
  hand-over state; force release), and the elections' leadership terms.
- ``dispenser``: the dispensers' counts and their work items (retry failed, release claims).
- ``notify``: notification topics and shared counters (read-only) and live configuration
  (editable, validated).
- ``line``: who waits in line for what (read-only).
- ``tokens``: the HTTP API's tokens (made here, shown once, revoked; last use).
- ``policy``: the pools' policies (how a pool learns; editable, validated).
"""

from resource_lease.admin.dispenser import DispenserItemAdmin
from resource_lease.admin.groups import BarrierOverviewAdmin, GroupMemberAdmin
from resource_lease.admin.line import WaiterAdmin
from resource_lease.admin.locks import ElectionAdmin, LeadershipTermAdmin, LockAdmin, SemaphoreAdmin
from resource_lease.admin.notify import ConfigEntryAdmin, CounterAdmin, TopicAdmin
from resource_lease.admin.overview import LeaseEventAdmin, PoolOverviewAdmin
from resource_lease.admin.policy import PoolPolicyAdmin
from resource_lease.admin.resources import ResourceAdmin
from resource_lease.admin.tokens import ApiTokenAdmin

__all__ = [
    "ApiTokenAdmin",
    "BarrierOverviewAdmin",
    "ConfigEntryAdmin",
    "CounterAdmin",
    "DispenserItemAdmin",
    "ElectionAdmin",
    "GroupMemberAdmin",
    "LeadershipTermAdmin",
    "LeaseEventAdmin",
    "LockAdmin",
    "PoolOverviewAdmin",
    "PoolPolicyAdmin",
    "ResourceAdmin",
    "SemaphoreAdmin",
    "TopicAdmin",
    "WaiterAdmin",
]
