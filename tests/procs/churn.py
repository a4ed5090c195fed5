"""A worker that leases, uses and releases resources in a loop, and reports every grant.

    python -m tests.procs.churn --kind K --seconds S --ttl T [--hold H] [--fenced]

Each cycle: ``acquire(kind, ttl, timeout)``, hold for a random time up to H seconds (with
``--fenced``, make a fenced write to the resource row inside), release. At the end it reports
``done``: every grant as ``[pk, fence, start, end, acquired_at, expires_at]`` (start/end on
the host's monotonic clock: when the grant was received, when the release was sent or
the local deadline passed, whichever came first;
acquired_at/expires_at by the database's clock), acquire latencies, and counts of what went
wrong: transient database errors the engine retried (deadlocks, lock wait timeouts,
serialization failures, SQLite busy; counted from the engine's DEBUG log records),
``NoResourceAvailable``, releases refused, and unexpected exceptions.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import time
from collections import Counter

from tests.procs.instrument import emit, error_text, setup

# How the engine's "transient database error, retrying" messages name the database error.
TRANSIENT_KINDS = (
    ("deadlock", ("1213", "deadlock")),
    ("lock_wait", ("1205", "lock wait", "lock timeout")),
    ("serialization", ("could not serialize",)),
    ("busy", ("database is locked",)),
)


class RetryCounter(logging.Handler):
    """Counts the engine's retried transient errors by kind."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "transient database error" not in message:
            return
        lowered = message.lower()
        for name, needles in TRANSIENT_KINDS:
            if any(needle in lowered for needle in needles):
                self.counts[name] += 1
                return
        self.counts["other"] += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--ttl", type=float, required=True)
    parser.add_argument("--hold", type=float, default=0.02)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--fenced", action="store_true")
    args = parser.parse_args()
    setup()
    from resource_lease import acquire
    from resource_lease.exceptions import NoResourceAvailable
    from resource_lease.models import Resource

    retries = RetryCounter()
    engine_log = logging.getLogger("resource_lease")
    engine_log.addHandler(retries)
    engine_log.setLevel(logging.DEBUG)
    for handler in engine_log.handlers:
        if handler is not retries:
            handler.setLevel(logging.WARNING)  # keep stderr quiet: DEBUG is for counting

    emit("ready")
    sys.stdin.readline()  # "go": every worker starts at once
    counts: Counter[str] = Counter()
    errors: list[str] = []
    grants: list[list[object]] = []
    latencies: list[float] = []
    worker = f"w{os.getpid()}"
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        sent = time.monotonic()
        try:
            lease = acquire(args.kind, ttl=args.ttl, timeout=args.timeout)
        except NoResourceAvailable:
            counts["no_resource"] += 1
            continue
        except Exception as exc:  # noqa: BLE001  (every error is reported, as data)
            counts["error"] += 1
            errors.append(error_text(exc))
            time.sleep(0.05)
            continue
        start = time.monotonic()
        latencies.append(start - sent)
        try:
            time.sleep(random.uniform(0, args.hold))
            if args.fenced:
                with lease.fenced():
                    Resource.objects.filter(pk=lease.resource.pk).update(data={"fence": lease.fence, "by": worker})
            released_sent = time.monotonic()
            if not lease.release():
                counts["release_refused"] += 1
        except Exception as exc:  # noqa: BLE001  (every error is reported, as data)
            released_sent = time.monotonic()
            counts["error"] += 1
            errors.append(error_text(exc))
            try:
                lease.release()
            except Exception as again:  # noqa: BLE001
                errors.append(error_text(again))
        # Trust ended at the release, or at the local deadline if the hold outlived it.
        trusted_until = min(released_sent, lease._deadline)
        grants.append(
            [lease.resource.pk, lease.fence, start, trusted_until, lease.resource.acquired_at, lease.expires_at]
        )
    emit(
        "done",
        worker=worker,
        grants=grants,
        latencies=latencies,
        counts=dict(counts),
        retried=dict(retries.counts),
        errors=errors[:20],
    )


if __name__ == "__main__":
    main()
