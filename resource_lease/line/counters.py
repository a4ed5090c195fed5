"""What this process's waiters did: counters read by benchmarks, the nemesis and tests (what a
waiter costs the database). Re-exported as ``resource_lease.line.stats``."""

from __future__ import annotations


class Stats:
    """What this process's waiters did (benchmarks: what a waiter costs the database)."""

    def __init__(self) -> None:
        self.entered = 0  # places taken
        self.looks = 0  # looks at a line (one read each)
        self.attempts = 0  # grant statements run while in line (the first attempt excluded)
        self.wakes = 0  # wake-ups received (in-process or NOTIFY)
        self.renewals = 0  # places renewed
        self.at_once = 0  # granted at the first attempt, without taking a place
        self.enter_lock_waits = 0  # places not taken: the statement waited out the lock wait timeout
        self.first_tries_skipped = 0  # newcomers that went straight to a place: their line was marked
        self.marks_skipped = 0  # places taken without marking the line: this process had just marked it
        self.claims = 0  # grants read that a release handed to a place (one read each)
        self.handed = 0  # ... of which found a grant
        self.handed_unread = 0  # grants handed to a place taken as the release described them (no read)
        self.handed_back = 0  # grants handed to a waiter that had left (given back as it left)
        self.turns_passed = 0  # turns told to a waiter that left without taking them, passed on
        self.leaves_retried = 0  # places left by the keeper: the database could not be told as the waiter left

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


#: Counters of this process's waiting (plain ints: a lost increment between threads is fine).
stats = Stats()
