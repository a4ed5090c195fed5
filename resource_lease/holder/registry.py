"""The process-wide registry of resource holders, and SIGTERM handling on top of it.

Every ``ResourceHolder`` that acquired or started, and was not terminated, is registered
here (weakly), so that ``terminate_all()`` (and the SIGTERM handler) can release every
lease this process holds. A forked child starts with an empty registry: the parent's
holders and their leases are not the child's to terminate.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from resource_lease import shutdown
from resource_lease.forking import at_fork

if TYPE_CHECKING:
    from resource_lease.holder.thread import ResourceHolder

# Holders that may hold a lease in this process, for ``terminate_all()`` (SIGTERM).
_live: weakref.WeakSet[ResourceHolder] = weakref.WeakSet()
_live_lock = threading.Lock()


def register(holder: ResourceHolder) -> None:
    """Count ``holder`` among the live holders (it acquires or starts)."""
    with _live_lock:
        _live.add(holder)


def unregister(holder: ResourceHolder) -> None:
    """Forget ``holder`` (it was terminated)."""
    with _live_lock:
        _live.discard(holder)


def live_holders() -> list[ResourceHolder]:
    """The holders of this process that acquired or started and were not terminated."""
    with _live_lock:
        return list(_live)


def terminate_all(timeout: float | None = 10.0) -> int:
    """Terminate every live holder of this process (releasing its lease). Returns how many."""
    holders = live_holders()
    for holder in holders:
        holder.terminate(timeout)
    return len(holders)


def install_sigterm_handler(timeout: float = 15.0) -> None:
    """``resource_lease.install_sigterm_handler``: on SIGTERM, terminate every live holder
    and give back every other lease and place in line of this process, then exit (or call
    the handler installed before); at a normal exit, give back what is still held."""
    shutdown.install_sigterm_handler(timeout)


# The holders go first when the process gives back what it holds: their threads would
# otherwise take a resource again.
shutdown.give_back_first(terminate_all)


def _after_fork_in_child() -> None:
    # The parent's holders (and their leases) are not the child's to terminate
    # (docs/pitfalls.md#fork).
    global _live, _live_lock
    _live = weakref.WeakSet()
    _live_lock = threading.Lock()


at_fork(after_in_child=_after_fork_in_child)

__all__ = ["install_sigterm_handler", "live_holders", "register", "terminate_all", "unregister"]
