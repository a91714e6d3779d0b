"""Spark data source filters -> flightstore :mod:`flightstore.expressions` predicates.

Only filters the server evaluates exactly are translated; anything else (string ends-with/contains,
nested columns, timestamp literals whose time zone Spark and the server could read differently)
stays in Spark.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import pyarrow as pa
from pyspark.sql import datasource as ds

from flightstore import expressions as ex

__all__ = ["to_predicate"]

_COMPARISONS = {
    ds.EqualTo: "=", ds.GreaterThan: ">", ds.GreaterThanOrEqual: ">=", ds.LessThan: "<",
    ds.LessThanOrEqual: "<=",
}


# Children whose Arrow result is null exactly where SQL's is, so NOT of them matches SQL.
_NULL_PRESERVING = (ds.EqualTo, ds.GreaterThan, ds.GreaterThanOrEqual, ds.LessThan, ds.LessThanOrEqual,
                    ds.IsNull, ds.IsNotNull, ds.StringStartsWith)


def _column(attribute: tuple, schema: pa.Schema) -> str | None:
    if len(attribute) != 1 or schema.get_field_index(attribute[0]) < 0:
        return None
    return attribute[0]


def _literal_ok(value: Any) -> bool:
    if isinstance(value, _dt.datetime):
        return False  # Spark hands session-time-zone wall clock values; keep these filters in Spark
    return isinstance(value, (bool, int, float, str, bytes, _dt.date)) or value is None


def to_predicate(spark_filter: Any, schema: pa.Schema) -> ex.Predicate | None:
    """The flightstore predicate equal to ``spark_filter``, or None when it cannot be pushed."""
    predicate = _translate(spark_filter, schema)
    if predicate is None:
        return None
    try:
        predicate.bind(schema)  # the server will do the same; refuse what it would refuse
    except Exception:  # noqa: BLE001 - anything not bindable is simply not pushed
        return None
    return predicate


def _translate(f: Any, schema: pa.Schema) -> ex.Predicate | None:
    op = _COMPARISONS.get(type(f))
    if op is not None:
        column = _column(f.attribute, schema)
        if column is None or not _literal_ok(f.value) or f.value is None:
            return None
        return ex.Comparison(column, op, f.value)
    if isinstance(f, ds.EqualNullSafe):
        column = _column(f.attribute, schema)
        if column is None or not _literal_ok(f.value):
            return None
        return ex.IsNull(column) if f.value is None else ex.Comparison(column, "=", f.value)
    if isinstance(f, ds.In):
        column = _column(f.attribute, schema)
        values = tuple(v for v in f.value if v is not None)
        if column is None or not all(_literal_ok(v) for v in values):
            return None
        return ex.In(column, values)
    if isinstance(f, ds.IsNull):
        column = _column(f.attribute, schema)
        return None if column is None else ex.IsNull(column)
    if isinstance(f, ds.IsNotNull):
        column = _column(f.attribute, schema)
        return None if column is None else ex.IsNotNull(column)
    if isinstance(f, ds.StringStartsWith):
        column = _column(f.attribute, schema)
        return None if column is None else ex.StartsWith(column, f.value)
    if isinstance(f, ds.Not):
        if isinstance(f.child, ds.In):  # Arrow's is_in answers false (not null) for a null value
            child = _translate(f.child, schema)
            return None if child is None else ex.And(ex.IsNotNull(child.column), ex.Not(child))
        if not isinstance(f.child, _NULL_PRESERVING):
            return None
        child = _translate(f.child, schema)
        return None if child is None else ex.Not(child)
    for name, combine in (("And", ex.And), ("Or", ex.Or)):  # not offered by pyspark 4.3; ready if added
        if type(f).__name__ == name and hasattr(f, "left"):
            left, right = _translate(f.left, schema), _translate(f.right, schema)
            return None if left is None or right is None else combine(left, right)
    return None
