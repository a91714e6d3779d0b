"""ALTER TABLE as pure functions: a descriptor and a list of changes in, the new descriptor out.

One function decides every change, so a single server (:meth:`Store.alter_table`) and a cluster's
coordinator agree on what is allowed. Nothing here touches storage: schema changes never rewrite
stored data (the descriptor keeps every past schema, and readers fill columns added later with
NULL), and partition changes are catalog state that the store then applies to directories.

What may change:

* :class:`AddColumns`: nullable columns appended at the end (several in one statement);
* :class:`ModifyColumn`: a lossless widening of a column that is not a key (integers to wider
  integers or DOUBLE, FLOAT to DOUBLE, DECIMAL to a DECIMAL holding every value);
* :class:`SetOptions` / :class:`ResetOptions`: options marked ``live`` in the registry only
  (``table.log.ttl``, auto-partition retention and precreate, ...); any other is refused, named;
* :class:`RenameTable`;
* :class:`AddPartition` / :class:`DropPartition`, within :class:`PartitionLimits`.

Everything else (dropping or renaming columns, other type changes, the primary key, the bucket
count) is :class:`~flightstore.errors.Unsupported` at planning, and nothing changes. A list of
changes applies all or nothing: the first refused change stops the whole statement.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from flightstore.config import FIELD_OPTION_PATTERN, TABLE_OPTIONS, validate_table_options
from flightstore.errors import AlreadyExists, InvalidInput, InvalidOption, PartitionNotFound, Unsupported
from flightstore.partitioning import Partition, partition_name
from flightstore.schema import IDENTIFIER, TableDescriptor, TablePath

__all__ = [
    "MAX_SCHEMA_VERSION",
    "AddColumns",
    "AddPartition",
    "Change",
    "DropPartition",
    "ModifyColumn",
    "PartitionLimits",
    "RenameTable",
    "ResetOptions",
    "SetOptions",
    "apply_changes",
    "change_from_json",
    "widens_losslessly",
]

MAX_SCHEMA_VERSION = 0xFFFF  # KV values carry their schema version in two bytes


@dataclass(frozen=True)
class PartitionLimits:
    """The server's ``max.partition.num``, ``max.bucket.num`` and ``max.table-bucket.num``."""

    max_partitions: int = 1000
    max_buckets: int = 128_000
    max_table_buckets: int = 1024

    def check_create(self, descriptor: TableDescriptor) -> None:
        """Refuse, before anything is created, a new table with more buckets than allowed."""
        buckets = descriptor.num_buckets
        if buckets > self.max_table_buckets:
            raise InvalidInput(f"{descriptor.path}: 'bucket.num' = {buckets} is more than "
                               f"max.table-bucket.num ({self.max_table_buckets}) allows")
        total = buckets * max(1, len(descriptor.partitions))
        if total > self.max_buckets:
            raise InvalidInput(f"{descriptor.path}: {total} buckets is more than max.bucket.num "
                               f"({self.max_buckets}) allows")


class Change:
    """One change of an ALTER TABLE statement."""

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError


def _schema_json(fields: Sequence[pa.Field]) -> str:
    return base64.b64encode(pa.schema(fields).serialize().to_pybytes()).decode()


def _fields_of(text: str) -> tuple[pa.Field, ...]:
    return tuple(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))))


def _new_version(descriptor: TableDescriptor, schema: pa.Schema) -> TableDescriptor:
    if descriptor.version >= MAX_SCHEMA_VERSION:
        raise Unsupported(f"table {descriptor.path} has {descriptor.version} schema versions, the "
                          "most a table may have")
    return replace(descriptor, schema=schema, version=descriptor.version + 1,
                   past_schemas=descriptor.past_schemas + (descriptor.schema,))


@dataclass(frozen=True)
class AddColumns(Change):
    """``ADD [COLUMN] c TYPE [COMMENT '...']`` / ``ADD (c TYPE, d TYPE)``: appended, nullable."""

    fields: tuple[pa.Field, ...]

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        where = f"ALTER TABLE {descriptor.path}"
        existing = {n.lower() for n in descriptor.schema.names}
        seen: set[str] = set()
        for field in self.fields:
            name = field.name
            if not name or "$" in name or name.startswith("_") and name in (
                    "_change_type", "_log_offset", "_commit_timestamp"):
                raise InvalidInput(f"{where}: invalid or reserved column name {name!r}")
            if name.lower() in existing or name.lower() in seen:
                raise AlreadyExists(f"{where}: column {name!r} already exists")
            if not field.nullable:
                raise Unsupported(f"{where}: added column {name!r} must be nullable (rows written "
                                  "before hold NULL in it); drop NOT NULL")
            seen.add(name.lower())
        schema = pa.schema(list(descriptor.schema) + list(self.fields), metadata=descriptor.schema.metadata)
        return _new_version(descriptor, schema)

    def to_json(self) -> dict[str, Any]:
        return {"change": "add_columns", "fields": _schema_json(self.fields)}


def widens_losslessly(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether every ``source`` value is exactly a ``target`` value (so old data reads as is)."""
    t = pa.types
    if source == target:
        return True
    if t.is_signed_integer(source):
        if t.is_signed_integer(target):
            return target.bit_width >= source.bit_width
        if t.is_float64(target):
            return source.bit_width <= 32
        if t.is_decimal(target):
            digits = {8: 3, 16: 5, 32: 10, 64: 19}[source.bit_width]
            return target.precision - target.scale >= digits
        return False
    if t.is_float32(source):
        return t.is_float64(target)
    if t.is_decimal(source) and t.is_decimal(target):
        return target.scale >= source.scale and \
            target.precision - target.scale >= source.precision - source.scale
    if t.is_timestamp(source) and t.is_timestamp(target):
        order = ["s", "ms", "us", "ns"]
        return source.tz == target.tz and order.index(target.unit) >= order.index(source.unit) \
            and target.unit != "ns"
    return False


@dataclass(frozen=True)
class ModifyColumn(Change):
    """``MODIFY c NEWTYPE`` (``ALTER COLUMN c TYPE NEWTYPE``): lossless widening of a non-key
    column; rows stored before read back converted."""

    name: str
    type: pa.DataType

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        where = f"ALTER TABLE {descriptor.path}"
        names = [n for n in descriptor.schema.names if n.lower() == self.name.lower()]
        if not names:
            raise InvalidInput(f"{where}: unknown column {self.name!r}")
        name = names[0]
        keys = set(descriptor.primary_key) | set(descriptor.partition_keys) | set(descriptor.bucket_key)
        if name in keys:
            raise Unsupported(f"{where}: column {name!r} is a key column; its type cannot change")
        if name == descriptor.options.get("table.merge-engine.versioned.ver-column"):
            raise Unsupported(f"{where}: column {name!r} is the version column; its type cannot change")
        field = descriptor.schema.field(name)
        if field.type == self.type:
            return descriptor
        if not widens_losslessly(field.type, self.type):
            raise Unsupported(f"{where}: changing column {name!r} from {field.type} to {self.type} is "
                              "not a lossless widening; only wider integers, FLOAT to DOUBLE and wider "
                              "DECIMALs are supported")
        index = descriptor.schema.get_field_index(name)
        schema = descriptor.schema.set(index, field.with_type(self.type))
        return _new_version(descriptor, schema)

    def to_json(self) -> dict[str, Any]:
        return {"change": "modify_column", "fields": _schema_json([pa.field(self.name, self.type)])}


def _live_option(key: str, where: str) -> None:
    option = TABLE_OPTIONS.get(key)
    if option is None and not FIELD_OPTION_PATTERN.match(key):
        raise InvalidOption(f"{where}: unknown table option '{key}'")
    if option is None or not option.live:
        live = ", ".join(k for k, o in TABLE_OPTIONS.items() if o.live)
        raise Unsupported(f"{where}: option '{key}' cannot change on an existing table; options "
                          f"that can: {live}")


def _with_options(descriptor: TableDescriptor, options: dict[str, str]) -> TableDescriptor:
    changed = replace(descriptor, options=validate_table_options(options))
    from flightstore.autopartition import auto_partition
    auto_partition(changed)
    return changed


@dataclass(frozen=True)
class SetOptions(Change):
    """``SET ('k' = 'v', ...)`` of live options."""

    options: tuple[tuple[str, str], ...]

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        for key, _ in self.options:
            _live_option(key, f"ALTER TABLE {descriptor.path} SET")
        return _with_options(descriptor, {**descriptor.options, **dict(self.options)})

    def to_json(self) -> dict[str, Any]:
        return {"change": "set_options", "options": [list(kv) for kv in self.options]}


@dataclass(frozen=True)
class ResetOptions(Change):
    """``RESET ('k', ...)``: live options back to their defaults."""

    keys: tuple[str, ...]

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        for key in self.keys:
            _live_option(key, f"ALTER TABLE {descriptor.path} RESET")
        return _with_options(descriptor, {k: v for k, v in descriptor.options.items()
                                          if k not in self.keys})

    def to_json(self) -> dict[str, Any]:
        return {"change": "reset_options", "keys": list(self.keys)}


@dataclass(frozen=True)
class RenameTable(Change):
    """``RENAME TO [db.]u`` (within its database)."""

    target: TablePath

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        if not IDENTIFIER.match(self.target.table):
            raise InvalidInput(f"invalid table name {self.target.table!r}: use letters, digits and _")
        if self.target.database != descriptor.path.database:
            raise Unsupported(f"ALTER TABLE {descriptor.path} RENAME TO {self.target}: a table stays "
                              "in its database")
        return replace(descriptor, path=self.target)

    def to_json(self) -> dict[str, Any]:
        return {"change": "rename", "database": self.target.database, "table": self.target.table}


@dataclass(frozen=True)
class AddPartition(Change):
    """``ADD [IF NOT EXISTS] PARTITION (k = v, ...)``; ``values`` are canonical, in key order."""

    values: tuple[str, ...]
    if_not_exists: bool = False

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        where = f"table {descriptor.path}"
        if not descriptor.is_partitioned:
            raise InvalidInput(f"{where} is not partitioned")
        name = partition_name(self.values)
        if descriptor.partition(name) is not None:
            if self.if_not_exists:
                return descriptor
            raise AlreadyExists(f"{where} already has partition {name!r}")
        count = len(descriptor.partitions) + 1
        if count > limits.max_partitions:
            raise InvalidInput(f"{where}: creating partition {name!r} would make {count} partitions, "
                               f"more than max.partition.num ({limits.max_partitions}); drop old "
                               "partitions first")
        if count * descriptor.num_buckets > limits.max_buckets:
            raise InvalidInput(f"{where}: creating partition {name!r} would make "
                               f"{count * descriptor.num_buckets} buckets, more than max.bucket.num "
                               f"({limits.max_buckets})")
        partition = Partition(descriptor.next_partition_id, name, tuple(self.values))
        return replace(descriptor, partitions=descriptor.partitions + (partition,),
                       next_partition_id=descriptor.next_partition_id + 1)

    def to_json(self) -> dict[str, Any]:
        return {"change": "add_partition", "values": list(self.values),
                "if_not_exists": self.if_not_exists}


@dataclass(frozen=True)
class DropPartition(Change):
    """``DROP [IF EXISTS] PARTITION (k = v, ...)``."""

    values: tuple[str, ...]
    if_exists: bool = False

    def apply(self, descriptor: TableDescriptor, limits: PartitionLimits) -> TableDescriptor:
        if not descriptor.is_partitioned:
            raise InvalidInput(f"table {descriptor.path} is not partitioned")
        name = partition_name(self.values)
        if descriptor.partition(name) is None:
            if self.if_exists:
                return descriptor
            raise PartitionNotFound(f"table {descriptor.path} has no partition {name!r}")
        return replace(descriptor, partitions=tuple(p for p in descriptor.partitions if p.name != name))

    def to_json(self) -> dict[str, Any]:
        return {"change": "drop_partition", "values": list(self.values), "if_exists": self.if_exists}


def change_from_json(data: Mapping[str, Any]) -> Change:
    """Inverse of :meth:`Change.to_json` (changes travel to a cluster's coordinator as JSON)."""
    kind = data.get("change")
    if kind == "add_columns":
        return AddColumns(_fields_of(data["fields"]))
    if kind == "modify_column":
        field = _fields_of(data["fields"])[0]
        return ModifyColumn(field.name, field.type)
    if kind == "set_options":
        return SetOptions(tuple((str(k), str(v)) for k, v in data["options"]))
    if kind == "reset_options":
        return ResetOptions(tuple(str(k) for k in data["keys"]))
    if kind == "rename":
        return RenameTable(TablePath(str(data["database"]), str(data["table"])))
    if kind == "add_partition":
        return AddPartition(tuple(str(v) for v in data["values"]), bool(data.get("if_not_exists")))
    if kind == "drop_partition":
        return DropPartition(tuple(str(v) for v in data["values"]), bool(data.get("if_exists")))
    raise InvalidInput(f"unknown ALTER TABLE change {kind!r}")


def apply_changes(descriptor: TableDescriptor, changes: Sequence[Change],
                  limits: PartitionLimits = PartitionLimits()) -> TableDescriptor:
    """The descriptor after every change, in order; the first refused change raises and the
    caller keeps ``descriptor`` (nothing half-applied)."""
    for change in changes:
        descriptor = change.apply(descriptor, limits)
    return descriptor
