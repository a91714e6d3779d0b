"""Types of a statement's ``?`` / ``$n`` parameters, for Flight SQL prepared statements.

Each parameter takes the Arrow type of the column it is compared with (``=``, ``<``, ``IN``,
``BETWEEN``), inserted into (``VALUES`` position) or assigned to (``UPDATE SET``); LIMIT / OFFSET
parameters are BIGINT, LIKE patterns STRING, and anything else STRING (never the null type).
"""

from __future__ import annotations

import pyarrow as pa
from sqlglot import exp

from flightstore.errors import FlightstoreError, SqlError
from flightstore.sql.parse import Explain, parse_statement, placeholders
from flightstore.sql.resolve import CatalogView, ResolvedTable, resolve_table_node

__all__ = ["parameter_schema"]

_COMPARE = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE, exp.NullSafeEQ, exp.NullSafeNEQ)


def parameter_schema(sql: str, catalog: CatalogView) -> pa.Schema:
    """The parameters of ``sql`` as fields ``"0"``, ``"1"``, ... with concrete Arrow types."""
    statement = parse_statement(sql)
    while isinstance(statement, Explain):
        statement = statement.statement
    if not isinstance(statement, exp.Expression):
        return pa.schema([])
    found = placeholders(statement)
    count = max((index for _, index in found), default=-1) + 1
    types: list[pa.DataType | None] = [None] * count
    tables = _tables(statement, catalog)
    insert_columns = _insert_columns(statement, tables)
    for node, index in found:
        inferred = _infer(node, tables, insert_columns)
        if inferred is not None and types[index] is None:
            types[index] = inferred
    return pa.schema([pa.field(str(i), t or pa.string()) for i, t in enumerate(types)])


def _tables(statement: exp.Expression, catalog: CatalogView) -> dict[str, ResolvedTable]:
    """Alias (lower-cased) -> table, for every resolvable table reference."""
    tables: dict[str, ResolvedTable] = {}
    for node in statement.find_all(exp.Table):
        try:
            resolved = resolve_table_node(catalog, node)
        except (FlightstoreError, SqlError):
            continue
        tables[node.alias_or_name.lower()] = resolved
        tables.setdefault(node.name.lower(), resolved)
    return tables


def _column_type(column: exp.Expression, tables: dict[str, ResolvedTable]) -> pa.DataType | None:
    if not isinstance(column, exp.Column):
        return None
    candidates = [tables[column.table.lower()]] if column.table and \
        column.table.lower() in tables else list({id(t): t for t in tables.values()}.values())
    found = []
    for table in candidates:
        for field in table.schema:
            if field.name.lower() == column.name.lower():
                found.append(field.type)
    return found[0] if len(set(map(str, found))) == 1 else None


def _insert_columns(statement: exp.Expression, tables: dict[str, ResolvedTable]
                    ) -> list[pa.DataType] | None:
    if not isinstance(statement, exp.Insert):
        return None
    target = statement.this
    names: list[str] = []
    if isinstance(target, exp.Schema):
        names = [i.name for i in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table) or target.alias_or_name.lower() not in tables:
        return None
    schema = tables[target.alias_or_name.lower()].schema
    lowered = {f.name.lower(): f.type for f in schema}
    if not names:
        return list(schema.types)
    return [lowered.get(n.lower(), pa.string()) for n in names]


def _infer(node: exp.Placeholder, tables: dict[str, ResolvedTable],
           insert_columns: list[pa.DataType] | None) -> pa.DataType | None:
    child: exp.Expression = node
    parent = node.parent
    while isinstance(parent, (exp.Paren, exp.Neg)):
        child, parent = parent, parent.parent
    if isinstance(parent, exp.Cast):
        return None
    if isinstance(parent, _COMPARE):
        other = parent.expression if parent.this is child else parent.this
        if isinstance(parent.parent, exp.Update) and parent.arg_key == "expressions":
            other = parent.this
        return _column_type(other, tables)
    if isinstance(parent, exp.In):
        return _column_type(parent.this, tables)
    if isinstance(parent, exp.Between):
        return _column_type(parent.this, tables)
    if isinstance(parent, (exp.Like, exp.ILike)):
        return pa.string()
    if isinstance(parent, (exp.Limit, exp.Offset)):
        return pa.int64()
    if isinstance(parent, exp.Tuple) and isinstance(parent.parent, exp.Values) and insert_columns:
        position = child.index if child.index is not None else -1
        if 0 <= position < len(insert_columns):
            return insert_columns[position]
    return None
