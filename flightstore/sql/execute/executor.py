"""The executor: plans a statement (through its :class:`~.plan_cache.PlanCache`) and runs the
plan by its route, each route in the part that owns it.

This module is the dispatcher only: which part answers which plan node, the result's exact
:meth:`Executor.output_schema`, how a result splits into independent partitions (one per bucket),
and the casts and stop checks between batches. The routes themselves live in :mod:`.lookups`
(point and prefix lookups), :mod:`.changelog`, :mod:`.views` (``$partitions``, ``$lake*``,
DESCRIBE), :mod:`.residual_sql` (DuckDB, fed by :mod:`.inputs` and :mod:`.fanout`) and
:mod:`.statements` (DDL, writes).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from flightstore.catalog import DEFAULT_DATABASE
from flightstore.errors import Unsupported
from flightstore.schema import TablePath
from flightstore.sql import nodes as n
from flightstore.sql.control import QueryControl
from flightstore.sql.engine import SqlEngine
from flightstore.sql.execute.changelog import changelog_batches, changelog_table
from flightstore.sql.execute.context import ExecutionContext
from flightstore.sql.execute.fanout import PartialAggregates
from flightstore.sql.execute.inputs import ResidualInputs
from flightstore.sql.execute.lookups import point_lookup, point_row, prefix_lookup
from flightstore.sql.execute.plan_cache import PlanCache
from flightstore.sql.execute.residual_sql import ResidualRunner
from flightstore.sql.execute.results import (
    DESCRIBE_SCHEMA,
    ROWS_AFFECTED_SCHEMA,
    SHOW_PARTITIONS_SCHEMA,
    cast_to,
    fields,
    is_query,
)
from flightstore.sql.execute.statements import Statements
from flightstore.sql.execute.views import SystemViews
from flightstore.sql.grants import SHOW_GRANTS_SCHEMA
from flightstore.sql.plan import is_union
from flightstore.sql.resolve import binlog_schema, changelog_schema, lake_schema
from flightstore.store import Store

__all__ = ["Executor", "is_query"]


class Executor:
    """Plans and runs SQL against one store. Thread-safe (no per-query state is kept here).

    ``lake`` (a :class:`flightstore.lake.LakeCatalog`) is where datalake-enabled tables are tiered:
    without it (an embedded store, cluster mode) a union read is the log alone and the ``$lake``
    views are refused. ``tierer`` (a :class:`flightstore.lake.LakeTierer`), when this process
    tiers, feeds ``t$lake$status`` its last error; without it the status comes from the lake."""

    def __init__(self, store: Store, lake: Any = None, tierer: Any = None,
                 cache_entries: int | None = None) -> None:
        """``cache_entries`` bounds each cache (plans, point-lookup templates, residual schemas);
        default: the store's ``sql.cache.entries`` option."""
        self.context = context = ExecutionContext(store, lake, tierer, cache_entries)
        self.plan_cache = PlanCache(store, context.cache_entries)
        self.views = SystemViews(context)
        self.inputs = ResidualInputs(context, self.views)
        self.partials = PartialAggregates(context, self.inputs)
        self.residuals = ResidualRunner(context, self.inputs, self.partials)
        self.statements = Statements(context, self.execute_table)

    # The server sets the lake and the tierer after construction: every part reads them from the
    # context at run time.
    @property
    def store(self) -> Store:
        return self.context.store

    @property
    def engine(self) -> SqlEngine:
        return self.context.engine

    @property
    def lake(self) -> Any:
        return self.context.lake

    @lake.setter
    def lake(self, lake: Any) -> None:
        self.context.lake = lake

    @property
    def tierer(self) -> Any:
        return self.context.tierer

    @tierer.setter
    def tierer(self, tierer: Any) -> None:
        self.context.tierer = tierer

    @property
    def materialize_limit(self) -> int:
        return self.context.materialize_limit

    def control(self, caller_gone=None) -> QueryControl:
        """A new query's stop conditions: the ``query.timeout`` deadline (from now) and
        ``caller_gone`` (the server passes its call context's ``is_cancelled``)."""
        return QueryControl(self.context.query_timeout_s, caller_gone)

    def close(self) -> None:
        """Release the embedded engine (its spill files go with it)."""
        self.context.engine.close()

    # ---- planning -----------------------------------------------------------------------------
    def plan(self, sql: str, params: Sequence[Any] | None = None,
             database: str = DEFAULT_DATABASE) -> n.PlanNode:
        """Plan ``sql`` (cached by statement shape: :class:`~.plan_cache.PlanCache`)."""
        return self.plan_cache.plan(sql, params, database)

    def point_key(self, sql: str, params: Sequence[Any] | None,
                  database: str = DEFAULT_DATABASE) -> tuple[n.PointLookup, tuple[int, ...]] | None:
        """A learned point-lookup template of ``sql`` and its integer key, unplanned
        (:meth:`~.plan_cache.PlanCache.point_key`); read it with :meth:`point_row`."""
        return self.plan_cache.point_key(sql, params, database)

    def point_row(self, plan: n.PointLookup, values: Sequence[int]) -> tuple[pa.Table, int] | None:
        """The answer of ``plan`` for the key ``values`` and its buffer bytes
        (:func:`~.lookups.point_row`), or None: run the plan of the statement instead."""
        return point_row(self.context.store, plan, values)

    def output_schema(self, plan: n.PlanNode) -> pa.Schema:
        """The exact schema of the plan's result (statements: ``rows_affected``)."""
        store = self.context.store
        if isinstance(plan, (n.PointLookup, n.PrefixLookup, n.Scan, n.RangeScan, n.UnionScan)):
            return store.table(plan.table).projection(plan.columns)
        if isinstance(plan, n.LakeScan):
            return fields(lake_schema(store.table(plan.table).descriptor), plan.columns)
        if isinstance(plan, n.Count):
            return pa.schema([pa.field(plan.column_name, pa.int64(), nullable=False)])
        if isinstance(plan, n.Changelog):
            descriptor = store.table(plan.table).descriptor
            full = binlog_schema(descriptor) if plan.kind == "binlog" else changelog_schema(descriptor)
            return fields(full, plan.columns)
        if isinstance(plan, n.Residual):
            return self.residuals.schema(plan)
        if isinstance(plan, n.ShowDatabases):
            return pa.schema([pa.field("database_name", pa.string(), nullable=False)])
        if isinstance(plan, n.ShowTables):
            return pa.schema([pa.field("table_name", pa.string(), nullable=False)])
        if isinstance(plan, n.Describe):
            return DESCRIBE_SCHEMA
        if isinstance(plan, n.ShowPartitions):
            return SHOW_PARTITIONS_SCHEMA
        if isinstance(plan, n.Explain):
            return pa.schema([pa.field("plan", pa.string(), nullable=False)])
        if isinstance(plan, n.ShowGrants):
            return SHOW_GRANTS_SCHEMA
        return ROWS_AFFECTED_SCHEMA

    def partitions(self, plan: n.PlanNode) -> list[int | None]:
        """Independent pieces of the result: one per bucket for scans (of the pruned partitions of
        a partitioned table: one per partition and bucket), else a single ``None``."""
        if isinstance(plan, n.RangeScan) and plan.bucket is not None:
            return [plan.bucket]
        if isinstance(plan, (n.Scan, n.RangeScan, n.UnionScan, n.Changelog)) and plan.limit is None:
            if isinstance(plan, n.Changelog) and plan.kind == "binlog":
                return [None]
            if isinstance(plan, n.UnionScan):  # each bucket: its lake files, then its log tail
                from flightstore.lake.union import union_buckets
                buckets = union_buckets(self.context.store.table(plan.table), plan.filter)
                return buckets if len(buckets) > 1 else [None]
            buckets = self.context.store.table(plan.table).bucket_ids(plan.partitions)
            if len(buckets) > 1:
                return list(buckets)
        return [None]

    # ---- running ------------------------------------------------------------------------------
    def execute(self, plan: n.PlanNode, partition: int | None = None,
                schema: pa.Schema | None = None,
                control: QueryControl | None = None) -> Iterator[pa.RecordBatch]:
        """Yield the result batches of ``plan`` (of one bucket when ``partition`` is given), cast
        to ``schema``: the plan's :meth:`output_schema`, computed here unless the caller has it
        (for residual SQL that costs a DuckDB run). The stream stops (Cancelled, DeadlineExceeded)
        between batches when ``control`` (default: a new one with ``query.timeout``) says so."""
        schema = self.output_schema(plan) if schema is None else schema
        control = self.control() if control is None else control
        for batch in self._run(plan, partition, control):
            control.check()
            if batch.num_rows:
                yield cast_to(batch, schema)

    def answers_at_once(self, plan: n.PlanNode) -> bool:
        """Whether ``plan`` is cheap and small enough to run while its FlightInfo is built: point
        lookups (bounded by the keys in the statement), counts and catalog listings."""
        return isinstance(plan, (n.PointLookup, n.Count, n.ShowDatabases, n.ShowTables, n.Describe,
                                 n.Explain, n.ShowGrants, n.ShowPartitions))

    def execute_table(self, plan: n.PlanNode, schema: pa.Schema | None = None) -> pa.Table:
        if isinstance(plan, n.PointLookup) and plan.filter is None:
            # The common case on its own (a lookup answers whole, in the plan's column order):
            # no partitions, generators, filter or re-selection for one multi-get.
            found = point_lookup(self.context.store, plan)
            return found if schema is None else cast_to(found, schema)
        schema = self.output_schema(plan) if schema is None else schema
        # A union read in one piece reads the lake once, not once per bucket.
        parts = [None] if isinstance(plan, n.UnionScan) else self.partitions(plan)
        pieces = [b if isinstance(b, pa.Table) else pa.Table.from_batches([b])
                  for p in parts for b in self.execute(plan, p, schema)]
        if len(pieces) == 1:
            return pieces[0]
        return pa.concat_tables(pieces) if pieces else schema.empty_table()

    def run_statement(self, plan: n.PlanNode) -> int:
        """Execute a DDL or write statement; return the number of rows it affected."""
        return self.statements.run(plan)

    def changelog_table(self, path: TablePath, kind: str, partition: int | None = None,
                        partitions: tuple[str, ...] | None = None) -> pa.Table:
        return changelog_table(self.context.store, path, kind, partition, partitions)

    def partial_schema(self, item: n.ResidualInput) -> pa.Schema:
        """The schema of a partial aggregate's rows (a cluster peer asks before it forwards)."""
        return self.partials.schema(item)

    def partial_rows(self, table, item: n.ResidualInput, buckets: Sequence[int]) -> pa.Table:
        """``item.partial`` over ``buckets`` of ``table`` held here (a forwarded partial read)."""
        return self.partials.rows(table, item, buckets)

    def _run(self, plan: n.PlanNode, partition: int | None,
             control: QueryControl) -> Iterator[pa.RecordBatch | pa.Table]:
        context = self.context
        store = context.store
        if isinstance(plan, n.PointLookup):
            yield point_lookup(store, plan)
        elif isinstance(plan, n.PrefixLookup):
            yield prefix_lookup(store, plan)
        elif isinstance(plan, n.Scan):
            table = store.table(plan.table)
            buckets = None if partition is None else [partition]
            yield from table.scan(list(plan.columns), plan.filter, plan.limit, buckets)
        elif isinstance(plan, n.UnionScan):
            from flightstore.lake.union import read_union
            table = store.table(plan.table)
            yield from read_union(context.lake, table, plan.columns, filter=plan.filter, limit=plan.limit,
                                  buckets=None if partition is None else [partition])
        elif isinstance(plan, n.LakeScan):
            yield from self.views.lake_rows(plan.table, plan.columns, plan.filter, plan.limit,
                                            plan.snapshot_id, plan.as_of_ms, stream=True)[1]
        elif isinstance(plan, n.RangeScan):
            table = store.table(plan.table)
            buckets = [partition] if partition is not None else \
                None if plan.bucket is None else [plan.bucket]
            yield from table.scan(list(plan.columns), plan.filter, plan.limit, buckets, plan.range)
        elif isinstance(plan, n.Count):
            table = store.table(plan.table)
            if is_union(table.descriptor):
                from flightstore.lake.union import union_count
                count = union_count(context.lake, table, partitions=plan.partitions)
            else:
                count = table.row_count() if plan.partitions is None else table.row_count(plan.partitions)
            yield pa.table({plan.column_name: pa.array([count], pa.int64())})
        elif isinstance(plan, n.ShowPartitions):
            yield self.views.show_partitions_table(plan.table)
        elif isinstance(plan, n.Changelog):
            yield from changelog_batches(store, plan, partition)
        elif isinstance(plan, n.Residual):
            yield from self.residuals.run(plan, control)
        elif isinstance(plan, n.ShowDatabases):
            yield pa.table({"database_name": store.list_databases()})
        elif isinstance(plan, n.ShowTables):
            yield pa.table({"table_name": pa.array(store.list_tables(plan.database), pa.string())})
        elif isinstance(plan, n.Describe):
            yield self.views.describe_table(plan.table)
        elif isinstance(plan, n.Explain):
            lines = [plan.plan.explain()]
            if isinstance(plan.plan, n.UnionScan):
                lines += self.views.union_parts(plan.plan)
            yield pa.table({"plan": lines})
        elif isinstance(plan, n.ShowGrants):
            raise Unsupported("SHOW GRANTS needs a server (the embedded store has no users)")
        else:
            yield pa.table({"rows_affected": pa.array([self.run_statement(plan)], pa.int64())})
