"""Insert many rows fast: what seed_proxies and the audit trail's writer both need.

``QuerySet.bulk_create`` compiles every field of every row through the SQL compiler, which
costs tens of microseconds a row: a list of 100,000 proxies took close to a minute, and the
audit writer's inserts stole that much CPU (and the GIL) from the threads that lease. Here
each value is prepared by its field (so every backend gets what it expects), values shared
by all rows are prepared once, and the driver batches one short INSERT its own way (MySQLdb
rewrites it into multi-row INSERTs, psycopg pipelines it, sqlite3 loops in C). Plain,
portable SQL: nothing here differs per vendor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from django.db import connections, transaction
from django.db.models import Field, Model


def insert_many(
    model: type[Model], rows: Iterable[Mapping[str, Any]], *, using: str, defaults: Mapping[str, Any] | None = None
) -> int:
    """Insert ``rows`` (field attname -> value) into ``model``'s table; returns how many.

    A field missing from a row takes its value from ``defaults``, else the field's default
    (``auto_now_add`` included), prepared once for all rows. The model's primary key must be
    an auto field. No signals are sent and no instances are built.
    """
    connection = connections[using]
    rows = list(rows)
    if not rows:
        return 0
    template = model(**(defaults or {}))
    shared: dict[str, Any] = {}
    fields: list[Any] = []
    for field in model._meta.concrete_fields:
        if field.primary_key:
            continue
        value = field.get_db_prep_save(field.pre_save(template, add=True), connection)
        # A nullable column no row fills is left out: NULL is what it would get anyway, and
        # every value less per row counts at 100,000 rows.
        if value is None and field.null and not any(field.attname in row for row in rows):
            continue
        shared[field.attname] = value
        fields.append(field)
    params = [
        [
            field.get_db_prep_save(row[field.attname], connection) if field.attname in row else shared[field.attname]
            for field in fields
        ]
        for row in rows
    ]
    qn = connection.ops.quote_name
    columns = ", ".join(qn(f.column) for f in fields)
    placeholders = ", ".join(["%s"] * len(fields))
    # One transaction: in autocommit, each row would be committed (and synced) on its own.
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {qn(model._meta.db_table)} ({columns}) VALUES ({placeholders})", params)
    return len(params)


def update_many(model: type[Model], attname: str, values: Mapping[Any, Any], *, using: str) -> int:
    """Set one field of many rows, ``values`` mapping primary key -> new value; returns how
    many rows matched.

    One ``UPDATE ... SET col = CASE pk WHEN ... END WHERE pk IN (...)`` per call: what
    ``bulk_update`` does, without building an ORM expression per row (which made 66,000
    updates take 20 s). Keep ``values`` to a thousand rows or so per call.
    """
    if not values:
        return 0
    connection = connections[using]
    field = cast("Field[Any, Any]", model._meta.get_field(attname))
    pk = cast("Field[Any, Any]", model._meta.pk)
    qn = connection.ops.quote_name
    column, key = qn(field.column), qn(pk.column)
    # Where CASE yields a value of the wrong type otherwise (PostgreSQL: text for jsonb),
    # Django casts each branch to the column's type; so do we.
    value_sql = "%s"
    if connection.features.requires_casted_case_in_updates:
        value_sql = f"CAST(%s AS {field.db_type(connection)})"
    params: list[Any] = []
    for key_value, value in values.items():
        params += [pk.get_db_prep_value(key_value, connection), field.get_db_prep_save(value, connection)]
    whens = " ".join([f"WHEN %s THEN {value_sql}"] * len(values))
    keys = ", ".join(["%s"] * len(values))
    params += [pk.get_db_prep_value(key_value, connection) for key_value in values]
    sql = (
        f"UPDATE {qn(model._meta.db_table)} SET {column} = CASE {key} {whens} ELSE {column} END WHERE {key} IN ({keys})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)
