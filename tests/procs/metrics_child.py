"""A process that leases ``kind`` ``n`` times and exits: with PROMETHEUS_MULTIPROC_DIR set
(before prometheus_client is imported), its metrics land in that directory's files; with
RESOURCE_LEASE_TEST_NO_PROMETHEUS, prometheus_client cannot be imported at all.

python -m tests.procs.metrics_child KIND N
"""

from __future__ import annotations

import os
import sys

if os.environ.get("RESOURCE_LEASE_TEST_NO_PROMETHEUS"):
    sys.modules["prometheus_client"] = None  # type: ignore[assignment]  # as if not installed

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()

from resource_lease import acquire, metrics  # noqa: E402


def main(kind: str, n: int) -> None:
    waited = []
    for _ in range(n):
        with acquire(kind, ttl=30, timeout=10) as lease:
            waited.append(lease.waited)
    print(f"enabled={metrics.ENABLED} waited={all(w is not None and w >= 0 for w in waited)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
