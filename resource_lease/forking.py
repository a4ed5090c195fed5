"""What ``os.fork()`` does to the process's state, in one place (docs/pitfalls.md#fork).

Only the thread that forks goes on in the child; a lock another thread held at that moment
stays held there for ever: a Python lock, or one inside a database client's C library (SQLite
keeps a process-wide mutex and a per-file record of who in the process holds which lock). A
child that then needs it hangs. So the library's background threads (the keeper, the LISTEN
thread, the audit writer, the callback threads) and every lease statement in any thread run
inside the **fork gate** (``fork_gate.inside()``); ``fork()`` closes the gate first: new
entries wait, and the fork waits until no other thread is inside (at most ``FORK_WAIT``
seconds: past that it forks anyway and says so in the log). The child starts with an open gate.

Every per-process piece of state registers its fork hooks here (``at_fork``), so there is one
``os.register_at_fork`` for the library and one order: in the parent, the gate closes before
any piece's ``before`` hook runs and opens after every ``after_in_parent``; in the child, the
gate is new before any ``after_in_child`` runs. ``PerProcess`` is the usual way: an object
the child makes afresh.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

logger = logging.getLogger("resource_lease")

T = TypeVar("T")

#: The longest a fork waits for the other threads to leave the gate before it forks anyway.
FORK_WAIT = 10.0

Hook = Callable[[], None]

_before: list[Hook] = []
_after_in_parent: list[Hook] = []
_after_in_child: list[Hook] = []


class ForkGate:
    """A shared/exclusive gate: threads are ``inside()`` (shared, re-entrant) while they use
    the database; a fork takes it exclusively (see the module's docstring)."""

    def __init__(self) -> None:
        self._enabled = True
        self._fresh({})

    def _fresh(self, depth: dict[int, int]) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._depth = depth  # thread ident -> its nesting of inside(), for threads inside
        self._inside = len(depth)  # threads inside now
        self._forking = 0  # forks under way (threads that fork at once each close the gate)
        self._forkers: set[int] = set()  # their threads (their own before hooks never wait)

    def inside(self) -> ForkGate:
        """A context manager: this thread uses the database inside it; a fork waits until it
        has left (it may be entered again inside)."""
        return self

    def __enter__(self) -> None:
        ident = threading.get_ident()
        depth = self._depth.get(ident, 0)
        if not depth:
            with self._lock:
                while self._forking and ident not in self._forkers:
                    self._cond.wait()
                self._inside += 1
        self._depth[ident] = depth + 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        ident = threading.get_ident()
        depth = self._depth[ident] - 1
        if depth:
            self._depth[ident] = depth
            return
        del self._depth[ident]
        with self._lock:
            self._inside -= 1
            if self._forking and self._inside <= 1:
                self._cond.notify_all()

    def close(self, timeout: float) -> bool:
        """Before a fork: let no thread in, and wait up to ``timeout`` seconds until none but
        the calling one is inside; whether that happened (if not, it is logged)."""
        if not self._enabled:
            return True
        ident = threading.get_ident()
        mine = 1 if self._depth.get(ident) else 0
        deadline = time.monotonic() + timeout
        with self._lock:
            self._forking += 1
            self._forkers.add(ident)
            while self._inside > mine:
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.warning(
                        "fork: %d thread(s) still inside a database call after %gs; forking anyway"
                        " (the child may hang on a lock they hold: docs/pitfalls.md#fork)",
                        self._inside - mine,
                        timeout,
                    )
                    return False
                self._cond.wait(left)
        return True

    def open(self) -> None:
        """After a fork, in the parent: let the waiting threads in."""
        ident = threading.get_ident()
        with self._lock:
            if ident in self._forkers:  # not when the gate was disabled
                self._forking -= 1
                self._forkers.discard(ident)
                self._cond.notify_all()

    def reset_in_child(self) -> None:
        """After a fork, in the child: the other threads are gone, and so is what they held;
        the forking thread, if it was inside, leaves later."""
        ident = threading.get_ident()
        depth = self._depth.get(ident, 0)
        self._fresh({ident: depth} if depth else {})

    def disable(self) -> None:
        """Forks no longer wait (a negative control: tests/test_fork_safety.py)."""
        self._enabled = False


#: The process's fork gate.
fork_gate = ForkGate()


def at_fork(
    *, before: Hook | None = None, after_in_parent: Hook | None = None, after_in_child: Hook | None = None
) -> None:
    """Register a per-process piece's fork hooks (``os.register_at_fork``'s, with its order:
    ``before`` hooks run in reverse order of registration, the ``after`` ones in order)."""
    if before is not None:
        _before.insert(0, before)
    if after_in_parent is not None:
        _after_in_parent.append(after_in_parent)
    if after_in_child is not None:
        _after_in_child.append(after_in_child)


def _run(hooks: list[Hook], when: str) -> None:
    for hook in list(hooks):
        try:
            hook()
        except Exception:  # one piece's failure must not skip the others'
            logger.exception("fork: the %s hook %r failed", when, hook)


def _before_fork() -> None:
    fork_gate.close(FORK_WAIT)
    _run(_before, "before")


def _after_fork_in_parent() -> None:
    try:
        _run(_after_in_parent, "after_in_parent")
    finally:
        fork_gate.open()


def _after_fork_in_child() -> None:
    fork_gate.reset_in_child()
    _run(_after_in_child, "after_in_child")


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class PerProcess(Generic[T]):
    """``make()``'s object for this process: threads do not survive ``fork()``, so a child
    gets a fresh one (keeping nothing of its parent's jobs, threads or connections) the
    moment it is forked. Call it to get the current one."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value = make()
        at_fork(after_in_child=self._renew)

    def _renew(self) -> None:
        self._value = self._make()

    def __call__(self) -> T:
        return self._value


__all__ = ["FORK_WAIT", "ForkGate", "PerProcess", "at_fork", "fork_gate"]
