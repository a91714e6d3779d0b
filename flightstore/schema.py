"""Table descriptors: columns, primary key, bucket key, partition keys, bucket count, options.

A :class:`TableDescriptor` is an immutable value; the catalog persists it as JSON (the Arrow schema
travels as base64 IPC bytes, so every Arrow type and nullability round-trips exactly).

It also records what ALTER TABLE changed over the table's life: ``version`` is the schema version
(1 at CREATE, +1 per schema change) and ``past_schemas`` the schemas of versions 1 .. version-1,
so stored data written under any version reads back (columns added later read as NULL). The
partitions of a partitioned table (:class:`~flightstore.partitioning.Partition`, with the next
never-used partition id) travel with it too: they are catalog state, changed atomically with it.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import pyarrow as pa

from flightstore.config import table_option, validate_table_options
from flightstore.errors import InvalidInput, SchemaMismatch
from flightstore.names import IDENTIFIER, check_name, shown_name
from flightstore.partitioning import Partition, check_partition_type

__all__ = ["TablePath", "TableDescriptor", "sql_type_to_arrow", "arrow_type_to_sql", "IDENTIFIER", "as_table",
           "Projections", "conform", "storage_type", "storage_schema"]



@dataclass(frozen=True, order=True)
class TablePath:
    """``database.table``."""

    database: str
    table: str

    @classmethod
    def parse(cls, text: str, default_database: str = "default") -> "TablePath":
        if not isinstance(text, str):
            raise InvalidInput(f"a table name must be a string, not {type(text).__name__}")
        parts = [part.strip().strip('"`') for part in text.split(".")]
        if len(parts) == 1:
            parts = [default_database, parts[0]]
        if len(parts) != 2:
            raise InvalidInput(f"invalid table name {shown_name(text)}; expected database.table")
        return cls.checked(parts[0], parts[1])

    @classmethod
    def checked(cls, database: Any, table: Any) -> TablePath:
        """The path of ``database.table`` once both names pass :func:`flightstore.names.check_name`
        (InvalidInput otherwise): how every path that may create or rename something is built."""
        return cls(check_name(database, "database"), check_name(table, "table"))

    def __str__(self) -> str:
        return f"{self.database}.{self.table}"


@dataclass(frozen=True)
class TableDescriptor:
    """Everything that defines a table. Build with :meth:`create`, which validates."""

    path: TablePath
    schema: pa.Schema
    primary_key: tuple[str, ...] = ()
    bucket_key: tuple[str, ...] = ()
    partition_keys: tuple[str, ...] = ()
    num_buckets: int = 1
    options: Mapping[str, str] = field(default_factory=dict)
    comment: str = ""
    version: int = 1
    past_schemas: tuple[pa.Schema, ...] = ()
    partitions: tuple[Partition, ...] = ()
    next_partition_id: int = 0

    @classmethod
    def create(cls, path: TablePath | str, schema: pa.Schema, primary_key: Sequence[str] = (),
               partition_keys: Sequence[str] = (), options: Mapping[str, Any] | None = None,
               comment: str = "") -> "TableDescriptor":
        """Validate and build a descriptor; bucket key and count come from the options."""
        path = TablePath.parse(path) if isinstance(path, str) else TablePath.checked(path.database, path.table)
        opts = validate_table_options(options or {})
        schema = storage_schema(schema)
        names = schema.names
        if len(set(names)) != len(names):
            raise InvalidInput(f"table {path}: duplicate column names")
        for name in names:
            if name.startswith("_") and name in ("_change_type", "_log_offset", "_commit_timestamp"):
                raise InvalidInput(f"table {path}: column name {name!r} is reserved")
        for kind, columns in (("primary key", primary_key), ("partition key", partition_keys)):
            for column in columns:
                if column not in names:
                    raise InvalidInput(f"table {path}: {kind} column {column!r} is not a column")
        primary_key = tuple(primary_key)
        if len(set(partition_keys)) != len(partition_keys):
            raise InvalidInput(f"table {path}: a partition key column is named twice")
        for column in partition_keys:
            check_partition_type(column, schema.field(column).type, f"table {path}")
        if primary_key or partition_keys:  # key columns never hold NULL
            fields = [f.with_nullable(False) if f.name in primary_key or f.name in partition_keys
                      else f for f in schema]
            schema = pa.schema(fields, metadata=schema.metadata)
        if primary_key:
            for column in partition_keys:
                if column not in primary_key:
                    raise InvalidInput(
                        f"table {path}: partition key {column!r} must be part of the primary key")
        bucket_key = tuple(table_option(opts, "bucket.key"))
        if bucket_key:
            for column in bucket_key:
                if column not in names:
                    raise InvalidInput(f"table {path}: bucket key column {column!r} is not a column")
                if primary_key and column not in primary_key:
                    raise InvalidInput(
                        f"table {path}: bucket key column {column!r} must be part of the primary key")
        elif primary_key:
            bucket_key = tuple(c for c in primary_key if c not in partition_keys) or primary_key
        if primary_key:
            physical = tuple(c for c in primary_key if c not in partition_keys)
            if physical[: len(bucket_key)] != bucket_key and set(bucket_key) != set(physical):
                # Prefix lookups need the bucket key to lead the primary key.
                raise InvalidInput(
                    f"table {path}: bucket key {list(bucket_key)} must be a prefix of the primary key "
                    f"{list(physical)}")
        engine = table_option(opts, "table.merge-engine")
        if engine and not primary_key:
            raise InvalidInput(f"table {path}: 'table.merge-engine' needs a primary key")
        if engine == "versioned":
            ver = opts.get("table.merge-engine.versioned.ver-column")
            if not ver:
                raise InvalidInput(
                    f"table {path}: the versioned merge engine needs "
                    "'table.merge-engine.versioned.ver-column'")
            if ver not in names:
                raise InvalidInput(f"table {path}: version column {ver!r} is not a column")
            if not (pa.types.is_integer(schema.field(ver).type)
                    or pa.types.is_timestamp(schema.field(ver).type)):
                raise InvalidInput(
                    f"table {path}: version column {ver!r} must be an integer or timestamp column")
        stats = table_option(opts, "table.statistics.columns")
        for column in stats:
            if column != "*" and column not in names:
                raise InvalidInput(f"table {path}: statistics column {column!r} is not a column")
        descriptor = cls(path=path, schema=schema, primary_key=primary_key, bucket_key=bucket_key,
                         partition_keys=tuple(partition_keys),
                         num_buckets=table_option(opts, "bucket.num"), options=opts, comment=comment)
        from flightstore.autopartition import auto_partition
        auto_partition(descriptor)  # refuses auto-partition options the table cannot honour
        return descriptor

    # ---- derived properties -------------------------------------------------------------------
    @property
    def has_primary_key(self) -> bool:
        return bool(self.primary_key)

    @property
    def merge_engine(self) -> str:
        """``last_row`` (default), ``first_row``, ``versioned`` or ``aggregation``."""
        return table_option(self.options, "table.merge-engine") or "last_row"

    def option(self, key: str) -> Any:
        return table_option(self.options, key)

    @property
    def statistics_columns(self) -> tuple[str, ...]:
        wanted = self.option("table.statistics.columns")
        if "*" in wanted:
            return tuple(f.name for f in self.schema if _has_order(f.type))
        return tuple(wanted)

    @property
    def is_partitioned(self) -> bool:
        return bool(self.partition_keys)

    def schema_of(self, version: int) -> pa.Schema:
        """The table schema at schema ``version`` (1 .. :attr:`version`)."""
        if version == self.version:
            return self.schema
        if not 1 <= version < self.version:
            raise InvalidInput(f"table {self.path} has no schema version {version}")
        return self.past_schemas[version - 1]

    @property
    def schemas(self) -> dict[int, pa.Schema]:
        """Every schema version of the table: ``{version: schema}``."""
        return {**{i: s for i, s in enumerate(self.past_schemas, start=1)}, self.version: self.schema}

    def partition(self, name: str) -> Partition | None:
        """The partition named ``name`` (None when there is none)."""
        for partition in self.partitions:
            if partition.name == name:
                return partition
        return None

    def with_version(self, version: int) -> "TableDescriptor":
        """A fresh table's descriptor at schema ``version`` (history and partitions cleared)."""
        return replace(self, version=version, past_schemas=(), partitions=(), next_partition_id=0)

    # ---- persistence --------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "database": self.path.database, "table": self.path.table,
            "schema": _schema_text(self.schema),
            "primary_key": list(self.primary_key), "bucket_key": list(self.bucket_key),
            "partition_keys": list(self.partition_keys), "num_buckets": self.num_buckets,
            "options": dict(self.options), "comment": self.comment, "version": self.version,
            "past_schemas": [_schema_text(s) for s in self.past_schemas],
            "partitions": [p.to_json() for p in self.partitions],
            "next_partition_id": self.next_partition_id,
        }, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TableDescriptor":
        data = json.loads(text)
        return cls(path=TablePath(data["database"], data["table"]), schema=_schema_of(data["schema"]),
                   primary_key=tuple(data["primary_key"]), bucket_key=tuple(data["bucket_key"]),
                   partition_keys=tuple(data["partition_keys"]), num_buckets=int(data["num_buckets"]),
                   options=dict(data["options"]), comment=data.get("comment", ""),
                   version=int(data.get("version", 1)),
                   past_schemas=tuple(_schema_of(s) for s in data.get("past_schemas", ())),
                   partitions=tuple(Partition.from_json(p) for p in data.get("partitions", ())),
                   next_partition_id=int(data.get("next_partition_id", 0)))


def _schema_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_of(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


class Projections:
    """Memoized schemas of column subsets of one schema: point lookups ask for the same few
    projections over and over, and building a schema costs more than the lookup's RocksDB get."""

    LIMIT = 64

    def __init__(self, schema: pa.Schema, keep_metadata: bool = False) -> None:
        self.schema = schema
        self.metadata = schema.metadata if keep_metadata else None
        self._memo: dict[tuple[str, ...], pa.Schema] = {}
        self.names = frozenset(schema.names)  # membership checks of every lookup's columns

    def of(self, names: Sequence[str]) -> pa.Schema:
        key = tuple(names)
        schema = self._memo.get(key)
        if schema is None:
            schema = pa.schema([self.schema.field(name) for name in key], metadata=self.metadata)
            if len(self._memo) < self.LIMIT:
                self._memo[key] = schema
        return schema


def as_table(data: Any) -> pa.Table:
    """Written or looked-up data as an Arrow table: a Table, RecordBatch, dict of columns or list
    of row dicts."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, Mapping):
        return pa.table(dict(data))
    if isinstance(data, list):
        return pa.Table.from_pylist(data)
    raise InvalidInput(f"expected an Arrow table, record batch, dict of columns or list of rows, "
                       f"got {type(data).__name__}")


def conform(data: pa.RecordBatch | pa.Table, target: pa.Schema, names: Sequence[str],
            num_rows: int | None = None) -> pa.RecordBatch | pa.Table:
    """``data``, stored under an older schema version, as the columns ``names`` of ``target``:
    columns it lacks (added later) are NULL, columns whose type was widened are cast (losslessly,
    as ALTER TABLE allows only such widening). ``num_rows`` sizes a result with no stored column."""
    rows = data.num_rows if num_rows is None else num_rows
    present = set(data.schema.names)
    arrays, fields = [], []
    for name in names:
        field = target.field(name)
        if name in present:
            column = data.column(name)
            if column.type != field.type:
                column = column.cast(field.type)
        else:
            column = pa.nulls(rows, field.type)
        arrays.append(column)
        fields.append(field)
    kind = pa.RecordBatch if isinstance(data, pa.RecordBatch) else pa.Table
    return kind.from_arrays(arrays, schema=pa.schema(fields))


def storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """The type a column of ``arrow_type`` is stored as: view and large layouts (``string_view``,
    ``large_string``, ``binary_view``, ``large_list``, ``list_view`` ... as polars and DuckDB send
    them) become their plain types, dictionaries their value type, recursively. Values are the
    same; the log, the KV encoding and every client then see one layout per SQL type."""
    t = pa.types
    if t.is_string_view(arrow_type) or t.is_large_string(arrow_type):
        return pa.string()
    if t.is_binary_view(arrow_type) or t.is_large_binary(arrow_type):
        return pa.binary()
    if t.is_dictionary(arrow_type):
        return storage_type(arrow_type.value_type)
    if t.is_run_end_encoded(arrow_type):
        return storage_type(arrow_type.value_type)
    if t.is_list_view(arrow_type) or t.is_large_list_view(arrow_type):
        # pyarrow (26) casts list views to lists wrongly (an invalid array): refuse them clearly.
        raise SchemaMismatch(f"list view columns ({arrow_type}) are not supported; send them as lists")
    if t.is_list(arrow_type) or t.is_large_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(storage_type(arrow_type.value_type)))
    if t.is_fixed_size_list(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(storage_type(arrow_type.value_type)),
                        arrow_type.list_size)
    if t.is_struct(arrow_type):
        return pa.struct([f.with_type(storage_type(f.type)) for f in arrow_type])
    if t.is_map(arrow_type):
        return pa.map_(arrow_type.key_field.with_type(storage_type(arrow_type.key_type)),
                       arrow_type.item_field.with_type(storage_type(arrow_type.item_type)),
                       arrow_type.keys_sorted)
    return arrow_type


def storage_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field of its :func:`storage_type` (metadata kept)."""
    return pa.schema([f.with_type(storage_type(f.type)) for f in schema], metadata=schema.metadata)


def _has_order(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
            or pa.types.is_decimal(arrow_type) or pa.types.is_temporal(arrow_type)
            or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_boolean(arrow_type))


_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(), "BOOL": pa.bool_(),
    "TINYINT": pa.int8(), "SMALLINT": pa.int16(), "INT": pa.int32(), "INTEGER": pa.int32(),
    "BIGINT": pa.int64(), "FLOAT": pa.float32(), "REAL": pa.float32(), "DOUBLE": pa.float64(),
    "DOUBLE PRECISION": pa.float64(), "STRING": pa.string(), "VARCHAR": pa.string(),
    "CHAR": pa.string(), "TEXT": pa.string(), "BYTES": pa.binary(), "BINARY": pa.binary(),
    "VARBINARY": pa.binary(), "BLOB": pa.binary(), "DATE": pa.date32(), "TIME": pa.time64("us"),
}


def sql_type_to_arrow(text: str) -> pa.DataType:
    """Map a Flink/Fluss SQL type (``BIGINT``, ``DECIMAL(10,2)``, ``TIMESTAMP_LTZ(3)``) to Arrow."""
    normalized = re.sub(r"\s+", " ", text.strip().upper())
    normalized = re.sub(r"\s+NOT NULL$", "", normalized)
    match = re.fullmatch(r"([A-Z_ ]+?)\s*(?:\((\d+)(?:\s*,\s*(\d+))?\))?", normalized)
    if not match:
        raise InvalidInput(f"unsupported column type {text!r}")
    name, p, s = match.group(1).strip(), match.group(2), match.group(3)
    if name in ("DECIMAL", "NUMERIC", "DEC"):
        precision = int(p) if p else 10
        scale = int(s) if s else 0
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise InvalidInput(f"invalid DECIMAL({precision}, {scale})")
        return pa.decimal128(precision, scale)
    if name in ("TIMESTAMP", "TIMESTAMP_LTZ", "TIMESTAMP WITH LOCAL TIME ZONE",
                "TIMESTAMP WITHOUT TIME ZONE"):
        precision = int(p) if p else 6
        if not 0 <= precision <= 9:
            raise InvalidInput(f"invalid timestamp precision {precision}")
        unit = "s" if precision == 0 else "ms" if precision <= 3 else "us" if precision <= 6 else "ns"
        tz = "UTC" if name in ("TIMESTAMP_LTZ", "TIMESTAMP WITH LOCAL TIME ZONE") else None
        return pa.timestamp(unit, tz=tz)
    if name in ("VARCHAR", "CHAR", "STRING", "BINARY", "VARBINARY", "BYTES", "TIME"):
        return _SIMPLE_TYPES[name]
    if p is None and name in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[name]
    raise InvalidInput(f"unsupported column type {text!r}")


def arrow_type_to_sql(arrow_type: pa.DataType) -> str:
    """The Flink SQL name of an Arrow type (inverse of :func:`sql_type_to_arrow`)."""
    if pa.types.is_boolean(arrow_type):
        return "BOOLEAN"
    names = {pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INT", pa.int64(): "BIGINT",
             pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.date32(): "DATE"}
    if arrow_type in names:
        return names[arrow_type]
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "STRING"
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return "BYTES"
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision}, {arrow_type.scale})"
    if pa.types.is_time(arrow_type):
        return "TIME"
    if pa.types.is_timestamp(arrow_type):
        precision = {"s": 0, "ms": 3, "us": 6, "ns": 9}[arrow_type.unit]
        return f"TIMESTAMP_LTZ({precision})" if arrow_type.tz else f"TIMESTAMP({precision})"
    return str(arrow_type).upper()
