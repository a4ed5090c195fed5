"""resource_lease: share a pool of scarce resources between processes through the database.

from resource_lease import acquire

with acquire("proxy", ttl=30, auto_renew=True) as lease:
    use(lease.resource.data["url"])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from resource_lease.exceptions import (
    BarrierTimeout,
    LeaseDatabaseError,
    LeaseError,
    LeaseLost,
    MemberTaken,
    NoResourceAvailable,
)

__version__ = "0.1.0"

__all__ = [
    "BarrierTimeout",
    "DoubleBarrier",
    "Config",
    "Group",
    "Lease",
    "LeaseDatabaseError",
    "LeaseError",
    "LeaseLost",
    "MemberTaken",
    "NoResourceAvailable",
    "ResourceHolder",
    "Watch",
    "acquire",
    "close_connections",
    "notify",
    "watch",
]

if TYPE_CHECKING:
    from resource_lease.barrier import DoubleBarrier
    from resource_lease.config import Config
    from resource_lease.db.connections import close_connections
    from resource_lease.groups import Group
    from resource_lease.holder import ResourceHolder
    from resource_lease.lease import Lease, acquire
    from resource_lease.notifications import Watch, notify, watch

# The names below import models, which need the app registry; resolve them on first use so
# that ``import resource_lease`` works before django.setup() (e.g. in settings or celery.py).
_LAZY = {
    "acquire": "resource_lease.lease",
    "Lease": "resource_lease.lease",
    "ResourceHolder": "resource_lease.holder",
    "close_connections": "resource_lease.db.connections",
    "Group": "resource_lease.groups",
    "DoubleBarrier": "resource_lease.barrier",
    "notify": "resource_lease.notifications",
    "watch": "resource_lease.notifications",
    "Watch": "resource_lease.notifications",
    "Config": "resource_lease.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'resource_lease' has no attribute {name!r}")
