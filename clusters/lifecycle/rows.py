"""Writing many rows, each with its own values, in one statement."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection
from django.db.models import Model


def update_rows(rows: Sequence[Model], fields: Sequence[str]) -> int:
    """`UPDATE … SET f = v.f, … FROM (the rows' values) AS v WHERE id = v.pk`: every row in
    `rows` (one model) gets its own in-memory values of `fields`, in one statement whose size
    grows linearly with the rows. Django's `bulk_update` builds a CASE per row and column
    instead, which PostgreSQL plans in time that grows with rows × columns. The same technique
    as the meter's write-back (billing/meter.py, `_update_from_values`): PostgreSQL gets one
    array per column (`unnest`), SQLite a VALUES list. Returns the rows updated."""
    if not rows:
        return 0
    model = type(rows[0])
    meta = model._meta
    columns = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    names = ["pk"] + [f"c{index}" for index in range(1, len(columns) + 1)]
    values = [
        [row.pk]
        + [column.get_db_prep_save(getattr(row, column.attname), connection) for column in columns]
        for row in rows
    ]
    if connection.vendor == "postgresql":
        types = [meta.pk.db_type(connection)] + [column.db_type(connection) for column in columns]
        arrays = ", ".join(f"%s::{kind}[]" for kind in types)
        source = f"unnest({arrays}) AS v ({', '.join(names)})"
        params = [list(column) for column in zip(*values, strict=True)]
    else:
        row = "(" + ", ".join(["%s"] * len(names)) + ")"
        aliases = ", ".join(f"column{index + 1} AS {name}" for index, name in enumerate(names))
        source = f"(SELECT {aliases} FROM (VALUES {', '.join([row] * len(values))})) AS v"  # noqa: S608 - no input
        params = [value for row_values in values for value in row_values]
    sets = ", ".join(
        f"{quote(column.column)} = v.{name}"
        for column, name in zip(columns, names[1:], strict=True)
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {sets} FROM {source} WHERE {table}.{quote(meta.pk.column)} = v.pk",  # noqa: S608 - names are ours, values are parameters
            params,
        )
        return cursor.rowcount
