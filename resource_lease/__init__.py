"""resource_lease: share a pool of scarce resources between processes through the database.

from resource_lease import acquire

with acquire("proxy", ttl=30, auto_renew=True) as lease:
    use(lease.resource.data["url"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resource_lease.exceptions import (
    BarrierTimeout,
    DatabaseUnavailable,
    LeaseDatabaseError,
    LeaseError,
    LeaseLost,
    LockHeld,
    MemberTaken,
    NoResourceAvailable,
    OutcomeUnknown,
    RateLimited,
    SyncCallFromAsync,
)

__version__ = "0.1.0"

__all__ = [
    "BarrierTimeout",
    "Config",
    "DatabaseUnavailable",
    "Dispenser",
    "DoubleBarrier",
    "Election",
    "FolderWorker",
    "Group",
    "Lease",
    "LeaseDatabaseError",
    "LeaseError",
    "LeaseLost",
    "LockHeld",
    "MemberTaken",
    "NoResourceAvailable",
    "OutcomeUnknown",
    "RateLimited",
    "ResourceHolder",
    "SyncCallFromAsync",
    "Watch",
    "WorkItem",
    "Worker",
    "aacquire",
    "acquire",
    "alock",
    "arwlock",
    "asemaphore",
    "close_connections",
    "counter",
    "install_sigterm_handler",
    "leader_only",
    "lock",
    "notify",
    "pool_policy",
    "rate_limit",
    "rwlock",
    "semaphore",
    "synchronized",
    "watch",
]

if TYPE_CHECKING:
    from resource_lease.db.connections import close_connections
    from resource_lease.health import pool_policy
    from resource_lease.holder import ResourceHolder
    from resource_lease.lease import Lease, aacquire, acquire
    from resource_lease.recipes.barrier import DoubleBarrier
    from resource_lease.recipes.config import Config
    from resource_lease.recipes.counters import counter
    from resource_lease.recipes.dispenser import Dispenser, WorkItem
    from resource_lease.recipes.election import Election, leader_only
    from resource_lease.recipes.groups import Group
    from resource_lease.recipes.locks import alock, asemaphore, lock, semaphore, synchronized
    from resource_lease.recipes.notifications import Watch, notify, watch
    from resource_lease.recipes.ratelimit import rate_limit
    from resource_lease.recipes.rwlock import arwlock, rwlock
    from resource_lease.recipes.worker import FolderWorker, Worker
    from resource_lease.shutdown import install_sigterm_handler

# The names below import models, which need the app registry; resolve them on first use so
# that ``import resource_lease`` works before django.setup() (e.g. in settings or celery.py).
_LAZY = {
    "aacquire": "resource_lease.lease",
    "alock": "resource_lease.recipes.locks",
    "asemaphore": "resource_lease.recipes.locks",
    "arwlock": "resource_lease.recipes.rwlock",
    "acquire": "resource_lease.lease",
    "Lease": "resource_lease.lease",
    "ResourceHolder": "resource_lease.holder",
    "close_connections": "resource_lease.db.connections",
    "Election": "resource_lease.recipes.election",
    "leader_only": "resource_lease.recipes.election",
    "Dispenser": "resource_lease.recipes.dispenser",
    "WorkItem": "resource_lease.recipes.dispenser",
    "Worker": "resource_lease.recipes.worker",
    "FolderWorker": "resource_lease.recipes.worker",
    "Group": "resource_lease.recipes.groups",
    "DoubleBarrier": "resource_lease.recipes.barrier",
    "lock": "resource_lease.recipes.locks",
    "semaphore": "resource_lease.recipes.locks",
    "synchronized": "resource_lease.recipes.locks",
    "rwlock": "resource_lease.recipes.rwlock",
    "notify": "resource_lease.recipes.notifications",
    "watch": "resource_lease.recipes.notifications",
    "Watch": "resource_lease.recipes.notifications",
    "Config": "resource_lease.recipes.config",
    "counter": "resource_lease.recipes.counters",
    "rate_limit": "resource_lease.recipes.ratelimit",
    "pool_policy": "resource_lease.health",
    "install_sigterm_handler": "resource_lease.shutdown",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'resource_lease' has no attribute {name!r}")
