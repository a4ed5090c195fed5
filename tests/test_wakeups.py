"""How a waiter of this process is woken (``resource_lease.wakeups``): a turn told to it, or a
row a release handed to its place (PostgreSQL's RELEASE, or a release by this process).

A hand-off is not a turn. A turn the waiter does not take is passed on as it leaves
(``Waiting.cleanup`` runs ``pass_turn``, a statement with a NOTIFY), so a hand-off counted as a
turn made every waiter served by a hand-off that arrived while it was busy (in a look, a
renewal) send a useless PASS_TURN before its ``acquire()`` returned, and wake the waiter
first in line behind it for nothing (seen as 94 of 870 profile samples of a waiter at 64
processes on a pool of 40). Negative control: the old wake-up, which marks a hand-off as a turn.
"""

from __future__ import annotations

import pytest

from resource_lease.line.wakeups import Board, Handed, Waker


class TurnOnHandoffWaker(Waker):
    """The negative control: the wake-up before the fix, a hand-off also told as a turn."""

    def wake(self, *, turn: bool = False, handed: Handed | None = None) -> None:
        super().wake(turn=turn or handed is not None, handed=handed)


@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_row_handed_to_a_place_wakes_its_waiter_without_a_turn_to_pass_on(variant: str) -> None:
    board = Board()
    waker = Waker() if variant == "engine" else TurnOnHandoffWaker()
    board.add_place("default", 41, waker)
    found = board.wake_turn("default", 41, handed=7)
    checks = {
        "the place's waiter was found": found,
        "it was woken": waker.wait(0) == 1,
        "it reads the row handed to it": waker.take_handed() == (41, 7, None),
        "no turn is left to pass on when it leaves": waker.take_turn() is False,
    }
    # A turn (a release that freed its row and told this place) is still one.
    board.wake_turn("default", 41)
    checks["a turn told is one"] = waker.take_turn() is True and waker.take_handed() is None
    failed = [what for what, ok in checks.items() if not ok]
    if variant == "engine":
        assert not failed, failed
    else:
        assert failed == ["no turn is left to pass on when it leaves"], failed
