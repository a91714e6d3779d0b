"""Residual SQL on the embedded engine (:mod:`flightstore.sql.engine`, DuckDB with a memory limit
and spilling): its result schema, bound on empty inputs and kept per plan and catalog version
(prepare, GetFlightInfo and DoGet all ask for it), and its result streamed batch by batch from
streamed inputs (:mod:`.inputs`; partial aggregates: :mod:`.fanout`), cut at
``query.max-result-rows``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from flightstore.errors import ResourceExhausted, SqlError
from flightstore.sql import nodes as n
from flightstore.sql.control import QueryControl
from flightstore.sql.engine import InputRescanned
from flightstore.sql.execute.context import ExecutionContext
from flightstore.sql.execute.fanout import PartialAggregates
from flightstore.sql.execute.inputs import ResidualInputs
from flightstore.sql.partial import fused_sql

__all__ = ["ResidualRunner"]


class ResidualRunner:
    """Binds and runs ``Residual`` plans."""

    def __init__(self, context: ExecutionContext, inputs: ResidualInputs,
                 partials: PartialAggregates) -> None:
        self.context = context
        self.inputs = inputs
        self.partials = partials

    def schema(self, plan: n.Residual) -> pa.Schema:
        """The result schema of residual SQL (DuckDB on empty inputs), kept per plan and catalog
        version: prepare, GetFlightInfo and DoGet all ask for it."""
        context = self.context
        try:
            key = (plan.sql, plan.inputs, context.store.catalog.version)
            hash(key)
        except TypeError:
            key = None
        schema = context.engine_schemas.get(key) if key is not None else None
        if schema is None:
            schema = context.engine.schema(plan.sql, {item.name: self._input_schema(item)
                                                      for item in plan.inputs})
            if key is not None:
                context.engine_schemas.put(key, schema)
        return schema

    def run(self, plan: n.Residual, control: QueryControl) -> Iterator[pa.RecordBatch]:
        """Stream the residual SQL's result from streamed inputs; should DuckDB read one input
        twice (the plan scans a table reference more than once) before the first batch came out,
        run it again on materialized inputs."""
        engine = self.context.engine
        fused = len(plan.inputs) == 1 and plan.inputs[0].partial is not None and \
            not self.context.store.table(plan.inputs[0].table).distributed  # a cluster: partials run on leaders
        sql = fused_sql(plan.inputs[0].name, plan.inputs[0].partial, plan.sql) if fused else plan.sql
        inputs = self._fused_inputs(plan, stream=True) if fused else \
            {item.name: self._input_data(item, stream=True) for item in plan.inputs}
        rows = 0
        try:
            for batch in engine.run(sql, inputs, control):
                rows = self._count_result(rows, batch)
                yield batch
        except InputRescanned:
            if rows:
                raise SqlError("the embedded engine read one input twice after the answer had "
                               "begun; the query cannot run streamed") from None
            inputs = self._fused_inputs(plan, stream=False) if fused else \
                {item.name: self._input_data(item) for item in plan.inputs}
            for batch in engine.run(sql, inputs, control):
                rows = self._count_result(rows, batch)
                yield batch

    def _input_schema(self, item: n.ResidualInput) -> pa.Schema:
        return self.partials.schema(item) if item.partial is not None else self.inputs.schema(item)

    def _input_data(self, item: n.ResidualInput, stream: bool = False):
        return self.partials.data(item) if item.partial is not None else self.inputs.data(item, stream)

    def _fused_inputs(self, plan: n.Residual, stream: bool) -> dict:
        """The rows of a plan's one partial input, all held here: the partial and the merge run
        as one statement over them (:func:`~flightstore.sql.partial.fused_sql`), one DuckDB call."""
        item = plan.inputs[0]
        return {item.name: self.inputs.local_rows(item, stream)}

    def _count_result(self, rows: int, batch: pa.RecordBatch) -> int:
        """``rows`` plus the batch's, refused past ``query.max-result-rows``."""
        rows += batch.num_rows
        limit = self.context.max_result_rows
        if limit and rows > limit:
            raise ResourceExhausted(f"the query returns more than {limit:,} rows "
                                    "(server option query.max-result-rows); it was stopped")
        return rows
