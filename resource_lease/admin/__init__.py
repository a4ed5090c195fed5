"""The Django admin: one module per concern, each registering its own models.

- ``resources``: the pool of resources (states, quarantine, force release) and its overview.
- ``locks``: named locks, semaphores and leader elections (holders, fences, time left,
  hand-over state; force release).
"""

from resource_lease.admin.locks import ElectionAdmin, LockAdmin, SemaphoreAdmin
from resource_lease.admin.resources import PoolOverviewAdmin, ResourceAdmin

__all__ = ["ElectionAdmin", "LockAdmin", "PoolOverviewAdmin", "ResourceAdmin", "SemaphoreAdmin"]
