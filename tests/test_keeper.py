"""The process's keeper: one thread runs every periodic job; users' callbacks never stall it;
an overrun is loud; a forked child has a keeper of its own."""

from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from resource_lease import lock, notify, watch
from resource_lease.keeper import Callbacks, keeper
from resource_lease.models import Resource
from resource_lease.pool import force_release

pytestmark = pytest.mark.django_db(transaction=True)


class Job:
    """A job that counts its steps and sleeps ``takes`` seconds in each."""

    def __init__(self, *, every: float = 0.05, takes: float = 0.0, steps: int | None = None) -> None:
        self.every = every
        self.takes = takes
        self.steps = steps
        self.ran = 0
        self.threads: set[str] = set()
        self.done = threading.Event()

    def __repr__(self) -> str:
        return "<test job>"

    def keep(self) -> float | None:
        self.ran += 1
        self.threads.add(threading.current_thread().name)
        time.sleep(self.takes)
        if self.steps is not None and self.ran >= self.steps:
            self.done.set()
            return None
        return self.every


def test_jobs_run_on_the_one_keeper_thread_until_they_stop() -> None:
    jobs = [Job(steps=3), Job(steps=5)]
    for job in jobs:
        keeper().schedule(job, 0.0)
    assert all(job.done.wait(20) for job in jobs)
    assert [job.ran for job in jobs] == [3, 5]
    assert {name for job in jobs for name in job.threads} == {"resource-lease-keeper"}
    assert not any(keeper().scheduled(job) for job in jobs)


def test_a_cancelled_job_runs_no_more_and_a_woken_one_runs_at_once() -> None:
    job = Job(every=3600.0)
    keeper().schedule(job, 3600.0)
    keeper().wake(job)
    deadline = time.monotonic() + 20
    while job.ran == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.ran == 1, "wake() did not run the job"
    keeper().cancel(job)
    assert not keeper().scheduled(job)


def switches(thread: threading.Thread) -> int:
    """The voluntary context switches of ``thread`` so far (Linux's /proc)."""
    with open(f"/proc/self/task/{thread.native_id}/status") as status:
        return int(status.read().split("voluntary_ctxt_switches:")[1].split()[0])


def test_a_job_due_after_the_next_one_does_not_wake_the_keeper_thread() -> None:
    """Scheduling and cancelling jobs due after the one the keeper waits for (a place in line
    and a renewed lease are each one, on every waited grant) leave its thread asleep. The
    control: a job due before it wakes the thread, which runs it at once."""
    first = Job(every=60.0)
    keeper().schedule(first, 30.0)
    thread = keeper().thread
    assert thread is not None
    time.sleep(0.2)  # the thread waits for ``first`` now
    later = [Job() for _ in range(100)]
    before = switches(thread)
    for job in later:
        keeper().schedule(job, 40.0)
        time.sleep(0.002)  # as a waiter does between them: the keeper's thread could run
        keeper().cancel(job)
        time.sleep(0.002)
    assert switches(thread) - before <= 40  # each used to wake it: 200 wake-ups (other tests may leave jobs)
    sooner = Job(steps=1)
    keeper().schedule(sooner, 0.0)
    assert sooner.done.wait(5)
    keeper().cancel(first)


def test_a_lone_lease_granted_and_released_leaves_the_keeper_thread_asleep() -> None:
    """A lock taken and given back while the keeper keeps nothing else schedules its renewal
    and cancels it: neither wakes the keeper's thread, which sleeps through its idle second
    (issue 39: each used to, two thread switches on every uncontended cycle). Counted as the
    notifies of its condition, not as the switches of one thread: the thread may exit at the
    end of an idle second between two cycles, and the next grant starts another."""
    with lock("keeper-lone", ttl=30):
        pass  # starts the keeper's thread, if it had exited
    cond = keeper()._cond
    notified = 0
    notify = cond.notify

    def counted(n: int = 1) -> None:
        nonlocal notified
        notified += 1
        notify(n)

    cond.notify = counted  # type: ignore[method-assign]
    try:
        for _ in range(100):
            with lock("keeper-lone", ttl=30):
                pass
    finally:
        del cond.notify
    print(f"the keeper's thread was notified {notified} times over 100 lock cycles")
    assert notified <= 10  # 177 with the keeper before (0fd6f9b): a wake-up at each grant and release


def test_the_keeper_thread_exits_soon_after_its_last_job_is_cancelled() -> None:
    """With nothing left to keep, the keeper's thread exits about a second later (and closes
    its connections), though the job cancelled was due a minute later: the cancel wakes it
    because it would otherwise sleep until then. The control is the sleep it would have."""
    deadline = time.monotonic() + 10
    while keeper().jobs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert keeper().jobs() == [], "jobs of earlier tests are still kept"
    job = Job(every=60.0)
    keeper().schedule(job, 60.0)
    time.sleep(0.3)  # the thread sleeps until the job is due
    thread = keeper().thread
    assert thread is not None and thread.is_alive()
    keeper().cancel(job)
    thread.join(timeout=5)
    assert not thread.is_alive(), "the keeper's thread slept on for the cancelled job"
    assert job.ran == 0


def test_an_overrun_step_is_a_warning_naming_the_job_and_how_long_it_took(caplog: pytest.LogCaptureFixture) -> None:
    job = Job(every=0.1, takes=0.3, steps=2)
    with caplog.at_level(logging.WARNING, logger="resource_lease"):
        keeper().schedule(job, 0.0)
        assert job.done.wait(20)
    overruns = [r.getMessage() for r in caplog.records if "keeper: <test job>.keep() took" in r.getMessage()]
    print(overruns)
    assert overruns, caplog.text
    assert "asked to run again in 0.100s" in overruns[0]


def test_a_step_that_fits_its_interval_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """The negative control of the overrun warning: the same check finds nothing here."""
    job = Job(every=0.5, takes=0.0, steps=2)
    with caplog.at_level(logging.WARNING, logger="resource_lease"):
        keeper().schedule(job, 0.0)
        assert job.done.wait(20)
    assert "<test job>.keep() took" not in caplog.text


def test_a_step_that_raises_is_logged_with_its_traceback_and_dropped(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        ran = 0

        def keep(self) -> float | None:
            self.ran += 1
            raise RuntimeError("bug in a job")

    job = Broken()
    with caplog.at_level(logging.ERROR, logger="resource_lease"):
        keeper().schedule(job, 0.0)
        deadline = time.monotonic() + 20
        while keeper().scheduled(job) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert job.ran == 1 and not keeper().scheduled(job)
    failed = [r for r in caplog.records if "no longer kept" in r.getMessage()]
    assert failed and failed[0].exc_info is not None


def _renewed_through(block: Any) -> bool:
    """Hold a lock (ttl 2 s, renewed by the keeper every 0.67 s) while ``block(seconds)``
    keeps something busy for 6 s; whether the lock was still ours afterwards."""
    lease = lock("keeper-stall", ttl=2.0, timeout=5)
    try:
        block(6.0)
        return not lease.lost and lease.is_held()
    finally:
        lease.release()


def test_a_blocking_callback_does_not_stall_the_renewals() -> None:
    entered, go = threading.Event(), threading.Event()

    def callback(payload: Any, version: int) -> None:
        entered.set()
        go.wait(60)  # a user's callback that blocks

    w = watch("keeper-stall", callback, poll=0.1)
    try:

        def block(seconds: float) -> None:
            notify("keeper-stall")
            assert entered.wait(20), "the callback never ran"
            time.sleep(seconds)

        held = _renewed_through(block)
    finally:
        go.set()
        w.stop()
    assert held, "a callback blocked the keeper: the lock was not renewed"


def test_negative_control_a_job_that_blocks_the_keeper_loses_the_lock() -> None:
    """The same check catches a blocking step run on the keeper itself (what a callback
    would do if it ran there)."""

    def block(seconds: float) -> None:
        job = Job(every=1.0, takes=seconds, steps=1)  # held here: the keeper holds jobs weakly
        keeper().schedule(job, 0.0)
        assert job.done.wait(seconds + 20)

    assert not _renewed_through(block), "the check cannot see a stalled keeper"


def test_an_owners_callbacks_run_in_order_on_one_thread() -> None:
    class Owner:
        pass

    callbacks = Callbacks(limit=2)
    owner = Owner()
    callbacks.pin(owner)
    seen: list[tuple[int, str]] = []
    done = threading.Event()
    for i in range(20):
        callbacks.call(owner, lambda i=i: seen.append((i, threading.current_thread().name)))
    callbacks.call(owner, done.set)
    assert done.wait(20)
    callbacks.unpin(owner)
    assert [i for i, _ in seen] == list(range(20))
    assert len({name for _, name in seen}) == 1


def test_a_forked_child_keeps_nothing_of_its_parent_and_starts_its_own_keeper() -> None:
    parents = Job(every=0.05)
    keeper().schedule(parents, 0.0)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                inherited = keeper().scheduled(parents)
                own = Job(steps=2)
                keeper().schedule(own, 0.0)
                ok = own.done.wait(10) and not inherited and own.threads == {"resource-lease-keeper"}
                os.write(write, b"ok" if ok else f"inherited={inherited} ran={own.ran}".encode())
            finally:
                os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        answer = os.read(read, 200).decode()
        os.close(read)
    finally:
        keeper().cancel(parents)
    assert status == 0 and answer == "ok", answer


@pytest.mark.parametrize("drain", [True, False], ids=["engine", "no-drain-control"])
def test_a_process_that_exits_right_after_a_loss_still_runs_its_on_lost(
    drain: bool, spawn_worker: Callable[..., subprocess.Popen[str]]
) -> None:
    """The keeper finds the lease gone and hands ``on_lost`` to a callback thread (a daemon);
    the main thread sees ``lost`` and returns at once. The exit waits for the callback
    (``keeper.EXIT_DRAIN``); the control, an exit that does not, loses it (seen in the Galera
    node-kill test's holder, whose loss went unreported)."""
    Resource.objects.create(kind="exit-lost", name="r", busy_before=timezone.now() - dt.timedelta(days=1))
    args = ["exit-lost"] + ([] if drain else ["--no-drain"])
    proc = spawn_worker("tests.procs.lost_at_exit", *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "acquired"
    assert force_release(Resource.objects.filter(kind="exit-lost")) == 1  # its next renewal is refused
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "lost seen" in out, out
    if drain:
        assert "on_lost ran" in out, out
    else:
        assert "on_lost ran" not in out, f"the control ran on_lost anyway: {out}"
