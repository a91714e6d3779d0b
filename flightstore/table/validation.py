"""Validating a write against a table's schema before any bucket is touched: columns known,
types that widen losslessly (cast safely, encodings decoded), primary keys present and not null.
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import InvalidInput, SchemaMismatch
from flightstore.schema import as_table, storage_type

__all__ = ["TableValidation"]


class TableValidation:
    """The validation of writes of :class:`~flightstore.store.Table` (mixed into it: ``self`` is the
    table, with its descriptor, logs, KV tablets, writers and locks)."""

    # ---- validation ---------------------------------------------------------------------------
    def conform(self, data: Any, columns: Sequence[str] | None = None) -> tuple[pa.Table, tuple | None]:
        """Cast ``data`` to the table schema (missing columns null); return it and the target columns.

        Raises SchemaMismatch for unknown columns, uncastable values, or missing non-null columns.
        """
        table = self._known_columns(as_table(data))
        names = self.schema.names
        present = {name: i for i, name in enumerate(table.column_names)}  # a wide table: one lookup each
        target: tuple | None = None
        if columns is not None:
            target = tuple(columns)
            bad = [c for c in target if c not in names]
            if bad:
                raise SchemaMismatch(f"table {self.path} has no column(s) {', '.join(map(repr, bad))} "
                                     "named in the partial update")
            missing = [c for c in target if c not in present]
            if missing:
                raise SchemaMismatch(f"partial update of {self.path} names {missing} but the data "
                                     "lacks them")
            missing_pk = [c for c in self.descriptor.primary_key if c not in target]
            if missing_pk:
                raise SchemaMismatch(f"partial update of {self.path} must include the primary key "
                                     f"column(s) {missing_pk}")
            if set(target) == set(names):
                target = None
        arrays = []
        for field in self.schema:
            if field.name in present and (target is None or field.name in target):
                column = table.column(present[field.name])
                if column.type != field.type:
                    if not _widens(column.type, field.type):
                        raise SchemaMismatch(f"column {field.name!r} of {self.path} is {field.type}; "
                                             f"data of type {column.type} does not fit it")
                    try:
                        column = pc.cast(_decoded(column), field.type)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                        raise SchemaMismatch(f"column {field.name!r} of {self.path}: cannot convert "
                                             f"{column.type} to {field.type}: {exc}") from None
                if not field.nullable and column.null_count:
                    what = "primary key column" if field.name in self.descriptor.primary_key else "column"
                    raise InvalidInput(f"{what} {field.name!r} of {self.path} must not be null")
                arrays.append(column)
            else:
                if (not field.nullable and target is None) or field.name in self.descriptor.primary_key:
                    raise SchemaMismatch(f"data written to {self.path} lacks the non-null column "
                                         f"{field.name!r}")
                arrays.append(pa.nulls(table.num_rows, field.type))
        return pa.Table.from_arrays(arrays, schema=self.schema), target

    def _known_columns(self, table: pa.Table) -> pa.Table:
        names = self.schema.names
        unknown = [c for c in table.column_names if c not in names]
        if unknown:
            raise SchemaMismatch(f"table {self.path} has no column(s) {', '.join(map(repr, unknown))}; "
                                 f"columns are {', '.join(names)}")
        if len(set(table.column_names)) != table.num_columns:
            raise SchemaMismatch(f"duplicate columns in data written to {self.path}")
        return table


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` without run-end or dictionary encoding, values in their storage type: pyarrow's
    cast decodes neither runs nor dictionaries of view types (``array_take`` has no view kernel)."""
    kind = column.type
    if pa.types.is_run_end_encoded(kind):
        return _decoded(pa.chunked_array([pc.run_end_decode(c) for c in column.chunks], kind.value_type))
    if pa.types.is_dictionary(kind):
        values = storage_type(kind.value_type)
        chunks = [pa.DictionaryArray.from_arrays(c.indices, pc.cast(c.dictionary, values)).dictionary_decode()
                  for c in column.chunks]
        return pa.chunked_array(chunks, values)
    return column


def _widens(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether writing ``source`` values into a ``target`` column is lossless by kind.

    Integers widen into wider integers, floats and decimals; floats into floats; strings, binaries,
    dates, times, timestamps and decimals into their own kind. Values are still range-checked by
    the (safe) cast. Nulls fit anything.
    """
    t = pa.types
    if t.is_null(source) or source == target:
        return True
    if t.is_dictionary(source) or t.is_run_end_encoded(source):
        return _widens(source.value_type, target)
    if t.is_nested(source):  # lists, structs, maps: the same shape in another layout
        return storage_type(source) == storage_type(target)
    kinds = (
        (t.is_integer, lambda x: t.is_integer(x) or t.is_floating(x) or t.is_decimal(x)),
        (t.is_floating, t.is_floating),
        (t.is_decimal, lambda x: t.is_decimal(x) or t.is_floating(x)),
        (lambda x: t.is_string(x) or t.is_large_string(x) or t.is_string_view(x),
         lambda x: t.is_string(x) or t.is_large_string(x)),
        (lambda x: t.is_binary(x) or t.is_large_binary(x) or t.is_fixed_size_binary(x)
         or t.is_binary_view(x),
         lambda x: t.is_binary(x) or t.is_large_binary(x)),
        (t.is_boolean, t.is_boolean),
        (t.is_date, t.is_date),
        (t.is_time, t.is_time),
        (t.is_timestamp, t.is_timestamp),
        (t.is_duration, t.is_duration),
    )
    return any(is_source(source) and fits(target) for is_source, fits in kinds)
