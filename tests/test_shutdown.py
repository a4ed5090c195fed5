"""SIGTERM and a normal exit give back every lease, lock and place in line of a process
(``resource_lease.install_sigterm_handler``, docs/operations.md#shutting-down).

Real processes on the test database: one holds a lease, a lock and (in a daemon thread) a
place in line, with a ttl of 60 s; after SIGTERM all three are free at once. The negative
control is the same process without the handler: Python's default SIGTERM gives nothing back,
and all three stay taken (for their ttl).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from resource_lease import LockHeld, NoResourceAvailable, acquire, install_sigterm_handler, lock
from resource_lease.line import Line, waiters
from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

TTL = 60.0


def start(spawn_worker: Any, make_pool: Any, tag: str, *flags: str) -> tuple[subprocess.Popen[str], Any]:
    make_pool(f"sd-{tag}", 1)
    make_pool(f"sdw-{tag}", 1)
    blocker = acquire(f"sdw-{tag}", ttl=TTL)  # the waiter's kind is all taken: it waits in line
    proc = spawn_worker(
        "tests.procs.shutdown_holder",
        f"sd-{tag}",
        f"sd-lock-{tag}",
        f"sdw-{tag}",
        str(TTL),
        *flags,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("READY"), line
    return proc, blocker


def ended(proc: subprocess.Popen[str], timeout: float = 60) -> int:
    """The process's exit status once it has exited; if it has not within ``timeout`` seconds,
    every thread's stack (SIGUSR1: the child's faulthandler, into the captured stderr), then
    a failure that says so."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        pytest.fail(f"the process did not exit within {timeout}s; its threads' stacks are in its stderr")


def held_by_the_dead(tag: str) -> dict[str, bool]:
    """What the process held, whether still taken (asked right after it ended)."""
    held: dict[str, bool] = {}
    try:
        acquire(f"sd-{tag}", ttl=5).release()
        held["lease"] = False
    except NoResourceAvailable:
        held["lease"] = True
    try:
        lock(f"sd-lock-{tag}", ttl=5, auto_renew=False).release()
        held["lock"] = False
    except LockHeld:
        held["lock"] = True
    held["place"] = bool(waiters(Line("default", f"sdw-{tag}")))
    return held


def test_sigterm_gives_back_the_lease_the_lock_and_the_place_at_once(make_pool: Any, spawn_worker: Any) -> None:
    proc, blocker = start(spawn_worker, make_pool, "term", "--handler")
    proc.send_signal(signal.SIGTERM)
    assert ended(proc) == 143
    assert held_by_the_dead("term") == {"lease": False, "lock": False, "place": False}
    blocker.release()


def test_negative_control_without_the_handler_sigterm_keeps_all_three(make_pool: Any, spawn_worker: Any) -> None:
    proc, blocker = start(spawn_worker, make_pool, "ctl")
    proc.send_signal(signal.SIGTERM)
    assert ended(proc) == -signal.SIGTERM
    assert held_by_the_dead("ctl") == {"lease": True, "lock": True, "place": True}
    blocker.release()


def test_a_normal_exit_gives_back_what_is_still_held(make_pool: Any, spawn_worker: Any) -> None:
    proc, blocker = start(spawn_worker, make_pool, "exit", "--handler", "--exit")
    assert proc.stdin is not None
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    assert ended(proc) == 0
    assert held_by_the_dead("exit") == {"lease": False, "lock": False, "place": False}
    blocker.release()


@pytest.mark.parametrize(
    "how,flags,place_kept",
    [
        ("exit", ("--exit",), False),
        ("sigterm", (), False),
        ("negative-control-no-settle", ("--exit", "--no-settle"), True),
    ],
    ids=["exit", "sigterm", "negative-control-no-settle"],
)
def test_a_place_taken_as_the_process_stops_is_given_back_once_registered(
    make_pool: Any, spawn_worker: Any, how: str, flags: tuple[str, ...], place_kept: bool
) -> None:
    """The waiter's place is in the database, and not yet registered with the keeper, when
    the process exits (or gets SIGTERM): the giving back waits for the registration, then
    leaves the place. Negative control: without the wait, the place is missed and stays for
    its ttl (the daemon thread is frozen as the interpreter ends)."""
    proc, blocker = start(spawn_worker, make_pool, f"reg-{how}"[:20], "--handler", "--slow-register", *flags)
    if "--exit" in flags:
        assert proc.stdin is not None
        proc.stdin.write("exit\n")
        proc.stdin.flush()
        assert ended(proc) == 0
    else:
        proc.send_signal(signal.SIGTERM)
        assert ended(proc) == 143
    assert held_by_the_dead(f"reg-{how}"[:20]) == {"lease": False, "lock": False, "place": place_kept}
    blocker.release()


def test_a_handler_installed_before_is_called_instead_of_exiting(make_pool: Any, spawn_worker: Any) -> None:
    proc, blocker = start(spawn_worker, make_pool, "chain", "--handler", "--chain")
    proc.send_signal(signal.SIGTERM)
    assert ended(proc) == 7  # the application's own handler decided
    assert held_by_the_dead("chain") == {"lease": False, "lock": False, "place": False}
    blocker.release()


def test_install_refuses_a_bad_timeout_and_a_thread_other_than_the_main_one() -> None:
    with pytest.raises(ValueError, match="timeout"):
        install_sigterm_handler(timeout=-1)
    import threading

    errors: list[BaseException] = []

    def other() -> None:
        try:
            install_sigterm_handler()
        except ValueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert errors and "main thread" in str(errors[0])


@pytest.mark.parametrize("signal_name", ["worker_init", "worker_process_init"])
def test_a_celery_worker_process_installs_the_handler(signal_name: str) -> None:
    # A process of its own: the handler and its exit hook must not land in the test runner.
    code = (
        "import signal, sys\n"
        "from tests.procs import setup\n"
        "setup()\n"
        "from celery import signals\n"
        "import resource_lease.contrib.celery\n"
        "from resource_lease import shutdown\n"
        "before = signal.getsignal(signal.SIGTERM)\n"
        f"signals.{signal_name}.send(sender=None)\n"
        "after = signal.getsignal(signal.SIGTERM)\n"
        "print(before is not after and after is shutdown._installed)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=worker_env(), cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr


@pytest.mark.parametrize("sweep", [True, False], ids=["sweep", "negative-control-no-sweep"])
def test_grants_dropped_unreleased_and_expired_are_forgotten(make_pool: Any, monkeypatch: Any, sweep: bool) -> None:
    """What SIGTERM would give back forgets a lease dropped unreleased once its row has
    expired, swept when the record doubles (O(1) per grant, not a walk of every held lease).
    Negative control: no sweep, and the first batch is still there."""
    import time

    from resource_lease import lease as lease_module

    # A record of this test's grants alone (in a long test run, earlier tests' unexpired
    # grants fill the process's record and set when it next sweeps), swept from the first
    # threshold, or never.
    monkeypatch.setattr(lease_module, "_granted", {})
    monkeypatch.setattr(lease_module, "_sweep_at", lease_module.SWEEP_FROM if sweep else 10**9)
    make_pool("sd-sweep", 2 * lease_module.SWEEP_FROM)
    first = []
    for _ in range(lease_module.SWEEP_FROM):
        dropped = acquire("sd-sweep", ttl=0.3)
        first.append((dropped.using, dropped.resource.pk, dropped.fence))
        del dropped  # never released: held until its ttl
    time.sleep(0.6)  # every row of the first batch has expired by now
    for _ in range(lease_module.SWEEP_FROM):
        acquire("sd-sweep", ttl=30).release()
    kept = [key for key in first if key in lease_module._granted]
    assert (kept == []) if sweep else (len(kept) == len(first)), len(kept)
