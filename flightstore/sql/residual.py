"""Residual planning: any query the storage routes cannot answer runs in the embedded engine.

Each catalog table reference becomes a named input (``"__t0"``, ``"__t1"``, ...) that keeps the
reference's alias, so the query text is otherwise unchanged and transpiled to DuckDB. sqlglot's
``qualify`` (with a schema mapping built from the catalog) tells which columns each input must
provide; WHERE conjuncts of the outermost SELECT that touch one top-level input and convert to a
:class:`~flightstore.expressions.Predicate` are pushed into that input (and kept in the SQL), unless
the query has outer joins, where pushing below the join would change the result.
"""

from __future__ import annotations

import re

import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import OptimizeError, SqlglotError
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, traverse_scope

from flightstore.errors import InvalidInput, SqlError
from flightstore.expressions import Predicate, and_all
from flightstore.partitioning import pruned_names
from flightstore.sql.nodes import Residual, ResidualInput
from flightstore.sql.partial import push_partial_aggregates
from flightstore.sql.predicates import conjuncts, to_predicate
from flightstore.sql.resolve import CatalogView, ResolvedTable, resolve_column, resolve_table_node

__all__ = ["INPUT_PREFIX", "plan_residual"]

INPUT_PREFIX = "__t"
_UNRESOLVED = re.compile(r"Column '(?:\"?[^\"']*\"?\.)?\"?([^\"']+)\"?' could not be resolved"
                         r"(?: for table: '([^']+)')?|Unknown column: (\w+)")
_POSITION = re.compile(r"Line: (\d+), Col: (\d+)")


def _cte_names(ast: exp.Expression) -> set[str]:
    return {cte.alias_or_name.lower() for cte in ast.find_all(exp.CTE)}


def _table_refs(ast: exp.Expression) -> list[exp.Table]:
    """Catalog table references (CTE references excluded), in text order."""
    ctes = _cte_names(ast)
    refs = []
    for node in ast.find_all(exp.Table, bfs=False):
        if not node.db and node.name.lower() in ctes:
            continue
        refs.append(node)
    return refs


def _has_outer_join(ast: exp.Expression) -> bool:
    for join in ast.find_all(exp.Join):
        side = (join.side or "").upper()
        kind = (join.kind or "").upper()
        if side or kind not in ("", "INNER", "CROSS"):
            return True
    return False


def plan_residual(ast: exp.Expression, catalog: CatalogView) -> Residual:
    """Plan ``ast`` (a query) as DuckDB SQL over pruned, pre-filtered inputs."""
    ast = ast.copy()
    refs = _table_refs(ast)
    _unqualify_columns(ast, refs)
    resolved: list[ResolvedTable] = []
    for index, node in enumerate(refs):
        resolved.append(resolve_table_node(catalog, node))
        alias = node.args.get("alias")
        if alias is None:
            alias = exp.TableAlias(this=exp.Identifier(this=node.name, quoted=True))
        node.replace(exp.Table(this=exp.Identifier(this=f"{INPUT_PREFIX}{index}", quoted=True),
                               alias=alias))
    try:
        sql = ast.sql(dialect="duckdb")
    except SqlglotError as exc:
        raise SqlError(f"cannot translate the query for the embedded engine: {exc}") from None
    if not resolved:
        return Residual(sql=sql, inputs=())

    analysis = _qualified(ast, resolved)
    used: list[set[str]] = [set() for _ in resolved]
    scopes = traverse_scope(analysis)
    for scope in scopes:
        for column in scope.columns:
            index = _input_of(scope, column.table)
            if index is not None:
                used[index].add(column.name)

    filters: list[list[Predicate]] = [[] for _ in resolved]
    root = scopes[-1] if scopes else None
    if root is not None and isinstance(analysis, exp.Select) and not _has_outer_join(analysis):
        _push_filters(root, analysis, resolved, filters)

    inputs = []
    for index, table in enumerate(resolved):
        lowered = {name.lower() for name in used[index]}
        columns = tuple(n for n in table.schema.names if n.lower() in lowered)
        if not columns:  # e.g. COUNT(*): one narrow column keeps the row count
            columns = (table.descriptor.primary_key or table.schema.names)[:1]
        predicate = and_all(filters[index])
        partitions = pruned_names(table.descriptor, predicate) \
            if table.source in ("table", "changelog") else None
        inputs.append(ResidualInput(name=f"{INPUT_PREFIX}{index}", table=table.path,
                                    source=table.source, columns=tuple(columns), filter=predicate,
                                    partitions=partitions, snapshot_id=table.snapshot_id,
                                    as_of_ms=table.as_of_ms))
    planned = Residual(sql=sql, inputs=tuple(inputs))
    return _with_partial_aggregates(ast, planned, resolved) or planned


def _with_partial_aggregates(ast: exp.Expression, planned: Residual, resolved: list[ResolvedTable]
                             ) -> Residual | None:
    """The aggregation of one table split into per-bucket partial aggregates and their merge
    (:mod:`flightstore.sql.partial`), when the query allows it."""
    if len(resolved) != 1:
        return None
    item = planned.inputs[0]
    schema = pa.schema([resolved[0].schema.field(c) for c in item.columns])
    return push_partial_aggregates(ast, planned, schema)


def _unqualify_columns(ast: exp.Expression, refs: list[exp.Table]) -> None:
    """Rewrite schema-qualified columns (``bi.sales.cust_id``, as SQLAlchemy writes with
    ``schema=``) to the table's own name (``sales.cust_id``): each table reference becomes a named
    input aliased by that name, which the embedded engine would not find under ``bi.sales``."""
    by_path = {(ref.db.lower(), ref.name.lower()) for ref in refs if ref.db and not ref.alias}
    for column in ast.find_all(exp.Column):
        if not column.args.get("db"):
            continue
        key = (column.db.lower(), column.table.lower())
        if key not in by_path:
            raise SqlError(f"column {column.sql()} names table {column.db}.{column.table}, which is not "
                           "in the FROM clause (or has an alias there: use the alias)")
        column.set("catalog", None)
        column.set("db", None)


def _qualified(ast: exp.Expression, resolved: list[ResolvedTable]) -> exp.Expression:
    """A lower-cased, fully qualified copy of ``ast`` (stars expanded) for analysis only."""
    mapping = {f"{INPUT_PREFIX}{i}": {name.lower(): "TEXT" for name in table.schema.names}
               for i, table in enumerate(resolved)}
    analysis = ast.copy()
    for identifier in analysis.find_all(exp.Identifier):
        if not identifier.name.startswith(INPUT_PREFIX):
            identifier.set("this", identifier.name.lower())
            identifier.set("quoted", False)
    try:
        return qualify(analysis, schema=mapping, dialect="duckdb", quote_identifiers=False,
                       validate_qualify_columns=True)
    except OptimizeError as exc:
        raise _unresolved(str(exc), resolved) from None
    except SqlglotError as exc:
        raise SqlError(f"cannot analyse the query: {exc}") from None


def _unresolved(message: str, resolved: list[ResolvedTable]) -> SqlError:
    """The user's-terms error for a name the analysis could not resolve: which column (or table
    alias), where in the SQL, and the columns that do exist."""
    names = [t.shown for t in resolved]
    position = _POSITION.search(message)
    match = _UNRESOLVED.search(message)
    column = (match.group(1) or match.group(3)) if match else ""
    qualifier = match.group(2) if match else None
    where = ""
    if position:  # sqlglot points at the name's last character: report where it starts
        shown = f"{qualifier}.{column}" if qualifier else column
        where = f" at line {position.group(1)}, column {max(1, int(position.group(2)) - len(shown) + 1)}"
    if match is None:
        return SqlError(f"cannot resolve the names of the query over {', '.join(names)}{where}")
    if qualifier is not None and not qualifier.startswith(INPUT_PREFIX):
        return SqlError(f"unknown table or alias {qualifier!r} in {qualifier}.{column}{where}; "
                        f"the query reads {', '.join(names)}")
    if len(resolved) == 1:
        return SqlError(f"unknown column {column!r}{where} in table {names[0]}; columns are "
                        f"{', '.join(resolved[0].schema.names)}")
    listing = "; ".join(f"{name}: {', '.join(t.schema.names)}" for name, t in zip(names, resolved))
    return SqlError(f"unknown column {column!r}{where}; the query reads {listing}")


def _input_of(scope: Scope | None, alias: str) -> int | None:
    while scope is not None:
        source = scope.sources.get(alias)
        if source is not None:
            if isinstance(source, exp.Table) and source.name.startswith(INPUT_PREFIX):
                return int(source.name[len(INPUT_PREFIX):])
            return None
        scope = scope.parent
    return None


def _push_filters(root: Scope, select: exp.Select, resolved: list[ResolvedTable],
                  filters: list[list[Predicate]]) -> None:
    where = select.args.get("where")
    if where is None:
        return
    for term in conjuncts(where.this):
        if term.find(exp.Select, exp.Subquery):
            continue
        aliases = {column.table for column in term.find_all(exp.Column)}
        if len(aliases) != 1:
            continue
        alias = aliases.pop()
        index = _input_of(root, alias) if alias in root.sources else None
        if index is None:
            continue
        schema = resolved[index].schema
        table = resolved[index].path

        def column_of(column: exp.Column, alias: str = alias, schema=schema, table=table) -> str | None:
            return resolve_column(schema, column.name, table) if column.table == alias else None

        predicate = to_predicate(term, column_of, schema)
        if predicate is None:
            continue
        try:
            filters[index].append(predicate.bind(schema))
        except InvalidInput as exc:
            raise SqlError(str(exc)) from None
