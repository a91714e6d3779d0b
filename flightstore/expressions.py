"""Filter expressions shared by log batch skipping, SQL WHERE pushdown and Spark ``pushFilters``.

A small tree of immutable predicates over column references and literals. Each node can

* :meth:`Predicate.bind` itself to a schema (unknown columns are refused, literals cast to the
  column type),
* compile to a ``pyarrow.compute.Expression`` for exact row filtering (:meth:`to_arrow`),
* answer "might match" / "cannot match" against per-batch statistics (:meth:`might_match`), the way
  pyiceberg's metrics evaluator prunes files,
* round-trip through JSON (:meth:`to_json` / :func:`from_json`) so tickets and connectors carry it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
from dataclasses import dataclass
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from flightstore.errors import InvalidInput

__all__ = [
    "ColumnStats", "Predicate", "Comparison", "In", "IsNull", "IsNotNull", "StartsWith",
    "And", "Or", "Not", "AlwaysTrue", "and_all", "from_json",
]


@dataclass(frozen=True)
class ColumnStats:
    """Statistics of one column in one batch; ``min``/``max`` are None when all values are null."""

    min: Any
    max: Any
    null_count: int
    row_count: int


class Predicate:
    """Base of every filter node."""

    def columns(self) -> set[str]:
        raise NotImplementedError

    def bind(self, schema: pa.Schema) -> "Predicate":
        raise NotImplementedError

    def to_arrow(self) -> pc.Expression:
        raise NotImplementedError

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        """False only when no row of a batch with these statistics can satisfy the predicate."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def __and__(self, other: "Predicate") -> "Predicate":
        return And(self, other)

    def __or__(self, other: "Predicate") -> "Predicate":
        return Or(self, other)


def _field(schema: pa.Schema, column: str) -> pa.Field:
    index = schema.get_field_index(column)
    if index < 0:
        raise InvalidInput(f"unknown column {column!r}; columns are {', '.join(schema.names)}")
    return schema.field(index)


def _cast_literal(value: Any, arrow_type: pa.DataType, column: str) -> Any:
    if value is None:
        return None
    try:
        if pa.types.is_timestamp(arrow_type) and isinstance(value, str):
            scalar = pc.cast(pa.scalar(value), arrow_type)
        elif pa.types.is_date(arrow_type) and isinstance(value, str):
            scalar = pa.scalar(_dt.date.fromisoformat(value), arrow_type)
        elif pa.types.is_decimal(arrow_type) and not isinstance(value, decimal.Decimal):
            scalar = pa.scalar(decimal.Decimal(str(value)), arrow_type)
        elif pa.types.is_integer(arrow_type) and isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{value} is not an integer")
            scalar = pa.scalar(int(value), arrow_type)
        else:
            scalar = pa.scalar(value, arrow_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError, TypeError,
            decimal.InvalidOperation, OverflowError) as exc:
        raise InvalidInput(f"cannot compare column {column!r} of type {arrow_type} with {value!r}: "
                           f"{exc}") from None
    return scalar.as_py()


_OPS = {
    "=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


@dataclass(frozen=True)
class Comparison(Predicate):
    """``column <op> value`` with op one of = != < <= > >=."""

    column: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise InvalidInput(f"unsupported comparison operator {self.op!r}")

    def columns(self) -> set[str]:
        return {self.column}

    def bind(self, schema: pa.Schema) -> "Comparison":
        field = _field(schema, self.column)
        return Comparison(self.column, self.op, _cast_literal(self.value, field.type, self.column))

    def to_arrow(self) -> pc.Expression:
        return _OPS[self.op](pc.field(self.column), pc.scalar(self.value))

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        s = stats.get(self.column)
        if s is None or self.value is None:
            return True
        if s.null_count == s.row_count:
            return False  # comparisons with null are never true
        if s.min is None or s.max is None:
            return True
        try:
            if self.op == "=":
                return s.min <= self.value <= s.max
            if self.op == "!=":
                return not (s.min == s.max == self.value)
            if self.op == "<":
                return s.min < self.value
            if self.op == "<=":
                return s.min <= self.value
            if self.op == ">":
                return s.max > self.value
            return s.max >= self.value
        except TypeError:
            return True

    def to_dict(self) -> dict:
        return {"op": self.op, "column": self.column, "value": _encode_value(self.value)}


@dataclass(frozen=True)
class In(Predicate):
    """``column IN (values...)``."""

    column: str
    values: tuple

    def columns(self) -> set[str]:
        return {self.column}

    def bind(self, schema: pa.Schema) -> "In":
        field = _field(schema, self.column)
        return In(self.column, tuple(_cast_literal(v, field.type, self.column) for v in self.values))

    def to_arrow(self) -> pc.Expression:
        values = [v for v in self.values if v is not None]
        return pc.field(self.column).isin(values)

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        s = stats.get(self.column)
        if s is None or s.min is None or s.max is None:
            return s is None or s.null_count < s.row_count
        try:
            return any(v is not None and s.min <= v <= s.max for v in self.values)
        except TypeError:
            return True

    def to_dict(self) -> dict:
        return {"op": "in", "column": self.column, "values": [_encode_value(v) for v in self.values]}


@dataclass(frozen=True)
class IsNull(Predicate):
    column: str

    def columns(self) -> set[str]:
        return {self.column}

    def bind(self, schema: pa.Schema) -> "IsNull":
        _field(schema, self.column)
        return self

    def to_arrow(self) -> pc.Expression:
        return pc.field(self.column).is_null()

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        s = stats.get(self.column)
        return s is None or s.null_count > 0

    def to_dict(self) -> dict:
        return {"op": "is_null", "column": self.column}


@dataclass(frozen=True)
class IsNotNull(Predicate):
    column: str

    def columns(self) -> set[str]:
        return {self.column}

    def bind(self, schema: pa.Schema) -> "IsNotNull":
        _field(schema, self.column)
        return self

    def to_arrow(self) -> pc.Expression:
        return pc.field(self.column).is_valid()

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        s = stats.get(self.column)
        return s is None or s.null_count < s.row_count

    def to_dict(self) -> dict:
        return {"op": "is_not_null", "column": self.column}


@dataclass(frozen=True)
class StartsWith(Predicate):
    column: str
    prefix: str

    def columns(self) -> set[str]:
        return {self.column}

    def bind(self, schema: pa.Schema) -> "StartsWith":
        field = _field(schema, self.column)
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            raise InvalidInput(f"STARTS WITH needs a string column; {self.column!r} is {field.type}")
        return self

    def to_arrow(self) -> pc.Expression:
        return pc.starts_with(pc.field(self.column), self.prefix)

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        s = stats.get(self.column)
        if s is None or s.min is None or s.max is None:
            return s is None or s.null_count < s.row_count
        return s.min[: len(self.prefix)] <= self.prefix <= s.max[: len(self.prefix)]

    def to_dict(self) -> dict:
        return {"op": "starts_with", "column": self.column, "value": self.prefix}


@dataclass(frozen=True)
class And(Predicate):
    left: Predicate
    right: Predicate

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()

    def bind(self, schema: pa.Schema) -> "And":
        return And(self.left.bind(schema), self.right.bind(schema))

    def to_arrow(self) -> pc.Expression:
        return self.left.to_arrow() & self.right.to_arrow()

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        return self.left.might_match(stats) and self.right.might_match(stats)

    def to_dict(self) -> dict:
        return {"op": "and", "args": [self.left.to_dict(), self.right.to_dict()]}


@dataclass(frozen=True)
class Or(Predicate):
    left: Predicate
    right: Predicate

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()

    def bind(self, schema: pa.Schema) -> "Or":
        return Or(self.left.bind(schema), self.right.bind(schema))

    def to_arrow(self) -> pc.Expression:
        return self.left.to_arrow() | self.right.to_arrow()

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        return self.left.might_match(stats) or self.right.might_match(stats)

    def to_dict(self) -> dict:
        return {"op": "or", "args": [self.left.to_dict(), self.right.to_dict()]}


@dataclass(frozen=True)
class Not(Predicate):
    child: Predicate

    def columns(self) -> set[str]:
        return self.child.columns()

    def bind(self, schema: pa.Schema) -> "Not":
        return Not(self.child.bind(schema))

    def to_arrow(self) -> pc.Expression:
        return ~self.child.to_arrow()

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        return True  # conservative: statistics rarely prove a negation

    def to_dict(self) -> dict:
        return {"op": "not", "args": [self.child.to_dict()]}


@dataclass(frozen=True)
class AlwaysTrue(Predicate):
    def columns(self) -> set[str]:
        return set()

    def bind(self, schema: pa.Schema) -> "AlwaysTrue":
        return self

    def to_arrow(self) -> pc.Expression:
        return pc.scalar(True)

    def might_match(self, stats: Mapping[str, ColumnStats]) -> bool:
        return True

    def to_dict(self) -> dict:
        return {"op": "true"}


def and_all(predicates: list[Predicate]) -> Predicate | None:
    """Conjunction of ``predicates``; None when the list is empty."""
    result: Predicate | None = None
    for predicate in predicates:
        result = predicate if result is None else And(result, predicate)
    return result


def _encode_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, _dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, _dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, _dt.time):
        return {"$time": value.isoformat()}
    raise InvalidInput(f"cannot encode filter literal {value!r}")


def _decode_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    (tag, text), = value.items()
    return {"$bytes": lambda t: base64.b64decode(t), "$decimal": decimal.Decimal,
            "$datetime": _dt.datetime.fromisoformat, "$date": _dt.date.fromisoformat,
            "$time": _dt.time.fromisoformat}[tag](text)


def _from_dict(data: dict) -> Predicate:
    op = data["op"]
    if op in _OPS:
        return Comparison(data["column"], op, _decode_value(data["value"]))
    if op == "in":
        return In(data["column"], tuple(_decode_value(v) for v in data["values"]))
    if op == "is_null":
        return IsNull(data["column"])
    if op == "is_not_null":
        return IsNotNull(data["column"])
    if op == "starts_with":
        return StartsWith(data["column"], data["value"])
    if op == "and":
        return And(*(_from_dict(arg) for arg in data["args"]))
    if op == "or":
        return Or(*(_from_dict(arg) for arg in data["args"]))
    if op == "not":
        return Not(_from_dict(data["args"][0]))
    if op == "true":
        return AlwaysTrue()
    raise InvalidInput(f"unknown filter operator {op!r}")


def from_json(text: str | dict) -> Predicate:
    """Inverse of :meth:`Predicate.to_json`."""
    try:
        return _from_dict(json.loads(text) if isinstance(text, str) else text)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"malformed filter: {exc}") from None
