"""Run a plan against the store and yield Arrow record batches.

The routes of the planner map one-to-one onto the embedded API (``flightstore.store``): point and
prefix lookups onto KV multi-gets and prefix scans, ``Count`` onto maintained counts, ``Scan`` onto
column-pruned, statistics-skipping scans (one partition per bucket), ``RangeScan`` onto RocksDB seek
ranges (one partition per bucket it visits), ``Changelog`` onto the logs.
``UnionScan`` onto a union read of a datalake-enabled log table (:mod:`flightstore.lake.union`: the lake
below the tiered offsets plus the log from there), ``LakeScan`` onto a pyiceberg read of the lake
(time travel included), ``t$lake$snapshots`` / ``t$lake$status`` onto the lake's commits and the
tiering status. ``Residual`` SQL runs on the embedded engine (:mod:`flightstore.sql.engine`, DuckDB
with a memory limit and spilling) fed by pruned, pre-filtered Arrow **streams** (each catalog table
input is scanned batch by batch as DuckDB pulls it) and its result streams out batch by batch.
Statements (DDL, writes) run once and answer one ``rows_affected`` row.

Every query runs under a :class:`~flightstore.sql.control.QueryControl` (``query.timeout``, and
whatever the server adds: CancelFlightInfo, the caller's disconnection): the stream stops between
batches, and the engine's watchdog interrupts DuckDB mid-batch.

Every query has an exact :meth:`Executor.output_schema` known before it runs (Flight SQL clients
check that FlightInfo's schema equals the stream's, nullability included), and every batch a
partition yields is cast to it.

One module per concern, each readable alone:

================  ==============================================================================
``executor``      :class:`Executor`: plan -> the part that runs it; output schemas, partitions
``context``       what every part runs with: store, DuckDB engine, lake, ``query.*`` limits
``plan_cache``    plans by statement shape; point-lookup templates (no parsing per literal)
``lookups``       the point- and prefix-lookup fast path (KV multi-gets)
``changelog``     ``t$changelog`` / ``t$binlog``
``views``         ``t$partitions``, ``t$lake*``, DESCRIBE, SHOW PARTITIONS, EXPLAIN's union lines
``inputs``        residual SQL's inputs: streamed or materialized scans, other sources
``fanout``        partial aggregates where the rows are; the cluster fan-out to bucket leaders
``residual_sql``  residual SQL on DuckDB: bound schemas, streamed results, result-row limit
``statements``    DDL and writes (``rows_affected``)
``results``       query vs statement, fixed result schemas, casts to the exact result schema
================  ==============================================================================
"""

from flightstore.sql.execute.executor import Executor
from flightstore.sql.execute.plan_cache import StoreCatalog
from flightstore.sql.execute.results import ROWS_AFFECTED_SCHEMA, is_query

__all__ = ["ROWS_AFFECTED_SCHEMA", "Executor", "StoreCatalog", "is_query"]
