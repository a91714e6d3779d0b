"""Partitions of a table: partition values, names, row routing and pruning (pure, no I/O).

A table ``PARTITIONED BY (c1[, c2])`` stores each distinct value tuple of its partition columns as
one *partition* with its own buckets (own log, own KV). As in Apache Fluss, a partition is named by
the canonical string forms of its values joined with ``$`` (``2026-11-23``, ``2026-11-23$eu``) and
carries an id that is never reused, so a dropped partition's log offsets can never be mistaken for
a new one's.

Partition columns are STRING or a type with a canonical string form: TINYINT, SMALLINT, INT,
BIGINT (decimal digits, ``-`` for negatives) and DATE (ISO ``yyyy-MM-dd``). Values are never
NULL, never empty and never contain ``$``.

Pruning (:func:`prune`) answers "might match" / "cannot match" per partition: every leaf of the
filter that reads only partition columns is evaluated *exactly* on the partition's values (one
Arrow filter over a table of all partitions, vectorized); leaves over other columns are unknown and
so "might match". A partition pruned away cannot hold a row the filter accepts.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import InvalidInput
from flightstore.expressions import AlwaysTrue, And, Not, Or, Predicate

__all__ = [
    "MAX_VALUE_LENGTH",
    "SEPARATOR",
    "Partition",
    "bucket_id",
    "check_partition_type",
    "flink_name",
    "partition_for_values",
    "partition_name",
    "partition_values",
    "prune",
    "pruned_names",
    "row_partition_names",
    "split_bucket_id",
    "values_table",
]

SEPARATOR = "$"
MAX_VALUE_LENGTH = 200


@dataclass(frozen=True, order=True)
class Partition:
    """One partition: its never-reused ``id``, its ``name`` and its values in partition-key order
    (canonical strings)."""

    id: int
    name: str
    values: tuple[str, ...]

    def to_json(self) -> list:
        return [self.id, list(self.values)]

    @classmethod
    def from_json(cls, data: Sequence) -> Partition:
        values = tuple(str(v) for v in data[1])
        return cls(int(data[0]), partition_name(values), values)


def bucket_id(partition_id: int, bucket: int, num_buckets: int) -> int:
    """The table-wide number of bucket ``bucket`` of partition ``partition_id``.

    Changelog offsets, Flight endpoints and Spark input partitions address one log by one integer;
    partition ids are never reused, so neither is a table-wide bucket number."""
    return partition_id * num_buckets + bucket


def split_bucket_id(global_bucket: int, num_buckets: int) -> tuple[int, int]:
    """Inverse of :func:`bucket_id`: ``(partition id, bucket)``."""
    return divmod(int(global_bucket), num_buckets)


def check_partition_type(name: str, arrow_type: pa.DataType, where: str) -> None:
    """Refuse a partition column whose type has no canonical string form."""
    if _is_string(arrow_type) or pa.types.is_signed_integer(arrow_type) or pa.types.is_date32(arrow_type):
        return
    raise InvalidInput(f"{where}: partition key column {name!r} has type {arrow_type}; partition "
                       "columns must be STRING, TINYINT, SMALLINT, INT, BIGINT or DATE")


def _is_string(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def partition_name(values: Sequence[str]) -> str:
    """Fluss's partition name: the values joined with ``$``."""
    return SEPARATOR.join(values)


def flink_name(keys: Sequence[str], values: Sequence[str]) -> str:
    """The ``k=v/k2=v2`` form of ``SHOW PARTITIONS`` (Flink's)."""
    return "/".join(f"{k}={v}" for k, v in zip(keys, values))


def _canonical(value: object, arrow_type: pa.DataType, column: str) -> str:
    """The canonical string of one partition value given as SQL literal / Python value."""
    if value is None:
        raise InvalidInput(f"partition column {column!r} must not be NULL")
    if _is_string(arrow_type):
        text = value if isinstance(value, str) else None
        if text is None:
            raise InvalidInput(f"partition column {column!r} is STRING; {value!r} is not a string")
    elif pa.types.is_integer(arrow_type):
        if isinstance(value, bool):
            raise InvalidInput(f"partition column {column!r} is {arrow_type}; {value!r} is not an integer")
        try:
            number = int(value) if not isinstance(value, float) or value.is_integer() else None
        except (TypeError, ValueError):
            number = None
        if number is None:
            raise InvalidInput(f"partition column {column!r} is {arrow_type}; {value!r} is not an integer")
        try:
            pa.scalar(number, arrow_type)
        except (pa.ArrowInvalid, OverflowError):
            raise InvalidInput(f"partition column {column!r}: {number} does not fit {arrow_type}") from None
        text = str(number)
    else:  # date32
        if isinstance(value, _dt.datetime):
            value = value.date()
        if isinstance(value, _dt.date):
            text = value.isoformat()
        else:
            try:
                text = _dt.date.fromisoformat(str(value)).isoformat()
            except ValueError:
                raise InvalidInput(f"partition column {column!r} is DATE; {value!r} is not a date "
                                   "(yyyy-MM-dd)") from None
    _check_text(text, column)
    return text


def _check_text(text: str, column: str) -> None:
    if not text:
        raise InvalidInput(f"partition column {column!r} must not be an empty string")
    if SEPARATOR in text:
        raise InvalidInput(f"partition value {text!r} of column {column!r} contains {SEPARATOR!r}, "
                           "the partition name separator")
    if len(text) > MAX_VALUE_LENGTH:
        raise InvalidInput(f"partition value of column {column!r} is longer than "
                           f"{MAX_VALUE_LENGTH} characters")


def partition_values(keys: Sequence[str], schema: pa.Schema, spec: Mapping[str, object],
                     where: str) -> tuple[str, ...]:
    """The canonical values of a partition given as ``{column: value}`` (every key, nothing else)."""
    lowered = {str(k).lower(): v for k, v in spec.items()}
    unknown = [k for k in lowered if k not in {c.lower() for c in keys}]
    if unknown or len(lowered) != len(spec):
        raise InvalidInput(f"{where}: {', '.join(map(repr, unknown or spec))} is not a partition key; "
                           f"the partition keys are {', '.join(keys)}")
    missing = [k for k in keys if k.lower() not in lowered]
    if missing:
        raise InvalidInput(f"{where}: a partition needs a value for every partition key; missing "
                           f"{', '.join(missing)}")
    return tuple(_canonical(lowered[k.lower()], schema.field(k).type, k) for k in keys)


def row_partition_names(data: pa.Table | pa.RecordBatch, keys: Sequence[str], where: str) -> pa.Array:
    """The partition name of every row (vectorized). Raises InvalidInput naming the column when a
    value is NULL, empty, holds ``$`` or is too long: nothing of such a write may land."""
    texts = []
    for key in keys:
        column = data.column(key)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if column.null_count:
            raise InvalidInput(f"{where}: partition column {key!r} must not be NULL "
                               f"({column.null_count} row(s) are)")
        text = column if _is_string(column.type) else column.cast(pa.string())
        text = text.cast(pa.string())
        lengths = pc.utf8_length(text)
        if len(text) and (pc.min(lengths).as_py() == 0 or pc.max(lengths).as_py() > MAX_VALUE_LENGTH):
            bad = "an empty string" if pc.min(lengths).as_py() == 0 else \
                f"longer than {MAX_VALUE_LENGTH} characters"
            raise InvalidInput(f"{where}: a value of partition column {key!r} is {bad}")
        if len(text) and pc.any(pc.match_substring(text, SEPARATOR)).as_py():
            raise InvalidInput(f"{where}: a value of partition column {key!r} contains "
                               f"{SEPARATOR!r}, the partition name separator")
        texts.append(text)
    if len(texts) == 1:
        return texts[0]
    return pc.binary_join_element_wise(*texts, SEPARATOR)


def _typed(values: Iterable[str], arrow_type: pa.DataType) -> pa.Array:
    """Canonical strings back as values of ``arrow_type`` (integers and ISO dates parse)."""
    return pa.array(list(values), pa.string()).cast(arrow_type)


def values_table(partitions: Sequence[Partition], keys: Sequence[str], schema: pa.Schema) -> pa.Table:
    """One row per partition: its values typed as the partition columns (for exact evaluation)."""
    return pa.table({key: _typed((p.values[i] for p in partitions), schema.field(key).type)
                     for i, key in enumerate(keys)})


def _relax(predicate: Predicate, keys: frozenset[str]) -> Predicate:
    """A predicate over partition columns only that every row satisfying ``predicate`` satisfies:
    leaves over other columns become TRUE (a NOT over them too)."""
    if predicate.columns() <= keys:
        return predicate
    if isinstance(predicate, And):
        return And(_relax(predicate.left, keys), _relax(predicate.right, keys))
    if isinstance(predicate, Or):
        return Or(_relax(predicate.left, keys), _relax(predicate.right, keys))
    if isinstance(predicate, Not):
        return AlwaysTrue()  # NOT (unknown) is unknown
    return AlwaysTrue()


def prune(partitions: Sequence[Partition], keys: Sequence[str], schema: pa.Schema,
          predicate: Predicate | None) -> tuple[Partition, ...]:
    """The partitions that might hold a row satisfying ``predicate`` (bound to ``schema``), in
    name order. Exact for predicates that read only partition columns."""
    ordered = tuple(sorted(partitions, key=lambda p: p.name))
    if predicate is None or not ordered:
        return ordered
    relaxed = _relax(predicate, frozenset(keys))
    if isinstance(relaxed, AlwaysTrue):
        return ordered
    keep = _evaluate(values_table(ordered, keys, schema), relaxed)
    return tuple(p for p, k in zip(ordered, keep) if k)


def pruned_names(descriptor, predicate: Predicate | None) -> tuple[str, ...] | None:
    """Names of the partitions of ``descriptor`` (a TableDescriptor) that ``predicate`` cannot rule
    out, in name order; None for a table that is not partitioned."""
    if not descriptor.partition_keys:
        return None
    return tuple(p.name for p in prune(descriptor.partitions, descriptor.partition_keys,
                                       descriptor.schema, predicate))


def _evaluate(table: pa.Table, predicate: Predicate) -> np.ndarray:
    """Whether ``predicate`` holds on each row of ``table`` (one Arrow filter pass)."""
    marker = "__row"
    indexed = table.append_column(marker, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    kept = indexed.filter(predicate.to_arrow()).column(marker).to_numpy()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[kept] = True
    return mask


def partition_for_values(partitions: Iterable[Partition], values: tuple[str, ...]) -> Partition | None:
    """The partition holding ``values``, if it exists."""
    for partition in partitions:
        if partition.values == values:
            return partition
    return None
