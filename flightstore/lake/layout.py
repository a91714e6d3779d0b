"""The Iceberg layout of a flightstore table: schema, partition spec, sort order, lake rows.

A lake table holds the table's columns plus three of its own:

* ``__bucket`` (int32): the flightstore bucket the row was written to;
* ``__offset`` (int64): the row's offset in that bucket's log, so lake + log never overlap;
* ``__timestamp`` (timestamptz): when the row was appended to the log.

Partition spec: ``identity(<partition column>)`` for each partition key (partitioned tables), then
``bucket(<bucket key>, bucket.num)`` when the bucket key is one column of a type whose Iceberg
bucket transform equals :func:`flightstore.bucketing.bucket_ids` (murmur3 of the long / bytes), else
``identity(__bucket)``. Either way every data file holds rows of exactly one flightstore bucket,
so a bucket's lake part and log part line up (bucket alignment). Rows are written in ``__offset``
order within a file, which the declared sort order states.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from flightstore.errors import Unsupported
from flightstore.log import LogBatch
from flightstore.schema import TableDescriptor

if TYPE_CHECKING:  # pyiceberg is imported where it is used: a server without a lake never loads it
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.table.sorting import SortOrder

__all__ = [
    "BUCKET_COLUMN",
    "META_COLUMNS",
    "OFFSET_COLUMN",
    "TIMESTAMP_COLUMN",
    "bucket_transform_column",
    "iceberg_schema",
    "lake_batch",
    "lake_rows",
    "lake_schema",
    "partition_spec",
    "sort_order",
    "table_types",
]

BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN = "__bucket", "__offset", "__timestamp"
META_COLUMNS = (BUCKET_COLUMN, OFFSET_COLUMN, TIMESTAMP_COLUMN)
_META_FIELDS = (pa.field(BUCKET_COLUMN, pa.int32(), nullable=False),
                pa.field(OFFSET_COLUMN, pa.int64(), nullable=False),
                pa.field(TIMESTAMP_COLUMN, pa.timestamp("us", tz="UTC"), nullable=False))
_FIRST_PARTITION_FIELD_ID = 1000  # Iceberg's convention for partition field ids


def _lake_type(arrow_type: pa.DataType) -> pa.DataType:
    """Iceberg has 32- and 64-bit signed integers and microsecond times and timestamps only:
    narrower or unsigned integers widen, second and millisecond timestamps and times become
    microseconds (values, and so their bucket hash, are unchanged); other types are stored as is."""
    t = pa.types
    if t.is_timestamp(arrow_type) and arrow_type.unit in ("s", "ms"):
        return pa.timestamp("us", tz=arrow_type.tz)
    if t.is_time32(arrow_type):
        return pa.time64("us")
    if t.is_int8(arrow_type) or t.is_int16(arrow_type) or t.is_uint8(arrow_type) or t.is_uint16(arrow_type):
        return pa.int32()
    if t.is_uint32(arrow_type):
        return pa.int64()
    return arrow_type


def lake_schema(descriptor: TableDescriptor) -> pa.Schema:
    """The Arrow schema of lake rows: the table's columns (integers widened to Iceberg's), then the
    meta columns. Reads cast back to the table's own types."""
    clash = [name for name in META_COLUMNS if name in descriptor.schema.names]
    if clash:
        raise Unsupported(f"table {descriptor.path}: column(s) {clash} clash with the lake's own columns")
    fields = [f.with_type(_lake_type(f.type)) for f in descriptor.schema.remove_metadata()]
    return pa.schema(fields + list(_META_FIELDS))


def table_types(descriptor: TableDescriptor) -> pa.Schema:
    """The schema lake rows are read back in: the table's own types, then the meta columns."""
    return pa.schema(list(descriptor.schema.remove_metadata()) + list(_META_FIELDS))


def iceberg_schema(descriptor: TableDescriptor) -> Schema:
    """The Iceberg schema of the lake table (fresh field ids 1..n in column order)."""
    from pyiceberg.catalog import Catalog as _IcebergCatalog
    from pyiceberg.io.pyarrow import UnsupportedPyArrowTypeException
    from pyiceberg.schema import assign_fresh_schema_ids
    try:
        converted = _IcebergCatalog._convert_schema_if_needed(lake_schema(descriptor))
    except (ValueError, TypeError, UnsupportedPyArrowTypeException) as exc:
        raise Unsupported(f"table {descriptor.path} cannot be tiered to Iceberg: {exc}") from None
    return assign_fresh_schema_ids(converted)


def _hashes_like_iceberg(arrow_type: pa.DataType) -> bool:
    """Whether flightstore's bucket hash of this type is Iceberg's bucket transform of its column.

    Both hash the little-endian long of integers, dates (days) and timestamps (micros), and the
    bytes of strings and binaries. Iceberg stores second/milli timestamps as micros, the same value
    flightstore hashes; nanosecond timestamps, decimals, floats and booleans differ. Times hash
    alike too, but pyiceberg 0.12 cannot write a bucket(time) partition value.
    """
    t = pa.types
    return (t.is_integer(arrow_type) and not t.is_uint64(arrow_type) or t.is_date32(arrow_type)
            or (t.is_timestamp(arrow_type) and arrow_type.unit != "ns")
            or t.is_string(arrow_type) or t.is_large_string(arrow_type)
            or t.is_binary(arrow_type) or t.is_large_binary(arrow_type))


def bucket_transform_column(descriptor: TableDescriptor) -> str | None:
    """The column partitioned by Iceberg's ``bucket[N]``, or None when ``identity(__bucket)`` is used
    (no bucket key, a multi-column key, or a type whose hash differs)."""
    key = descriptor.bucket_key
    if len(key) == 1 and _hashes_like_iceberg(descriptor.schema.field(key[0]).type):
        return key[0]
    return None


def partition_spec(descriptor: TableDescriptor, schema: Schema) -> PartitionSpec:
    """identity(partition columns), then bucket(key, bucket.num) or identity(__bucket)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import BucketTransform, IdentityTransform
    fields = []
    for name in descriptor.partition_keys:
        fields.append(PartitionField(source_id=schema.find_field(name).field_id,
                                     field_id=_FIRST_PARTITION_FIELD_ID + len(fields),
                                     transform=IdentityTransform(), name=name))
    column = bucket_transform_column(descriptor)
    if column is not None:
        fields.append(PartitionField(source_id=schema.find_field(column).field_id,
                                     field_id=_FIRST_PARTITION_FIELD_ID + len(fields),
                                     transform=BucketTransform(descriptor.num_buckets),
                                     name=f"{column}_bucket"))
    else:
        fields.append(PartitionField(source_id=schema.find_field(BUCKET_COLUMN).field_id,
                                     field_id=_FIRST_PARTITION_FIELD_ID + len(fields),
                                     transform=IdentityTransform(), name=BUCKET_COLUMN))
    return PartitionSpec(*fields)


def sort_order(schema: Schema) -> SortOrder:
    """Rows are ordered by ``__offset`` within each data file."""
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import IdentityTransform
    return SortOrder(SortField(source_id=schema.find_field(OFFSET_COLUMN).field_id,
                               transform=IdentityTransform()))


def lake_batch(record: LogBatch, bucket: int, schema: pa.Schema) -> pa.RecordBatch:
    """The lake rows of one log record read from ``bucket``: its columns plus the meta columns.

    ``schema`` is :func:`lake_schema` of the table; the record must hold every table column (a
    primary-key table's ``_change_type`` is left out: see :func:`change_kinds`).
    """
    n = record.batch.num_rows
    micros = np.full(n, record.timestamp_ms * 1000, dtype=np.int64)
    return lake_rows(record.batch, bucket, record.row_offsets, micros, schema)


def lake_rows(batch: pa.RecordBatch, bucket: int, offsets: pa.Array, micros: np.ndarray,
              schema: pa.Schema) -> pa.RecordBatch:
    """``batch``'s table columns (picked by name, cast to the lake's types) plus ``__bucket`` =
    ``bucket``, ``__offset`` = ``offsets`` and ``__timestamp`` = ``micros`` (UTC microseconds)."""
    n = batch.num_rows
    table_fields = list(schema)[:-len(META_COLUMNS)]
    columns = [batch.column(field.name) for field in table_fields]
    arrays = [column if column.type == field.type else column.cast(field.type)
              for column, field in zip(columns, table_fields)] + [
        pa.array(np.full(n, bucket, dtype=np.int32)),
        offsets,
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(micros)]),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
