"""A child forked while the parent's background threads use the database does not hang
(docs/pitfalls.md#fork).

The fork gate (``resource_lease.forking``): a fork waits until the keeper's step, the
LISTEN thread's and the audit writer's database calls and every lease statement of other
threads have ended, at most ``FORK_WAIT`` seconds (logged when it gives up), and not for the
forking thread itself. A lock of the library's that any thread takes briefly is new in the
child (the control: not renewed, a child forked while another thread held it hangs). Then
many children forked from a busy parent (tests/procs/fork_storm.py)
each use the library at once and all finish; without the gate (the negative control) one
hangs on SQLite, inside SQLite's own locks. Children of ``multiprocessing``'s fork, forkserver
and spawn start methods use the library too (the Celery prefork pool: tests/test_celery.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from resource_lease import forking, named
from resource_lease.forking import fork_gate
from tests.short_mode import SHORT

#: Children per run: a few hundred (CI's short mode: fewer, each backend runs it).
CHILDREN = 120 if SHORT else 300
#: The negative control forks until a child hangs, at most this many.
CONTROL_CAP = 2000
#: Seconds a child may take for one semaphore grant with ``timeout=2`` before it is killed and
#: counted as hung (it hangs for ever: a lock that no thread of the child will release).
DEADLINE = 20.0
#: Seconds a child forked from this process may take for it (one semaphore grant, or none).
CHILD_DEADLINE = 10.0
#: Children of each ``multiprocessing`` start method.
MP_CHILDREN = 1 if SHORT else 2


def child_status(pid: int) -> int:
    """The forked child's exit code (-9: it had not exited after ``CHILD_DEADLINE`` s, and was
    killed)."""
    deadline = time.monotonic() + CHILD_DEADLINE
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.01)


def fork_and_check(check: Callable[[], bool]) -> int:
    """Fork; the child exits 0 if ``check()`` is true; the child's exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if check() else 2
        finally:
            os._exit(code)
    return child_status(pid)


class InsideThread:
    """A thread inside the fork gate until ``release`` is set (or for ``hold`` seconds)."""

    def __init__(self, hold: float | None = None) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.left = threading.Event()
        self.hold = hold
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.entered.wait(10)

    def _run(self) -> None:
        with fork_gate.inside():
            self.entered.set()
            if self.hold is not None:
                time.sleep(self.hold)
            else:
                self.release.wait(30)
            self.left.set()

    def end(self) -> None:
        self.release.set()
        self.thread.join(30)


# -- the gate -----------------------------------------------------------------------------


def test_a_fork_waits_for_a_thread_inside_the_gate() -> None:
    inside = InsideThread(hold=0.3)
    code = fork_and_check(lambda: True)
    left_before_fork_returned = inside.left.is_set()
    inside.end()
    assert code == 0
    assert left_before_fork_returned, "the fork did not wait for the thread inside the gate"


def test_negative_control_without_the_gate_a_fork_does_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fork_gate, "_enabled", False)
    inside = InsideThread()  # inside until released, after the fork
    code = fork_and_check(lambda: True)
    left_before_fork_returned = inside.left.is_set()
    inside.end()
    assert code == 0
    assert not left_before_fork_returned


def test_a_fork_gives_up_waiting_after_fork_wait_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(forking, "FORK_WAIT", 0.5)
    inside = InsideThread()  # stuck inside until after the fork
    try:
        with caplog.at_level(logging.WARNING, logger="resource_lease"):
            code = fork_and_check(lambda: True)
        assert code == 0
        assert not inside.left.is_set()
        assert "1 thread(s) still inside a database call after 0.5s; forking anyway" in caplog.text
    finally:
        inside.end()
    # The gate is open again: another thread gets in at once.
    again = InsideThread(hold=0.0)
    again.end()
    assert again.left.is_set()


def test_the_forking_thread_inside_the_gate_does_not_wait_for_itself(caplog: pytest.LogCaptureFixture) -> None:
    def child() -> bool:
        # The gate is new in the child: another thread gets in, and this one leaves later.
        other = InsideThread(hold=0.0)
        other.end()
        return other.left.is_set()

    with caplog.at_level(logging.WARNING, logger="resource_lease"), fork_gate.inside():
        code = fork_and_check(child)
    assert code == 0
    assert "forking anyway" not in caplog.text


def test_threads_that_fork_at_once_each_wait_and_the_gate_opens_after_both() -> None:
    inside = InsideThread(hold=0.3)
    codes: list[int] = []
    forkers = [threading.Thread(target=lambda: codes.append(fork_and_check(lambda: True))) for _ in range(2)]
    for forker in forkers:
        forker.start()
    for forker in forkers:
        forker.join(60)
    assert codes == [0, 0]
    assert inside.left.is_set()
    inside.end()
    again = InsideThread(hold=0.0)  # the gate is open again
    again.end()
    assert again.left.is_set()


# -- locks other threads hold at the fork --------------------------------------------------


def fork_while_a_thread_holds(lock: Any) -> int:
    """Fork while another thread holds ``lock``; the child takes and releases a semaphore
    slot (``timeout=2``); its exit code (-9: it hung, and was killed)."""
    from resource_lease import semaphore

    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            done.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert holding.wait(10)
    try:

        def child() -> bool:
            with semaphore("fork-held-lock", 4, ttl=10, timeout=2, auto_renew=False):
                pass
            return True

        return fork_and_check(child)
    finally:
        done.set()
        holder.join(10)


@pytest.mark.django_db(transaction=True)
def test_the_known_rows_lock_another_thread_held_at_the_fork_is_new_in_the_child() -> None:
    """Every named lease takes ``named._known_lock`` briefly, in any thread (a user's too,
    which the gate does not hold back)."""
    assert fork_while_a_thread_holds(named._known_lock) == 0


@pytest.mark.django_db(transaction=True)
def test_negative_control_a_lock_not_renewed_in_the_child_hangs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks = [hook for hook in forking._after_in_child if hook != named._after_fork_in_child]
    assert len(hooks) == len(forking._after_in_child) - 1
    monkeypatch.setattr(forking, "_after_in_child", hooks)
    assert fork_while_a_thread_holds(named._known_lock) == -9


# -- children of a busy parent ------------------------------------------------------------


def storm(spawn_worker: Callable[..., subprocess.Popen[str]], *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run tests/procs/fork_storm.py; its summary, with ``"said"``: what its children said
    on stderr (a child's error)."""
    proc = spawn_worker("tests.procs.fork_storm", *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"fork_storm failed ({proc.returncode}):\n{err[-4000:]}"
    summary: dict[str, Any] = json.loads(lines[-1])
    print(f"fork_storm {' '.join(args)} on {connection.vendor}: {summary}")
    summary["said"] = [line for line in err.splitlines() if line.startswith("child ")][:20]
    return summary


@pytest.mark.django_db(transaction=True)
def test_children_forked_from_a_busy_parent_all_finish(spawn_worker: Callable[..., subprocess.Popen[str]]) -> None:
    summary = storm(spawn_worker, "--children", str(CHILDREN), "--at-once", "4", "--deadline", str(DEADLINE))
    assert summary["hung"] == 0, f"{summary['hung']} of {summary['total']} children hung: {summary}"
    assert (summary["total"], summary["ok"], summary["errors"]) == (CHILDREN, CHILDREN, []), summary


@pytest.mark.django_db(transaction=True)
def test_negative_control_without_the_gate_a_child_hangs_on_sqlite(
    spawn_worker: Callable[..., subprocess.Popen[str]],
) -> None:
    """The same children, the gate disabled: forking goes on until one hangs (on SQLite,
    2 to 5 children in 100 in our runs), at most ``CONTROL_CAP``."""
    if connection.vendor != "sqlite":
        pytest.skip("without the gate, children hang on SQLite (its in-process locks); none were seen on servers")
    summary = storm(
        spawn_worker,
        "--children",
        str(CONTROL_CAP),
        "--at-once",
        "4",
        "--deadline",
        str(DEADLINE),
        "--until-hung",
        "--no-gate",
    )
    assert summary["hung"] >= 1, f"no child hung in {summary['total']} without the gate: {summary}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_child_of_each_multiprocessing_start_method_uses_the_library(
    method: str, spawn_worker: Callable[..., subprocess.Popen[str]]
) -> None:
    """forkserver and spawn children inherit nothing of the busy parent (a new interpreter);
    fork's go through the gate."""
    summary = storm(spawn_worker, "--children", str(MP_CHILDREN), "--start-method", method, "--deadline", "90")
    expected = (MP_CHILDREN, 0, MP_CHILDREN, [])
    assert (summary["total"], summary["hung"], summary["ok"], summary["errors"]) == expected, summary


#: A statement that runs for a while on each vendor (SQLite has no sleep: a long count).
SLOW_STATEMENT = {
    "postgresql": "SELECT pg_sleep(0.5)",
    "mysql": "SELECT SLEEP(0.5)",
    "sqlite": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) SELECT COUNT(*) FROM c",
}


@pytest.mark.django_db(transaction=True)
def test_closing_every_connection_waits_for_a_statement_another_thread_runs() -> None:
    """``close_every_connection`` (the tests' teardown) closes the fork gate as a fork does: a
    statement another thread runs on its own lease connection (the keeper renewing a lease in
    the background) ends with its answer before its connection is closed. Closing under it
    crashed the SQLite driver (a segfault in a CI rehearsal). The control: a close that does
    not wait returns while the statement still runs."""
    from resource_lease.db.connections import close_every_connection, run

    started = threading.Event()
    answers: list[tuple[Any, float]] = []

    def slow(dialect: Any, cursor: Any) -> Any:
        started.set()
        cursor.execute(SLOW_STATEMENT[connection.vendor])
        return cursor.fetchall()

    worker = threading.Thread(
        target=lambda: answers.append((run("default", slow, what="a slow statement"), time.monotonic()))
    )
    worker.start()
    assert started.wait(10)
    time.sleep(0.05)  # the statement runs now
    close_every_connection()
    closed_at = time.monotonic()
    worker.join(30)
    assert answers, "the statement failed: its connection was closed under it"
    rows, ended_at = answers[0]
    assert rows and ended_at <= closed_at, "close_every_connection returned while the statement still ran"
