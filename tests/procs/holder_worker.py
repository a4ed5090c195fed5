"""A process that holds one resource with a ResourceHolder and reports what happens to it.

``python -m tests.procs.holder_worker KIND TTL RENEW_INTERVAL``

Prints one JSON object per line on stdout:

- ``{"event": "acquired", "pk", "name", "fence", "holder", "pid"}`` whenever the holder is on a
  new grant (first acquire, and each re-acquire after a loss),
- ``{"event": "lost", "pk", "fence", "reason"}`` from ``on_lost()``,
- ``{"event": "fenced", "pk", "fence", "ok"}``: after a re-acquire, whether a fenced write
  with the *previous* lease still went through (it must not).

SIGTERM terminates the holder through ``install_sigterm_handler`` (lease released, exit 143).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

from tests.procs import setup

_out = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _out:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def main() -> None:
    kind, ttl, renew_interval = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    setup()

    from resource_lease.exceptions import LeaseLost
    from resource_lease.holder import ResourceHolder, install_sigterm_handler
    from resource_lease.lease import Lease

    class Worker(ResourceHolder):
        def is_valid(self) -> bool:
            return True

        def on_lost(self) -> None:
            lease = self.lost_lease
            assert lease is not None
            emit("lost", pk=lease.resource.pk, fence=lease.fence, reason=self.lost_reason)
            super().on_lost()

    install_sigterm_handler()
    holder = Worker(kind=kind, ttl=ttl, renew_interval=renew_interval)
    holder.acquire()
    holder.start()
    previous: Lease | None = None
    idle = threading.Event()
    while True:
        lease = holder.lease
        if lease is not None and lease is not previous and holder.holding:
            emit(
                "acquired",
                pk=lease.resource.pk,
                name=lease.resource.name,
                fence=lease.fence,
                holder=lease.holder,
                pid=os.getpid(),
            )
            if previous is not None:
                try:
                    with previous.fenced():
                        ok = True
                except LeaseLost:
                    ok = False
                emit("fenced", pk=previous.resource.pk, fence=previous.fence, ok=ok)
            previous = lease
        idle.wait(0.02)


if __name__ == "__main__":
    main()
