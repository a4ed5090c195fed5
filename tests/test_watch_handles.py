"""Every handle that runs in the background runs until it is stopped, kept or not.

A child process (tests/procs/dropped_handles.py) starts each one without keeping it, runs
``gc.collect()``, and says READY; this process then changes what each watches (a
notification, a config value, a second member of the watched group, a leader of the observed
election) and waits for the child's callbacks, and reads that the dropped group member is
still a member and the dropped candidate still leads, three ttls later. Negative control: the
keeper holds its jobs weakly, as before the fix: the same checks find every handle stopped.
Then ``stop()`` still ends a watch (no callback after it).
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from resource_lease import Config, Election, Group, notify, watch
from tests.conftest import spawn

pytestmark = pytest.mark.django_db(transaction=True)

PREFIX = "dropped-"
TTL = 3.0
#: Seconds to wait for the callbacks: a poll is 0.2 s; room for a loaded machine. (The
#: misses once seen here, with no database error logged, were the child's own lines: its
#: callbacks print from several threads, and two print() calls interleaved into one line
#: that named neither row. It now writes each line whole, under a lock.)
WAIT = 60.0
ROWS = ["watch", "config", "group-watch", "observe", "start", "joined"]


def _reader(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


def _called(lines: queue.Queue[str], seen: dict[str, list[str]], deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line.startswith("CALLED "):
            _, row, *rest = line.split(" ")
            seen.setdefault(row, []).append(" ".join(rest))


def _within(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def run(weak: bool) -> dict[str, bool]:
    args = ["--prefix", PREFIX, "--ttl", str(TTL)] + (["--weak"] if weak else [])
    proc = spawn("tests.procs.dropped_handles", *args, stdout=subprocess.PIPE)
    try:
        lines = _reader(proc)
        first = lines.get(timeout=60)
        while first != "READY":
            first = lines.get(timeout=60)
        seen: dict[str, list[str]] = {}
        _called(lines, seen, time.monotonic() + 1.0)  # the first looks: the state now
        before = {row: len(calls) for row, calls in seen.items()}
        notify(f"{PREFIX}topic", {"n": 1})
        Config(f"{PREFIX}config", {"k": 0}).set("k", 1)
        other = Group(f"{PREFIX}watched", ttl=30, member="other").join()
        rival = Election(f"{PREFIX}observed", ttl=30, holder="rival")
        rival.campaign(timeout=10)
        changed = time.monotonic()
        calls = {
            "watch": lambda: any("n" in call for call in seen.get("watch", [])[before.get("watch", 0) :]),
            "config": lambda: any(call.startswith("k ") for call in seen.get("config", [])),
            "group-watch": lambda: any("other" in call for call in seen.get("group-watch", [])),
            "observe": lambda: any("rival" in call for call in seen.get("observe", [])),
        }
        deadline = changed + WAIT
        while time.monotonic() < deadline and not all(called() for called in calls.values()):
            _called(lines, seen, min(deadline, time.monotonic() + 0.5))
        time.sleep(max(0.0, changed + 3 * TTL - time.monotonic()))  # past the ttl of a membership nobody renews
        _called(lines, seen, time.monotonic() + 0.5)
        result = {
            **{row: called() for row, called in calls.items()},
            # Held (a renewal that came late on a loaded machine is taken again at once), or
            # lapsed for good: looked at for a few seconds.
            "start": _within(lambda: Election(f"{PREFIX}started").leader() == "dropped-candidate"),
            "joined": _within(lambda: "dropped-member" in Group(f"{PREFIX}joined").members()),
        }
        other.leave()
        rival.resign()
        return result
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_handle_nobody_keeps_runs_until_stopped() -> None:
    result = run(weak=False)
    assert all(result.values()), result


def test_negative_control_a_keeper_holding_jobs_weakly_stops_them_silently(vendor: str) -> None:
    result = run(weak=True)
    # On PostgreSQL the LISTEN subscription of a watch woken by NOTIFY happens to hold it
    # (as the issue found): there the weak keeper stops the group's watch (polled), the
    # kept membership and the background campaign.
    survive = {"watch", "config", "observe"} if vendor == "postgresql" else set()
    caught = {row for row, ran in result.items() if not ran}
    assert caught == set(ROWS) - survive, result


def test_stop_still_ends_a_watch() -> None:
    calls: list[Any] = []
    handle = watch(f"{PREFIX}stopped", lambda payload, version: calls.append(payload), poll=0.1)
    deadline = time.monotonic() + WAIT
    notify(f"{PREFIX}stopped", 1)
    while 1 not in calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 1 in calls
    handle.stop()
    from resource_lease.keeper import keeper

    assert handle not in keeper().held()
    notify(f"{PREFIX}stopped", 2)
    time.sleep(1.0)
    assert 2 not in calls
