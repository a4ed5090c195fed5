"""Scenario 1: exclusion stress, the long version of the core suite's tests/test_exclusion.py.

The same worker (tests/procs/exclusion.py: a deliberately non-atomic critical section on a
per-resource counter file, and a ledger of grants on the host's monotonic clock) and the same
checker (tests/ledger.py: overlaps, fences out of order, lost counter updates). Short here
(the core suite already runs it, and its negative control, in CI);
``RESOURCE_LEASE_FAULTS_SECONDS`` makes it long, with the negative control: the naive acquire
(SELECT, then an unconditional UPDATE) must be caught, else the check proves nothing.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from resource_lease.models import Resource
from tests.faults.harness import duration, exclusion_race, long_seconds

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

WORKERS = 6
RESOURCES = 3


@pytest.mark.parametrize("naive", [False, True], ids=["engine", "naive-control"])
def test_exclusion_stress(
    naive: bool,
    spawn_worker: Callable[..., subprocess.Popen[str]],
    make_pool: Callable[..., list[Resource]],
    tmp_path: Path,
    figures: Callable[..., Any],
) -> None:
    if naive and not long_seconds():
        pytest.skip("short run: tests/test_exclusion.py runs the negative control in CI")
    make_pool("race", RESOURCES)
    seconds = duration(2.0)
    verdict, failed = exclusion_race(spawn_worker, tmp_path, kind="race", workers=WORKERS, seconds=seconds, naive=naive)
    figures(
        "1-exclusion-naive-control" if naive else "1-exclusion",
        seconds=seconds,
        workers=WORKERS,
        resources=RESOURCES,
        grants=verdict.grants,
        violations=verdict.violations + failed,
        overlaps=len(verdict.overlaps),
        fence_disorder=len(verdict.fence_disorder),
        lost_updates=len(verdict.lost_updates),
    )
    assert verdict.grants >= 30, "too few grants for the check to mean anything"
    if naive:
        assert verdict.violations > 0, "the checker did not notice a broken acquire"
    else:
        assert verdict.violations == 0 and failed == 0, verdict.summary()
