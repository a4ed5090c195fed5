"""MariaDB Galera Cluster: what the MySQL dialect needs to lease safely on a cluster.

Galera replicates every write set to all nodes of the primary component and certifies it
before it commits, so the engine's single conditional UPDATE stays the one thing that decides
a race, whichever node runs it: two grants of one row on two nodes conflict at certification
and one of them fails with a deadlock error (1213), which the engine retries like any
deadlock. What a cluster adds, and this module handles:

- Causality. A node applies other nodes' write sets asynchronously after they are certified,
  so without ``wsrep_sync_wait`` a renewal, release or read-back on node B could miss a grant
  that node A has committed, and refuse a live lease. The engine's sessions wait for the
  node to catch up before every read and UPDATE (``SYNC_WAIT``), set only when ``wsrep_on``.
- Nodes that cannot serve. A node that is not ready (joining, or outside the primary
  component) answers every statement with error 1047; a node that left the primary component
  is treated as a lost connection (``classify_not_ready``), the others as a transient error.
- Several hosts. An alias may list the cluster's nodes (``CLUSTER_HOSTS`` in its DATABASES
  entry, or a DATABASE_URL with several hosts): the engine's connections then move to the next
  node when theirs dies or leaves the primary component (``connect``).
- The system check's view of a node (``node_report``), and the node clocks it compares.

The Galera facts this relies on: docs/pitfalls.md#galera.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("resource_lease")

#: ``wsrep_sync_wait`` for the engine's sessions: 1 (reads: SELECT, SHOW, BEGIN) + 2 (UPDATE
#: and DELETE) + 4 (INSERT and REPLACE: named rows are created on first use, and an insert
#: that cannot see a row another node just created would only fail certification).
SYNC_WAIT = 7
#: ER_UNKNOWN_COM_ERROR, as Galera uses it: "WSREP has not yet prepared node for application use".
ER_WSREP_NOT_READY = 1047
#: The key of a DATABASES entry that lists the alias's cluster nodes.
HOSTS_KEY = "CLUSTER_HOSTS"


class NodeNotUsable(Exception):
    """A node answered but cannot serve leases (not ready, or outside the primary component)."""


def parse_host(value: Any, default_port: int = 3306) -> tuple[str, int]:
    """``"host"``, ``"host:port"``, ``"[v6]:port"`` or ``(host, port)`` as ``(host, port)``."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        host, port = str(value[0]), int(value[1])
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        if text.startswith("["):  # [::1]:3306
            host, _, rest = text[1:].partition("]")
            port = int(rest[1:]) if rest.startswith(":") else default_port
        elif text.count(":") == 1:
            host, port_text = text.split(":")
            port = int(port_text)
        else:
            host, port = text, default_port
    else:
        raise ValueError(f"{HOSTS_KEY} entries are 'host', 'host:port' or (host, port); got {value!r}")
    if not host or not 0 < port < 65536:
        raise ValueError(f"{HOSTS_KEY} entry {value!r} has no host or a port out of range")
    return host, port


def cluster_hosts(settings_dict: dict[str, Any]) -> list[tuple[str, int]]:
    """The nodes a DATABASES entry lists in ``CLUSTER_HOSTS``, in order; [] if it lists none."""
    raw = settings_dict.get(HOSTS_KEY) or []
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part.strip()]
    default_port = int(settings_dict.get("PORT") or 3306)
    return [parse_host(value, default_port) for value in raw]


# -- one session -------------------------------------------------------------------------


def wsrep_on(cursor: Any) -> bool:
    """Whether this session replicates through Galera (``wsrep_on``; absent on MySQL)."""
    cursor.execute("SHOW SESSION VARIABLES LIKE 'wsrep\\_on'")
    rows = cursor.fetchall()
    return bool(rows) and str(rows[0][1]).upper() == "ON"


def node_state(cursor: Any) -> tuple[str, str]:
    """``(wsrep_cluster_status, wsrep_ready)`` of the node: ("Primary", "ON") when it serves."""
    cursor.execute("SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_status', 'wsrep_ready')")
    values = {str(name).lower(): str(value) for name, value in cursor.fetchall()}
    return values.get("wsrep_cluster_status", ""), values.get("wsrep_ready", "")


def setup_session(raw_connection: Any, *, require_ready: bool) -> bool:
    """Galera settings for an engine session; returns whether the server is a Galera node.

    With ``require_ready`` (the alias lists several nodes) a node that is not ready or not in
    the primary component raises ``NodeNotUsable``, so the caller moves to the next node
    rather than fail every statement on this one.
    """
    cursor = raw_connection.cursor()
    try:
        if not wsrep_on(cursor):
            return False
        if require_ready:
            status, ready = node_state(cursor)
            if status != "Primary" or ready != "ON":
                raise NodeNotUsable(f"wsrep_cluster_status={status or '?'}, wsrep_ready={ready or '?'}")
        # Every read and UPDATE first waits until this node has applied every write set the
        # cluster had certified when the statement arrived: a renewal or release on this node
        # then sees a grant another node made, and a read-back sees what was committed.
        cursor.execute("SET SESSION wsrep_sync_wait = %s", (SYNC_WAIT,))
        return True
    finally:
        cursor.close()


def classify_not_ready(raw_connection: Any, *, several_hosts: bool) -> str:
    """How to treat error 1047 (node not ready): "transient" or "disconnect".

    A node still in the primary component that is briefly not ready (a view change, a
    donor's pause) is retried like a deadlock. A node outside the primary component will not
    serve until the cluster heals: treated as a lost connection, so the engine drops it and
    (with several hosts) reconnects to another node. With several hosts any 1047 moves on,
    since another node can serve now. The statement did not run either way.
    """
    if several_hosts or raw_connection is None:
        return "disconnect"
    try:
        cursor = raw_connection.cursor()
        try:
            status, _ready = node_state(cursor)
        finally:
            cursor.close()
    except Exception:  # the node does not even answer SHOW STATUS: as good as gone
        logger.debug("probing a node that is not ready failed", exc_info=True)
        return "disconnect"
    return "transient" if status == "Primary" else "disconnect"


# -- several hosts -----------------------------------------------------------------------


class HostRotation:
    """Which node of an alias an engine connection tries next.

    Sticky and in the listed order: a connection starts at the first node, stays on the node
    that last worked, and moves on (wrapping round) when it fails. One node taking the
    writes is what Galera prefers (writes to one row from several nodes at once end in
    certification conflicts); list the nodes in another order on some clients to spread them.
    """

    def __init__(self, hosts: Sequence[tuple[str, int]]) -> None:
        self.hosts = list(hosts)
        self.current = 0

    def order(self) -> list[tuple[str, int]]:
        """Every node, the current one first."""
        return self.hosts[self.current :] + self.hosts[: self.current]

    def settle(self, host: tuple[str, int]) -> None:
        self.current = self.hosts.index(host)

    def skip(self) -> None:
        """The current node failed: try the next one first next time (a node that hangs
        rather than refuses would otherwise cost a whole connect timeout every time)."""
        self.current = (self.current + 1) % len(self.hosts)


def connect(
    wrapper: BaseDatabaseWrapper, rotation: HostRotation, setup: Any, *, what: str = "lease connection"
) -> None:
    """Open ``wrapper``'s connection on the first node of ``rotation`` that connects and
    passes ``setup(raw_connection)``; raise the last node's error if none does."""
    import MySQLdb
    from django.db import DatabaseError

    last: BaseException | None = None
    for host, port in rotation.order():
        wrapper.settings_dict["HOST"], wrapper.settings_dict["PORT"] = host, str(port)
        try:
            wrapper.ensure_connection()
            setup(wrapper.connection)
        except (DatabaseError, MySQLdb.Error, NodeNotUsable) as exc:  # down or cannot serve: try the next
            last = exc
            logger.info("%s: node %s:%s unusable, trying the next: %s", what, host, port, exc)
            raw, wrapper.connection = wrapper.connection, None
            if raw is not None:
                try:
                    raw.close()
                except Exception:
                    logger.debug("closing a rejected connection failed", exc_info=True)
            continue
        if rotation.current != rotation.hosts.index((host, port)):
            logger.warning("%s moved to cluster node %s:%s", what, host, port)
        rotation.settle((host, port))
        return
    assert last is not None
    raise last


# -- what the system check looks at ------------------------------------------------------


def may_be_node(connection: BaseDatabaseWrapper) -> bool:
    """Whether a Django connection's server can be a Galera node (MySQL/MariaDB)."""
    return connection.vendor == "mysql"


def node_report_at(connection: BaseDatabaseWrapper, host: str, port: int) -> dict[str, str] | str:
    """Another node's ``node_report`` (``{}`` if wsrep is off) through a throwaway connection
    with ``connection``'s settings, or why it could not be had."""
    import MySQLdb
    from django.db import DatabaseError

    # A bare driver connection: no init_command nor Django's session set-up, which a node
    # outside the primary component would refuse (error 1047) before it could be asked why.
    settings_dict = {**connection.settings_dict, "HOST": host, "PORT": str(port)}
    params = type(connection)(settings_dict, connection.alias).get_connection_params()
    params.pop("init_command", None)
    try:
        raw = MySQLdb.connect(**params)
    except (DatabaseError, MySQLdb.Error) as exc:  # the check reports a dead node, it does not crash on it
        return str(exc)
    try:
        cursor = raw.cursor()
        return node_report(cursor) or {}
    except (DatabaseError, MySQLdb.Error) as exc:
        return str(exc)
    finally:
        raw.close()


def node_report(cursor: Any) -> dict[str, str] | None:
    """The settings and status of a node that matter to leases; None if wsrep is off.

    Keys: wsrep_cluster_status, wsrep_ready, wsrep_cluster_size, wsrep_local_state_comment,
    session_sync_wait (this session's), global_sync_wait, binlog_format, wsrep_dirty_reads,
    wsrep_provider_options, utc_now (the node's clock, 'YYYY-MM-DD HH:MM:SS.ffffff').
    """
    if not wsrep_on(cursor):
        return None
    cursor.execute(
        "SHOW STATUS WHERE Variable_name IN"
        " ('wsrep_cluster_status', 'wsrep_ready', 'wsrep_cluster_size', 'wsrep_local_state_comment')"
    )
    report = {str(name).lower(): str(value) for name, value in cursor.fetchall()}
    cursor.execute(
        "SELECT @@SESSION.wsrep_sync_wait, @@GLOBAL.wsrep_sync_wait, @@GLOBAL.binlog_format,"
        " @@GLOBAL.wsrep_dirty_reads, @@GLOBAL.wsrep_provider_options, UTC_TIMESTAMP(6)"
    )
    session_wait, global_wait, binlog_format, dirty, options, now = cursor.fetchone()
    report.update(
        session_sync_wait=str(session_wait),
        global_sync_wait=str(global_wait),
        binlog_format=str(binlog_format),
        wsrep_dirty_reads=str(dirty),
        wsrep_provider_options=str(options or ""),
        utc_now=str(now),
    )
    return report


def provider_option(options: str, name: str) -> str | None:
    """One value of ``wsrep_provider_options`` ('a = 1; b = no; ...'), or None."""
    for item in options.split(";"):
        key, sep, value = item.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return None
