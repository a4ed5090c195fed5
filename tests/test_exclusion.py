"""No two holders of one resource at once, with real processes racing on the database."""

from __future__ import annotations

from pathlib import Path

from tests.ledger import check
from tests.procs.exclusion import at_least

WORKERS = 6
RESOURCES = 3


def race(spawn_worker, make_pool, tmp_path: Path, *, naive: bool, seconds: float) -> object:
    make_pool("race", RESOURCES)
    # Each worker records its share of the 30 grants the checks below need, however slowly it started.
    args = ["--kind", "race", "--dir", str(tmp_path), "--seconds", str(seconds), *at_least(30, WORKERS)]
    procs = [spawn_worker("tests.procs.exclusion", *args, *(["--naive"] if naive else [])) for _ in range(WORKERS)]
    for proc in procs:
        assert proc.wait(timeout=seconds + 120) == 0
    return check(tmp_path)


def test_no_two_holders_overlap_and_fences_increase(spawn_worker, make_pool, tmp_path: Path) -> None:
    verdict = race(spawn_worker, make_pool, tmp_path, naive=False, seconds=3.0)
    print(f"exclusion: {verdict.summary()}")
    assert verdict.grants >= 30, "too few grants for the check to mean anything"
    assert verdict.violations == 0, verdict.summary()


def test_negative_control_naive_acquire_is_caught(spawn_worker, make_pool, tmp_path: Path) -> None:
    """The same check must fail a SELECT-then-unconditional-UPDATE acquire: else it proves nothing."""
    verdict = race(spawn_worker, make_pool, tmp_path, naive=True, seconds=3.0)
    print(f"negative control: {verdict.summary()}")
    assert verdict.grants >= 30
    assert verdict.violations > 0, "the checker did not notice a broken acquire"
