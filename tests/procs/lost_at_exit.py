"""A process that learns its lease is lost and returns at once: its ``on_lost`` (dispatched
by the keeper to a callback thread, slow on purpose) must still run before it exits.

    python -m tests.procs.lost_at_exit KIND [--no-drain]

Prints ``acquired``, then waits for a line on stdin (the test takes the lease away), waits
for the loss, prints ``lost seen`` and returns. ``--no-drain`` is the negative control: the
exit does not wait for the callbacks (``keeper.EXIT_DRAIN`` 0).
"""

from __future__ import annotations

import sys
import time
from typing import Any


def main() -> None:
    from tests.procs import setup

    setup()
    import importlib

    from resource_lease import acquire

    if "--no-drain" in sys.argv:
        importlib.import_module("resource_lease.keeper").EXIT_DRAIN = 0.0

    def on_lost(lease: Any) -> None:
        time.sleep(0.5)  # longer than the rest of this process's life without the drain
        print("on_lost ran", flush=True)

    lease = acquire(sys.argv[1], ttl=1.0, auto_renew=True, on_lost=on_lost)
    print("acquired", flush=True)
    sys.stdin.readline()
    if not lease.lost_event.wait(30):
        print("never lost", flush=True)
    print("lost seen", flush=True)


if __name__ == "__main__":
    main()
