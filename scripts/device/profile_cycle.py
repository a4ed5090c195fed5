"""The uncontended cycle under cProfile, per function: for scripts/device/profdiff.sh.

    python scripts/device/profile_cycle.py OUT.json

Runs ``acquire(kind, timeout=0).release()`` 2,000 times (after 300 to warm up) on the
database of DATABASE_URL, under cProfile (wall clock, so a statement's wait counts), and
writes each function's calls and own time per cycle (µs) to OUT.json, keyed by a path that
is the same in two checkouts. Run it from the checkout to measure (its resource_lease is
imported), with DJANGO_SETTINGS_MODULE=project.settings.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
sys.path.insert(0, os.getcwd())

import django  # noqa: E402

django.setup()

from resource_lease import acquire  # noqa: E402
from resource_lease.models import Resource  # noqa: E402

KIND = "profcycle"
CYCLES = 2000


def main() -> None:
    Resource.objects.filter(kind=KIND).delete()
    Resource.objects.bulk_create([Resource(kind=KIND, name=f"{KIND}-{i}") for i in range(40)])
    for _ in range(300):
        acquire(KIND, ttl=30, timeout=0).release()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CYCLES):
        acquire(KIND, ttl=30, timeout=0).release()
    profile.disable()
    found: dict[str, list[float]] = {}
    for (path, _line, name), (_cc, calls, own, _cum, _callers) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        where = path.split("site-packages/")[-1].replace(os.getcwd() + "/", "")
        entry = found.setdefault(f"{where}:{name}", [0.0, 0.0])
        entry[0] += calls / CYCLES
        entry[1] += own / CYCLES * 1e6
    with open(sys.argv[1], "w") as out:
        json.dump(found, out)
    Resource.objects.filter(kind=KIND).delete()


if __name__ == "__main__":
    main()
