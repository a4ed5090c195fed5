"""asyncio: the same grants for Django's async views and consumers, never blocking the loop.

The async twins stand beside their sync twins (``aacquire`` in ``lease.py``, ``alock`` and
``asemaphore`` in ``recipes/locks.py``, ``arwlock`` in ``recipes/rwlock.py``) and are awaited
by the line's asyncio driver (``resource_lease.line.aio``); blocking calls run in a worker
thread (``resource_lease.offload``). This module gathers them for ``from resource_lease.aio
import ...``; ``from resource_lease import aacquire`` works as well::

    lease = await aacquire("proxy", ttl=30, timeout=5)
    async with alock("rebuild", ttl=60, timeout=5) as lease:
        ...
"""

from __future__ import annotations

from resource_lease.lease import aacquire
from resource_lease.line.aio import Acquiring, AsyncWaker, arun
from resource_lease.offload import async_twin, in_thread
from resource_lease.recipes.locks import alock, asemaphore
from resource_lease.recipes.rwlock import ARwLock, arwlock

__all__ = [
    "ARwLock",
    "Acquiring",
    "AsyncWaker",
    "aacquire",
    "alock",
    "arun",
    "arwlock",
    "asemaphore",
    "async_twin",
    "in_thread",
]
