"""A watcher whose database goes away catches up (MariaDB and PostgreSQL; SQLite has no
server): its sessions ended from the server (``KILL`` / ``pg_terminate_backend``), and the
database unreachable for a while (a TCP proxy in front of it cut and refusing connections).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import DatabaseError, connection

from resource_lease import notify
from resource_lease.db.connections import close_connections
from tests.conftest import worker_env
from tests.faults.harness import Child
from tests.notify_helpers import check_deliveries, deliveries, notify_child, wait_version

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def start(spawn_worker: Callable[..., subprocess.Popen[str]]) -> Callable[..., Child]:
    return notify_child(spawn_worker)


@pytest.fixture(autouse=True)
def _server_databases_only() -> None:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server: no session to kill, no connection to lose")


def _kill_other_sessions() -> int:
    """End every session on the test database but this one, from the server."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
            ids = [row[0] for row in cursor.fetchall()]
            for session in ids:
                try:
                    cursor.execute(f"KILL CONNECTION {int(session)}")
                except DatabaseError:  # it ended by itself meanwhile
                    pass
            return len(ids)
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_a_watcher_whose_connections_are_killed_catches_up(start: Callable[..., Child]) -> None:
    watcher = start("watch", "--topic", "killed", "--poll", 0.5)
    watcher.wait_for("ready", timeout=60)
    sent: dict[int, Any] = {}
    catch_up = []
    for round_ in range(3):
        v = notify("killed", {"round": round_})
        sent[v] = {"round": round_}
        wait_version(watcher, v)
        close_connections()
        time.sleep(0.3)
        killed = _kill_other_sessions()
        assert killed >= 1, "no session of the watcher to kill: the fault was not injected"
        t0 = time.monotonic()
        for i in range(3):
            sent[notify("killed", {"round": round_, "i": i})] = {"round": round_, "i": i}
        got = wait_version(watcher, max(sent), timeout=30)
        catch_up.append(got["start"] - t0)
    watcher.finish()
    problems = check_deliveries(deliveries(watcher), sent, max(sent))
    print(f"killed sessions: caught up in {[round(c, 3) for c in catch_up]} s")
    assert not problems, problems


class OutageProxy:
    """A TCP proxy to the database server that can be taken down (every connection through
    it cut, new ones refused at once) and brought back up."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.up = True
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def down(self) -> None:
        self.up = False
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.down()
        self._listener.close()


@pytest.fixture
def outage_proxy() -> Iterator[OutageProxy]:
    url = urlsplit(os.environ.get("DATABASE_URL", ""))
    proxy = OutageProxy(url.hostname or "127.0.0.1", url.port or (3306 if url.scheme.startswith("mysql") else 5432))
    yield proxy
    proxy.close()


def test_a_watcher_whose_database_was_unreachable_catches_up_on_reconnect(
    start: Callable[..., Child], outage_proxy: OutageProxy
) -> None:
    url = urlsplit(os.environ["DATABASE_URL"])
    through_proxy = urlunsplit(url._replace(netloc=f"{url.username or ''}@127.0.0.1:{outage_proxy.port}"))
    watcher = start("watch", "--topic", "outage", "--poll", 0.5, env=worker_env(DATABASE_URL=through_proxy))
    watcher.wait_for("ready", timeout=60)
    sent = {notify("outage", "first"): "first"}
    wait_version(watcher, 1)
    outage_proxy.down()
    for i in range(3):  # changes the watcher cannot see while its database is unreachable
        sent[notify("outage", f"during-{i}")] = f"during-{i}"
        time.sleep(0.7)
    delivered_during = [e for e in deliveries(watcher) if e["version"] > 1]
    outage_proxy.up = True
    back = time.monotonic()
    got = wait_version(watcher, max(sent), timeout=60)
    watcher.finish()
    print(f"outage: caught up {got['start'] - back:.2f} s after the database came back")
    assert not delivered_during, f"delivered while unreachable (the proxy did not cut it): {delivered_during}"
    problems = check_deliveries(deliveries(watcher), sent, max(sent))
    assert not problems, problems
    assert got["payload"] == "during-2"
