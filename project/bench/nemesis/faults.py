"""The nemesis: the faults it injects into the clients and the database server.

- ``kill``: SIGKILL a random client (a new one takes its place);
- ``stop``: SIGSTOP a random client for 0.2 to 2.5 ttl, then SIGCONT (past its ttl, its
  grants expire and are taken over while it sleeps);
- ``cut``: end a random session of the database from the server side (``KILL CONNECTION``
  on MySQL/MariaDB, ``pg_terminate_backend`` on PostgreSQL: tests/faults/harness.py);
- ``restart``: restart the local database server (tests/faults/harness.py's helper), only
  when ``RESOURCE_LEASE_FAULTS_NO_RESTART`` is unset, the server is on this machine and we
  are root;
- ``failover``: take the primary of a Patroni cluster away (SIGKILL, SIGSTOP, switchover or
  a network cut, in turn from one drawn at random) and make the cluster whole again (failover.py), at most once per
  ``restart_every`` seconds, only when the database is the cluster of scripts/patroni;
- ``skew``: move a random client's wall clock (libfaketime reads the client's own
  timestamp file at every call: +5 h, -7 h, +90 s, back to 0). The monotonic clock, which
  the history is written in and the engine's local deadlines use, is left alone.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connections

from project.bench.nemesis import failover
from project.bench.nemesis.checker import FaultLog
from tests.faults.harness import (
    FAKETIME_SITE,
    LIBFAKETIME,
    ensure_server_up,
    have_server_tools,
    restart_server,
)

SKEWS = ("+5h", "-7h", "+90s", "+0")
REPO = Path(__file__).resolve().parents[3]


def restart_allowed(alias: str) -> str:
    """Why the server may not be restarted ('' if it may)."""
    connection = connections[alias]
    if connection.vendor == "sqlite":
        return "SQLite has no server"
    if os.environ.get("RESOURCE_LEASE_FAULTS_NO_RESTART"):
        return "RESOURCE_LEASE_FAULTS_NO_RESTART is set"
    if connection.settings_dict.get("HOST") not in ("127.0.0.1", "localhost", ""):
        return "the server is not on this machine"
    if not have_server_tools(connection.vendor):
        return "restarting the server needs root and its tools"
    return ""


def skew_available(alias: str) -> str:
    """Why client clocks cannot be skewed ('' if they can)."""
    if connections[alias].vendor == "sqlite":
        return "SQLite's clock is each client's own wall clock"
    if not LIBFAKETIME.exists():
        return f"libfaketime is not installed ({LIBFAKETIME})"
    return ""


@dataclass
class Proc:
    name: str
    argv: list[str]
    popen: subprocess.Popen[bytes]
    clock_file: Path | None
    stopped_until: float = 0.0


@dataclass
class Nemesis:
    """Starts the clients, injects the faults, keeps the log the checker reads."""

    alias: str
    directory: Path
    env: dict[str, str]
    ttl: float
    kinds: tuple[str, ...]
    restart_every: float
    skew: bool
    rng: random.Random = field(default_factory=random.Random)
    procs: dict[str, Proc] = field(default_factory=dict)
    log: FaultLog = field(default_factory=FaultLog)
    counts: Counter[str] = field(default_factory=Counter)
    last_restart: float = field(default_factory=time.monotonic)
    order: list[str] = field(default_factory=list)
    #: The failover fault's kinds, taken in turn (failover.KINDS), and the failovers made.
    failover_kinds: tuple[str, ...] = failover.KINDS
    failovers: list[failover.Failover] = field(default_factory=list)
    last_failover: float = field(default_factory=time.monotonic)
    failover_start: int = 0
    #: Tries at which the cluster was not whole (no failover then), and what status said last.
    failover_not_whole: int = 0
    failover_last_status: str = ""

    # -- clients ---------------------------------------------------------------------

    def spawn(self, name: str, argv: list[str]) -> Proc:
        env = dict(self.env)
        clock_file = None
        if self.skew:
            clock_file = self.directory / f"clock-{name}"
            clock_file.write_text(self.rng.choice(SKEWS) + "\n")
            env.update(
                LD_PRELOAD=str(LIBFAKETIME),
                FAKETIME_TIMESTAMP_FILE=str(clock_file),
                FAKETIME_NO_CACHE="1",
                FAKETIME_DONT_FAKE_MONOTONIC="1",
                PYTHONPATH=os.pathsep.join([str(FAKETIME_SITE), str(REPO)]),
            )
        with open(self.directory / f"client-{name}.log", "ab") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "project.bench.nemesis.client", *argv],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, argv, popen, clock_file)
        self.procs[name] = proc
        return proc

    def living(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.popen.poll() is None]

    def started(self, proc: Proc) -> bool:
        """Whether the client has set up and begun its history (a client still starting is
        never a victim: on a loaded machine a replacement can take seconds to start)."""
        return (self.directory / f"history-{proc.name}-{proc.popen.pid}").exists()

    def wait_for_starts(self, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while not all(self.started(p) for p in self.living()):
            if time.monotonic() > end:
                raise RuntimeError(f"the clients did not start within {timeout:g}s: see {self.directory}/client-*.log")
            time.sleep(0.1)

    # -- faults ----------------------------------------------------------------------

    def step(self) -> str:
        """Wake clients whose stop is over, then inject one fault; its name."""
        self.wake(time.monotonic())
        # Every kind once, in a random order, before any comes again (a short run sees them all).
        if not self.order:
            self.order = self.rng.sample(self.kinds, len(self.kinds))
        kind = self.order.pop()
        if kind == "restart" and time.monotonic() - self.last_restart < self.restart_every:
            return ""
        if kind == "failover" and time.monotonic() - self.last_failover < self.restart_every:
            return ""
        done = getattr(self, f"_{kind}")()
        if done:
            self.counts[kind] += 1
        return kind if done else ""

    def wake(self, now: float, *, everyone: bool = False) -> None:
        for proc in self.procs.values():
            if proc.stopped_until and (everyone or proc.stopped_until <= now):
                self._signal(proc, signal.SIGCONT)
                self.log.stopped[proc.popen.pid][-1] = (self.log.stopped[proc.popen.pid][-1][0], time.monotonic_ns())
                proc.stopped_until = 0.0

    def _victim(self) -> Proc | None:
        candidates = [p for p in self.living() if not p.stopped_until and self.started(p)]
        return self.rng.choice(candidates) if candidates else None

    def _kill(self) -> bool:
        proc = self._victim()
        if proc is None:
            return False
        self._signal(proc, signal.SIGKILL)
        proc.popen.wait()
        self.log.killed.add(proc.popen.pid)
        self.spawn(proc.name, proc.argv)
        return True

    def _stop(self) -> bool:
        proc = self._victim()
        if proc is None:
            return False
        seconds = self.rng.uniform(0.2, 2.5) * self.ttl
        self._signal(proc, signal.SIGSTOP)
        proc.stopped_until = time.monotonic() + seconds
        self.log.stopped[proc.popen.pid].append((time.monotonic_ns(), time.monotonic_ns() + int(seconds * 1e9)))
        return True

    def _cut(self) -> bool:
        sessions = client_sessions(self.alias)
        if not sessions:
            return False
        try:
            end_session(self.alias, self.rng.choice(sessions))
        except Exception:  # noqa: BLE001  (the session ended by itself meanwhile)
            return False
        return True

    def _restart(self) -> bool:
        vendor = connections[self.alias].vendor
        port = connections[self.alias].settings_dict.get("PORT") or None  # another instance than CI's
        down = time.monotonic_ns()
        try:
            restart_server(vendor, port)
        finally:
            ensure_server_up(vendor, port)
            self.log.down.append((down, time.monotonic_ns()))
            self.last_restart = time.monotonic()
            connections[self.alias].close()
        return True

    def _failover(self) -> bool:
        status = failover.patroni("status", timeout=60)
        if status.returncode != 0:
            self.failover_not_whole += 1
            self.failover_last_status = (status.stdout + status.stderr)[-1500:]
            failover.patroni("reap", timeout=60)  # a stray postmaster keeps a replica from rejoining
            return False  # not whole yet after the last one: a replica still rejoining
        # In turn, from a kind drawn at random (a short run that fails over thrice still
        # meets every kind across runs).
        if not self.failovers:
            self.failover_start = self.rng.randrange(len(self.failover_kinds))
        kind = self.failover_kinds[(self.failover_start + len(self.failovers)) % len(self.failover_kinds)]
        try:
            made = failover.fail_over(self.alias, kind)
        finally:
            self.last_failover = time.monotonic()
        self.failovers.append(made)
        # Waits during the failover may outlast their timeout: the server was away, and for
        # two io timeouts after (a statement hung on the cut or resumed old primary until
        # tcp_user_timeout, then a connect to it until connect_timeout), as
        # tests/test_partitions.py allows after a partition heals.
        self.log.down.append((made.started, made.whole + int(failover.AFTERMATH * 1e9)))
        return True

    def _skew(self) -> bool:
        proc = self._victim()
        if proc is None or proc.clock_file is None:
            return False
        proc.clock_file.write_text(self.rng.choice(SKEWS) + "\n")
        return True

    @staticmethod
    def _signal(proc: Proc, sig: int) -> None:
        try:
            os.kill(proc.popen.pid, sig)
        except ProcessLookupError:
            pass

    def finish(self, deadline: float) -> list[str]:
        """Wake everyone; wait for the clients to end by ``deadline``; kill and name those that do not."""
        self.wake(time.monotonic(), everyone=True)
        hung = []
        for proc in self.procs.values():
            try:
                proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung.append(proc.name)
                proc.popen.kill()
                proc.popen.wait()
        return hung

    def summary(self) -> dict[str, Any]:
        counts: dict[str, Any] = dict(sorted(self.counts.items()))
        for made in self.failovers:
            key = f"failover_{made.kind}"
            counts[key] = counts.get(key, 0) + 1
        return counts


def client_sessions(alias: str) -> list[int]:
    """Server-side ids of the other sessions on this database (the clients' ones)."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()"
            )
        elif connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        else:
            return []
        return [int(row[0]) for row in cursor.fetchall()]


def end_session(alias: str, session: int) -> None:
    """End one session from the server side, as tests/faults/harness.py does for the default alias."""
    connection = connections[alias]
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"KILL CONNECTION {int(session)}")
        else:
            cursor.execute("SELECT pg_terminate_backend(%s)", [int(session)])
