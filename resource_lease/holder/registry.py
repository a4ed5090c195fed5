"""The process-wide registry of resource holders, and SIGTERM handling on top of it.

Every ``ResourceHolder`` that acquired or started, and was not terminated, is registered
here (weakly), so that ``terminate_all()`` (and the SIGTERM handler) can release every
lease this process holds. A forked child starts with an empty registry: the parent's
holders and their leases are not the child's to terminate.
"""

from __future__ import annotations

import logging
import signal
import threading
import weakref
from types import FrameType
from typing import TYPE_CHECKING

from resource_lease.forking import at_fork
from resource_lease.validation import check_seconds

if TYPE_CHECKING:
    from resource_lease.holder.thread import ResourceHolder

logger = logging.getLogger("resource_lease")

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
    """On SIGTERM, terminate every live holder (releasing its lease), then exit.

    A handler installed before is called afterwards instead of exiting (it decides); else
    the process exits with ``SystemExit(128 + SIGTERM)``, so ``finally`` blocks run.
    Call it from the main thread.
    """
    wait = check_seconds(timeout, "timeout")
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # The releases run on a thread of their own: the handler interrupts the main thread
        # anywhere, possibly inside a lock a release needs. Not a daemon, so if it has to wait
        # for the main thread to unwind, the interpreter still lets it finish before exiting.
        worker = threading.Thread(target=terminate_all, name="resource-lease-sigterm")
        worker.start()
        worker.join(wait)
        logger.info("SIGTERM: terminated this process's resource holders")
        if callable(previous):
            previous(signum, frame)
            return
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def _after_fork_in_child() -> None:
    # The parent's holders (and their leases) are not the child's to terminate
    # (docs/pitfalls.md#fork).
    global _live, _live_lock
    _live = weakref.WeakSet()
    _live_lock = threading.Lock()


at_fork(after_in_child=_after_fork_in_child)

__all__ = ["install_sigterm_handler", "live_holders", "register", "terminate_all", "unregister"]
