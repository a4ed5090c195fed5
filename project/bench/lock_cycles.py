"""One worker of ``manage.py lock_bench``: take and give back a lock (or a pooled resource)
as fast as it can during one window, and print what it did as one JSON line.

    python -m project.bench.lock_cycles --mode lock|read|write|acquire --name N --start EPOCH --seconds S

Waiting is the library's own (``timeout`` up to the end of the window: backoff with jitter,
capped at a second), so contended figures include the time waiters spend backing off.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("lock", "read", "write", "acquire"), required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--start", type=float, required=True, help="wall-clock time to start at")
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from resource_lease import NoResourceAvailable, acquire, lock, rwlock

    def take(timeout: float):  # noqa: ANN202
        if args.mode == "lock":
            return lock(args.name, ttl=60, timeout=timeout, auto_renew=False)
        if args.mode in ("read", "write"):  # rwlock(name).read() / .write()
            return getattr(rwlock(args.name), args.mode)(ttl=60, timeout=timeout, auto_renew=False)
        return acquire(args.name, ttl=60, timeout=timeout)

    take(30).release()  # connect and create the row before the window: not measured
    time.sleep(max(0.0, args.start - time.time()))
    end = time.monotonic() + args.seconds
    cycles = timeouts = 0
    while (left := end - time.monotonic()) > 0:
        try:
            lease = take(left)
        except NoResourceAvailable:
            timeouts += 1
            continue
        lease.release()
        if time.monotonic() <= end:
            cycles += 1
    sys.stdout.write(json.dumps({"cycles": cycles, "timeouts": timeouts}) + "\n")


if __name__ == "__main__":
    main()
