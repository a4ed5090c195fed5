"""rate_limit(): at most n acquisitions per window of ``per`` seconds, across every process.

- real processes hammering one rate limit: no window of ``per`` seconds of the database's
  clock holds more than n grants (the negative control gives each slot back at once, a
  semaphore of n, and the same check catches it);
- ``try_acquire`` never waits and never takes a slot a waiter in line waits for; ``acquire``
  waits for the first slot to free; ``RateLimited`` names the key and when a slot frees;
- an acquisition is never given back (not by the exit's give-back either);
- the asyncio twins; bad input is a ValueError naming the argument, with nothing written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import pickle
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import resource_lease
from resource_lease import LeaseError, NoResourceAvailable, RateLimited, named, rate_limit
from resource_lease.lease import give_back_granted
from resource_lease.line import Line, waiters
from resource_lease.models import Resource
from resource_lease.recipes.ratelimit import rate_limit_kind

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _forget_created_rows():
    named._known.clear()  # each test starts on an empty table


def slots(key: str) -> list[Resource]:
    return list(Resource.objects.filter(kind=rate_limit_kind(key)).order_by("name"))


def grant_times(key: str) -> list[dt.datetime]:
    """When each slot was last granted, by the database's clock (its expiry less ``per``)."""
    return sorted(row.acquired_at for row in slots(key) if row.acquired_at is not None)


# -- across processes ------------------------------------------------------------------------


def crowded_windows(times: list[dt.datetime], n: int, per: float) -> int:
    """How many grants open a window of ``per`` seconds (half-open) that holds more than n."""
    times = sorted(times)
    window = dt.timedelta(seconds=per)
    return sum(1 for i in range(len(times) - n) if times[i + n] - times[i] < window)


def race(spawn_worker, directory: Path, *extra: str, key: str, workers: int = 4) -> list[dt.datetime]:
    go = directory / "go"
    procs = [
        spawn_worker(
            "tests.procs.rate_worker",
            *("--key", key, "--n", "3", "--per", "0.5", "--seconds", "3", "--out", str(directory / f"w{i}.txt")),
            *("--go", str(go), *extra),
            stdout=subprocess.PIPE,
        )
        for i in range(workers)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    go.touch()
    for proc in procs:
        out, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0, out
    times = []
    for path in directory.glob("w*.txt"):
        times += [dt.datetime.fromisoformat(line) for line in path.read_text().split()]
    return times


def test_never_more_than_n_acquisitions_in_any_window_across_processes(spawn_worker, tmp_path: Path) -> None:
    times = race(spawn_worker, tmp_path, key="api.example")
    crowded = crowded_windows(times, 3, 0.5)
    print(f"rate limit 3 per 0.5s, 4 processes for 3s: {len(times)} acquisitions, crowded windows {crowded}")
    assert len(times) >= 9, "too few acquisitions for the check to mean anything"
    assert crowded == 0
    # Every acquisition was a grant of a slot (fences count them), none given back early.
    assert sum(row.fence for row in slots("api.example")) == len(times)


def test_negative_control_slots_given_back_at_once_let_more_through(spawn_worker, tmp_path: Path) -> None:
    """The same check catches a limit whose slots are freed at once (a semaphore of n)."""
    times = race(spawn_worker, tmp_path, "--control", key="broken")
    crowded = crowded_windows(times, 3, 0.5)
    print(f"negative control: {len(times)} acquisitions, crowded windows {crowded}")
    assert crowded > 0


# -- one process -------------------------------------------------------------------------------


def test_try_acquire_allows_n_then_refuses_without_waiting() -> None:
    limit = rate_limit("shop", 2, per=60)
    assert slots("shop") == []  # making it writes nothing
    assert limit.try_acquire() is True
    assert limit.try_acquire() is True
    assert limit.try_acquire() is False
    with pytest.raises(RateLimited) as caught:
        limit.acquire(timeout=0)
    error = caught.value
    assert isinstance(error, NoResourceAvailable) and isinstance(error, LeaseError)
    assert error.key == "shop" and error.available_at is not None
    assert error.available_at == min(row.busy_before for row in slots("shop"))
    assert "'shop'" in str(error) and "database clock" in str(error)
    assert pickle.loads(pickle.dumps(error)).available_at == error.available_at
    assert [row.fence for row in slots("shop")] == [1, 1]


def test_acquire_waits_for_the_first_slot_to_free_by_the_database_clock() -> None:
    limit = rate_limit("slow", 1, per=0.5)
    limit.acquire()
    first = grant_times("slow")[0]
    limit.acquire(timeout=30)
    second = grant_times("slow")[0]
    assert second - first >= dt.timedelta(seconds=0.5)


def test_an_acquisition_is_never_given_back() -> None:
    limit = rate_limit("kept", 1, per=60)
    limit.acquire(timeout=0)
    assert give_back_granted() == 0  # what SIGTERM and the exit give back: not a rate limit's slot
    assert limit.try_acquire() is False
    (row,) = slots("kept")
    assert row.grant_token and row.busy_before > row.acquired_at + dt.timedelta(seconds=59)


def test_a_waiter_in_line_is_served_before_a_newcomer() -> None:
    limit = rate_limit("line", 1, per=1.0)
    limit.acquire(timeout=0)
    outcome: list[str] = []
    waiter = threading.Thread(target=lambda: outcome.append(str(limit.acquire(timeout=60))))
    waiter.start()
    line = Line("default", rate_limit_kind("line"))
    while not waiters(line) and waiter.is_alive():
        time.sleep(0.01)
    # From now until the waiter is served, and after: the slot is the waiter's or busy.
    while waiter.is_alive():
        assert limit.try_acquire() is False
        time.sleep(0.05)
    waiter.join()
    assert outcome == ["None"]
    assert slots("line")[0].fence == 2


def test_a_changed_n_takes_effect_for_new_acquisitions() -> None:
    assert rate_limit("resize", 1, per=60).try_acquire()
    assert rate_limit("resize", 3, per=60).try_acquire()  # two more slots
    assert rate_limit("resize", 3, per=60).try_acquire()
    assert rate_limit("resize", 3, per=60).try_acquire() is False
    assert [row.enabled for row in slots("resize")] == [True, True, True]
    assert rate_limit("resize", 1, per=60).try_acquire() is False
    assert [row.enabled for row in slots("resize")] == [True, False, False]  # never granted again


def test_the_asyncio_twins() -> None:
    async def main() -> tuple[bool, bool]:
        limit = rate_limit("async", 2, per=60)
        await limit.aacquire(timeout=5)
        allowed = await limit.atry_acquire()
        refused = await limit.atry_acquire()
        with pytest.raises(RateLimited):
            await limit.aacquire(timeout=0.2)
        return allowed, refused

    assert asyncio.run(main()) == (True, False)


BAD_CALLS: list[tuple[str, Callable[[], object]]] = [
    ("key", lambda: rate_limit("", 1, per=1)),
    ("key", lambda: rate_limit("k" * 201, 1, per=1)),
    ("key", lambda: rate_limit(3, 1, per=1)),
    ("n", lambda: rate_limit("k", 0, per=1)),
    ("n", lambda: rate_limit("k", True, per=1)),
    ("n", lambda: rate_limit("k", 2.0, per=1)),
    ("n", lambda: rate_limit("k", 1001, per=1)),
    ("per", lambda: rate_limit("k", 1, per=0)),
    ("per", lambda: rate_limit("k", 1, per=-1)),
    ("per", lambda: rate_limit("k", 1, per=float("inf"))),
    ("per", lambda: rate_limit("k", 1, per=float("nan"))),
    ("per", lambda: rate_limit("k", 1, per="1")),
    ("timeout", lambda: rate_limit("k", 1, per=1).acquire(timeout=-1)),
    ("using", lambda: rate_limit("k", 1, per=1, using="nope")),
    ("holder", lambda: rate_limit("k", 1, per=1, holder="")),
    ("priority", lambda: rate_limit("k", 1, per=1, priority="high")),
]


@pytest.mark.parametrize(("argument", "call"), BAD_CALLS)
def test_bad_input_is_a_value_error_naming_the_argument_and_writes_nothing(argument, call) -> None:
    with pytest.raises(ValueError, match=argument):
        call()
    assert not Resource.objects.exists()


def test_exported_from_the_package() -> None:
    assert resource_lease.rate_limit is rate_limit
    assert resource_lease.RateLimited is RateLimited
    assert {"rate_limit", "RateLimited"} <= set(resource_lease.__all__)


def test_inspect_locks_shows_each_rate_limit() -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    rate_limit("report", 3, per=60).acquire(timeout=0)
    out = StringIO()
    call_command("inspect_locks", "--json", stdout=out)
    (entry,) = json.loads(out.getvalue())["rate_limits"]
    assert entry["key"] == "report" and entry["n"] == 3 and entry["used"] == 1
    assert entry["next_free_at"].endswith("Z")
    text = StringIO()
    call_command("inspect_locks", stdout=text)
    assert "Rate limits: 1" in text.getvalue() and "report" in text.getvalue()
