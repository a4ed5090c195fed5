"""A ResourceHolder the fault scenarios drive: events out, commands in.

    python -m tests.faults.procs.resource_holder --kind K --ttl T

A ``ResourceHolder`` subclass (every resource valid) that reports ``acquired`` once it holds
one, and ``lost`` from its ``on_lost()``; its thread then re-acquires by itself (``state``
shows the new fence). Commands on stdin (``<id> <command> [args]``), answered by ``reply``:
``check`` (the holder's check()), ``fenced_write NOTE`` (through the lease it started
with), ``state``, ``close``, ``exit``. instrument.py reports sessions and renewals.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from tests.faults.procs.instrument import emit, error_text, setup


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--ttl", type=float, required=True)
    args = parser.parse_args()
    setup()
    from resource_lease import ResourceHolder
    from resource_lease.models import Resource

    class Holder(ResourceHolder):
        def is_valid(self) -> bool:
            return True

        def on_lost(self) -> None:
            lease = self.lost_lease
            emit("lost", fence=lease.fence if lease else None, reason=self.lost_reason)

    holder = Holder(kind=args.kind, ttl=args.ttl)
    emit("ready")
    first = _acquired(holder)
    holder.start()
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        ident, command, rest = int(words[0]), words[1], words[2:]
        try:
            result: Any
            if command == "check":
                result = holder.check().fence
            elif command == "fenced_write":
                with first.fenced():
                    Resource.objects.filter(pk=first.resource.pk).update(data={"fence": first.fence, "note": rest[0]})
                result = first.fence
            elif command == "state":
                result = {"holding": holder.holding, "lost": holder.lost, "fence": holder.fence}
            elif command == "close":
                result = holder.close()
            elif command == "exit":
                holder.terminate(timeout=10)
                emit("reply", id=ident, cmd=command, ok=True, result=None)
                break
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception as exc:  # noqa: BLE001  (every error is reported, as data)
            emit("reply", id=ident, cmd=command, ok=False, error=error_text(exc))
        else:
            emit("reply", id=ident, cmd=command, ok=True, result=result)
    sys.stdout.flush()
    os._exit(0)


def _acquired(holder: Any) -> Any:
    sent = time.monotonic()
    lease = holder.acquire(timeout=60)
    emit(
        "acquired",
        pk=lease.resource.pk,
        fence=lease.fence,
        holder=lease.holder,
        expires_at=lease.expires_at,
        t_sent=sent,
        t_recv=time.monotonic(),
        deadline=lease._deadline,
    )
    return lease


if __name__ == "__main__":
    main()
