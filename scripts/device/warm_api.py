"""The public API's own Python per uncontended cycle, warm: its two statements stubbed.

    DATABASE_URL=... python scripts/device/warm_api.py

Runs ``acquire(kind, timeout=0).release()`` 20,000 times with ``Operations.grant`` and
``Operations.release_to_line`` answering what they answered once for real (a granted row;
released), so nothing goes to the database and the caches stay warm. Set against
``cycle_cost``'s "engine" less "engine statements" (the same Python between real round
trips), it says how much of that is the code's own work and how much the caches refilled
after each round trip (docs/benchmarks.md, eighth session). Run it from the checkout to
measure, with DJANGO_SETTINGS_MODULE=project.settings. A measuring script, not a test: the
stubs never leave this process.
"""

from __future__ import annotations

import os
import sys
import time
import timeit
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
sys.path.insert(0, os.getcwd())

import django  # noqa: E402

django.setup()

from resource_lease import acquire  # noqa: E402
from resource_lease.db import operations  # noqa: E402
from resource_lease.db.connections import lease_connection  # noqa: E402
from resource_lease.models import Resource  # noqa: E402

KIND = "warmapi"
CYCLES = 20_000


def main() -> None:
    Resource.objects.filter(kind=KIND).delete()
    Resource.objects.bulk_create([Resource(kind=KIND, name=f"{KIND}-{i}") for i in range(4)])
    lease = acquire(KIND, ttl=3000, timeout=0)
    dialect = lease_connection("default").dialect
    cursor = lease_connection("default").cursor()
    cursor.execute(f"SELECT {dialect.columns} FROM {dialect.table} WHERE id = %s", (lease.resource.pk,))
    row = cursor.fetchall()[0]
    cursor.close()
    lease.release()

    def grant(self: Any, ask: Any, turn: Any = None) -> tuple[Any, bool]:
        return row, False

    def release_to_line(self: Any, *, pk: int, holder: str, fence: int) -> tuple[bool, int]:
        return True, 0

    operations.Operations.grant = grant  # type: ignore[method-assign]
    operations.Operations.release_to_line = release_to_line  # type: ignore[method-assign]

    def cycle() -> None:
        acquire(KIND, ttl=3000, timeout=0).release()

    best = min(timeit.repeat(cycle, number=CYCLES, repeat=7)) / CYCLES * 1e6
    started = time.thread_time()
    for _ in range(CYCLES):
        cycle()
    spent = (time.thread_time() - started) / CYCLES * 1e6
    print(
        f"{os.getcwd()}: the public API's Python, statements stubbed: best {best:.1f} us, thread CPU {spent:.1f} us a cycle"
    )
    Resource.objects.filter(kind=KIND).delete()


if __name__ == "__main__":
    main()
