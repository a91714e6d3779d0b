"""Partial aggregates: an aggregation over one table runs in two steps, per bucket and then merged.

``SELECT k, SUM(x), AVG(y), COUNT(*) FROM t WHERE w GROUP BY k [HAVING] [ORDER BY] [LIMIT]``
becomes

* a **partial** query run on each bucket's rows where they are (the input's ``partial`` SQL):
  ``SELECT k AS __g0, SUM(x) AS __a0, SUM(y) AS __a1, COUNT(y) AS __a2, COUNT(*) AS __a3
  FROM "__t0" AS t WHERE w GROUP BY k``, a few rows per bucket;
* a **merge** query over the buckets' partial rows (the residual SQL): ``SELECT __g0 AS k,
  SUM(__a0) AS "sum(x)", SUM(__a1) / SUM(__a2) AS "avg(y)", COALESCE(SUM(__a3), 0) AS
  "count_star()" FROM "__t0" GROUP BY __g0 [HAVING / ORDER BY / LIMIT over the merged values]``.

Pushed: ``COUNT(*)``, ``COUNT(x)``, ``SUM``, ``MIN``, ``MAX`` and ``AVG`` (as a sum and a count)
over any row expression, grouped by any row expressions (or not grouped). Anything else keeps the
one-step plan: DISTINCT aggregates (``COUNT(DISTINCT x)``), other aggregate functions, FILTER
clauses, window functions, joins, subqueries, ``SELECT DISTINCT``, GROUPING SETS/ROLLUP/CUBE,
positional ``GROUP BY 1``, and any column used outside an aggregate that is not a grouping key.

The merged query answers exactly what the one-step query answers: its output columns carry the
one-step query's names and types (both are bound by DuckDB on empty inputs while planning, and a
merged column whose type differs is cast to the one-step type); if any step does not bind, the
query is not pushed.

Execution (:mod:`flightstore.sql.execute`): the partial runs where the rows are, over a stream of
the buckets held there (another server's buckets get it as a checked plan,
:mod:`flightstore.sql.partial_plan`, never as SQL text); when every bucket is local the two steps run as one statement
(:func:`fused_sql`), which the planner binds too.
"""

from __future__ import annotations

import dataclasses
import threading

import duckdb
import pyarrow as pa
from sqlglot import exp
from sqlglot.errors import SqlglotError

from flightstore.sql.nodes import Residual
from flightstore.sql.partial_plan import PartialPlan

__all__ = ["AGGREGATE_PREFIX", "GROUP_PREFIX", "fused_sql", "push_partial_aggregates"]

GROUP_PREFIX = "__g"
AGGREGATE_PREFIX = "__a"
_ALLOWED_ARGS = {"expressions", "from", "from_", "where", "group", "having", "order", "limit", "offset"}
_PUSHED = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)
_REFUSED = (exp.Window, exp.Filter, exp.WithinGroup, exp.Subquery, exp.Distinct, exp.Lateral,
            exp.Join, exp.Unnest, exp.IgnoreNulls, exp.RespectNulls, exp.Placeholder)

_engine_lock = threading.Lock()
_engine: duckdb.DuckDBPyConnection | None = None


def push_partial_aggregates(select: exp.Expression, residual: Residual, input_schema: pa.Schema
                            ) -> Residual | None:
    """``residual`` (one table input, ``select`` its rewritten AST over that input) as a partial
    aggregate per bucket and a merge, or None when the query does not allow it.

    ``input_schema`` is the input's pruned schema (to bind the queries on empty inputs)."""
    if len(residual.inputs) != 1 or residual.inputs[0].source != "table":
        return None
    if residual.inputs[0].snapshot_id is not None or residual.inputs[0].as_of_ms is not None:
        return None  # time travel reads the lake as it was, not the buckets
    if not _shape_allows(select):
        return None
    try:
        split = _split(select, input_schema)
    except (SqlglotError, duckdb.Error, _NotPushable):
        return None
    if split is None:
        return None
    partial_sql, merge_sql = split
    name = residual.inputs[0].name
    if not PartialPlan.from_sql(partial_sql, name).check(name, input_schema.names):
        return None  # a leader would refuse it (see flightstore.sql.partial_plan): one step
    return Residual(sql=merge_sql, inputs=(dataclasses.replace(residual.inputs[0], partial=partial_sql),))


def fused_sql(name: str, partial_sql: str, merge_sql: str) -> str:
    """The partial and the merge as one statement over the rows registered as ``name``: the merge
    reads the partial as a CTE of that name (inside the CTE the name is still the rows)."""
    return f'WITH "{name}" AS ({partial_sql}) {merge_sql}'


class _NotPushable(Exception):
    pass


def _shape_allows(select: exp.Expression) -> bool:
    if not isinstance(select, exp.Select):
        return False
    for key, value in select.args.items():
        if key not in _ALLOWED_ARGS and value not in (None, False, [], ""):
            return False
    source = select.args.get("from_") or select.args.get("from")
    if source is None or not isinstance(source.this, exp.Table):
        return False
    if select.find(*_REFUSED) is not None or any(s is not select for s in select.find_all(exp.Select)):
        return False
    group = select.args.get("group")  # not ROLLUP, CUBE, GROUPING SETS, GROUP BY ALL
    return group is None or not any(v for k, v in group.args.items() if k != "expressions")


def _key(node: exp.Expression) -> str:
    """A comparable text of an expression: table qualifiers dropped, identifiers lower-cased."""
    if isinstance(node, exp.Column) and isinstance(node.this, exp.Identifier):
        return node.name.lower()  # what the general case gives a column, without a copy
    copy = node.copy()
    for column in list(copy.find_all(exp.Column)):
        column.set("table", None)
    for identifier in copy.find_all(exp.Identifier):
        identifier.set("this", identifier.name.lower())
        identifier.set("quoted", False)
    return copy.sql(dialect="duckdb")


def _column(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=True))


class _Partials:
    """The partial aggregates a query needs, each computed once however often it is used."""

    def __init__(self) -> None:
        self.items: list[exp.Expression] = []  # partial expressions, aliased __a0, __a1, ...
        self._index: dict[str, int] = {}

    def add(self, node: exp.Expression) -> exp.Column:
        key = _key(node)
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(node)
        return _column(f"{AGGREGATE_PREFIX}{self._index[key]}")

    def merged(self, aggregate: exp.AggFunc) -> exp.Expression:
        """The merge expression of one aggregate of the query."""
        argument = aggregate.this
        if argument is None or argument.find(exp.AggFunc) is not None:
            raise _NotPushable("nested aggregate")
        if isinstance(aggregate, exp.Count):
            if aggregate.expressions:
                raise _NotPushable("COUNT of several columns")
            count = self.add(exp.Count(this=argument.copy()))
            return exp.func("COALESCE", exp.Sum(this=count), exp.Literal.number(0))
        if isinstance(aggregate, exp.Avg):
            total = self.add(exp.Sum(this=argument.copy()))
            count = self.add(exp.Count(this=argument.copy()))
            return exp.Div(this=exp.cast(exp.Sum(this=total), "DOUBLE"),
                           expression=exp.Sum(this=count))
        partial = self.add(type(aggregate)(this=argument.copy()))
        return exp.Sum(this=partial) if isinstance(aggregate, exp.Sum) else type(aggregate)(this=partial)


def _split(select: exp.Select, input_schema: pa.Schema) -> tuple[str, str] | None:
    group = select.args.get("group")
    keys = list(group.expressions) if group is not None else []
    for key in keys:
        if key.find(exp.AggFunc) is not None or isinstance(key, exp.Literal):
            return None
    outer = [*select.expressions, select.args.get("having"), select.args.get("order")]
    outer = [node for node in outer if node is not None]
    aggregates = [a for node in outer for a in node.find_all(exp.AggFunc)]
    if not aggregates:
        return None
    if any(not isinstance(a, _PUSHED) for a in aggregates):
        return None
    if any(isinstance(n, exp.Star) for n in select.expressions):
        return None

    group_of = {_key(k): i for i, k in enumerate(keys)}
    partials = _Partials()

    key_kinds = tuple({type(k) for k in keys})  # only nodes of these kinds can be a grouping key

    def substitute(node: exp.Expression) -> exp.Expression:
        index = group_of.get(_key(node)) if key_kinds and isinstance(node, key_kinds) else None
        if index is not None:
            return _column(f"{GROUP_PREFIX}{index}")
        if isinstance(node, exp.AggFunc):
            return partials.merged(node)
        return node

    original_sql = select.sql(dialect="duckdb")
    merge = select.copy()
    merge.set("where", None)
    merge.set("group", None)
    merge.set("expressions", [_replaced(_unaliased(e).copy(), substitute) for e in select.expressions])
    for part in ("having", "order"):
        if select.args.get(part) is not None:
            merge.set(part, _replaced(select.args[part].copy(), substitute))
    source = select.args.get("from_") or select.args.get("from")
    merge.set("from_" if "from_" in select.args else "from",
              exp.From(this=exp.Table(this=exp.Identifier(this=source.this.name, quoted=True))))

    partial = exp.select(*[exp.alias_(k.copy(), f"{GROUP_PREFIX}{i}", quoted=True) for i, k in enumerate(keys)],
                         *[exp.alias_(p, f"{AGGREGATE_PREFIX}{j}", quoted=True)
                           for j, p in enumerate(partials.items)])
    partial.set("from_", source.copy())
    if select.args.get("where") is not None:
        partial.set("where", select.args["where"].copy())
    if keys:
        partial.set("group", exp.Group(expressions=[k.copy() for k in keys]))
        merge.set("group", exp.Group(expressions=[_column(f"{GROUP_PREFIX}{i}") for i in range(len(keys))]))

    table_columns = {name.lower() for name in input_schema.names}
    return _bound(original_sql, partial, merge, input_schema, table_columns)


def _unaliased(node: exp.Expression) -> exp.Expression:
    return node.this if isinstance(node, exp.Alias) else node


def _replaced(node: exp.Expression, replace) -> exp.Expression:
    """``node`` with every subtree ``replace`` changes replaced, top-down; a replacement is not
    visited again (a merged ``SUM(__a0)`` is itself an aggregate)."""
    new = replace(node)
    if new is not node:
        return new
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _replaced(value, replace))
        elif isinstance(value, list):
            node.set(key, [_replaced(v, replace) if isinstance(v, exp.Expression) else v for v in value])
    return node


def _bound(original_sql: str, partial: exp.Select, merge: exp.Select, input_schema: pa.Schema,
           table_columns: set[str]) -> tuple[str, str] | None:
    """Bind the one-step query, the partial and the merge on empty inputs; name (and where the
    types differ, cast) the merged columns as the one-step query's. None when a step does not
    bind, or the merge still reads a table column outside a grouping key or aggregate."""
    source = (partial.args.get("from_")).this.name
    global _engine
    with _engine_lock:
        if _engine is None:
            _engine = duckdb.connect(config={"enable_external_access": False, "lock_configuration": True})
        connection = _engine.cursor()
    try:
        connection.register(source, input_schema.empty_table())
        one_step = connection.sql(original_sql)
        names, types = list(one_step.columns), [str(t) for t in one_step.types]
        partial_sql = partial.sql(dialect="duckdb")
        partial_rows = connection.sql(partial_sql).to_arrow_table()
        aliases = {name.lower() for name in names} | {
            e.alias.lower() for e in merge.expressions if isinstance(e, exp.Alias)}
        outputs = []
        for name, expression in zip(names, merge.expressions):
            outputs.append(exp.alias_(expression, name, quoted=True))
        merge.set("expressions", outputs)
        for column in merge.find_all(exp.Column):
            name = column.name.lower()
            if name.startswith((GROUP_PREFIX, AGGREGATE_PREFIX)):
                continue
            if name in table_columns or name not in aliases:
                return None  # a column outside a grouping key or an aggregate
        connection.unregister(source)
        connection.register(source, partial_rows)
        merge_sql = merge.sql(dialect="duckdb")
        merged = [str(t) for t in connection.sql(merge_sql).types]
        if merged != types:
            for index, (got, wanted) in enumerate(zip(merged, types)):
                if got != wanted:
                    item = merge.expressions[index]
                    item.set("this", exp.cast(item.this, exp.DataType.build(wanted, dialect="duckdb")))
            merge_sql = merge.sql(dialect="duckdb")
            relation = connection.sql(merge_sql)
            if [str(t) for t in relation.types] != types or list(relation.columns) != names:
                return None
        # Where all the rows are local both steps run as one statement (fused_sql): it must give
        # the same names and types.
        connection.unregister(source)
        connection.register(source, input_schema.empty_table())
        relation = connection.sql(fused_sql(source, partial_sql, merge_sql))
        if [str(t) for t in relation.types] != types or list(relation.columns) != names:
            return None
        return partial_sql, merge_sql
    finally:
        connection.close()
