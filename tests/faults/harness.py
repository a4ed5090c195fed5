"""Tools the fault scenarios share.

- ``Child``: a worker process that reports JSON lines on stdout and takes commands on stdin.
- ``run_churn`` and ``exclusion_race``: many workers racing for a pool, their grants judged
  by the suite's one exclusion checker (tests/grants.py: no two processes trust one resource
  at the same instant, fences increase).
- ``CutProxy``: a TCP proxy that lets a statement reach the server and then cuts the
  connection before the answer comes back (a commit whose outcome the client cannot know).
- Database-server operations: end one session from the server side, restart the server.
- ``long_seconds``/``rounds``: the short (CI) and long (``RESOURCE_LEASE_FAULTS_SECONDS``) runs.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.grants import Grant, exclusion_violations

# libfaketime (Debian package faketime), the variant for multi-threaded programs.
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
FAKETIME_SITE = Path(__file__).resolve().parent / "faketime_site"
REPO = Path(__file__).resolve().parents[2]


# -- short and long runs ---------------------------------------------------------------


def long_seconds() -> float:
    """Seconds each scenario runs for in the long version; 0 for the short (CI) version."""
    raw = os.environ.get("RESOURCE_LEASE_FAULTS_SECONDS", "").strip()
    if not raw:
        return 0.0
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"RESOURCE_LEASE_FAULTS_SECONDS must be a number of seconds >= 0, got {raw!r}")
    return value


def rounds(short: int, per_second: float) -> int:
    """How many times to repeat a fault: ``short`` in CI, scaled to the long run's length."""
    seconds = long_seconds()
    return max(short, int(seconds * per_second)) if seconds else short


def duration(short: float) -> float:
    """How long a timed scenario runs: ``short`` in CI, the long run's length otherwise."""
    return max(short, long_seconds())


# -- figures ---------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (q in [0, 1]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def spread(name: str, values: Sequence[float]) -> dict[str, float]:
    """``{name_p50, name_max}`` in seconds, for a figures line."""
    return {f"{name}_p50": quantile(values, 0.5), f"{name}_max": max(values) if values else math.nan}


# -- child processes -------------------------------------------------------------------


class Child:
    """A worker process speaking JSON lines: events on stdout, commands on stdin."""

    def __init__(self, proc: subprocess.Popen[str], name: str) -> None:
        self.proc = proc
        self.name = name
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"ev": "text", "line": line.rstrip("\n")}
            if not isinstance(event, dict):
                event = {"ev": "text", "line": line.rstrip("\n")}
            event["t_seen"] = time.monotonic()
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self.events.append({"ev": "eof", "t_seen": time.monotonic()})
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def mark(self) -> int:
        """A position in the event list: ``wait_for(..., since=mark)`` sees only later events."""
        with self._cond:
            return len(self.events)

    def of(self, ev: str) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events if e.get("ev") == ev]

    def wait_for(
        self,
        ev: str,
        *,
        timeout: float = 30.0,
        since: int = 0,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        """The first event named ``ev`` at or after ``since`` (matching ``where``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[since:]:
                    if event.get("ev") == ev and (where is None or where(event)):
                        return event
                    if event.get("ev") == "eof":
                        raise AssertionError(f"{self.name} exited (rc={self.proc.poll()}) before {ev!r}: {self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.name}: no {ev!r} within {timeout:g}s: {self.tail()}")
                self._cond.wait(min(left, 0.5))

    def tail(self, n: int = 8) -> list[dict[str, Any]]:
        return self.events[-n:]

    def send(self, *words: Any) -> int:
        """Send one command line without waiting; ``reply(ident)`` waits for its answer."""
        assert self.proc.stdin is not None
        with self._cond:
            self._next_id += 1
            ident = self._next_id
        self.proc.stdin.write(" ".join([str(ident), *map(str, words)]) + "\n")
        self.proc.stdin.flush()
        return ident

    def reply(self, ident: int, timeout: float = 30.0) -> dict[str, Any]:
        return self.wait_for("reply", timeout=timeout, where=lambda e: e.get("id") == ident)

    def command(self, *words: Any, timeout: float = 30.0) -> dict[str, Any]:
        """Send one command line and wait for its reply."""
        return self.reply(self.send(*words), timeout)

    def signal(self, sig: int) -> float:
        """Send ``sig``; return the monotonic time it was sent."""
        now = time.monotonic()
        os.kill(self.proc.pid, sig)
        return now

    def stop(self) -> float:
        return self.signal(signal.SIGSTOP)

    def cont(self) -> float:
        return self.signal(signal.SIGCONT)

    def kill(self) -> float:
        """SIGKILL, and reap the process; returns when it was sent."""
        sent = self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        return sent

    def finish(self, timeout: float = 30.0) -> int:
        """Close stdin (the child exits at end of input) and wait for it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        return self.proc.wait(timeout=timeout)


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that runs a child under libfaketime with its wall clock moved by
    ``offset`` (e.g. ``"+5h"``).

    The monotonic clock is left alone: under libfaketime 0.9.10 a faked monotonic clock
    makes Python's lock and condition waits hang. faketime_site/ works around its broken
    ``time.sleep()``.
    """
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join([str(FAKETIME_SITE), str(REPO)]),
    }


# -- a TCP proxy that loses answers ----------------------------------------------------


class CutProxy:
    """Forward TCP connections to a database server; when armed, cut one connection after
    the server has answered a chosen statement, before the client sees the answer (or, armed
    with ``hold``, deliver that answer only ``hold`` seconds later: a late answer).

    The statement is recognised by byte patterns in one client-to-server packet (the SQL text
    travels in clear on a local connection without TLS). The server runs it to the end (an
    autocommit statement has committed when its answer is sent); the client gets a dropped
    connection: the outcome is unknown to it. Armed with ``hold`` and ``lose``, the answer is
    held back ``hold`` seconds and then lost all the same (a client waiting out its timeout on
    a server cut off the network, as through a failover). Armed with ``outage``, the statement never
    reaches the server: every connection through the proxy is cut as it is sent, and new ones
    are hung up on for ``outage`` seconds (the database gone for the client, for a moment).
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._patterns: tuple[bytes, ...] | None = None
        self._hold: float | None = None
        self._outage: float | None = None
        self._lose = False
        self._unless: bytes | None = None
        self._refuse_until = 0.0
        self._lock = threading.Lock()
        self.cuts: queue.Queue[float] = queue.Queue()
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="cut-proxy", daemon=True).start()

    def arm(
        self,
        *patterns: bytes,
        hold: float | None = None,
        lose: bool = False,
        outage: float | None = None,
        unless: bytes | None = None,
    ) -> None:
        """Cut the next connection whose client sends one packet containing all ``patterns``
        (and not ``unless``) (with ``hold``: keep it, and hold back the answer to that packet
        for ``hold`` seconds, then deliver it, or with ``lose`` cut it then; with ``outage``:
        drop that packet, cut every connection and refuse new ones for ``outage`` seconds).
        ``cuts`` gets the time the answer (or the packet) was caught."""
        with self._lock:
            self._unless = unless
            self._patterns = patterns
            self._hold = hold
            self._lose = lose
            self._outage = outage

    def _matches(self, data: bytes) -> bool:
        return (
            self._patterns is not None
            and all(p in data for p in self._patterns)
            and (self._unless is None or self._unless not in data)
        )

    def _take(self, data: bytes) -> float | bool:
        """False, or what to do with the answer: True (cut) or the seconds to hold it."""
        with self._lock:
            if self._matches(data):
                self._patterns = None
                return True if self._hold is None else self._hold
        return False

    def _outage_begins(self, data: bytes) -> bool:
        """Whether ``data`` is the packet an outage was armed on (then it has begun)."""
        with self._lock:
            if self._outage is None or not self._matches(data):
                return False
            self._patterns = None
            self._refuse_until = time.monotonic() + self._outage
            self._outage = None
        self.cuts.put(time.monotonic())
        self._close(*self._socks)
        return True

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if time.monotonic() < self._refuse_until:
                self._close(client)  # the database is away: hung up on at once
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._socks += [client, server]
            state: dict[str, float | bool] = {"cut": False}
            threading.Thread(target=self._pump_up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(server, client, state), daemon=True).start()

    def _pump_up(self, client: socket.socket, server: socket.socket, state: dict[str, float | bool]) -> None:
        try:
            while data := client.recv(65536):
                if self._outage_begins(data):
                    return  # never sent: every connection is cut
                if taken := self._take(data):
                    state["cut"] = taken  # set before the server can answer
                server.sendall(data)
        except OSError:
            pass
        self._close(client, server)

    def _pump_down(self, server: socket.socket, client: socket.socket, state: dict[str, float | bool]) -> None:
        try:
            while data := server.recv(65536):
                if isinstance(state["cut"], float):
                    # The answer to the chosen statement, committed: delivered late (or lost late).
                    held, state["cut"] = float(state["cut"]), False
                    self.cuts.put(time.monotonic())
                    time.sleep(held)
                    if self._lose:
                        self._close(client, server)
                        return
                elif state["cut"]:
                    # The answer to the chosen statement: swallow it and hang up on both sides.
                    self._close(client, server)
                    self.cuts.put(time.monotonic())
                    return
                client.sendall(data)
        except OSError:
            pass
        self._close(client, server)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self._close(*self._socks)


# -- the database server ---------------------------------------------------------------


def end_session(session_id: int) -> None:
    """End one database session from the server side (``KILL`` / ``pg_terminate_backend``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"KILL CONNECTION {int(session_id)}")
        else:
            cursor.execute("SELECT pg_terminate_backend(%s)", [int(session_id)])


def _run(*argv: str, timeout: float = 60) -> None:
    subprocess.run(argv, check=True, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


#: The ports of the servers SERVICES.md describes (the ones CI uses). A server on another port
#: is another instance on this machine (``manage.py nemesis`` with restarts, docs/jepsen.md):
#: PostgreSQL's cluster is found by its port (``pg_lsclusters``); a MariaDB instance is
#: restarted with the command line it runs with.
DEFAULT_PORTS = {"mysql": 3306, "postgresql": 5432}

#: A MariaDB instance's command line by port, read before it was shut down (to start it again).
_mariadb_argv: dict[int, list[str]] = {}


def _port(vendor: str, port: int | str | None) -> int:
    return int(port) if port else DEFAULT_PORTS[vendor]


def server_answers(vendor: str, port: int | str | None = None) -> bool:
    """Whether the local server of ``vendor`` (on ``port``) accepts a connection and a query now."""
    at = str(_port(vendor, port))
    if vendor == "mysql":
        argv = ["mysqladmin", "-uroot", "-h127.0.0.1", "-P", at, "--connect-timeout=2", "ping"]
    else:
        argv = ["psql", "-h127.0.0.1", "-p", at, "-Upostgres", "-d", "postgres", "-Atc", "SELECT 1"]
    env = dict(os.environ, PGCONNECT_TIMEOUT="2")
    result = subprocess.run(argv, capture_output=True, timeout=15, env=env, check=False)
    return result.returncode == 0


def wait_until_answers(vendor: str, timeout: float = 120.0, port: int | str | None = None) -> float:
    """Wait until the server answers; return how long that took."""
    started = time.monotonic()
    while not server_answers(vendor, port):
        if time.monotonic() - started > timeout:
            raise AssertionError(
                f"the {vendor} server on port {_port(vendor, port)} did not answer within {timeout:g}s"
            )
        time.sleep(0.2)
    return time.monotonic() - started


def _pg_version() -> str:
    return sorted(os.listdir("/etc/postgresql"))[-1]


def _pg_cluster(port: int) -> tuple[str, str]:
    """The PostgreSQL cluster (version, name) that listens on ``port``: CI's own on the
    default port, whatever ``pg_lsclusters`` says (it may not list a cluster that is down)."""
    if port == DEFAULT_PORTS["postgresql"]:
        return _pg_version(), "main"
    listing = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True, timeout=30)
    for line in listing.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(port):
            return fields[0], fields[1]
    raise AssertionError(f"no PostgreSQL cluster of this machine listens on port {port} (pg_lsclusters)")


def _mariadb_pid(port: int = DEFAULT_PORTS["mysql"]) -> int | None:
    """The pid of the MariaDB server on ``port``, from its pid file."""
    if port == DEFAULT_PORTS["mysql"]:
        pid_file = "/run/mysqld/mysqld.pid"
    else:
        asked = subprocess.run(
            ["mysql", "-uroot", "-h127.0.0.1", "-P", str(port), "-NBe", "SELECT @@pid_file"],
            capture_output=True, text=True, timeout=15, check=False,
        )  # fmt: skip
        pid_file = asked.stdout.strip()
        if asked.returncode != 0 or not pid_file:
            return None
    try:
        pid = int(Path(pid_file).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start_server(vendor: str, port: int | str | None = None) -> None:
    """Start the local server (the commands of SERVICES.md, or the instance on ``port``);
    no-op if it is running."""
    at = _port(vendor, port)
    if vendor == "mysql":
        if at == DEFAULT_PORTS["mysql"]:
            # By its pid file: another mariadbd on this machine (a Galera test node, the
            # nemesis's instance on 3307) must not pass for this one.
            _run(
                "start-stop-daemon", "--start", "--oknodo", "--background",
                "--pidfile", "/run/mysqld/mysqld.pid", "--exec", "/usr/sbin/mariadbd",
            )  # fmt: skip
            return
        argv = _mariadb_argv.get(at)
        if argv is None:
            raise AssertionError(f"the MariaDB instance on port {at} is down and its command line is unknown")
        # Detached, its output not ours (start-stop-daemon's --pidfile check needs a pid file
        # the instance may not name).
        quiet = subprocess.DEVNULL
        subprocess.run(["setsid", "--fork", *argv], stdin=quiet, stdout=quiet, stderr=quiet, check=True, timeout=60)
    else:
        version, cluster = _pg_cluster(at)
        _run("pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "start", timeout=120)


def restart_server(vendor: str, port: int | str | None = None) -> float:
    """Stop and start the local server (on ``port``); return seconds until it answered again."""
    started = time.monotonic()
    at = _port(vendor, port)
    if vendor == "mysql":
        pid = _mariadb_pid(at)
        if pid is not None and at != DEFAULT_PORTS["mysql"]:
            _mariadb_argv[at] = Path(f"/proc/{pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")
        where = ["--protocol=socket"] if at == DEFAULT_PORTS["mysql"] else ["-h127.0.0.1", "-P", str(at)]
        _run("mysqladmin", "-uroot", *where, "shutdown", timeout=120)
        while pid is not None and _pid_alive(pid):
            if time.monotonic() - started > 120:
                raise AssertionError(f"mariadbd (port {at}) did not stop within 120s")
            time.sleep(0.05)
        start_server(vendor, at)
    else:
        version, cluster = _pg_cluster(at)
        _run("pg_ctlcluster", "--skip-systemctl-redirect", version, cluster, "restart", timeout=120)
    wait_until_answers(vendor, port=at)
    return time.monotonic() - started


def ensure_server_up(vendor: str, port: int | str | None = None) -> None:
    """Bring the server back whatever happened (called from ``finally``)."""
    if server_answers(vendor, port):
        return
    start_server(vendor, port)
    wait_until_answers(vendor, port=port)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def have_server_tools(vendor: str) -> bool:
    tools = ["mysqladmin", "start-stop-daemon"] if vendor == "mysql" else ["pg_ctlcluster", "psql"]
    return all(shutil.which(tool) for tool in tools) and os.geteuid() == 0


# -- the table -------------------------------------------------------------------------


def table_snapshot() -> list[tuple[Any, ...]]:
    """Every column of every resource row, in primary-key order (to prove nothing was written)."""
    from resource_lease.models import Resource

    names = [f.attname for f in Resource._meta.concrete_fields]
    return list(Resource.objects.order_by("pk").values_list(*names))


def poll_acquire(
    kind: str, *, ttl: float, timeout: float, pause: float = 0.02, **kwargs: Any
) -> tuple[Any, float, float]:
    """Try ``acquire(kind, timeout=0)`` every ``pause`` seconds until it succeeds.

    Returns (lease, monotonic time the successful attempt was sent, time it was received),
    so a takeover is timed to within one pause, not one backoff step.
    """
    from resource_lease import acquire
    from resource_lease.exceptions import NoResourceAvailable

    deadline = time.monotonic() + timeout
    while True:
        sent = time.monotonic()
        try:
            lease = acquire(kind, ttl=ttl, timeout=0, **kwargs)
        except NoResourceAvailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)
            continue
        return lease, sent, time.monotonic()


@dataclass
class ChurnResult:
    """What a set of churn workers (tests/procs/churn.py) reported, put together.

    ``grants`` are on the host's monotonic clock; ``db_grants`` are the same grants as
    instants of the database's clock (``acquired_at``): their order must agree with their
    fences. (Their end is not known there: renewals and the release move ``expires_at``.)
    """

    grants: list[Grant]
    db_grants: list[Grant]
    latencies: list[float]
    counts: dict[str, int]
    retried: dict[str, int]
    errors: list[str]

    @property
    def violations(self) -> list[str]:
        found = [str(v) for v in exclusion_violations(self.grants)]
        found += [f"by the database's clock: {v}" for v in exclusion_violations(self.db_grants)]
        found += [f"unexpected error: {e}" for e in self.errors]
        if self.counts.get("release_refused"):
            found.append(f"{self.counts['release_refused']} releases refused (a lease lost while held)")
        return found


def run_churn(
    start_child: Callable[..., Child],
    *,
    kind: str,
    workers: int,
    seconds: float,
    ttl: float,
    hold: float = 0.02,
    fenced: bool = False,
    env: dict[str, str] | None = None,
    envs: Sequence[dict[str, str]] = (),
) -> ChurnResult:
    """Run ``workers`` churn processes (tests/procs/churn.py) on ``kind`` for ``seconds``, all starting together.

    ``envs`` gives per-worker environment additions (cycled), e.g. skewed clocks.
    """
    import datetime as dt

    children = []
    for i in range(workers):
        extra = dict(env or {})
        if envs:
            extra.update(envs[i % len(envs)])
        flags = ["--fenced"] if fenced else []
        children.append(
            start_child("churn", "--kind", kind, "--seconds", seconds, "--ttl", ttl, "--hold", hold, *flags, env=extra)
        )
    for child in children:
        child.wait_for("ready", timeout=60)
    for child in children:
        child.send("go")
    result = ChurnResult([], [], [], {}, {}, [])
    for child in children:
        done = child.wait_for("done", timeout=seconds + 60)
        for pk, fence, start, end, acquired_at, _expires_at in done["grants"]:
            result.grants.append(Grant(pk, fence, done["worker"], start, end))
            granted = dt.datetime.fromisoformat(acquired_at).timestamp()
            result.db_grants.append(Grant(pk, fence, done["worker"], granted, granted))
        result.latencies += done["latencies"]
        for name, n in done["counts"].items():
            result.counts[name] = result.counts.get(name, 0) + n
        for name, n in done["retried"].items():
            result.retried[name] = result.retried.get(name, 0) + n
        result.errors += done["errors"]
        child.finish()
    return result


def exclusion_race(
    spawn_worker: Callable[..., subprocess.Popen[str]],
    directory: Path,
    *,
    kind: str,
    workers: int,
    seconds: float,
    naive: bool = False,
    envs: Sequence[dict[str, str]] = ({},),
    ttl: float = 10.0,
    enough: int = 30,
) -> tuple[Any, int]:
    """Race ``workers`` processes of the exclusion worker (tests/procs/exclusion.py) on ``kind``
    and judge their ledger with tests/ledger.py. ``envs`` (cycled) adds per-worker
    environment, e.g. a skewed clock. Each worker goes on past ``seconds`` until it recorded
    its share of ``enough`` grants (on a loaded machine, slow starts ate into a fixed run).
    Returns (verdict, number of workers that failed)."""
    from tests.conftest import worker_env
    from tests.ledger import check
    from tests.procs.exclusion import at_least

    args = ["--kind", kind, "--dir", str(directory), "--seconds", str(seconds), "--ttl", str(ttl)]
    args += at_least(enough, workers)
    procs = [
        spawn_worker(
            "tests.procs.exclusion",
            *args,
            *(["--naive"] if naive else []),
            env=worker_env(DJANGO_SETTINGS_MODULE="tests.faults.settings", **envs[i % len(envs)]),
        )
        for i in range(workers)
    ]
    failed = sum(proc.wait(timeout=seconds + 120) != 0 for proc in procs)
    return check(directory), failed
