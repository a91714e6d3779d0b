"""The aggregation merge engine (Fluss FIP-21): each non-key field folds its values with a function.

Configuration: ``'table.merge-engine' = 'aggregation'``, per field ``'fields.<field>.agg' =
'<function>'`` and parameters ``'fields.<field>.<function>.<param>'`` (e.g.
``'fields.tags.listagg.delimiter' = ';'``). A non-key field without a setting uses
``last_value_ignore_nulls``. :func:`validate_aggregation` checks all of it at CREATE TABLE.

Semantics of a write (rows applied as if one by one, in batch order):

* an upsert (+I/+U) creates the row if missing and aggregates every written field into it;
* a retraction (-U or -D, beyond Fluss) takes the row's contribution back for functions that can
  (see :mod:`flightstore.kv.merge.aggregate`); a retraction of a key that does not exist yet is
  dropped (as Flink does); the row stays even when every value was retracted (a -D never removes
  it, so the row count only grows). A -D with only the key (``Table.delete(keys)``) retracts nulls:
  it changes nothing, but it is still refused when a written field cannot retract;
* :meth:`AggregationMerger.check_write` refuses, before anything is written, a write holding
  retractions when a written field's function cannot retract (unless ``table.delete.behavior`` is
  ``ignore``: the table drops retractions first, or ``disable``: the table refuses them);
* a partial update (``target_columns``) aggregates only the written fields; the others keep their
  stored values.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.config import FIELD_OPTION_PATTERN
from flightstore.errors import InvalidInput
from flightstore.kv.merge.aggregate import AGGREGATORS, DEFAULT_FUNCTION, FieldAggregator, FieldInput
from flightstore.kv.merge.base import MergeInput, MergeResult, RowMerger, first_index, is_upsert, take_or_null
from flightstore.schema import TableDescriptor

__all__ = ["AggregationMerger", "field_aggregators", "is_retraction", "validate_aggregation"]


def is_retraction(kinds: np.ndarray) -> np.ndarray:
    return (kinds == changetype.UPDATE_BEFORE) | (kinds == changetype.DELETE)


def field_aggregators(descriptor: TableDescriptor) -> dict[str, FieldAggregator]:
    """The aggregate function of every non-key field, validated (InvalidInput naming the field)."""
    names = descriptor.schema.names
    functions: dict[str, str] = {}
    params: dict[str, dict[str, tuple[str, str]]] = {}
    where = f"table {descriptor.path}"
    for key, value in descriptor.options.items():
        match = FIELD_OPTION_PATTERN.match(key)
        if not match:
            continue
        field, rest = match.group(1), match.group(2)
        if field not in names:
            raise InvalidInput(f"{where}: option '{key}' names field {field!r}, which is not a column")
        if field in descriptor.primary_key:
            raise InvalidInput(f"{where}: option '{key}': {field!r} is a primary-key column; key "
                               "columns are not aggregated")
        if rest == "agg":
            functions[field] = str(value).strip().lower()
        else:
            function, param = rest.split(".", 1)
            params.setdefault(field, {})[param] = (function, str(value))
    aggregators: dict[str, FieldAggregator] = {}
    for field in descriptor.schema:
        if field.name in descriptor.primary_key:
            continue
        function = functions.get(field.name, DEFAULT_FUNCTION)
        cls = AGGREGATORS.get(function)
        if cls is None:
            raise InvalidInput(f"{where}: field {field.name!r}: unknown aggregate function "
                               f"{function!r}; known: {', '.join(sorted(AGGREGATORS))}")
        if not cls.supports(field.type):
            raise InvalidInput(f"{where}: field {field.name!r}: aggregate function {function} does not "
                               f"support type {field.type}")
        own: dict[str, str] = {}
        for param, (named, value) in params.get(field.name, {}).items():
            if named != function:
                raise InvalidInput(f"{where}: option 'fields.{field.name}.{named}.{param}' is for "
                                   f"{named}, but field {field.name!r} aggregates with {function}")
            if param not in cls.params:
                raise InvalidInput(f"{where}: aggregate function {function} of field {field.name!r} "
                                   f"has no parameter {param!r}"
                                   + (f"; parameters: {', '.join(cls.params)}" if cls.params else ""))
            own[param] = value
        aggregators[field.name] = cls(field, own)
    return aggregators


def validate_aggregation(descriptor: TableDescriptor) -> None:
    """Check an aggregation table's field options at CREATE TABLE; raise InvalidInput if wrong."""
    field_aggregators(descriptor)


class AggregationMerger(RowMerger):
    name = "aggregation"

    def __init__(self, descriptor: TableDescriptor) -> None:
        super().__init__(descriptor)
        self.aggregators = field_aggregators(descriptor)

    def _written(self, target_columns: tuple[str, ...] | None) -> list[str]:
        return [c for c in self.value_columns if target_columns is None or c in target_columns]

    def check_write(self, kinds: np.ndarray, target_columns: tuple[str, ...] | None,
                    batch: pa.Table | None = None) -> None:
        """Refuse retractions of fields whose function cannot retract (and, given the ``batch``,
        retracted values that cannot be taken back, e.g. a zero of a product) before any write."""
        super().check_write(kinds, target_columns)
        retracting = is_retraction(kinds)
        if not retracting.any():
            return
        for name in self._written(target_columns):
            aggregator = self.aggregators[name]
            if not aggregator.retractable:
                raise InvalidInput(
                    f"table {self.descriptor.path}: field {name!r} aggregates with "
                    f"{aggregator.name}, which cannot retract a -U/-D row; write only upserts, leave "
                    "the field out of the partial update, or set 'table.delete.behavior' = 'ignore'")
        if batch is not None:
            mask = pa.array(retracting)
            for name in self._written(target_columns):
                self.aggregators[name].check_retraction(batch.column(name).filter(mask).combine_chunks())

    def merge(self, inp: MergeInput) -> MergeResult:
        num_groups, group = inp.num_groups, inp.group
        upsert = is_upsert(inp.kinds)
        first_upsert = first_index(group, num_groups, upsert)
        # A key exists from the start (found) or from its first upsert; earlier retractions drop.
        never = np.iinfo(np.int64).max
        exists_from = np.where(inp.found, -1, np.where(first_upsert >= 0, first_upsert, never))
        rows = np.arange(len(group), dtype=np.int64)
        retract = is_retraction(inp.kinds) & (rows > exists_from[group])
        written = set(self._written(inp.target_columns))
        any_row = first_index(group, num_groups)
        columns = []
        for field in self.schema:
            if field.name in self.primary_key:
                columns.append(take_or_null(inp.batch.column(field.name), any_row))
            elif field.name in written:
                old = inp.old.column(field.name).combine_chunks()
                values = inp.batch.column(field.name).combine_chunks()
                columns.append(self.aggregators[field.name].merge(
                    FieldInput(values, upsert, retract, group, num_groups, old, inp.found)))
            else:
                columns.append(inp.old.column(field.name))
        new = pa.Table.from_arrays(columns, schema=self.schema)
        return MergeResult(new, inp.found | (first_upsert >= 0))
