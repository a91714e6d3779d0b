"""Aggregate functions of the aggregation merge engine: one small class per function (as Fluss).

Every function is a :class:`FieldAggregator`. The engine hands it one field of a write batch already
grouped by key (:class:`FieldInput`) and gets back the value each group holds afterwards. Work is
per column: pyarrow hash aggregation (``group_by``) or numpy over the group ids, never a Python loop
per row, except for Roaring bitmaps, whose values are opaque serialized objects.

Commutative functions (sum, product, max, min, bool_and, bool_or, rbm32, rbm64) implement
:meth:`FieldAggregator.aggregate` (the per-group partial of some rows) and
:meth:`FieldAggregator.combine` (stored value with a partial); order-dependent ones (first/last
value, listagg) override :meth:`FieldAggregator.merge` and use the row order of the batch.

Retraction (rows of kind -U / -D; beyond Fluss). Functions with ``retractable = True`` take back a
contribution; the others are refused by the engine before anything is written:

* ``sum`` subtracts, ``product`` divides (a retracted zero is refused: it cannot be divided out).
  For both a null stored value acts as the identity (0 or 1), so retractions and upserts commute.
* ``last_value`` / ``last_value_ignore_nulls``: retracting the value the field currently holds sets
  the field to null (the value before it is not kept); retracting any other value changes nothing.
* A null value in a retraction retracts nothing.

Undo (:mod:`flightstore.kv.undo`). Functions with ``invertible = True`` (sum, product) can take back
one writer's share of a value that other writers also changed: :meth:`FieldAggregator.contribution`
recovers what a changelog row added (after minus before, after over before), and ``retract`` takes
the writer's total back out of the current value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import InvalidInput
from flightstore.kv.merge.base import first_index, last_index, take_or_null

__all__ = ["AGGREGATORS", "DEFAULT_FUNCTION", "BoolAndAgg", "BoolOrAgg", "FieldAggregator",
           "FieldInput", "FirstValueAgg", "FirstValueIgnoreNullsAgg", "LastValueAgg",
           "LastValueIgnoreNullsAgg", "ListAgg", "MaxAgg", "MinAgg", "ProductAgg", "Rbm32Agg",
           "Rbm64Agg", "StringAgg", "SumAgg", "group_reduce"]

DEFAULT_FUNCTION = "last_value_ignore_nulls"


@dataclass
class FieldInput:
    """One field of a grouped write batch.

    ``values`` holds the field's value of every row; ``upsert`` / ``retract`` mark the rows that
    contribute (retractions of keys that did not exist yet are already removed by the engine);
    ``group`` maps rows to key groups 0..G-1; ``old`` is the stored value per group (null where
    ``found`` is False).
    """

    values: pa.Array
    upsert: np.ndarray
    retract: np.ndarray
    group: np.ndarray
    num_groups: int
    old: pa.Array
    found: np.ndarray


def _valid(values: pa.Array) -> np.ndarray:
    return values.is_valid().to_numpy(zero_copy_only=False)


def group_reduce(values: pa.Array, group: np.ndarray, num_groups: int, function: str,
                 options: pc.FunctionOptions | None = None) -> pa.Array:
    """Per-group ``function`` (a pyarrow hash aggregate) of ``values``; null for groups without rows."""
    table = pa.table({"g": pa.array(group, pa.int64()), "v": values})
    out = table.group_by("g", use_threads=False).aggregate([("v", function, options)])
    positions = np.full(num_groups, -1, dtype=np.int64)
    positions[out.column("g").to_numpy()] = np.arange(out.num_rows, dtype=np.int64)
    return take_or_null(out.column(1).combine_chunks(), positions)


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or t in (pa.float32(), pa.float64()) or pa.types.is_decimal(t)


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


class FieldAggregator:
    """Base of the aggregate functions. ``params`` are the field's ``fields.<f>.<fn>.<param>``."""

    name: ClassVar[str] = ""
    params: ClassVar[tuple[str, ...]] = ()
    retractable: ClassVar[bool] = False
    invertible: ClassVar[bool] = False  # retract(combine(x, p), p) == x: a share can be taken out

    def __init__(self, field: pa.Field, params: Mapping[str, str] | None = None) -> None:
        self.field = field
        self.type = field.type
        self.options = dict(params or {})

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        """Whether the function is defined for columns of ``type`` (checked at CREATE TABLE)."""
        return True

    # ---- commutative functions ----------------------------------------------------------------
    def aggregate(self, values: pa.Array, group: np.ndarray, num_groups: int) -> pa.Array:
        """The per-group partial of ``values`` (nulls skipped); null where a group has no value."""
        raise NotImplementedError

    def combine(self, old: pa.Array, partial: pa.Array) -> pa.Array:
        """Stored values combined element-wise with a partial; a null on either side is skipped."""
        raise NotImplementedError

    def retract(self, current: pa.Array, partial: pa.Array) -> pa.Array:
        """Take the partial of retracted values back out of ``current``."""
        raise InvalidInput(f"field {self.field.name!r}: {self.name} cannot retract")

    def check_retraction(self, values: pa.Array) -> None:
        """Refuse retracted values that cannot be taken back (InvalidInput), before any write."""

    def contribution(self, after: pa.Array, before: pa.Array) -> pa.Array:
        """What each change from ``before`` (null: no value yet) to ``after`` added to the field,
        as a partial :meth:`retract` takes back; null where it added nothing (invertible
        functions only; InvalidInput when a change cannot be inverted)."""
        raise InvalidInput(f"field {self.field.name!r}: {self.name} cannot take back one writer's "
                           "share of a value")

    def merge(self, inp: FieldInput) -> pa.Array:
        """The value of each group after the batch (commutative: upserts, then retractions)."""
        current = inp.old
        if inp.upsert.any():
            current = self.combine(current, self.aggregate(inp.values.filter(pa.array(inp.upsert)),
                                                           inp.group[inp.upsert], inp.num_groups))
        if inp.retract.any():
            retracted = inp.values.filter(pa.array(inp.retract))
            self.check_retraction(retracted)
            current = self.retract(current, self.aggregate(retracted, inp.group[inp.retract],
                                                           inp.num_groups))
        return current

    def _fit(self, array: pa.Array) -> pa.Array:
        """Cast a computed column back to the field type (integers wrap around, as in Java)."""
        if array.type == self.type:
            return array
        if pa.types.is_decimal(self.type):
            array = pc.round(array, ndigits=self.type.scale) if array.type.scale > self.type.scale \
                else array
            try:
                return pc.cast(array, self.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:  # value out of range
                raise InvalidInput(f"field {self.field.name!r}: {self.name} overflows {self.type}: "
                                   f"{exc}") from None
        return pc.cast(array, self.type, safe=False)


def _wide(*arrays: pa.Array, cap: int = 38) -> list[pa.Array]:
    """Decimals as decimal256 (precision at most ``cap``) so arithmetic cannot outgrow the type."""
    return [a.cast(pa.decimal256(min(a.type.precision, cap), a.type.scale))
            if pa.types.is_decimal128(a.type) else a for a in arrays]


class SumAgg(FieldAggregator):
    name = "sum"
    retractable = True

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        return _is_numeric(type)

    def aggregate(self, values, group, num_groups):
        return self._fit(group_reduce(values, group, num_groups, "sum",
                                      pc.ScalarAggregateOptions(min_count=1)))

    def combine(self, old, partial):
        old, partial = _wide(old, partial)
        return self._fit(pc.coalesce(pc.add(old, partial), old, partial))

    def retract(self, current, partial):
        current, partial = _wide(current, partial)
        return self._fit(pc.coalesce(pc.subtract(current, partial), current, pc.negate(partial)))

    invertible = True

    def contribution(self, after, before):
        after, before = _wide(after, before)
        zero = pa.scalar(0).cast(after.type)
        return self._fit(pc.subtract(after, pc.coalesce(before, zero)))


class ProductAgg(FieldAggregator):
    name = "product"
    retractable = True

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        return _is_numeric(type)

    def aggregate(self, values, group, num_groups):
        return self._fit(group_reduce(values, group, num_groups, "product",
                                      pc.ScalarAggregateOptions(min_count=1)))

    def combine(self, old, partial):
        old, partial = _wide(old, partial, cap=37)  # a product of two stays within 76 digits
        return self._fit(pc.coalesce(pc.multiply(old, partial), old, partial))

    def check_retraction(self, values: pa.Array) -> None:
        if pc.any(pc.equal(values, pa.scalar(0).cast(self.type))).as_py():
            raise InvalidInput(f"field {self.field.name!r}: product cannot retract a zero (the product "
                               "no longer holds the other factors)")

    def retract(self, current, partial):
        current, partial = _wide(current, partial, cap=37)
        one = pa.array(np.ones(len(partial), dtype=np.int64)).cast(partial.type)
        return self._fit(pc.coalesce(pc.divide(current, partial), current, pc.divide(one, partial)))

    invertible = True

    def contribution(self, after, before):
        zero = pa.scalar(0).cast(self.type)
        if pc.any(pc.equal(after, zero)).as_py():
            raise InvalidInput(f"field {self.field.name!r}: product: a factor of zero cannot be "
                               "taken back out (the product no longer holds the other factors)")
        after, before = _wide(after, before, cap=37)
        one = pa.scalar(1).cast(after.type)
        return self._fit(pc.divide(after, pc.coalesce(before, one)))


class _Extreme(FieldAggregator):
    function: ClassVar[str] = ""

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        return (_is_numeric(type) or _is_string(type) or pa.types.is_date(type)
                or pa.types.is_time(type) or pa.types.is_timestamp(type))

    def aggregate(self, values, group, num_groups):
        return group_reduce(values, group, num_groups, self.function)

    def combine(self, old, partial):
        element_wise = pc.max_element_wise if self.function == "max" else pc.min_element_wise
        if _is_numeric(self.type) or _is_string(self.type):
            return self._fit(element_wise(old, partial, skip_nulls=True))
        # Temporal types (some with a time zone) have no element-wise kernel: compare the ticks.
        ticks = pa.int32() if self.type.bit_width == 32 else pa.int64()
        chosen = element_wise(old.cast(ticks), partial.cast(ticks), skip_nulls=True)
        return chosen.cast(self.type)


class MaxAgg(_Extreme):
    name = function = "max"


class MinAgg(_Extreme):
    name = function = "min"


class LastValueAgg(FieldAggregator):
    """The latest upserted value, a null included; retracting the current value nulls it."""

    name = "last_value"
    retractable = True
    ignore_nulls: ClassVar[bool] = False

    def merge(self, inp: FieldInput) -> pa.Array:
        candidates = inp.upsert & _valid(inp.values) if self.ignore_nulls else inp.upsert
        last = last_index(inp.group, inp.num_groups, candidates)
        current = pc.if_else(pa.array(last >= 0), take_or_null(inp.values, last), inp.old)
        retract = inp.retract & _valid(inp.values)
        if retract.any():  # only retractions after the group's last upsert can hit its value
            rows = np.flatnonzero(retract)
            rows = rows[rows > last[inp.group[rows]]]
            groups = inp.group[rows]
            same = pc.fill_null(pc.equal(inp.values.take(pa.array(rows)),
                                         current.take(pa.array(groups))), False)
            hit = np.zeros(inp.num_groups, dtype=bool)
            hit[groups[same.to_numpy(zero_copy_only=False)]] = True
            current = pc.if_else(pa.array(hit), pa.nulls(inp.num_groups, self.type), current)
        return current


class LastValueIgnoreNullsAgg(LastValueAgg):
    """The latest non-null value (the default function); a null keeps the stored value."""

    name = "last_value_ignore_nulls"
    ignore_nulls = True


class FirstValueAgg(FieldAggregator):
    """The value of the row that created the key, a null included."""

    name = "first_value"

    def merge(self, inp: FieldInput) -> pa.Array:
        first = first_index(inp.group, inp.num_groups, inp.upsert)
        return pc.if_else(pa.array(inp.found), inp.old, take_or_null(inp.values, first))


class FirstValueIgnoreNullsAgg(FieldAggregator):
    """The first non-null value ever written; nulls are ignored until a value arrives."""

    name = "first_value_ignore_nulls"

    def merge(self, inp: FieldInput) -> pa.Array:
        first = first_index(inp.group, inp.num_groups, inp.upsert & _valid(inp.values))
        return pc.coalesce(inp.old, take_or_null(inp.values, first))


class ListAgg(FieldAggregator):
    """Non-null strings concatenated in arrival order with ``delimiter`` (default ``,``)."""

    name = "listagg"
    params = ("delimiter",)

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        return _is_string(type)

    @property
    def delimiter(self) -> str:
        return self.options.get("delimiter", ",")

    def aggregate(self, values, group, num_groups):
        valid = _valid(values)
        values, group = values.filter(pa.array(valid)), group[valid]
        order = np.argsort(group, kind="stable")  # row order kept inside each group
        counts = np.bincount(group, minlength=num_groups)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        lists = pa.LargeListArray.from_arrays(pa.array(offsets), values.take(pa.array(order)))
        joined = pc.binary_join(lists, self.delimiter)
        return self._fit(pc.if_else(pa.array(counts > 0), joined, pa.nulls(num_groups, joined.type)))

    def combine(self, old, partial):
        joined = pc.binary_join_element_wise(old, partial, self.delimiter)
        return pc.coalesce(joined, old, partial)


class StringAgg(ListAgg):
    name = "string_agg"


class _Bool(FieldAggregator):
    function: ClassVar[str] = ""

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        return pa.types.is_boolean(type)

    def aggregate(self, values, group, num_groups):
        return group_reduce(values, group, num_groups, self.function,
                            pc.ScalarAggregateOptions(min_count=1))

    def combine(self, old, partial):
        both = pc.and_(old, partial) if self.function == "all" else pc.or_(old, partial)
        return pc.coalesce(both, old, partial)


class BoolAndAgg(_Bool):
    name, function = "bool_and", "all"


class BoolOrAgg(_Bool):
    name, function = "bool_or", "any"


class _Roaring(FieldAggregator):
    """Union of serialized Roaring bitmaps (pyroaring). Bitmaps are opaque: a loop per value."""

    @classmethod
    def supports(cls, type: pa.DataType) -> bool:
        return _is_binary(type)

    def _bitmap_class(self):
        import pyroaring
        return pyroaring.BitMap if self.name == "rbm32" else pyroaring.BitMap64

    def _load(self, raw: bytes):
        try:
            return self._bitmap_class().deserialize(raw)
        except (ValueError, OverflowError, TypeError) as exc:  # pyroaring on bad bytes
            raise InvalidInput(f"field {self.field.name!r}: not a serialized {self.name} bitmap: "
                               f"{exc}") from None

    def aggregate(self, values, group, num_groups):
        valid = _valid(values)
        unions: dict[int, object] = {}
        for g, raw in zip(group[valid].tolist(), values.filter(pa.array(valid)).to_pylist()):
            bitmap = self._load(raw)
            unions[g] = unions[g] | bitmap if g in unions else bitmap
        out = [None] * num_groups
        for g, bitmap in unions.items():
            out[g] = bitmap.serialize()
        return pa.array(out, self.type)

    def combine(self, old, partial):
        both = np.flatnonzero(_valid(old) & _valid(partial))
        merged = pc.coalesce(partial, old).to_pylist()
        for g, a, b in zip(both.tolist(), old.take(pa.array(both)).to_pylist(),
                           partial.take(pa.array(both)).to_pylist()):
            merged[g] = (self._load(a) | self._load(b)).serialize()
        return pa.array(merged, self.type)


class Rbm32Agg(_Roaring):
    name = "rbm32"


class Rbm64Agg(_Roaring):
    name = "rbm64"


AGGREGATORS: dict[str, type[FieldAggregator]] = {cls.name: cls for cls in (
    SumAgg, ProductAgg, MaxAgg, MinAgg, LastValueAgg, LastValueIgnoreNullsAgg, FirstValueAgg,
    FirstValueIgnoreNullsAgg, ListAgg, StringAgg, BoolAndAgg, BoolOrAgg, Rbm32Agg, Rbm64Agg)}
