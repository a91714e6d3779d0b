"""Primary-key ranges: which contiguous run of a bucket's RocksDB keys can hold a filter's rows.

The key encoding is order-preserving and prefix-closed (:mod:`flightstore.kv.encoding`), so the
rows whose leading primary-key columns equal some values, and whose next key column lies between
two bounds, are one contiguous run of encoded keys. :func:`key_range` finds that run in a
conjunction of predicates (the "first non-equal key column" rule: ``=`` pins the leading columns,
``<``/``<=``/``>``/``>=``/``BETWEEN`` bound the next one); :func:`encode_range` turns it into the
RocksDB seek key and exclusive upper bound.

A range only narrows what is read: it is a superset of the rows the predicates accept (NaN keys,
``-0.0`` and ``0.0`` sharing a key, contradictory equalities...), so readers still apply the whole
filter to the rows in the range. Everything here is pure (no I/O): the planner uses it to show the
range in ``EXPLAIN``, the store to read it.

The bucket of a row is the hash of its bucket key, not a key range: a range on the bucket-key
column visits every bucket, while equalities on every bucket-key column pin one bucket
(:func:`pinned_bucket`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flightstore.bucketing import bucket_ids
from flightstore.expressions import And, Comparison, In, Predicate
from flightstore.kv.encoding import encode_keys
from flightstore.schema import TableDescriptor

__all__ = [
    "KeyRange",
    "conjuncts_of",
    "encode_range",
    "key_range",
    "pinned_bucket",
    "prefix_successor",
    "residual_predicates",
]


@dataclass(frozen=True)
class KeyRange:
    """Keys whose leading columns equal ``prefix`` and whose next column lies within the bounds.

    ``columns`` are the leading primary-key columns the range constrains, in key order: the
    ``len(prefix)`` pinned ones, then (when ``lower`` or ``upper`` is set) the bounded one.
    Values are Python values of the columns' Arrow types; a missing bound is None.
    """

    columns: tuple[str, ...]
    prefix: tuple[Any, ...] = ()
    lower: Any = None
    lower_inclusive: bool = True
    upper: Any = None
    upper_inclusive: bool = False

    @property
    def bounded(self) -> bool:
        """Whether the range bounds a column beyond its equality prefix."""
        return self.lower is not None or self.upper is not None

    def describe(self, render) -> str:
        """``{a: 1, b: [3, 10)}`` with ``render`` printing values (EXPLAIN's literal syntax)."""
        parts = [f"{c}: {render(v)}" for c, v in zip(self.columns, self.prefix)]
        if self.bounded:
            low = "-inf" if self.lower is None else render(self.lower)
            high = "+inf" if self.upper is None else render(self.upper)
            opening = "[" if self.lower is not None and self.lower_inclusive else "("
            closing = "]" if self.upper is not None and self.upper_inclusive else ")"
            parts.append(f"{self.columns[len(self.prefix)]}: {opening}{low}, {high}{closing}")
        return "{" + ", ".join(parts) + "}"


def conjuncts_of(predicates: Sequence[Predicate] | Predicate | None) -> list[Predicate]:
    """The AND terms of ``predicates`` (a predicate, a list of conjuncts or None), flattened."""
    if predicates is None:
        return []
    pending = [predicates] if isinstance(predicates, Predicate) else list(predicates)
    out: list[Predicate] = []
    while pending:
        predicate = pending.pop(0)
        if isinstance(predicate, And):
            pending[:0] = [predicate.left, predicate.right]
        else:
            out.append(predicate)
    return out


def _usable(value: Any) -> bool:
    """A literal a range can use: not NULL (never matches) and not NaN (never compares)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _equalities(conjuncts: list[Predicate]) -> dict[str, Any]:
    """Columns pinned to one value by ``=`` or a one-value ``IN``."""
    pinned: dict[str, Any] = {}
    for predicate in conjuncts:
        if isinstance(predicate, Comparison) and predicate.op == "=" and _usable(predicate.value):
            pinned.setdefault(predicate.column, predicate.value)
        elif isinstance(predicate, In):
            values = {v for v in predicate.values if _usable(v)}
            if len(values) == 1:
                pinned.setdefault(predicate.column, values.pop())
    return pinned


def _tightest(bounds: list[tuple[Any, bool]], lower: bool) -> tuple[Any, bool]:
    """The strongest of several (value, inclusive) bounds; (None, True) when there are none.
    Values of one column compare in Python as in SQL (the same Arrow type, NaN excluded)."""
    best: tuple[Any, bool] = (None, True)
    for value, inclusive in bounds:
        if best[0] is None:
            best = (value, inclusive)
            continue
        try:
            stronger = value > best[0] if lower else value < best[0]
        except TypeError:
            continue
        if stronger or (value == best[0] and not inclusive):
            best = (value, inclusive)
    return best


def key_range(predicates: Sequence[Predicate] | Predicate | None, descriptor: TableDescriptor
              ) -> KeyRange | None:
    """The primary-key range of a conjunction of bound predicates, or None when they pin no
    leading key column and bound none (the scan must read everything)."""
    pk = descriptor.primary_key
    if not pk:
        return None
    conjuncts = conjuncts_of(predicates)
    pinned = _equalities(conjuncts)
    prefix: list[Any] = []
    for column in pk:
        if column not in pinned:
            break
        prefix.append(pinned[column])
    if len(prefix) == len(pk):
        return KeyRange(columns=pk, prefix=tuple(prefix))
    column = pk[len(prefix)]
    lowers: list[tuple[Any, bool]] = []
    uppers: list[tuple[Any, bool]] = []
    for predicate in conjuncts:
        if isinstance(predicate, Comparison) and predicate.column == column \
                and _usable(predicate.value):
            if predicate.op in (">", ">="):
                lowers.append((predicate.value, predicate.op == ">="))
            elif predicate.op in ("<", "<="):
                uppers.append((predicate.value, predicate.op == "<="))
    lower, lower_inclusive = _tightest(lowers, lower=True)
    upper, upper_inclusive = _tightest(uppers, lower=False)
    lower_inclusive = lower_inclusive or lower is None  # one spelling of a missing bound
    upper_inclusive = upper_inclusive and upper is not None
    if not prefix and lower is None and upper is None:
        return None
    bounded = lower is not None or upper is not None
    return KeyRange(columns=pk[: len(prefix) + bounded], prefix=tuple(prefix), lower=lower,
                    lower_inclusive=lower_inclusive, upper=upper, upper_inclusive=upper_inclusive)


def _implied(predicate: Predicate, found: KeyRange) -> bool:
    """Whether every key of the range satisfies ``predicate`` (so reading the range decides it)."""
    pinned = dict(zip(found.columns, found.prefix))
    if isinstance(predicate, Comparison) and predicate.column in pinned:
        return predicate.op == "=" and predicate.value == pinned[predicate.column]
    if isinstance(predicate, In) and predicate.column in pinned:
        return {v for v in predicate.values if _usable(v)} == {pinned[predicate.column]}
    if not found.bounded or not isinstance(predicate, Comparison) \
            or predicate.column != found.columns[len(found.prefix)]:
        return False
    try:
        if predicate.op in (">", ">=") and found.lower is not None:
            if found.lower != predicate.value:
                return found.lower > predicate.value
            return predicate.op == ">=" or not found.lower_inclusive
        if predicate.op in ("<", "<=") and found.upper is not None:
            if found.upper != predicate.value:
                return found.upper < predicate.value
            return predicate.op == "<=" or not found.upper_inclusive
    except TypeError:
        return False
    return False


def residual_predicates(predicates: Sequence[Predicate] | Predicate | None, found: KeyRange,
                        schema: pa.Schema) -> list[Predicate]:
    """The conjuncts a read of the range ``found`` still has to check row by row: all but the
    ``=``/bounds the range decides exactly. Floating-point key columns keep theirs (a NaN key
    sorts inside a lower-bounded range but compares false)."""
    floating = {c for c in found.columns if pa.types.is_floating(schema.field(c).type)}
    return [p for p in conjuncts_of(predicates)
            if not (p.columns() <= set(found.columns) and not p.columns() & floating
                    and _implied(p, found))]


def prefix_successor(key: bytes) -> bytes | None:
    """The smallest byte string above every string that starts with ``key`` (None: no such
    string, ``key`` is all 0xFF); the exclusive end of a prefix range."""
    stripped = key.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


def _encode(schema: pa.Schema, columns: Sequence[str], values: Sequence[Any]) -> bytes:
    if not columns:
        return b""
    arrays = [pa.array([value], schema.field(column).type) for column, value in zip(columns, values)]
    return encode_keys(pa.Table.from_arrays(arrays, names=list(columns)), columns)[0]


def encode_range(key_range: KeyRange, schema: pa.Schema) -> tuple[bytes | None, bytes | None]:
    """``(seek key, exclusive upper bound)`` of the range in the bucket's RocksDB key space;
    None means unbounded on that side. An empty range has ``lower >= upper``."""
    pinned = key_range.columns[: len(key_range.prefix)]
    prefix = _encode(schema, pinned, key_range.prefix)
    if not key_range.bounded:
        return prefix or None, prefix_successor(prefix) if prefix else None
    column = key_range.columns[len(key_range.prefix)]
    if key_range.lower is None:
        lower: bytes | None = prefix or None
    else:
        at = prefix + _encode(schema, [column], [key_range.lower])
        lower = at if key_range.lower_inclusive else prefix_successor(at)
        if lower is None:  # nothing sorts above an all-0xFF key
            return at, at
    if key_range.upper is None:
        upper = prefix_successor(prefix) if prefix else None
    else:
        at = prefix + _encode(schema, [column], [key_range.upper])
        upper = prefix_successor(at) if key_range.upper_inclusive else at
    return lower, upper


def pinned_bucket(predicates: Sequence[Predicate] | Predicate | None,
                  descriptor: TableDescriptor) -> int | None:
    """The one bucket that can hold the rows when ``=`` pins every bucket-key column, else None.

    Floating-point bucket keys are left alone: ``-0.0`` and ``0.0`` are one key but hash apart.
    """
    key = descriptor.bucket_key
    if not key or not descriptor.primary_key:
        return None
    if descriptor.num_buckets == 1:
        return 0
    pinned = _equalities(conjuncts_of(predicates))
    if any(column not in pinned or pa.types.is_floating(descriptor.schema.field(column).type)
           for column in key):
        return None
    row = pa.Table.from_arrays([pa.array([pinned[c]], descriptor.schema.field(c).type) for c in key],
                               names=list(key))
    return int(bucket_ids(row, key, descriptor.num_buckets)[0])
