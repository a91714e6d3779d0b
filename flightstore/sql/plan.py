"""The pure planner: SQL text + a catalog view in, a plan out. No I/O, no storage calls.

Queries take the route table of ARCHITECTURE.md when the SELECT is a plain projection of columns
(or ``*``) from one table with an optional storage-evaluable WHERE and LIMIT:

* every primary-key column pinned by ``=`` / ``IN`` -> :class:`PointLookup`;
* leading primary-key columns pinned by ``=`` and the next one bounded by ``<``, ``<=``, ``>``,
  ``>=`` or ``BETWEEN`` -> :class:`RangeScan` (one RocksDB seek range per bucket, or one bucket when
  the bucket key is pinned; see :mod:`flightstore.kv.ranges`);
* every bucket-key column pinned, the bucket key a strict prefix of the PK -> :class:`PrefixLookup`;
* leading primary-key columns pinned by ``=`` without the bucket key -> :class:`RangeScan`;
* ``SELECT COUNT(*) FROM t`` -> :class:`Count`;
* ``FROM t$changelog`` / ``t$binlog`` -> :class:`Changelog`;
* otherwise -> :class:`Scan` with the WHERE as a bound predicate.

Everything else is a :class:`Residual` (see :mod:`flightstore.sql.residual`). Writes are planned in
:mod:`flightstore.sql.dml`, DDL and metadata statements in :mod:`flightstore.sql.ddl`.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlglot import exp

from flightstore.errors import InvalidInput, SqlError
from flightstore.expressions import Predicate, and_all
from flightstore.kv.ranges import key_range, pinned_bucket, residual_predicates
from flightstore.partitioning import pruned_names
from flightstore.sql import ddl, dml, grants, nodes
from flightstore.sql.alter import plan_alter, plan_show_partitions
from flightstore.sql.literals import NotALiteral, literal_value
from flightstore.sql.nodes import *  # noqa: F401,F403 - the nodes are part of this module's API
from flightstore.sql.nodes import (
    Changelog,
    Count,
    LakeScan,
    Plan,
    PointLookup,
    PrefixLookup,
    RangeScan,
    Scan,
    UnionScan,
)
from flightstore.sql.nodes import __all__ as _NODES
from flightstore.sql.parameters import parameter_schema
from flightstore.sql.parse import Alter as ParsedAlter
from flightstore.sql.parse import Explain as ParsedExplain
from flightstore.sql.parse import Show, bind_parameters, parse_statement
from flightstore.sql.predicates import conjuncts, extract_keys, to_predicate
from flightstore.sql.residual import plan_residual
from flightstore.sql.resolve import CatalogView, ResolvedTable, resolve_column, resolve_table_node

__all__ = ["CatalogView", "plan", "plan_statement", "plan_query", "parameter_schema", "COUNT_COLUMN", "is_union",
           *_NODES]

COUNT_COLUMN = "count_star()"  # the name DuckDB gives COUNT(*), so both routes agree

_PLAIN_ARGS = {"expressions", "from", "from_", "where", "limit"}


def plan(sql: str, catalog: CatalogView, params: Sequence[Any] | None = None) -> Plan:
    """Plan one SQL statement; ``params`` fill its ``?`` / ``$n`` placeholders in order.

    Raises SqlError (syntax, unknown column, literal mismatch, parameter count), TableNotFound,
    DatabaseNotFound, Unsupported, and InvalidInput subclasses from table validation.
    """
    statement = parse_statement(sql)
    return plan_statement(_bind(statement, params), catalog)


def _bind(statement: Any, params: Sequence[Any] | None) -> Any:
    if isinstance(statement, ParsedExplain):
        return ParsedExplain(_bind(statement.statement, params))
    if isinstance(statement, exp.Expression):
        return bind_parameters(statement, params)
    if params:
        raise SqlError(f"the statement takes no parameters but {len(params)} were given")
    return statement


def plan_statement(statement: Any, catalog: CatalogView) -> Plan:
    """Plan a parsed statement (parameters already bound)."""
    if isinstance(statement, ParsedExplain):
        return nodes.Explain(plan_statement(statement.statement, catalog))
    if isinstance(statement, Show):
        if statement.what == "partitions":
            return plan_show_partitions(statement.table, catalog)
        return ddl.plan_show(statement, catalog)
    if isinstance(statement, ParsedAlter):
        return plan_alter(statement, catalog)
    if isinstance(statement, grants.GrantStatement):
        return grants.plan_grant(statement, catalog)
    if isinstance(statement, grants.ShowGrantsStatement):
        return grants.plan_show_grants(statement, catalog)
    if isinstance(statement, exp.Query):
        return plan_query(statement, catalog)
    if isinstance(statement, exp.Insert):
        return dml.plan_insert(statement, catalog, plan_query)
    if isinstance(statement, exp.Delete):
        return dml.plan_delete(statement, catalog)
    if isinstance(statement, exp.Update):
        return dml.plan_update(statement, catalog)
    return ddl.plan_ddl(statement, catalog)


def plan_query(ast: exp.Expression, catalog: CatalogView) -> Plan:
    """Route a query: a storage route for plain projections, else a residual plan."""
    if isinstance(ast, exp.Select) and _is_plain(ast):
        routed = _plan_plain(ast, catalog)
        if routed is not None:
            return routed
    return plan_residual(ast, catalog)


def _is_plain(select: exp.Select) -> bool:
    for key, value in select.args.items():
        if key not in _PLAIN_ARGS and value not in (None, False, [], ""):
            return False
    source = select.args.get("from_") or select.args.get("from")
    if source is None or not isinstance(source.this, exp.Table):
        return False
    limit = select.args.get("limit")
    if limit is not None and (not isinstance(limit, exp.Limit) or limit.args.get("offset")):
        return False
    where = select.args.get("where")
    return where is None or not where.find(exp.Select, exp.Subquery)


def _limit(select: exp.Select) -> int | None | bool:
    """The LIMIT as an int, None without LIMIT, False when it is not a literal count."""
    limit = select.args.get("limit")
    if limit is None:
        return None
    try:
        value = literal_value(limit.expression)
    except NotALiteral:
        return False
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SqlError(f"LIMIT must be a non-negative integer, not {limit.expression.sql()}")
    return value


def _count_name(select: exp.Select) -> str | None:
    """The output column name when the projection is exactly ``COUNT(*) [AS name]``."""
    if len(select.expressions) != 1:
        return None
    item = select.expressions[0]
    name = COUNT_COLUMN
    if isinstance(item, exp.Alias):
        name, item = item.alias, item.this
    if isinstance(item, exp.Count) and isinstance(item.this, exp.Star):
        return name
    return None


def _plan_plain(select: exp.Select, catalog: CatalogView) -> Plan | None:
    source = (select.args.get("from_") or select.args.get("from")).this
    table = resolve_table_node(catalog, source)
    if table.source in ("partitions", "lake_snapshots", "lake_status"):
        return None  # a small virtual table: the embedded engine answers any query on it
    qualifiers = {source.alias_or_name.lower(), source.name.lower()}

    limit = _limit(select)
    if limit is False:
        return None

    def column_of(column: exp.Column) -> str | None:
        if column.table and column.table.lower() not in qualifiers:
            return None
        return resolve_column(table.schema, column.name, _shown(table))

    predicates: list[Predicate] = []
    where = select.args.get("where")
    for term in conjuncts(where.this if where is not None else None):
        predicate = to_predicate(term, column_of, table.schema)
        if predicate is None:
            return None
        try:
            predicates.append(predicate.bind(table.schema))
        except InvalidInput as exc:
            raise SqlError(str(exc)) from None

    count_name = _count_name(select)
    if count_name is not None:
        return _count(table, count_name, predicates, limit)

    columns = _projection(select, table, qualifiers)
    if columns is None:
        return None

    if table.source == "lake":
        return LakeScan(table=table.path, columns=columns, filter=and_all(predicates), limit=limit,
                        snapshot_id=table.snapshot_id, as_of_ms=table.as_of_ms)
    if table.source != "table":
        return Changelog(table=table.path, kind=table.source, columns=columns,  # type: ignore[arg-type]
                         filter=and_all(predicates), limit=limit,
                         partitions=pruned_names(table.descriptor, and_all(predicates)))
    return _route(table, columns, predicates, limit)


def _count(table: ResolvedTable, name: str, predicates: list[Predicate], limit: int | None) -> Plan | None:
    """``COUNT(*)`` from maintained counts: the whole table, or the partitions a WHERE over
    partition columns only selects (such a WHERE decides every row of a partition alike)."""
    if table.source != "table" or limit is not None:
        return None
    descriptor = table.descriptor
    if not predicates:
        return Count(table=table.path, column_name=name,
                     partitions=pruned_names(descriptor, None))
    keys = set(descriptor.partition_keys)
    if keys and all(p.columns() <= keys for p in predicates):
        return Count(table=table.path, column_name=name,
                     partitions=pruned_names(descriptor, and_all(predicates)))
    return None


def _shown(table: ResolvedTable) -> str:
    return table.shown


def _projection(select: exp.Select, table: ResolvedTable, qualifiers: set[str]
                ) -> tuple[str, ...] | None:
    """The selected column names, or None when the projection is not plain columns / ``*``."""
    items = select.expressions
    if len(items) == 1 and isinstance(items[0], exp.Star):
        return tuple(table.schema.names)
    columns: list[str] = []
    for item in items:
        if not isinstance(item, exp.Column) or isinstance(item.this, exp.Star):
            return None
        if item.table and item.table.lower() not in qualifiers:
            return None
        columns.append(resolve_column(table.schema, item.name, _shown(table)))
    if len(set(columns)) != len(columns):
        return None
    return tuple(columns)


def _route(table: ResolvedTable, columns: tuple[str, ...], predicates: list[Predicate],
           limit: int | None) -> Plan:
    descriptor = table.descriptor
    schema = table.schema
    pk = descriptor.primary_key
    partitions = pruned_names(descriptor, and_all(predicates))
    if pk:
        found = extract_keys(predicates, pk, schema)
        if found is not None:
            keys, remaining = found
            if limit is None or limit >= keys.num_rows:
                return PointLookup(table=table.path, keys=keys, columns=columns,
                                   filter=and_all(remaining))
            return Scan(table=table.path, columns=columns, filter=and_all(predicates), limit=limit,
                        partitions=partitions)
        found_range = key_range(predicates, descriptor)
        if found_range is not None and set(found_range.columns) <= set(descriptor.partition_keys):
            found_range = None  # a range of partition values only: the pruning decides it
        if found_range is not None and found_range.bounded:
            return _range_scan(table, columns, predicates, limit, found_range, partitions)
        # A prefix lookup pins the bucket key (and, partitioned, the partition keys before it).
        prefix_key = tuple(descriptor.partition_keys) + tuple(descriptor.bucket_key)
        if descriptor.bucket_key and len(prefix_key) < len(pk) and pk[: len(prefix_key)] == prefix_key:
            found = extract_keys(predicates, prefix_key, schema)
            if found is not None:
                prefix, remaining = found
                return PrefixLookup(table=table.path, prefix=prefix, columns=columns,
                                    filter=and_all(remaining), limit=limit)
        if found_range is not None:
            return _range_scan(table, columns, predicates, limit, found_range, partitions)
    if is_union(descriptor):
        return UnionScan(table=table.path, columns=columns, filter=and_all(predicates), limit=limit)
    return Scan(table=table.path, columns=columns, filter=and_all(predicates), limit=limit,
                partitions=partitions)


def is_union(descriptor) -> bool:
    """Whether a plain read of the table is a union of its lake and its log: a datalake-enabled
    log table, partitioned or not (primary-key tables answer from the KV, their current state)."""
    return bool(descriptor.option("table.datalake.enabled")) and not descriptor.primary_key


def _range_scan(table: ResolvedTable, columns: tuple[str, ...], predicates: list[Predicate],
                limit: int | None, found_range, partitions: tuple[str, ...] | None) -> RangeScan:
    """The filter keeps what the range does not decide exactly (other columns, float keys...). A
    partitioned table's range is read in each pruned partition (a pinned bucket key pins one
    bucket per partition, which the partition's scan finds itself)."""
    return RangeScan(table=table.path, columns=columns, range=found_range,
                     bucket=None if partitions is not None else pinned_bucket(predicates, table.descriptor),
                     filter=and_all(residual_predicates(predicates, found_range, table.schema)),
                     limit=limit, partitions=partitions)
