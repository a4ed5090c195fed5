"""The leadership checker's sequence rule on hand-made event files (no database).

A save is judged in commit order (fence, then units), not by when it was logged: a leader
paused between its save's commit and its log line must pass, and a late save that its
successor did not see (a unit saved twice) must still fail.
"""

from __future__ import annotations

from pathlib import Path

from tests import leadership


def _events(directory: Path, worker: str, *saves: tuple[int, int, int]) -> None:
    (directory / f"events-{worker}").write_text("".join(f"{ns} SAVED {fence} {units}\n" for ns, fence, units in saves))


def test_a_save_logged_after_the_successors_saves_is_in_sequence(tmp_path: Path) -> None:
    # Leader "a" (fence 1) commits units 1-3, is paused before logging 3; "b" (fence 2) goes on
    # from 3 with 4 and 5; "a" logs 3 on resume.
    _events(tmp_path, "a", (10, 1, 1), (20, 1, 2), (90, 1, 3))
    _events(tmp_path, "b", (50, 2, 4), (60, 2, 5))
    verdict = leadership.check(tmp_path)
    assert verdict.bad_sequence == [], verdict.summary()


def test_negative_control_a_save_the_successor_did_not_see_is_caught(tmp_path: Path) -> None:
    # "a"'s save of 3 committed after "b" read the state: "b" saved 3 again.
    _events(tmp_path, "a", (10, 1, 1), (20, 1, 2), (90, 1, 3))
    _events(tmp_path, "b", (50, 2, 3), (60, 2, 4))
    verdict = leadership.check(tmp_path)
    assert verdict.bad_sequence, verdict.summary()


def test_negative_control_a_skipped_unit_is_caught(tmp_path: Path) -> None:
    _events(tmp_path, "a", (10, 1, 1), (20, 1, 2))
    _events(tmp_path, "b", (50, 2, 4))
    assert leadership.check(tmp_path).bad_sequence == [(3, 4)]
