"""What a plan answers: whether it is a query (rows) or a statement (``rows_affected``), the fixed
result schemas, and the casts every part applies so each batch has the result's exact schema
(Flight SQL clients check FlightInfo's schema against the stream's, nullability included).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flightstore.sql import nodes as n

__all__ = ["DESCRIBE_SCHEMA", "ROWS_AFFECTED_SCHEMA", "SHOW_PARTITIONS_SCHEMA", "cast_to", "fields",
           "is_query"]

ROWS_AFFECTED_SCHEMA = pa.schema([pa.field("rows_affected", pa.int64(), nullable=False)])
DESCRIBE_SCHEMA = pa.schema([pa.field("name", pa.string(), nullable=False),
                             pa.field("type", pa.string(), nullable=False),
                             pa.field("null", pa.bool_(), nullable=False),
                             pa.field("key", pa.string()),
                             pa.field("partition_key", pa.bool_(), nullable=False)])
SHOW_PARTITIONS_SCHEMA = pa.schema([pa.field("partition", pa.string(), nullable=False)])
_QUERY_NODES = (n.PointLookup, n.PrefixLookup, n.Scan, n.RangeScan, n.UnionScan, n.LakeScan, n.Count,
                n.Changelog, n.Residual,
                n.ShowDatabases, n.ShowTables, n.Describe, n.Explain, n.ShowGrants, n.ShowPartitions)


def is_query(plan: n.PlanNode) -> bool:
    """Whether the plan returns rows (as opposed to a statement that changes something)."""
    return isinstance(plan, _QUERY_NODES)


def fields(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """``columns`` of ``schema``, in that order."""
    return pa.schema([schema.field(c) for c in columns])


def cast_to(batch: pa.RecordBatch | pa.Table, schema: pa.Schema) -> pa.RecordBatch | pa.Table:
    """``batch`` with ``schema``'s names and types (itself when it has them already)."""
    if batch.schema.equals(schema):
        return batch
    return batch.rename_columns(schema.names).cast(schema)
