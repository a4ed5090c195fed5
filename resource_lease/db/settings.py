"""Recommended DATABASES entries per vendor, for projects that configure by URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dj_database_url

from resource_lease.db.galera import HOSTS_KEY, SYNC_WAIT, parse_host

# scheme://[userinfo@]hosts/rest, where hosts may be a comma-separated list (Galera nodes).
_URL = re.compile(r"^(?P<scheme>[a-z0-9+.-]+://)(?P<userinfo>[^@/]*@)?(?P<hosts>[^/?#]*)(?P<rest>.*)$", re.I)


def database_from_url(url: str, *, test_dir: Path | None = None) -> dict[str, Any]:
    """A DATABASES entry for ``url`` (mysql://, postgres://, sqlite://) set up for leasing.

    - MySQL/MariaDB: UTC session time zone whatever the server's (``NOW()`` and
      ``CURRENT_TIMESTAMP`` follow the session's zone while Django stores UTC:
      docs/pitfalls.md#database-clock), utf8mb4, READ COMMITTED (docs/pitfalls.md#read-committed).
    - SQLite: WAL, a busy timeout and IMMEDIATE transactions so several processes can lease
      at once (SQLite has no ``SELECT ... FOR UPDATE``, and without these concurrent writers
      fail with "database is locked": docs/pitfalls.md#sqlite); tests use a file
      (``test_dir``), never memory, so worker processes see the same database.
    - PostgreSQL: as dj-database-url gives it. Several hosts
      (``postgres://user@h1:5432,h2:5432,h3:5432/name?target_session_attrs=read-write``, a
      Patroni cluster) become libpq's host and port lists (HOST ``"h1,h2,h3"``, PORT
      ``"5432,5432,5432"``), with ``target_session_attrs=read-write`` unless the URL says
      otherwise, so every connection, the LISTEN one included, goes to the current primary:
      docs/ha.md.
    - MariaDB Galera: ``mysql://user:pw@node1:3306,node2:3306,node3:3306/name`` lists the
      cluster's nodes. HOST/PORT are the first node (the alias's own connections use it) and
      ``CLUSTER_HOSTS`` all of them, in order (the lease engine fails over between them); the
      connections also wait for causality (``wsrep_sync_wait``), see docs/galera.md and
      docs/pitfalls.md#galera.
    """
    hosts: list[str] = []
    pg_hosts: list[tuple[str, int]] = []
    match = _URL.match(url)
    if match and "," in match["hosts"]:
        scheme = match["scheme"].lower()
        if scheme.startswith("postgres") or scheme.startswith("pgsql"):
            try:
                pg_hosts = [parse_host(part, 5432) for part in match["hosts"].split(",") if part.strip()]
            except ValueError as exc:
                raise ValueError(f"a host of DATABASE_URL is not 'host' or 'host:port': {url!r}") from exc
        elif scheme.startswith("mysql"):
            parsed = [parse_host(part) for part in match["hosts"].split(",") if part.strip()]
            hosts = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in parsed]
        else:
            raise ValueError(
                f"several hosts in DATABASE_URL are supported for mysql:// (Galera) and postgres:// (Patroni) only: {url!r}"
            )
        url = f"{match['scheme']}{match['userinfo'] or ''}{match['hosts'].split(',')[0]}{match['rest']}"
    config: dict[str, Any] = dict(dj_database_url.parse(url, conn_max_age=0))
    options: dict[str, Any] = dict(config.get("OPTIONS") or {})
    engine = config["ENGINE"]
    if pg_hosts:
        # libpq takes the lists itself and connects to the first host that answers and, with
        # target_session_attrs=read-write, accepts writes: the primary, wherever it is now.
        config["HOST"] = ",".join(h for h, _ in pg_hosts)
        config["PORT"] = ",".join(str(p) for _, p in pg_hosts)
        options.setdefault("target_session_attrs", "read-write")
    if engine.endswith("mysql"):
        options.setdefault("charset", "utf8mb4")
        if hosts:
            config[HOSTS_KEY] = hosts
            # Reads on any node see what another node committed (docs/galera.md).
            options.setdefault("init_command", f"SET time_zone = '+00:00', SESSION wsrep_sync_wait = {SYNC_WAIT}")
        options.setdefault("init_command", "SET time_zone = '+00:00'")
        options.setdefault("isolation_level", "read committed")
        config["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    elif engine.endswith("sqlite3"):
        options.setdefault("init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
        options.setdefault("transaction_mode", "IMMEDIATE")
        options.setdefault("timeout", 30)
        if test_dir is not None:
            name = Path(str(config["NAME"])).stem
            config["TEST"] = {"NAME": str(test_dir / f"test_{name}.sqlite3")}
    config["OPTIONS"] = options
    return config
