"""Planning of writes: INSERT ... VALUES, INSERT ... SELECT, DELETE and UPDATE.

Values are literals cast strictly to the column types (:func:`literals.cast_value`); a mismatch, a
wrong number of values or a NULL in a NOT NULL column is a SqlError naming column and value.
Log tables are append-only: DELETE and UPDATE on them are :class:`Unsupported`.
"""

from __future__ import annotations

from typing import Any, Callable

import pyarrow as pa
from sqlglot import exp

from flightstore.errors import InvalidInput, SqlError, Unsupported
from flightstore.expressions import Predicate, and_all
from flightstore.sql.literals import NotALiteral, cast_value, literal_value
from flightstore.sql.nodes import Delete, Insert, InsertSelect, Plan, Residual, Update
from flightstore.sql.predicates import conjuncts, extract_keys, to_predicate
from flightstore.sql.resolve import CatalogView, ResolvedTable, resolve_column, resolve_table_node

__all__ = ["parameter_columns", "plan_insert", "plan_delete", "plan_update"]


def _target(catalog: CatalogView, node: exp.Expression, verb: str) -> ResolvedTable:
    if not isinstance(node, exp.Table):
        shown = node.sql() if isinstance(node, exp.Expression) else "nothing"
        raise SqlError(f"{verb} needs a table, not {shown!r}")
    table = resolve_table_node(catalog, node)
    if table.source != "table":
        raise SqlError(f"cannot {verb} {table.path}${table.source}: it is a read-only view of the log")
    return table


def _target_columns(table: ResolvedTable, identifiers: list[exp.Expression]) -> tuple[str, ...] | None:
    """Canonical target columns in table order; None when the statement writes every column."""
    if not identifiers:
        return None
    named = [resolve_column(table.schema, ident.name, table.path) for ident in identifiers]
    duplicates = sorted({n for n in named if named.count(n) > 1})
    if duplicates:
        raise SqlError(f"column {duplicates[0]!r} is listed twice in the INSERT")
    missing_pk = [c for c in table.descriptor.primary_key if c not in named]
    if missing_pk:
        raise SqlError(f"INSERT INTO {table.path} must write every primary-key column; missing "
                       f"{', '.join(missing_pk)}")
    if set(named) == set(table.schema.names):
        return None
    if not table.descriptor.has_primary_key:
        required = [f.name for f in table.schema if f.name not in named and not f.nullable]
        if required:
            raise SqlError(f"INSERT INTO {table.path} must write the NOT NULL column(s) "
                           f"{', '.join(required)}")
    return tuple(n for n in table.schema.names if n in named)


def plan_insert(statement: exp.Insert, catalog: CatalogView,
                plan_query: Callable[[exp.Expression, CatalogView], Plan]) -> Plan:
    """Insert (VALUES) or InsertSelect (a query)."""
    if statement.args.get("overwrite"):
        raise Unsupported("INSERT OVERWRITE is not supported; use INSERT INTO")
    for key in ("where", "conflict", "returning", "partition", "by_name"):
        if statement.args.get(key):
            raise Unsupported(f"INSERT with {key.upper().replace('_', ' ')} is not supported")
    target = statement.this
    identifiers: list[exp.Expression] = []
    if isinstance(target, exp.Schema):
        identifiers = list(target.expressions)
        target = target.this
    table = _target(catalog, target, "INSERT INTO")
    columns = _target_columns(table, identifiers)
    if not table.descriptor.has_primary_key:
        columns = None  # a log table row is always whole: unnamed columns are NULL
    written = [resolve_column(table.schema, i.name, table.path) for i in identifiers] or \
        list(table.schema.names)
    source = statement.expression
    if isinstance(source, exp.Values):
        data = _values_table(table, source, written, columns)
        return Insert(table=table.path, data=data, columns=columns)
    if isinstance(source, exp.Query):
        query = plan_query(source, catalog)
        _check_arity(query, source, len(written))
        mapped = None if written == list(table.schema.names) else tuple(written)
        return InsertSelect(table=table.path, query=query, columns=mapped)
    if source is None:
        raise SqlError("INSERT needs VALUES or a SELECT")
    raise SqlError(f"INSERT needs VALUES or a SELECT, not {source.sql()!r}")


def parameter_columns(statement: exp.Expression) -> tuple[str, ...] | None:
    """The column each parameter of ``INSERT INTO t [(c1, c2, ...)] VALUES (?, ?, ...)`` writes,
    in parameter order, as the statement spells them; ``()`` when the statement lists no columns
    (parameter ``i`` writes the table's column ``i``). None for any other shape: not an INSERT of
    one VALUES row made only of parameters, each used once.

    A bulk bind (``executemany``) turns parameter ``i`` of every row into one column: this says
    which, since the column list need not follow the table's order.
    """
    if not isinstance(statement, exp.Insert) or not isinstance(statement.expression, exp.Values):
        return None
    rows = statement.expression.expressions
    if len(rows) != 1:
        return None
    items = rows[0].expressions if isinstance(rows[0], exp.Tuple) else [rows[0]]
    numbers = [str(item.this) if isinstance(item, exp.Placeholder) else "" for item in items]
    if not all(n.isdigit() for n in numbers) or sorted(int(n) for n in numbers) != \
            list(range(1, len(items) + 1)):
        return None
    target = statement.this
    if not isinstance(target, exp.Schema):
        return () if numbers == [str(i) for i in range(1, len(items) + 1)] else None
    named = [ident.name for ident in target.expressions]
    if len(named) != len(items):
        return None  # the planner reports the mismatch
    by_parameter = dict(zip((int(n) for n in numbers), named))
    return tuple(by_parameter[i] for i in range(1, len(items) + 1))


def _column_value(table: ResolvedTable, name: str, item: exp.Expression, what: str,
                  null_detail: str = "") -> Any:
    """The literal ``item`` written into column ``name``: cast to its type, NOT NULL checked."""
    try:
        value = literal_value(item)
    except NotALiteral:
        raise SqlError(f"{what} must be literals; got {item.sql()!r} for column {name!r}") from None
    field = table.schema.field(name)
    value = cast_value(value, field.type, name)
    if value is None and not field.nullable:
        raise SqlError(f"column {name!r} of {table.path} is NOT NULL{null_detail}")
    return value


def _values_table(table: ResolvedTable, values: exp.Values, written: list[str],
                  columns: tuple[str, ...] | None) -> pa.Table:
    by_column: dict[str, list[Any]] = {name: [] for name in written}
    for number, row in enumerate(values.expressions, start=1):
        items = row.expressions if isinstance(row, exp.Tuple) else [row]
        if len(items) != len(written):
            raise SqlError(f"row {number} of the VALUES has {len(items)} value(s) but the INSERT "
                           f"writes {len(written)} column(s): {', '.join(written)}")
        for name, item in zip(written, items):
            by_column[name].append(_column_value(table, name, item, "INSERT VALUES",
                                                 f" but row {number} gives NULL"))
    rows = len(values.expressions)
    out_columns = columns if columns is not None else tuple(table.schema.names)
    arrays = []
    for name in out_columns:
        field = table.schema.field(name)
        arrays.append(pa.array(by_column.get(name, [None] * rows), field.type))
    schema = pa.schema([table.schema.field(n) for n in out_columns])
    return pa.Table.from_arrays(arrays, schema=schema)


def _check_arity(query: Plan, source: exp.Expression, expected: int) -> None:
    produced: int | None = None
    if hasattr(query, "columns"):
        produced = len(query.columns)  # type: ignore[attr-defined]
    elif isinstance(query, Residual) and isinstance(source, exp.Select) and \
            not any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and
                                                isinstance(e.this, exp.Star))
                    for e in source.expressions):
        produced = len(source.expressions)
    if produced is not None and produced != expected:
        raise SqlError(f"the SELECT produces {produced} column(s) but the INSERT writes {expected}")


def _where(table: ResolvedTable, statement: exp.Expression, verb: str
           ) -> tuple[pa.Table | None, Predicate | None]:
    qualifiers = {statement.this.alias_or_name.lower(), statement.this.name.lower()}

    def column_of(column: exp.Column) -> str | None:
        if column.table and column.table.lower() not in qualifiers:
            return None
        return resolve_column(table.schema, column.name, table.path)

    where = statement.args.get("where")
    predicates: list[Predicate] = []
    for term in conjuncts(where.this if where is not None else None):
        predicate = to_predicate(term, column_of, table.schema)
        if predicate is None:
            raise Unsupported(f"{verb} WHERE supports comparisons of columns with literals, IN, "
                              f"IS [NOT] NULL, LIKE 'prefix%', AND/OR/NOT; not {term.sql()!r}")
        try:
            predicates.append(predicate.bind(table.schema))
        except InvalidInput as exc:
            raise SqlError(str(exc)) from None
    found = extract_keys(predicates, table.descriptor.primary_key, table.schema)
    if found is not None:
        keys, remaining = found
        return keys, and_all(remaining)
    return None, and_all(predicates)


def _mutable(table: ResolvedTable, verb: str) -> None:
    if not table.descriptor.has_primary_key:
        raise Unsupported(f"cannot {verb} {table.path}: log tables are append-only; only "
                          "primary-key tables support DELETE and UPDATE")


def plan_delete(statement: exp.Delete, catalog: CatalogView) -> Delete:
    """Delete by keys when the WHERE pins the primary key, else by filter."""
    if statement.args.get("using") or statement.args.get("returning"):
        raise Unsupported("DELETE with USING or RETURNING is not supported")
    table = _target(catalog, statement.this, "DELETE FROM")
    _mutable(table, "DELETE FROM")
    keys, predicate = _where(table, statement, "DELETE")
    return Delete(table=table.path, keys=keys, filter=predicate)


def plan_update(statement: exp.Update, catalog: CatalogView) -> Update:
    """``UPDATE t SET c = literal, ... [WHERE ...]`` on a primary-key table."""
    for key in ("from", "from_", "returning", "order", "limit"):
        if statement.args.get(key):
            raise Unsupported(f"UPDATE with {key.strip('_').upper()} is not supported")
    table = _target(catalog, statement.this, "UPDATE")
    _mutable(table, "UPDATE")
    assignments: dict[str, Any] = {}
    for item in statement.expressions:
        if not isinstance(item, exp.EQ) or not isinstance(item.this, exp.Column):
            raise SqlError(f"UPDATE SET needs column = value, not {item.sql()!r}")
        name = resolve_column(table.schema, item.this.name, table.path)
        if name in table.descriptor.primary_key:
            raise SqlError(f"UPDATE cannot change primary-key column {name!r}; delete and insert "
                           "the row instead")
        if name in assignments:
            raise SqlError(f"column {name!r} is assigned twice")
        assignments[name] = _column_value(table, name, item.expression, "UPDATE SET values")
    keys, predicate = _where(table, statement, "UPDATE")
    return Update(table=table.path, assignments=assignments, keys=keys, filter=predicate)
