"""System checks for the misconfigurations that would otherwise fail at 3 a.m."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.core.checks import Warning as CheckWarning
from django.db import connections

from resource_lease.conf import LeaseSettings, combination_problems, shape_problem, value_problem
from resource_lease.db import SUPPORTED_VENDORS, dialect_class, engine_vendor
from resource_lease.db.replication import BELOW_ON, primary_report
from resource_lease.db.sqlite_options import in_memory


def _lease_alias() -> Any:
    """RESOURCE_LEASE["DATABASE"] as given (not through lease_settings, whose read would raise
    on a bad value: E010 reports that)."""
    user = getattr(settings, "RESOURCE_LEASE", None)
    return (user if isinstance(user, dict) else {}).get("DATABASE", LeaseSettings.DATABASE)


def _setting(key: str) -> Any:
    """A RESOURCE_LEASE value for a check: the user's if usable, else the default (a bad one
    is E010's to report, not a reason for another check to crash)."""
    user = getattr(settings, "RESOURCE_LEASE", None)
    value = (user if isinstance(user, dict) else {}).get(key, getattr(LeaseSettings, key))
    return getattr(LeaseSettings, key) if value_problem(key, value) else value


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    if not settings.USE_TZ:
        errors.append(
            Error(
                "USE_TZ is off: lease expiries are stored in UTC and compared with the database's clock.",
                hint="Set USE_TZ = True.",
                id="resource_lease.E001",
            )
        )
    user = getattr(settings, "RESOURCE_LEASE", None)
    if user is not None and not isinstance(user, dict):
        errors.append(Error("RESOURCE_LEASE must be a dict.", id="resource_lease.E004"))
        return errors
    unknown = sorted(set(user or {}) - LeaseSettings.known_keys(), key=str)
    if unknown:
        errors.append(
            Error(
                f"RESOURCE_LEASE has unknown keys: {', '.join(map(str, unknown))}.",
                hint=f"{shape_problem(user)}. Known keys: {', '.join(sorted(LeaseSettings.known_keys()))}.",
                id="resource_lease.E004",
            )
        )
    alias = _lease_alias()
    if isinstance(alias, str) and alias not in settings.DATABASES:
        errors.append(
            Error(f"RESOURCE_LEASE['DATABASE'] is {alias!r}, which is not in DATABASES.", id="resource_lease.E003")
        )
    return errors


@register(Tags.database)
def check_databases(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run with ``manage.py check --database ALIAS``: vendor and (MySQL) session time zone
    (docs/pitfalls.md#database-clock)."""
    errors: list[CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor not in SUPPORTED_VENDORS:
            errors.append(
                Error(
                    f"Database {alias!r} is {connection.vendor!r}; resource_lease supports "
                    f"{', '.join(SUPPORTED_VENDORS)}.",
                    id="resource_lease.E002",
                )
            )
            continue
        offset = dialect_class(connection.vendor).session_zone_offset(connection)
        if offset:
            errors.append(
                CheckWarning(
                    f"Database {alias!r}: the MySQL session time zone is {offset / 3600:+g}h from UTC, so "
                    "NOW() and CURRENT_TIMESTAMP disagree with the UTC datetimes Django stores.",
                    hint='Add "init_command": "SET time_zone=\'+00:00\'" to OPTIONS. (The lease engine '
                    "itself uses UTC_TIMESTAMP and is not affected; your own queries are.)",
                    id="resource_lease.W001",
                )
            )
    return errors


@register()
def check_vendor_static(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for alias, conf in settings.DATABASES.items():
        engine = conf.get("ENGINE", "")
        vendor = engine_vendor(engine)
        if alias == _lease_alias() and vendor is None:
            errors.append(
                Error(
                    f"Database {alias!r} uses {engine!r}; resource_lease supports MySQL/MariaDB, "
                    "PostgreSQL and SQLite.",
                    id="resource_lease.E002",
                )
            )
        if vendor is not None and dialect_class(vendor).counts_changed_rows(conf.get("OPTIONS") or {}):
            errors.append(
                CheckWarning(
                    f"Database {alias!r}: OPTIONS['client_flag'] replaces the CLIENT.FOUND_ROWS flag Django "
                    "sets, so UPDATE row counts on your connections (QuerySet.update(), the pool operations' "
                    "counts) report changed rows, not matched rows.",
                    hint="Include MySQLdb.constants.CLIENT.FOUND_ROWS in client_flag. (The lease engine's own "
                    "connections always set it and are not affected.)",
                    id="resource_lease.W003",
                )
            )
        if alias == _lease_alias() and in_memory(conf):
            errors.append(
                CheckWarning(
                    f"Database {alias!r} is an in-memory SQLite database: leases cannot be shared between processes.",
                    hint="Use a file, with WAL, a busy timeout and transaction_mode IMMEDIATE.",
                    id="resource_lease.W002",
                )
            )
    return errors


# -- RESOURCE_LEASE values (E010, E011) --------------------------------------------------------


@register()
def check_setting_values(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Every ``RESOURCE_LEASE`` value checked at start-up, each error naming its key."""
    user = getattr(settings, "RESOURCE_LEASE", None)
    if not isinstance(user, dict):
        return []  # E004's
    errors: list[CheckMessage] = []
    for key, value in user.items():
        problem = value_problem(key, value)
        if problem is not None:
            default = getattr(LeaseSettings, key)
            errors.append(
                Error(
                    f"RESOURCE_LEASE[{key!r}] {problem}.",
                    hint=f"The default is {default!r}; see the settings table in the README.",
                    id="resource_lease.E010",
                )
            )
    errors.extend(Error(f"{message}.", id="resource_lease.E011") for message in combination_problems(user))
    return errors


# -- exact names and kinds (W010, docs/pitfalls.md#collation) ----------------------------------


@register(Tags.database)
def check_exact_collation(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run with ``manage.py check --database ALIAS`` (and by ``migrate``): the kind and name
    columns compare exactly (case, trailing spaces), as the migration ``ExactCollation`` set."""
    from django.apps import apps
    from django.db import router
    from django.db.utils import DatabaseError

    from resource_lease.db.collation import inexact_columns

    errors: list[CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        for model in apps.get_app_config("resource_lease").get_models():
            fields = getattr(model, "exact_text_fields", ())
            if not fields or model._meta.proxy or not router.allow_migrate_model(alias, model):
                continue
            table = model._meta.db_table
            columns = [str(getattr(model._meta.get_field(name), "column", name)) for name in fields]
            try:
                loose = inexact_columns(connection, table, columns)
            except DatabaseError:
                continue  # no connection or no table yet: migrate first
            if loose:
                listed = ", ".join(f"{column} ({collation})" for column, collation in loose.items())
                errors.append(
                    CheckWarning(
                        f"Database {alias!r}: {table} compares {listed} ignoring case or trailing spaces: "
                        "'PROXY' and 'proxy ' match 'proxy' (acquire('PROXY') leases kind 'proxy'), and names that "
                        "differ only in case collide.",
                        hint="Run `manage.py migrate resource_lease` (its ExactCollation operation sets a binary, "
                        "no-pad collation), or restore it after a hand-made ALTER TABLE.",
                        id="resource_lease.W010",
                    )
                )
    return errors


# -- SQLite shared by several processes (W011, docs/pitfalls.md#sqlite) --------------------------


@register()
def check_sqlite_concurrency(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The lease database on an SQLite file needs WAL, a busy timeout and IMMEDIATE
    transactions once more than one process uses it (workers, the admin, a Celery worker)."""
    from resource_lease.db.sqlite_options import FIX, multiprocess_problems

    alias = _lease_alias()
    conf = settings.DATABASES.get(alias) if isinstance(alias, str) else None
    if not conf:
        return []  # E003's
    problems = multiprocess_problems(conf)
    if not problems:
        return []
    return [
        CheckWarning(
            f"Database {alias!r} is SQLite with {'; '.join(problems)}: leasing from more than one process "
            "will fail with 'database is locked' or stall.",
            hint=f"If more than one process uses it, set {FIX}.",
            id="resource_lease.W011",
        )
    ]


# -- MariaDB Galera Cluster (docs/galera.md, docs/pitfalls.md#galera) -----------------------


@register(Tags.database)
def check_galera(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run with ``manage.py check --database ALIAS``: Galera settings that break leases.

    Looks at the alias's node and every node its ``CLUSTER_HOSTS`` lists: in the primary
    component, causal reads on the alias's own connections, row-based replication, no dirty
    reads, quorum not ignored, node clocks in step. Silent for a server without wsrep.
    """
    from resource_lease.db import galera

    errors: list[CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        if not galera.may_be_node(connection):
            continue
        try:
            hosts = galera.cluster_hosts(connection.settings_dict)
        except ValueError as exc:
            errors.append(Error(f"Database {alias!r}: {exc}", id="resource_lease.E030"))
            continue
        with connection.cursor() as cursor:
            report = galera.node_report(cursor)
        if report is None:
            if len(hosts) > 1:
                errors.append(
                    Error(
                        f"Database {alias!r} lists {len(hosts)} {galera.HOSTS_KEY} but its server is not a Galera "
                        "node (wsrep_on is OFF): failing over between servers that are not one synchronous "
                        "cluster (asynchronous replicas) can grant a resource twice.",
                        hint=f"List only the nodes of one Galera cluster in {galera.HOSTS_KEY}, or one host.",
                        id="resource_lease.E030",
                    )
                )
            continue
        where = f"{connection.settings_dict.get('HOST') or 'localhost'}:{connection.settings_dict.get('PORT') or 3306}"
        errors += _galera_node_messages(alias, where, report, own_session=True)
        clocks = {where: report["utc_now"]}
        for host, port in hosts:
            name = f"{host}:{port}"
            if name == where:
                continue
            node_report = galera.node_report_at(connection, host, port)
            if isinstance(node_report, str):
                errors.append(
                    CheckWarning(
                        f"Database {alias!r}: cluster node {name} does not answer: {node_report}",
                        hint="The engine fails over to the other nodes; bring this one back to keep the "
                        "cluster able to lose a node.",
                        id="resource_lease.W037",
                    )
                )
                continue
            errors += _galera_node_messages(alias, name, node_report, own_session=False)
            clocks[name] = node_report["utc_now"]
        errors += _galera_clock_messages(alias, clocks)
    return errors


def _galera_node_messages(alias: str, node: str, report: dict[str, str], *, own_session: bool) -> list[CheckMessage]:
    from resource_lease.db import galera

    messages: list[CheckMessage] = []
    if not report:
        return [CheckWarning(f"Database {alias!r}: node {node} is not a Galera node.", id="resource_lease.W030")]
    status, ready = report.get("wsrep_cluster_status", ""), report.get("wsrep_ready", "")
    if status != "Primary" or ready != "ON":
        messages.append(
            CheckWarning(
                f"Database {alias!r}: Galera node {node} is not serving (wsrep_cluster_status={status}, "
                f"wsrep_ready={ready}): it is outside the primary component or still joining.",
                hint="Its clients' leases fail until it rejoins, unless CLUSTER_HOSTS lists other nodes.",
                id="resource_lease.W030",
            )
        )
    if own_session and not int(report.get("session_sync_wait") or 0) & 1:
        messages.append(
            CheckWarning(
                f"Database {alias!r}: wsrep_sync_wait is {report.get('session_sync_wait')} on this alias's "
                "connections, so their reads (fenced(), the admin, pool operations) may miss a grant or "
                "release another node committed a moment ago. The lease engine's own connections set it.",
                hint=f"Add \"SET SESSION wsrep_sync_wait = {galera.SYNC_WAIT}\" to OPTIONS['init_command'] "
                "(a DATABASE_URL listing several hosts does it), or set it globally on the nodes.",
                id="resource_lease.W031",
            )
        )
    if report.get("binlog_format", "").upper() != "ROW":
        messages.append(
            CheckWarning(
                f"Database {alias!r}: Galera node {node} has binlog_format={report.get('binlog_format')}; "
                "Galera replicates reliably only with row-based events.",
                hint="Set binlog_format = ROW on every node.",
                id="resource_lease.W032",
            )
        )
    if report.get("wsrep_dirty_reads", "0").upper() in ("1", "ON"):
        messages.append(
            CheckWarning(
                f"Database {alias!r}: Galera node {node} has wsrep_dirty_reads on: it answers reads while "
                "outside the primary component, from data that may be stale.",
                hint="Set wsrep_dirty_reads = OFF.",
                id="resource_lease.W033",
            )
        )
    options = report.get("wsrep_provider_options", "")
    ignored = [
        name for name in ("pc.ignore_quorum", "pc.ignore_sb") if galera.provider_option(options, name) in ("true", "1")
    ]
    if ignored:
        messages.append(
            CheckWarning(
                f"Database {alias!r}: Galera node {node} has {', '.join(ignored)} on: after a network split "
                "both sides keep accepting writes, and each can grant the same resource.",
                hint="Leave pc.ignore_quorum and pc.ignore_sb off (the default).",
                id="resource_lease.W034",
            )
        )
    size = int(report.get("wsrep_cluster_size") or 0)
    if own_session and 0 < size < 3:
        messages.append(
            CheckWarning(
                f"Database {alias!r}: the Galera cluster has {size} node(s); losing one leaves no majority, "
                "and the survivors stop serving.",
                hint="Run at least 3 nodes (or 2 and a garbd arbitrator).",
                id="resource_lease.W035",
            )
        )
    return messages


def _galera_clock_messages(alias: str, clocks: dict[str, str]) -> list[CheckMessage]:
    """Expiry is judged by the clock of whichever node runs the statement: nodes must agree
    (docs/pitfalls.md#database-clock)."""
    from django.utils.dateparse import parse_datetime

    if len(clocks) < 2:
        return []
    times = {node: parse_datetime(value) for node, value in clocks.items()}
    known = {node: t for node, t in times.items() if t is not None}
    if len(known) < 2:
        return []
    spread = (max(known.values()) - min(known.values())).total_seconds()
    allowed = float(_setting("SAFETY_MARGIN_MAX")) / 4
    if spread <= allowed:
        return []
    return [
        CheckWarning(
            f"Database {alias!r}: the clocks of the Galera nodes differ by about {spread:.2f}s "
            f"({', '.join(f'{n}={v}' for n, v in clocks.items())}). Lease expiry is judged by the clock of "
            "whichever node runs the statement, so a grant on a fast node can end a lease early.",
            hint=f"Keep the nodes in NTP sync, well within the safety margin ({allowed:g}s here: a quarter "
            "of RESOURCE_LEASE['SAFETY_MARGIN_MAX']).",
            id="resource_lease.W036",
        )
    ]


# -- PostgreSQL replication (docs/ha.md) ----------------------------------------------------


@register(Tags.database)
def check_replication(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Run with ``manage.py check --database ALIAS``: a PostgreSQL primary whose standbys
    could be promoted without its last commits. Warns when the server streams to standbys of
    which none is synchronous (W040), or when the app's sessions commit without waiting for
    the synchronous standby (``synchronous_commit`` below ``on``, W041). Silent for a server
    with no standbys, a standby, other vendors, and where the server hides the standbys'
    state from the app's role."""
    errors: list[CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        with connection.cursor() as cursor:
            report = primary_report(cursor)
        if report.in_recovery or report.standbys == 0:
            continue
        if report.hidden == 0 and report.synchronous == 0:
            errors.append(
                CheckWarning(
                    f"Database {alias!r}: the server streams to {report.standbys} standby(s), none of them "
                    "synchronous: a failover can promote a standby without the last grants, which then grants "
                    "those resources again (two holders, a fence going back).",
                    hint="Run the cluster with synchronous replication: Patroni's synchronous_mode and "
                    "synchronous_mode_strict (docs/ha.md).",
                    id="resource_lease.W040",
                )
            )
        if report.synchronous_commit in BELOW_ON:
            errors.append(
                CheckWarning(
                    f"Database {alias!r}: synchronous_commit is {report.synchronous_commit!r} on a replication "
                    "primary: a grant is acknowledged before a standby has it, and a failover can lose it.",
                    hint="Leave synchronous_commit at 'on' (or 'remote_apply') for the app's role and database "
                    "(docs/ha.md).",
                    id="resource_lease.W041",
                )
            )
    return errors
