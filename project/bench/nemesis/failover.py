"""The nemesis's ``failover`` fault: the primary of a Patroni cluster (scripts/patroni) taken
away, one of four ways, and the cluster made whole again (docs/ha.md, docs/jepsen.md).

- ``kill``: SIGKILL the primary's Patroni and PostgreSQL (a crashed machine); it is started
  again once another node accepts writes, and rejoins as a replica;
- ``stop``: SIGSTOP them (a hung machine) until another node accepts writes, past Patroni's
  ttl; then SIGCONT: it finds its key gone and demotes itself;
- ``switchover``: ``patronictl switchover`` (planned);
- ``cut``: drop every packet to and from the primary (nftables: its PostgreSQL and REST
  ports, its way to etcd) until another node accepts writes; then heal the cut.

Available when the database's settings list several hosts and ``scripts/patroni status``
says the cluster on this machine is whole; the nemesis waits for each failover to end (a new
primary accepts writes, the old node is back) before its next fault.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from django.db import connections

REPO = Path(__file__).resolve().parents[3]
PATRONI = REPO / "scripts" / "patroni"
KINDS = ("kill", "stop", "switchover", "cut")
#: Seconds a failover may take before the nemesis gives up on it (Patroni's ttl here: 10 s).
DEADLINE = 90.0
#: Seconds after the cluster is whole again during which clients may still wait on the old
#: primary: two io timeouts of the engine (LOCK_WAIT_TIMEOUT + 5 s each, db/connections.py).
AFTERMATH = 20.0


def patroni(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PATRONI), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def cluster_ports(alias: str) -> list[int]:
    """The ports of a multi-host PostgreSQL alias ([] for anything else)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    ports = str(connection.settings_dict.get("PORT") or "")
    hosts = str(connection.settings_dict.get("HOST") or "")
    if "," not in hosts:
        return []
    return [int(p) for p in ports.split(",") if p.strip().isdigit()]


def failover_allowed(alias: str) -> str:
    """Why the primary cannot be failed over ('' if it can)."""
    if not cluster_ports(alias):
        return "the database is not a cluster (a PostgreSQL URL listing the nodes of scripts/patroni)"
    if os.geteuid() != 0:
        return "failing over the cluster's nodes needs root (they run as postgres; a cut uses nftables)"
    if not PATRONI.exists() or patroni("status", timeout=60).returncode != 0:
        return "scripts/patroni status: no whole Patroni cluster on this machine"
    expected = [int(os.environ.get("RESOURCE_LEASE_PATRONI_PORT", "5441")) + i for i in range(3)]
    if sorted(cluster_ports(alias)) != expected:
        return f"the database's ports {cluster_ports(alias)} are not scripts/patroni's {expected}"
    return ""


@dataclass
class Failover:
    kind: str
    old: int  # the old primary's node (1-3)
    new: int
    started: int  # monotonic ns: the fault
    new_primary: int  # monotonic ns: another node accepted writes
    whole: int  # monotonic ns: the old node back (restarted, resumed, healed)

    @property
    def seconds(self) -> float:
        """From the fault to a new primary accepting writes."""
        return (self.new_primary - self.started) / 1e9


def leader() -> int:
    """The leader's node (1-3); for a moment after a healed cut or a failover the cluster may
    name none: asked again for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        answer = patroni("leader", timeout=30)
        if answer.returncode == 0 and answer.stdout.strip().isdigit():
            return int(answer.stdout.strip())
        if time.monotonic() > deadline:
            raise RuntimeError(f"scripts/patroni leader: {answer.stderr or answer.stdout}")
        time.sleep(1)


def wait_writable(ports: list[int], others: list[int], user: str, dbname: str) -> int:
    """Until a node of ``others`` (1-3) accepts writes; which."""
    import psycopg

    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            with psycopg.connect(
                host=",".join("127.0.0.1" for _ in others),
                port=",".join(str(ports[n - 1]) for n in others),
                user=user,
                dbname=dbname,
                target_session_attrs="read-write",
                connect_timeout=2,
            ) as db:
                return ports.index(int(db.info.port)) + 1
        except psycopg.Error:
            if time.monotonic() > deadline:
                status = patroni("status", timeout=60).stdout
                raise RuntimeError(f"no new primary {DEADLINE:.0f}s after the fault:\n{status}") from None
            time.sleep(0.3)


def fail_over(alias: str, kind: str) -> Failover:
    """Take the primary away by ``kind``, wait for a new one, make the cluster whole again."""
    if kind not in KINDS:
        raise ValueError(f"failover kind must be one of {', '.join(KINDS)}, got {kind!r}")
    settings = connections[alias].settings_dict
    ports = sorted(cluster_ports(alias))
    old = leader()
    action = {"kill": "kill", "stop": "pause", "switchover": "switchover", "cut": "cut"}[kind]
    started = time.monotonic_ns()
    done = patroni(*([action] if kind == "switchover" else [action, str(old)]))
    if done.returncode != 0:
        patroni("heal")
        raise RuntimeError(f"scripts/patroni {action}: {done.stderr or done.stdout}")
    try:
        new = wait_writable(ports, [n for n in (1, 2, 3) if n != old], str(settings["USER"]), str(settings["NAME"]))
        new_primary = time.monotonic_ns()
    finally:
        if kind == "stop":
            patroni("resume", str(old))
        elif kind == "cut":
            patroni("heal")
    if kind == "kill":
        patroni("start", str(old), timeout=DEADLINE + 120)
    connections[alias].close()  # the nemesis's own connection was on the old primary
    return Failover(kind, old, new, started, new_primary, time.monotonic_ns())
