"""Wait in line on a database that refuses connections at first (the alias ``late``,
tests/settings.py), and say how the wait ended.

    python -m tests.procs.late_waiter KIND TIMEOUT [--give-up-at-once]

Prints one JSON line: ``{"granted": fence, "took": s}`` or ``{"raised": name, "message", "took"}``.
``--give-up-at-once`` is the negative control: the wait raises the first refusal, as it did
before a refused connection was asked again while the timeout lasted.
"""

from __future__ import annotations

import json
import sys
import time

from tests.procs import setup


def main() -> None:
    kind, timeout = sys.argv[1], float(sys.argv[2])
    setup()
    from resource_lease import acquire, line

    if "--give-up-at-once" in sys.argv:
        line.Waiting.unavailable = lambda self, exc: None  # type: ignore[method-assign]
    started = time.monotonic()
    try:
        lease = acquire(kind, using="late", ttl=30, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out = {"raised": type(exc).__name__, "message": str(exc)}
    else:
        out = {"granted": lease.fence}
        lease.release()
    out["took"] = time.monotonic() - started
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
