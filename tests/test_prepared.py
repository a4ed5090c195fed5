"""The engine's own PostgreSQL connections prepare their statements; the user's keep Django's way.

Django's psycopg 3 backend binds parameters into the text and never prepares, so PostgreSQL
parses and plans each lease statement on every execution (docs/pitfalls.md#prepared-statements).
The engine's private connections bind on the server and let psycopg prepare what they run
often; ``PREPARED_STATEMENTS = False`` (behind a pooler that cannot carry prepared statements)
turns that off, and is the negative control: the same check finds nothing prepared.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from resource_lease import acquire
from resource_lease.db.connections import close_connections, lease_connection, run
from resource_lease.db.mysql import MySQLDialect
from resource_lease.db.postgresql import PREPARE_THRESHOLD, PostgreSQLDialect

CYCLES = PREPARE_THRESHOLD + 5


def _prepared_on_lease_connection() -> list[str]:
    def read(dialect: Any, cursor: Any) -> list[str]:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]

    return run("default", read, what="reading pg_prepared_statements")


def _cycle(kind: str) -> None:
    for _ in range(CYCLES):
        acquire(kind, ttl=30).release()


@pytest.fixture
def fresh_lease_connection() -> Any:
    close_connections()  # the next statement opens one with the current settings
    yield
    close_connections()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's prepared statements: PostgreSQL only")
def test_the_lease_statements_are_prepared_on_the_engine_connection_only(
    make_pool: Any, fresh_lease_connection: None
) -> None:
    make_pool("prep", 4)
    _cycle("prep")
    prepared = _prepared_on_lease_connection()
    assert any("grant_token" in sql and sql.lstrip().upper().startswith("UPDATE") for sql in prepared), prepared
    assert any("released_at" in sql for sql in prepared), prepared  # the release
    with connection.cursor() as cursor:  # the user's own connection: Django's settings
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0


def _look_plans(mode: str | None) -> tuple[int, int]:
    """Run a waiter's look (LOOK_ANY) CYCLES times on the engine's connection, its session's
    plan_cache_mode set to ``mode`` first (None: as the engine set it); (generic plans,
    custom plans) PostgreSQL counted for it."""
    from resource_lease.db import statements

    def looks(dialect: Any, cursor: Any) -> tuple[int, int]:
        if mode is not None:
            cursor.execute("SELECT set_config('plan_cache_mode', %s, false)", [mode])
        sql = statements.fill(dialect.statement("LOOK_ANY", None, target=""), limit=str(statements.LINE_ROOM))
        ahead = ("plans", 1, 0, 0, 1)
        for _ in range(CYCLES):
            dialect.run_repeated(cursor, sql, (1, *ahead, *ahead, "plans", "plans", "", "plans"))
            cursor.fetchall()
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
            ["SELECT (SELECT COUNT(*) FROM%"],
        )
        return cursor.fetchall()[0]

    return run("default", looks, what="a waiter's looks")


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's plan cache")
@pytest.mark.parametrize("variant", ["engine", "negative-control"])
def test_a_prepared_look_is_not_planned_again_at_each_execution(variant: str, fresh_lease_connection: None) -> None:
    """PostgreSQL's default plan_cache_mode may plan a prepared statement for its parameters at
    every execution (a waiter's look was: 0.64 ms of server CPU to plan 0.1 ms of work). The
    engine's sessions use the generic plan. Control: a session planning for each execution's
    parameters (force_custom_plan) is caught by the same count."""
    generic, custom = _look_plans(None if variant == "engine" else "force_custom_plan")
    if variant == "negative-control":
        assert custom >= CYCLES - PREPARE_THRESHOLD, (generic, custom)
        return
    assert generic >= 1 and custom == 0, (generic, custom)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's prepared statements: PostgreSQL only")
def test_negative_control_prepared_statements_off_prepares_nothing(
    make_pool: Any, settings: Any, fresh_lease_connection: None
) -> None:
    settings.RESOURCE_LEASE = {**settings.RESOURCE_LEASE, "PREPARED_STATEMENTS": False}
    make_pool("prep", 4)
    _cycle("prep")
    assert _prepared_on_lease_connection() == []


@pytest.mark.parametrize(
    "chosen",
    [{"prepare_threshold": None}, {"server_side_binding": False}, {"prepare_threshold": 1}],
)
def test_an_alias_that_chose_binding_or_preparing_keeps_its_choice(chosen: dict[str, Any]) -> None:
    options = dict(chosen)
    PostgreSQLDialect.connect_options(options, 5.0, prepared=True)
    for key, value in chosen.items():
        assert options[key] == value
    assert "server_side_binding" not in options or options["server_side_binding"] is chosen.get("server_side_binding")


def test_by_default_the_engine_binds_on_the_server_and_prepares() -> None:
    options: dict[str, Any] = {}
    PostgreSQLDialect.connect_options(options, 5.0, prepared=True)
    assert options["server_side_binding"] is True and options["prepare_threshold"] == PREPARE_THRESHOLD
    off: dict[str, Any] = {}
    PostgreSQLDialect.connect_options(off, 5.0, prepared=False)
    assert "server_side_binding" not in off and "prepare_threshold" not in off


# -- MariaDB: the statements of every uncontended cycle, prepared on the server ------------------
#
# MySQLdb has no server-side binding: every statement's text is parsed anew by the server. On
# MariaDB the engine's own connections PREPARE the probe's grant and the release once per
# session and EXECUTE them with their values (``MySQLDialect.run_hot``); the server's counters
# of this session say so. ``PREPARED_STATEMENTS = False`` is the negative control.

mariadb_only = pytest.mark.skipif(connection.vendor != "mysql", reason="EXECUTE ... USING values: MariaDB only")


@pytest.fixture
def mariadb(make_pool: Any, fresh_lease_connection: None) -> Any:
    """A pool of 4 "prep" resources, on MariaDB (MySQL's EXECUTE takes user variables only)."""
    if not connection.mysql_is_mariadb:
        pytest.skip("EXECUTE ... USING values: MariaDB only")
    make_pool("prep", 4)


def _session_counters() -> dict[str, int]:
    def read(dialect: Any, cursor: Any) -> dict[str, int]:
        cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN ('Com_prepare_sql', 'Com_execute_sql')")
        return {name: int(value) for name, value in cursor.fetchall()}

    return run("default", read, what="reading the session's counters")


@mariadb_only
def test_mariadb_prepares_a_cycles_statements_once_per_session(mariadb: None) -> None:
    acquire("prep", ttl=30).release()  # the session opens, and prepares what a cycle sends
    before = _session_counters()
    _cycle("prep")
    after = _session_counters()
    # Each cycle: its grant and its release executed, nothing prepared again.
    assert after["Com_execute_sql"] - before["Com_execute_sql"] == 2 * CYCLES, (before, after)
    assert after["Com_prepare_sql"] == before["Com_prepare_sql"], (before, after)
    # A new session (the old one lost) has none of them: it prepares them again, and works.
    lease_connection("default").discard()
    lease = acquire("prep", ttl=30)
    assert lease.release()
    assert _session_counters()["Com_prepare_sql"] == 2


@mariadb_only
def test_mariadb_past_the_prepared_limit_sends_the_text(mariadb: None, monkeypatch: Any) -> None:
    monkeypatch.setattr(MySQLDialect, "PREPARED_KEPT", 1)  # the grant's form only
    _cycle("prep")
    counters = _session_counters()
    assert counters["Com_prepare_sql"] == 1
    assert counters["Com_execute_sql"] == CYCLES  # the grants; the releases went as text


@mariadb_only
def test_negative_control_mariadb_with_prepared_statements_off_prepares_nothing(mariadb: None, settings: Any) -> None:
    settings.RESOURCE_LEASE = {**settings.RESOURCE_LEASE, "PREPARED_STATEMENTS": False}
    _cycle("prep")
    assert _session_counters() == {"Com_prepare_sql": 0, "Com_execute_sql": 0}


@mariadb_only
def test_mariadb_a_repeated_statement_is_prepared_once_and_answers_as_text(mariadb: None) -> None:
    """``run_repeated`` (a waiter's look): prepared once per session, each call an EXECUTE,
    with the answer the text gives."""

    def twice(dialect: Any, cursor: Any) -> list[Any]:
        answers = []
        for _ in range(2):
            dialect.run_repeated(cursor, "SELECT %s + 1, %s, %s", (41, "it's", None))
            answers.append(cursor.fetchall()[0])
        cursor.execute("SELECT %s + 1, %s, %s", (41, "it's", None))  # the text, bound by the driver
        answers.append(cursor.fetchall()[0])
        return answers

    before = _session_counters()
    answers = run("default", twice, what="a repeated statement")
    after = _session_counters()
    assert answers == [(42, "it's", None)] * 3
    assert after["Com_prepare_sql"] - before["Com_prepare_sql"] == 1
    assert after["Com_execute_sql"] - before["Com_execute_sql"] == 2


@mariadb_only
def test_mariadb_a_session_that_lost_its_prepared_statements_prepares_them_again(mariadb: None) -> None:
    """A proxy or the server may reset a session's prepared statements behind our back: the
    EXECUTE that finds none runs nothing, so the statement goes as text and is prepared again
    at the next call (without this, every cycle would fail with "Unknown prepared statement
    handler": the control deallocates them as such a reset would)."""
    acquire("prep", ttl=30).release()
    names = [name for name in lease_connection("default").dialect._prepared.values() if name]
    assert names  # the grant and the release

    def deallocate(dialect: Any, cursor: Any) -> None:
        for name in names:
            cursor.execute(b"DEALLOCATE PREPARE " + name)

    run("default", deallocate, what="a reset of the session's prepared statements")
    before = _session_counters()
    lease = acquire("prep", ttl=30)  # its EXECUTE finds nothing: sent as text
    assert lease.release()  # prepared again, and executed
    after = _session_counters()
    assert after["Com_prepare_sql"] - before["Com_prepare_sql"] == 1
    assert after["Com_execute_sql"] - before["Com_execute_sql"] == 2  # the failed one counts
    _cycle("prep")
