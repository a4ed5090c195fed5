"""The Django admin: one module per concern, each registering its own models.

- ``resources``: the pool of resources (states, quarantine, force release) and its overview.
"""

from resource_lease.admin.resources import PoolOverviewAdmin, ResourceAdmin

__all__ = ["PoolOverviewAdmin", "ResourceAdmin"]
