"""Set-based writes the ORM has no word for, on PostgreSQL and SQLite alike: the meter's and
the reconciler's write-backs, the metrics reports' bare insert, and the `__among` lookup."""

from collections.abc import Sequence

from django.db import connection
from django.db.models import Field, ForeignObject, Lookup, Model


def update_from_values(
    model: type[Model], assignments: dict[str, str], types: Sequence[str], rows: Sequence[tuple]
) -> int:
    """`UPDATE … SET … FROM` a set of (pk, c1, c2, …): many rows with their own values in one
    statement, in linear time (Django's bulk_update builds a CASE per row and column, which
    PostgreSQL plans in time that grows with rows × columns: seconds for a meter's thousands of
    rows). Expressions name the values `v.c1`, `v.c2`, …; `types` are their database types.
    PostgreSQL gets one array per column (`unnest`), SQLite a VALUES list. Returns the rows
    updated."""
    if not rows:
        return 0
    meta = model._meta
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    names = ["pk"] + [f"c{index}" for index in range(1, len(types) + 1)]
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"%s::{kind}[]" for kind in (meta.pk.db_type(connection), *types))
        source = f"unnest({arrays}) AS v ({', '.join(names)})"
        params = [list(column) for column in zip(*rows, strict=True)]
    else:
        row = "(" + ", ".join(["%s"] * len(names)) + ")"
        columns = ", ".join(f"column{index + 1} AS {name}" for index, name in enumerate(names))
        source = f"(SELECT {columns} FROM (VALUES {', '.join([row] * len(rows))})) AS v"  # noqa: S608 - no input
        params = [value for row_values in rows for value in row_values]
    sets = ", ".join(f"{quote(column)} = {value}" for column, value in assignments.items())
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {sets} FROM {source} WHERE {table}.{quote(meta.pk.column)} = v.pk",  # noqa: S608 - names are ours, values are parameters
            params,
        )
        return cursor.rowcount


def update_rows(rows: Sequence[Model], fields: Sequence[str]) -> int:
    """Every row in `rows` (one model) gets its own in-memory values of `fields`, in one
    statement (`update_from_values`). Returns the rows updated."""
    if not rows:
        return 0
    model = type(rows[0])
    columns = [_column(model, name) for name in fields]
    values = [
        (row.pk, *(c.get_db_prep_save(getattr(row, c.attname), connection) for c in columns))
        for row in rows
    ]
    return update_from_values(
        model,
        {column.column: f"v.c{index}" for index, column in enumerate(columns, 1)},
        [_column_type(column) for column in columns],
        values,
    )


def insert_rows(rows: Sequence[Model]) -> None:
    """Insert `rows` (one model, primary keys left to the database) in one bare `INSERT`: no
    transaction around it and no `RETURNING`, so the rows' `pk` stay unset. bulk_create sends
    the same INSERT inside a transaction of its own even for one statement (a BEGIN and a
    COMMIT: two round trips more) and reads the keys back; a metrics report needs neither.
    Every column gets the row's own value: for models without a `db_default` or a generated
    field, as bulk_create would then send too."""
    if not rows:
        return
    model = type(rows[0])
    meta = model._meta
    quote = connection.ops.quote_name
    fields = [field for field in meta.concrete_fields if not field.primary_key]
    columns = ", ".join(quote(field.column) for field in fields)
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    params = [
        field.get_db_prep_save(field.pre_save(instance, True), connection)
        for instance in rows
        for field in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES {', '.join([row] * len(rows))}",  # noqa: S608 - names are ours, values are parameters
            params,
        )


def _column(model: type[Model], name: str) -> Field:
    field = model._meta.get_field(name)
    assert isinstance(field, Field), f"{name} is a relation's other side, not a column"
    return field


def _column_type(field: Field) -> str:
    kind = field.db_type(connection)
    assert kind is not None, f"{field.name} has no column (a many-to-many)"
    return kind


@ForeignObject.register_lookup
@Field.register_lookup
class Among(Lookup):
    """`column__among=[…]`: like `__in`, but one array parameter on PostgreSQL
    (`= ANY(%s)`). psycopg's client-side binding parses a statement once per placeholder, so
    an `IN` of the meter's thousands of cluster ids cost more than the statement itself."""

    lookup_name = "among"
    prepare_rhs = False

    def as_sql(self, compiler, connection) -> tuple[str, list]:
        lhs, params = self.process_lhs(compiler, connection)
        values = list(self.rhs)
        if not values:
            return "1 = 0", list(params)
        if connection.vendor == "postgresql":
            return f"{lhs} = ANY(%s)", [*params, values]
        return f"{lhs} IN ({', '.join(['%s'] * len(values))})", [*params, *values]
