"""Partial aggregates run where the rows are (:mod:`flightstore.sql.partial`), and the cluster
fan-out that sends them there.

On one server the partial runs once over a stream of the buckets held here, never materialized.
In a cluster each bucket leader runs it over the buckets it leads (a forwarded ``partial`` read,
:meth:`PartialAggregates.rows`), this server over its own; only partial rows travel. (Measured: a
partial per bucket costs DuckDB ~30% more at 100k groups than one over the same buckets' stream.)
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flightstore.sql import nodes as n
from flightstore.sql.execute.context import ExecutionContext
from flightstore.sql.execute.inputs import ResidualInputs, small_batches
from flightstore.sql.execute.results import cast_to, fields
from flightstore.sql.plan import is_union

__all__ = ["PartialAggregates", "routed"]


def routed(table) -> bool:
    """Whether ``table`` is a cluster table whose buckets other servers lead (not a union table:
    its lake part is read here)."""
    return hasattr(table, "peers") and hasattr(table, "local") and not is_union(table.descriptor)


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
        it holds (pruned, skipped by statistics), never materialized."""
        schema = self.schema(item)
        table = self.context.store.table(item.table)
        if routed(table):
            return self._cluster(table, item, schema)
        batches = list(self.context.engine.run(item.partial,
                                               {item.name: self.inputs.local_rows(item, stream=True)}))
        return cast_to(pa.Table.from_batches(batches, schema=batches[0].schema) if batches
                       else schema.empty_table(), schema)

    def _cluster(self, table, item: n.ResidualInput, schema: pa.Schema) -> pa.Table:
        """In a cluster: each leader runs ``item.partial`` over the buckets it leads (a forwarded
        ``partial`` call, :meth:`rows`), this server over its own; only partial rows travel."""
        from flightstore.server.auth import CALLER_TOKEN
        mine: list[int] = []
        theirs: dict[int, tuple] = {}
        places = table.locations()
        for bucket in table.bucket_ids(item.partitions):
            place = places[int(bucket) % len(places)] if places else None
            if place is None or place.leader == table.server_id:
                mine.append(int(bucket))
            else:
                place.require()
                theirs.setdefault(place.leader, (place, []))[1].append(int(bucket))
        token = CALLER_TOKEN.get()
        parts = [self.rows(table.local, item, mine)] if mine else []
        for place, buckets in theirs.values():
            parts.append(table.peers.get_table(place, {
                "op": "partial", "table": str(item.table), "columns": list(item.columns),
                "filter": item.filter.to_dict() if item.filter is not None else None,
                "buckets": buckets, "partial": item.partial, "name": item.name}, token))
        return pa.concat_tables([cast_to(p, schema) for p in parts]) if parts else schema.empty_table()

    def rows(self, table, item: n.ResidualInput, buckets: Sequence[int]) -> pa.Table:
        """``item.partial`` over ``buckets`` of ``table`` held here (a stream, never materialized)."""
        rows_schema = fields(table.descriptor.schema, item.columns)
        batches = table.scan(list(item.columns), item.filter, buckets=list(buckets), exact=False)
        out = list(self.context.engine.run(item.partial, {item.name: (rows_schema, small_batches(batches))}))
        return pa.Table.from_batches(out, schema=out[0].schema) if out else self.schema(item).empty_table()
