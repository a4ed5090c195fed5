"""uvicorn server processes of the HTTP API on the test database (tests/test_api_servers.py,
tests/test_api_client.py, tests/test_api_node.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

#: How long a server may take to start answering (a loaded CI machine).
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``uvicorn project.asgi:application`` on a port of its own (the test's settings and
    database; the API mounted at /lease/api/ by tests/child_urls.py)."""

    def __init__(self) -> None:
        from tests.conftest import REPO, worker_env  # conftest imports this module's fixture

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/lease/api/"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "project.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--lifespan",
                "off",
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            env=worker_env(),
            cwd=REPO,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(self.url + "openapi.json", timeout=5):  # noqa: S310
                    return
            except (urllib.error.URLError, OSError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the uvicorn server on port {self.port} did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def servers(transactional_db: None) -> Iterator[Callable[[int], list[Server]]]:
    """``servers(n)``: n uvicorn processes, killed at the end of the test."""
    started: list[Server] = []

    def start(n: int) -> list[Server]:
        made = [Server() for _ in range(n)]
        started.extend(made)
        return made

    yield start
    for server in started:
        server.stop()
    # The flush after the test needs this process's connection: a test that waited long on
    # other processes may find it dropped by the server (wait_timeout, a restart).
    from django.db import connection

    connection.close_if_unusable_or_obsolete()
