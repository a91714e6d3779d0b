"""Partial aggregates run where the rows are (:mod:`flightstore.sql.partial`), and the cluster
fan-out that sends them there.

On one server the partial runs once over a stream of the buckets held here, never materialized.
In a cluster each bucket leader runs it over the buckets it leads (a peer ``partial`` read carrying
the partial as a :class:`~flightstore.sql.partial_plan.PartialPlan`, which the leader checks and
turns into SQL itself; :meth:`PartialAggregates.rows`), this server over its own; only partial
rows travel. (Measured: a
partial per bucket costs DuckDB ~30% more at 100k groups than one over the same buckets' stream.)
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flightstore.sql import nodes as n
from flightstore.sql.execute.context import ExecutionContext
from flightstore.sql.execute.inputs import ResidualInputs, small_batches
from flightstore.sql.execute.results import cast_to, fields
from flightstore.sql.partial_plan import PartialPlan
from flightstore.sql.plan import is_union

__all__ = ["PartialAggregates"]


class PartialAggregates:
    """The schema and rows of a partial-aggregate input (``item.partial`` set)."""

    def __init__(self, context: ExecutionContext, inputs: ResidualInputs) -> None:
        self.context = context
        self.inputs = inputs

    def schema(self, item: n.ResidualInput) -> pa.Schema:
        """The schema of ``item.partial``'s rows (DuckDB on an empty input), kept per input and
        catalog version like the residual schemas."""
        context = self.context
        key = (item, context.store.catalog.version)
        schema = context.engine_schemas.get(key)
        if schema is None:
            rows = fields(context.store.table(item.table).descriptor.schema, item.columns)
            schema = context.engine.schema(item.partial, {item.name: rows})
            context.engine_schemas.put(key, schema)
        return schema

    def data(self, item: n.ResidualInput) -> pa.Table:
        """``item.partial`` run where the rows are: once per server over a stream of the buckets
        it holds (pruned, skipped by statistics), never materialized. In a cluster each leader
        runs it over the buckets it leads (the table's ``partial_aggregates``: a peer ``partial``
        call, :meth:`rows`); only partial rows travel."""
        schema = self.schema(item)
        table = self.context.store.table(item.table)
        if is_union(table.descriptor):  # its lake part is read here
            batches = list(self.context.engine.run(item.partial,
                                                   {item.name: self.inputs.local_rows(item, stream=True)}))
            return cast_to(pa.Table.from_batches(batches, schema=batches[0].schema) if batches
                           else schema.empty_table(), schema)
        remote = {"op": "partial", "columns": list(item.columns),
                  "filter": item.filter.to_dict() if item.filter is not None else None,
                  "plan": PartialPlan.from_sql(item.partial, item.name).to_json()}  # never SQL text
        parts = table.partial_aggregates(table.bucket_ids(item.partitions),
                                         lambda local, buckets: self.rows(local, item, buckets), remote)
        return pa.concat_tables([cast_to(p, schema) for p in parts]) if parts else schema.empty_table()

    def rows(self, table, item: n.ResidualInput, buckets: Sequence[int]) -> pa.Table:
        """``item.partial`` over ``buckets`` of ``table`` held here (a stream, never materialized)."""
        rows_schema = fields(table.descriptor.schema, item.columns)
        batches = table.scan(list(item.columns), item.filter, buckets=list(buckets), exact=False)
        out = list(self.context.engine.run(item.partial, {item.name: (rows_schema, small_batches(batches))}))
        return pa.Table.from_batches(out, schema=out[0].schema) if out else self.schema(item).empty_table()
