"""A ResourceHolder the fault scenarios drive: events out, commands in.

    python -m tests.procs.resource_holder --kind K --ttl T

A ``ResourceHolder`` subclass (every resource valid) that reports ``acquired`` once it holds
one, and ``lost`` from its ``on_lost()``; its thread then re-acquires by itself (``state``
shows the new fence). Commands on stdin (instrument.py's ``serve``): ``check`` (the holder's
check()), ``fenced_write NOTE`` (through the lease it started with), ``state``, ``close``,
``exit`` (terminates the holder). instrument.py reports sessions and renewals.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from tests.procs.instrument import emit, serve, setup


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

    def run(command: str, rest: list[str]) -> Any:
        if command == "check":
            return holder.check().fence
        if command == "fenced_write":
            with first.fenced():
                Resource.objects.filter(pk=first.resource.pk).update(data={"fence": first.fence, "note": rest[0]})
            return first.fence
        if command == "state":
            return {"holding": holder.holding, "lost": holder.lost, "fence": holder.fence}
        if command == "close":
            return holder.close()
        raise ValueError(f"unknown command {command!r}")

    serve(run, on_exit=lambda: holder.terminate(timeout=10))


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
