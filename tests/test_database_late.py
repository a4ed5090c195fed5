"""A waiter whose database refuses its connection asks again while its timeout lasts (issue
37, point 10): before, the first refused connection ended a wait with time left on it.

A child process waits in line (``acquire(timeout=60)``) on the alias ``late``
(tests/settings.py): the test database, reached through a port nothing listens on until the
test starts forwarding it to the server (SQLite: a directory link the test creates later). The
wait is granted once the database answers. The negative control makes the wait give up at the
first refusal, as before: it raises ``DatabaseUnavailable`` though its timeout had time left.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.conftest import REPO, worker_env

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED_FOR = 3.0  # seconds the database refuses before it answers


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Forwarder:
    """Forwards a local port to the test database's server, once ``start``ed (before, the
    port refuses connections: nothing listens on it)."""

    def __init__(self) -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        settings = connection.settings_dict
        self.target = (settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 0))
        self.server: socket.socket | None = None
        self.sockets: list[socket.socket] = []

    def start(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        assert self.server is not None
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()

    def stop(self) -> None:
        for sock in [self.server, *self.sockets]:
            if sock is not None:
                sock.close()


@pytest.fixture
def late_database(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None]]]:
    """(what the child's RESOURCE_LEASE_TEST_LATE is, a call that makes the database answer)."""
    if connection.vendor == "sqlite":
        link = tmp_path / "late-link"
        real = Path(str(connection.settings_dict["NAME"])).resolve().parent
        yield str(link), lambda: link.symlink_to(real, target_is_directory=True)
        return
    forwarder = Forwarder()
    yield str(forwarder.port), forwarder.start
    forwarder.stop()


def wait_late(make_pool: Any, late: tuple[str, Callable[[], None]], *flags: str) -> dict[str, Any]:
    """The child's outcome; the database answers once the child has been refused (it says so
    on stderr) or has given up."""
    make_pool("late", 1)
    setting, answer = late
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.procs.late_waiter", "late", "60", *flags],
        cwd=REPO,
        env=worker_env(RESOURCE_LEASE_TEST_LATE=setting),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(child.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while child.poll() is None and not any("refused the connection" in line for line in err):
            assert time.monotonic() < deadline, "".join(err)
            time.sleep(0.05)
        time.sleep(REFUSED_FOR)  # refused for a while more
        answer()
        out = child.communicate(timeout=120)[0]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    reader.join(10)
    assert out.strip(), "".join(err)
    return dict(json.loads(out.strip().splitlines()[-1]), stderr="".join(err))


def test_a_waiter_asks_again_while_its_timeout_lasts_and_is_served(make_pool: Any, late_database: Any) -> None:
    result = wait_late(make_pool, late_database)
    assert result.get("granted") == 1, result
    assert result["took"] >= REFUSED_FOR, result  # it was refused for that long, and went on asking


def test_negative_control_giving_up_at_the_first_refusal_raises_with_time_left(
    make_pool: Any, late_database: Any
) -> None:
    result = wait_late(make_pool, late_database, "--give-up-at-once")
    assert result.get("raised") == "DatabaseUnavailable", result
    assert result["took"] < 60, result  # with time left on its timeout
