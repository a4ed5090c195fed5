"""A line_waiter process (tests/procs/line_waiter.py) as the line-of-waiters tests drive it:
``Waiting``, its fixture ``waiting`` (import ``waiting_fixture`` to use it) and
``wait_for_places``."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from resource_lease.models import Waiter
from tests.conftest import spawn

WAIT = 60.0  # seconds a step may take on a loaded machine before the test gives up


class Waiting:
    """A line_waiter process and the JSON events it printed (read by a thread of its own, so
    that ``next`` gives up on time even while the process prints nothing)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = spawn("tests.procs.line_waiter", *args, stdout=subprocess.PIPE, env=env)
        self.events: list[dict[str, Any]] = []
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put("")  # the end

    def next(self, *events: str, timeout: float = WAIT) -> dict[str, Any]:
        """The next event among ``events``; AssertionError if none comes within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {events} within {timeout}s") from None
            if not line:
                raise AssertionError(f"the waiter ended (rc={self.proc.wait()}) before {events}: {self.events}")
            found = json.loads(line)
            self.events.append(found)
            if found["event"] in events:
                return found

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.kill(self.proc.pid, sig)


@pytest.fixture(name="waiting")
def waiting_fixture() -> Iterator[Callable[..., Waiting]]:
    """``waiting(*args, env=None)``: a started line_waiter, once it is ready; each is killed
    (continued first, if paused) at the end of the test. A test module imports it to use it."""
    made: list[Waiting] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Waiting:
        w = Waiting(*args, env=env)
        made.append(w)
        w.next("ready")
        return w

    yield start
    for w in made:
        if w.proc.poll() is None:
            try:
                os.kill(w.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            w.proc.kill()
        w.proc.wait(timeout=30)


def wait_for_places(kind: str, name: str, n: int) -> None:
    """Until ``n`` live places are in the line (kind, name)."""
    deadline = time.monotonic() + WAIT
    while Waiter.objects.filter(kind=kind, name=name).count() < n:
        assert time.monotonic() < deadline, f"{n} places never appeared in line {kind}:{name}"
        time.sleep(0.02)
