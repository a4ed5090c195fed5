"""The Django admin: one module per concern, each registering its own models.

- ``resources``: the pool of resources (states, quarantine, force release) and its overview.
- ``groups``: group members (with a kick action) and barriers (round, cohort, who is inside).
- ``locks``: named locks, semaphores and leader elections (holders, fences, time left,
  hand-over state; force release).
- ``dispenser``: the dispensers' counts and their work items (retry failed, release claims).
- ``notify``: notification topics (read-only) and live configuration (editable, validated).
"""

from resource_lease.admin.dispenser import DispenserItemAdmin
from resource_lease.admin.groups import BarrierOverviewAdmin, GroupMemberAdmin
from resource_lease.admin.locks import ElectionAdmin, LockAdmin, SemaphoreAdmin
from resource_lease.admin.notify import ConfigEntryAdmin, TopicAdmin
from resource_lease.admin.resources import PoolOverviewAdmin, ResourceAdmin

__all__ = [
    "BarrierOverviewAdmin",
    "ConfigEntryAdmin",
    "DispenserItemAdmin",
    "ElectionAdmin",
    "GroupMemberAdmin",
    "LockAdmin",
    "PoolOverviewAdmin",
    "ResourceAdmin",
    "SemaphoreAdmin",
    "TopicAdmin",
]
