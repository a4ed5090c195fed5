"""Which tests one pytest run of ``scripts/test`` takes when a backend's suite is split in
shards that run at the same time, each in its own database (``RESOURCE_LEASE_TEST_SHARD=k/n``),
and which wait for a phase of their own (``RESOURCE_LEASE_TEST_PHASE``).

- Files, not tests, are dealt out: a file's fixtures (a Galera cluster, a Celery worker) are
  set up once, in one run. Files are dealt by their weight on the run's backend (seconds per
  file in the last full CI run, per backend: ``shard_weights.json``; a file this backend has
  no figure for counts as ``NEW_FILE``), heaviest first, each to the lightest shard so far:
  the same deal in every run of a backend. Per backend, because files weigh very differently
  on each: the Galera and partition tests run on MariaDB only, and dealt by their MariaDB
  weight they left a PostgreSQL shard 2.5 minutes, a SQLite one 3.4 minutes, shorter than its
  twin. (CI as a whole gained less, some 30 s: its two cores are busy either way.)
- ``TOGETHER``: files that share something outside their database (the Galera test cluster's
  ports and data directory; many client processes and their connections at once, which two
  shards together would run past PostgreSQL's 100 connections) go to one shard, one after
  the other.
- Tests marked ``restarts_server`` restart the database server under test: in a sharded run
  they would cut the other shard's connections, so they run in phase ``restarts``, after
  every shard of phase ``main`` of their backend has finished (``scripts/test``: the other
  backends' shards may still run; they use servers of their own).

Without ``RESOURCE_LEASE_TEST_SHARD`` every test runs (``scripts/test -- ...``, plain pytest).

    python -m tests.sharding weights var/test-logs/*.xml   # rewrite shard_weights.json from a run
    python -m tests.sharding show 2                         # each backend's deal, and its shards' weights
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

WEIGHTS = Path(__file__).with_name("shard_weights.json")
ROOT = Path(__file__).resolve().parent.parent
#: Seconds a file missing from shard_weights.json is taken to last.
NEW_FILE = 10.0
TOGETHER = (
    ("tests/test_galera.py", "tests/test_partitions.py"),
    ("tests/test_nemesis.py", "tests/test_bench_smoke.py", "tests/test_line.py", "tests/test_rwlock_ledger.py"),
)
PHASES = ("main", "restarts")
MARKER = "restarts_server"


#: The backends' names as ``scripts/test`` names its runs (their junit files), by Django vendor.
BACKENDS = {"mysql": "mariadb", "postgresql": "postgresql", "sqlite": "sqlite"}


def weights(backend: str) -> dict[str, float]:
    """Seconds per test file on ``backend`` (``BACKENDS``' values) in the last full run."""
    if backend not in BACKENDS.values():
        raise ValueError(f"backend must be one of {', '.join(sorted(BACKENDS.values()))}, got {backend!r}")
    per_backend = json.loads(WEIGHTS.read_text())
    return {str(k): float(v) for k, v in per_backend.get(backend, {}).items()}


def deal(files: Iterable[str], shards: int, known: dict[str, float]) -> dict[str, int]:
    """Each file's shard (0 .. shards - 1) by the weights ``known``: heaviest unit first, to
    the lightest shard."""
    files = sorted(set(files))
    units: list[tuple[str, ...]] = []
    grouped = set()
    for group in TOGETHER:
        members = tuple(f for f in group if f in files)
        if members:
            units.append(members)
            grouped.update(members)
    units += [(f,) for f in files if f not in grouped]
    units.sort(key=lambda unit: (-sum(known.get(f, NEW_FILE) for f in unit), unit))
    load = [0.0] * shards
    where: dict[str, int] = {}
    for unit in units:
        shard = min(range(shards), key=lambda s: (load[s], s))
        load[shard] += sum(known.get(f, NEW_FILE) for f in unit)
        for f in unit:
            where[f] = shard
    return where


def parse_shard(text: str) -> tuple[int, int]:
    """``"k/n"`` (1 <= k <= n) as (k - 1, n); a ValueError naming the variable otherwise."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"RESOURCE_LEASE_TEST_SHARD must look like 1/2, got {text!r}") from None
    if not 1 <= k <= n:
        raise ValueError(f"RESOURCE_LEASE_TEST_SHARD must be k/n with 1 <= k <= n, got {text!r}")
    return k - 1, n


def relative(path: Path | str) -> str:
    return Path(path).resolve().relative_to(ROOT).as_posix()


def select(
    items: list[object], shard: str | None, phase: str | None, backend: str = "sqlite"
) -> tuple[list[object], list[object]]:
    """(kept, deselected) among pytest's ``items`` for this run's shard and phase on ``backend``."""
    if phase is not None and phase not in PHASES:
        raise ValueError(f"RESOURCE_LEASE_TEST_PHASE must be one of {', '.join(PHASES)}, got {phase!r}")
    kept, dropped = [], []
    where: dict[str, int] = {}
    index = 0
    if shard:
        index, count = parse_shard(shard)
        where = deal({relative(item.path) for item in items}, count, weights(backend))  # type: ignore[attr-defined]
    for item in items:
        restarts = item.get_closest_marker(MARKER) is not None  # type: ignore[attr-defined]
        ok = True
        if phase is not None:
            ok = restarts == (phase == "restarts")
        if ok and shard and phase != "restarts":
            ok = where[relative(item.path)] == index  # type: ignore[attr-defined]
        (kept if ok else dropped).append(item)
    return kept, dropped


def junit_weights(paths: Iterable[str]) -> dict[str, dict[str, float]]:
    """Seconds per test file and backend in these junit files (``<backend>[-<shard>].xml``, as
    ``scripts/test`` names them): a file's seconds in the runs of its backend's main phase
    (the phase that is dealt; ``-restarts`` runs are left out), added."""
    per: dict[str, Counter[str]] = {}
    for path in paths:
        if Path(path).stem.endswith("-restarts"):
            continue
        backend = Path(path).stem.split("-")[0]
        if backend not in BACKENDS.values():
            raise ValueError(f"{path}: not a backend's junit file (<backend>[-<shard>].xml)")
        counter = per.setdefault(backend, Counter())
        for case in ET.parse(path).iter("testcase"):
            counter[case.get("classname", "").replace(".", "/") + ".py"] += float(case.get("time") or 0)
    return {
        backend: {name: round(seconds, 1) for name, seconds in sorted(counter.items())}
        for backend, counter in sorted(per.items())
    }


def from_environment() -> tuple[str | None, str | None]:
    """This run's (shard, phase) from the environment, checked."""
    shard = os.environ.get("RESOURCE_LEASE_TEST_SHARD") or None
    phase = os.environ.get("RESOURCE_LEASE_TEST_PHASE") or None
    if shard:
        parse_shard(shard)
    return shard, phase


def main(argv: list[str]) -> int:
    if argv[:1] == ["weights"] and len(argv) > 1:
        WEIGHTS.write_text(json.dumps(junit_weights(argv[1:]), indent=0, sort_keys=True) + "\n")
        return 0
    if argv[:1] == ["show"] and len(argv) == 2:
        files = sorted(relative(p) for p in (ROOT / "tests").rglob("test_*.py"))
        for backend in sorted(BACKENDS.values()):
            known = weights(backend)
            where = deal(files, int(argv[1]), known)
            for shard in range(int(argv[1])):
                mine = [f for f in files if where[f] == shard]
                print(
                    f"{backend} shard {shard + 1}: {sum(known.get(f, NEW_FILE) for f in mine):.0f}s, {len(mine)} files"
                )
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
