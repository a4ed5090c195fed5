"""Exact comparison of names and kinds: a binary, no-pad collation on MySQL/MariaDB.

MySQL and MariaDB compare text by the column's collation, and the default ones
(``utf8mb4_general_ci``, ``utf8mb4_unicode_ci``, ...) ignore case and trailing spaces: with
them ``acquire("PROXY")`` and ``acquire("proxy ")`` lease resources of kind ``proxy``, and
``Resource(kind="PROXY", name="p1")`` collides with ``proxy/p1`` on the unique constraint.
Even ``utf8mb4_bin`` pads with spaces on MariaDB and MySQL 5.7; the no-pad binary ones
(MariaDB ``utf8mb4_nopad_bin``, MySQL 8 ``utf8mb4_0900_bin``) compare exactly, as PostgreSQL's
default (deterministic) and SQLite's ``BINARY`` collations already do (see
docs/pitfalls.md#collation).

- ``ExactCollation(model_name, fields)``: a migration operation that gives those columns (and
  the table's default, so a later ``AlterField`` that rewrites a column keeps it) the exact
  collation on MySQL/MariaDB, and does nothing elsewhere. Any app table with name or key
  columns can reuse it: ``operations = [..., ExactCollation("lock", ["name"])]``.
- ``inexact_columns(connection, table, columns)``: which of those columns do not compare
  exactly, asked of the database (the system check ``resource_lease.W010`` uses it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState

#: The exact collations, best first: MariaDB 10.2+, MySQL 8.0. ``utf8mb4_bin`` is the last
#: resort (exact in case, but it ignores trailing spaces).
EXACT_COLLATIONS = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin", "utf8mb4_bin")


def exact_collation(connection: BaseDatabaseWrapper) -> str | None:
    """The collation this MySQL/MariaDB server compares utf8mb4 text exactly with; None on
    other vendors (their defaults already do)."""
    if connection.vendor != "mysql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLLATIONS WHERE COLLATION_NAME IN (%s, %s, %s)",
            list(EXACT_COLLATIONS),
        )
        available = {row[0] for row in cursor.fetchall()}
    return next(name for name in EXACT_COLLATIONS if name in available)


def _database_collation(connection: BaseDatabaseWrapper) -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA"
            " WHERE SCHEMA_NAME = DATABASE()"
        )
        charset, collation = cursor.fetchone()
    return charset, collation


def collation_sql(
    connection: BaseDatabaseWrapper,
    table: str,
    fields: Iterable[Any],
    *,
    charset: str = "utf8mb4",
    collation: str | None = None,
) -> list[str]:
    """The statements giving ``fields`` (model fields of ``table``) an exact collation (or
    ``charset`` and ``collation``); none on vendors that compare exactly already."""
    if connection.vendor != "mysql":
        return []
    target = collation or exact_collation(connection)
    qn = connection.ops.quote_name
    # Types as Django creates them, nullability kept: MODIFY restates the whole column.
    columns = ", ".join(
        f"MODIFY {qn(field.column)} {field.db_type(connection)} CHARACTER SET {charset} COLLATE {target}"
        f" {'NULL' if field.null else 'NOT NULL'}"
        for field in fields
    )
    # The table's default too: a later AlterField restates a column without a collation,
    # which then takes the table's default instead of the database's case-blind one.
    return [f"ALTER TABLE {qn(table)} DEFAULT CHARACTER SET {charset} COLLATE {target}, {columns}"]


class ExactCollation(Operation):
    """Make ``fields`` of ``model_name`` compare exactly (case and trailing spaces) on
    MySQL/MariaDB: a binary, no-pad collation for the columns and the table's default.
    A no-op on PostgreSQL and SQLite; the model state is unchanged (no ``db_collation``,
    which would name a collation the other vendors do not have).

    Reversing restores the database's default collation.
    """

    reversible = True
    reduces_to_sql = True

    def __init__(self, model_name: str, fields: Sequence[str]) -> None:
        self.model_name = model_name
        self.fields = list(fields)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [], {"model_name": self.model_name, "fields": self.fields})

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        pass

    def _run(self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, state: ProjectState, *, back: bool) -> None:
        connection = schema_editor.connection
        model = state.apps.get_model(app_label, self.model_name)
        if connection.vendor != "mysql" or not self.allow_migrate_model(connection.alias, model):
            return
        fields = [model._meta.get_field(name) for name in self.fields]
        charset, collation = _database_collation(connection) if back else ("utf8mb4", None)
        for sql in collation_sql(connection, model._meta.db_table, fields, charset=charset, collation=collation):
            schema_editor.execute(sql)

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        self._run(app_label, schema_editor, to_state, back=False)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        self._run(app_label, schema_editor, to_state, back=True)

    def describe(self) -> str:
        return f"Exact collation for {self.model_name}.{', '.join(self.fields)} (MySQL/MariaDB only)"

    @property
    def migration_name_fragment(self) -> str:
        return f"exact_collation_{self.model_name.lower()}"


def inexact_columns(connection: BaseDatabaseWrapper, table: str, columns: Sequence[str]) -> dict[str, str]:
    """``{column: collation}`` for those of ``columns`` that do not compare text exactly
    (case, trailing spaces, accents); empty when the table does not exist yet."""
    if connection.vendor == "mysql":
        return _mysql_inexact(connection, table, columns)
    if connection.vendor == "postgresql":
        return _postgresql_inexact(connection, table, columns)
    if connection.vendor == "sqlite":
        return _sqlite_inexact(connection, table, columns)
    return {}


def _mysql_inexact(connection: BaseDatabaseWrapper, table: str, columns: Sequence[str]) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            [table],
        )
        found = {name: (charset, collation) for name, charset, collation in cursor.fetchall()}
        result = {}
        for column in columns:
            if column not in found or found[column][1] is None:
                continue
            charset, collation = found[column]
            # Asked of the server rather than guessed from the name: MariaDB has no
            # PAD_ATTRIBUTE column, and *_bin pads on some versions and not on others.
            cursor.execute(
                f"SELECT CONVERT('a' USING {charset}) COLLATE {collation} = CONVERT('A' USING {charset}),"
                f" CONVERT('a' USING {charset}) COLLATE {collation} = CONVERT('a ' USING {charset})"
            )
            if any(cursor.fetchone()):
                result[column] = collation
    return result


def _postgresql_inexact(connection: BaseDatabaseWrapper, table: str, columns: Sequence[str]) -> dict[str, str]:
    # The database's default collation is always deterministic; only a column given a
    # nondeterministic (e.g. ICU case-insensitive) collation compares loosely.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_class t ON t.oid = a.attrelid"
            " JOIN pg_collation c ON c.oid = a.attcollation"
            " WHERE t.relname = %s AND pg_table_is_visible(t.oid) AND a.attname = ANY(%s)"
            " AND NOT c.collisdeterministic",
            [table, list(columns)],
        )
        return {name: collation for name, collation in cursor.fetchall()}


def _sqlite_inexact(connection: BaseDatabaseWrapper, table: str, columns: Sequence[str]) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
        row = cursor.fetchone()
    if row is None or not row[0]:
        return {}
    result = {}
    for column in columns:
        # Django writes each column as "name" type ... [COLLATE x]; BINARY is the exact default.
        match = re.search(rf'"{re.escape(column)}"[^,]*?\bCOLLATE\s+"?(\w+)"?', row[0], re.IGNORECASE)
        if match and match.group(1).upper() != "BINARY":
            result[column] = match.group(1)
    return result


__all__ = ["EXACT_COLLATIONS", "ExactCollation", "collation_sql", "exact_collation", "inexact_columns"]
