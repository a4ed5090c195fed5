"""A process that holds a lease, a lock and a place in line, then waits for SIGTERM.

    python -m tests.procs.shutdown_holder KIND LOCK WAIT_KIND TTL [--handler] [--chain] [--exit]
        [--slow-register] [--no-settle]

With ``--handler`` it calls ``resource_lease.install_sigterm_handler()`` first (without it:
the negative control, Python's default SIGTERM). It takes a lease of KIND and the lock LOCK
in the main thread (neither in a ``with`` block, so only the shutdown gives them back), and
starts a daemon thread that waits in line for WAIT_KIND (all of whose resources the test
holds). Prints ``READY`` once the waiter's place is in line. With ``--exit`` it then exits
normally (``sys.exit(0)``) on a line on stdin: the exit hook must give everything back.
``--chain`` installs an application handler (exit status 7) before the library's.
``--slow-register`` makes the waiter's thread take 1.5 s between its place's statement and
the place's registration with the keeper (``READY`` comes in between); ``--no-settle`` (the
negative control) makes the giving back not wait for it (``Keeper.settle``).
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time
from typing import Any

from tests.procs import setup


def main() -> None:
    # SIGUSR1: every thread's stack into stderr (the test asks for it when the process does
    # not exit: tests/test_shutdown.py's ``ended``).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    kind, lock_name, wait_kind, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    setup()
    from resource_lease import acquire, install_sigterm_handler, lock
    from resource_lease.line import Line, waiters

    if "--slow-register" in sys.argv:
        slow_registration()
    if "--no-settle" in sys.argv:
        from resource_lease.keeper import Keeper

        Keeper.settle = lambda self, timeout, besides=(): True  # type: ignore[method-assign,assignment,misc]
    if "--chain" in sys.argv:
        # The application's own handler, installed first: it must be called, not replaced.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(7))
    if "--handler" in sys.argv:
        install_sigterm_handler()
    lease = acquire(kind, ttl=ttl)
    held = lock(lock_name, ttl=ttl)

    def wait() -> None:
        acquire(wait_kind, ttl=ttl, timeout=None)

    threading.Thread(target=wait, daemon=True, name="waiter").start()
    while not waiters(Line("default", wait_kind)):
        time.sleep(0.05)
    print("READY", lease.resource.pk, held.fence, flush=True)
    if "--exit" in sys.argv:
        sys.stdin.readline()
        sys.exit(0)
    while True:
        time.sleep(60)


def slow_registration() -> None:
    """The waiter's place is in the database 1.5 s before the keeper knows it."""
    from resource_lease.line import places

    board = places.board

    class Slow:
        def __init__(self, real: Any) -> None:
            self.real = real

        def add_place(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(1.5)
            return self.real.add_place(*args, **kwargs)

    places.board = lambda: Slow(board())  # type: ignore[assignment,return-value]


if __name__ == "__main__":
    main()
