"""SQL literals <-> Python values <-> Arrow column types.

* :func:`literal_value` evaluates a constant sqlglot expression (numbers, strings, NULL, TRUE/FALSE,
  negation, ``DATE '...'``, ``TIMESTAMP '...'``, ``CAST(x AS type)``, ``X'..'``).
* :func:`cast_value` fits a value to a column's Arrow type *strictly*: widening and ISO text for
  temporal columns are fine, silent truncation or text-as-number is not. Failures are SqlErrors
  naming the column and the value.
* :func:`datatype_to_arrow` maps a parsed SQL type to Arrow through :func:`schema.sql_type_to_arrow`.
* :func:`render_value` prints a value as a SQL literal, for ``explain()`` texts.
"""

from __future__ import annotations

import datetime as _dt
import decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from flightstore.errors import InvalidInput, SqlError
from flightstore.schema import arrow_type_to_sql, sql_type_to_arrow

__all__ = ["NotALiteral", "literal_value", "cast_value", "datatype_to_arrow", "render_value",
           "is_literal"]


class NotALiteral(Exception):
    """Internal signal: the expression is not a constant."""


_TYPE_NAMES = {
    "TEXT": "STRING", "NCHAR": "CHAR", "NVARCHAR": "VARCHAR", "TIMESTAMPLTZ": "TIMESTAMP_LTZ",
    "TIMESTAMPTZ": "TIMESTAMP_LTZ", "TIMESTAMPNTZ": "TIMESTAMP", "DATETIME": "TIMESTAMP",
    "BLOB": "BYTES", "BOOL": "BOOLEAN",
}


def datatype_to_arrow(datatype: exp.DataType) -> pa.DataType:
    """Arrow type of a parsed Flink SQL type; InvalidInput for unsupported types."""
    if datatype.this == exp.DataType.Type.USERDEFINED:
        name = str(datatype.args.get("kind") or "").upper()
    else:
        name = datatype.this.value.upper()
    name = _TYPE_NAMES.get(name, name)
    params = [p.sql() for p in datatype.expressions]
    if datatype.args.get("nested") or any(not p.strip().isdigit() for p in params):
        raise InvalidInput(f"unsupported column type {datatype.sql()!r}")
    text = f"{name}({', '.join(params)})" if params else name
    return sql_type_to_arrow(text)


def is_literal(node: exp.Expression) -> bool:
    try:
        literal_value(node)
    except NotALiteral:
        return False
    return True


def literal_value(node: exp.Expression) -> Any:
    """The Python value of a constant expression; raise :class:`NotALiteral` otherwise."""
    if isinstance(node, exp.Paren):
        return literal_value(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        return _number(node.this)
    if isinstance(node, exp.Neg):
        value = literal_value(node.this)
        if isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool):
            return -value
        raise NotALiteral
    if isinstance(node, exp.HexString):
        try:
            return bytes.fromhex(node.this)
        except ValueError:
            raise SqlError(f"invalid hex literal X'{node.this}'") from None
    if isinstance(node, (exp.Cast, exp.TryCast)):
        value = literal_value(node.this)
        try:
            target = datatype_to_arrow(node.to)
        except InvalidInput as exc:
            raise SqlError(f"{node.sql()}: {exc}") from None
        return _sql_cast(value, target, node)
    raise NotALiteral


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _sql_cast(value: Any, target: pa.DataType, node: exp.Expression) -> Any:
    """CAST semantics: explicit, so text converts to numbers too."""
    if value is None:
        return None
    try:
        if pa.types.is_timestamp(target) or pa.types.is_date(target) or pa.types.is_time(target):
            return cast_value(value, target, "CAST")
        if isinstance(value, float) and pa.types.is_decimal(target):
            value = decimal.Decimal(repr(value))
        return pc.cast(pa.scalar(value), target).as_py()
    except (pa.ArrowException, SqlError, ValueError, TypeError, decimal.InvalidOperation):
        raise SqlError(f"cannot evaluate {node.sql()}: {value!r} is not a valid "
                       f"{arrow_type_to_sql(target)}") from None


def _mismatch(value: Any, arrow_type: pa.DataType, column: str, why: str = "") -> SqlError:
    detail = f" ({why})" if why else ""
    return SqlError(f"column {column!r} of type {arrow_type_to_sql(arrow_type)} cannot take the "
                    f"value {render_value(value)}{detail}")


def _parse_datetime(text: str, arrow_type: pa.DataType) -> _dt.datetime:
    cleaned = text.strip().replace("T", " ", 1)
    if cleaned.endswith("Z"):
        cleaned = cleaned[:-1] + "+00:00"
    value = _dt.datetime.fromisoformat(cleaned)
    return _fit_timezone(value, arrow_type)


def _fit_timezone(value: _dt.datetime, arrow_type: pa.DataType) -> _dt.datetime:
    if arrow_type.tz is not None and value.tzinfo is None:
        return value.replace(tzinfo=_dt.timezone.utc)
    if arrow_type.tz is None and value.tzinfo is not None:
        return value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return value


def cast_value(value: Any, arrow_type: pa.DataType, column: str) -> Any:
    """``value`` as a Python value of ``arrow_type``; SqlError naming ``column`` when it does not fit.

    Allowed: integers into any numeric column (range-checked), floats into floating and decimal
    columns (and integer columns when integral), ISO text into DATE / TIME / TIMESTAMP columns,
    dates into timestamps, bytes into binary columns. Everything else is a mismatch.
    """
    if value is None:
        return None
    t = arrow_type
    try:
        if pa.types.is_boolean(t):
            if isinstance(value, bool):
                return value
        elif isinstance(value, bool):
            pass
        elif pa.types.is_integer(t):
            if isinstance(value, (float, decimal.Decimal)) and value == int(value):
                value = int(value)
            if isinstance(value, int):
                info = np.iinfo(t.to_pandas_dtype())
                if not info.min <= value <= info.max:
                    raise _mismatch(value, t, column, f"out of range {info.min} to {info.max}")
                return value
        elif pa.types.is_floating(t):
            if isinstance(value, (int, float, decimal.Decimal)):
                return pa.scalar(float(value), t).as_py()
        elif pa.types.is_decimal(t):
            if isinstance(value, (int, float, decimal.Decimal)):
                number = decimal.Decimal(repr(value) if isinstance(value, float) else value)
                scaled = number.quantize(decimal.Decimal(1).scaleb(-t.scale))
                if scaled != number:
                    raise _mismatch(value, t, column, f"more than {t.scale} decimal places")
                if abs(scaled) >= decimal.Decimal(10) ** (t.precision - t.scale):
                    raise _mismatch(value, t, column, f"more than {t.precision - t.scale} digits "
                                    "before the decimal point")
                return pa.scalar(scaled, t).as_py()
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            if isinstance(value, str):
                return value
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            if isinstance(value, (bytes, bytearray)):
                return bytes(value)
        elif pa.types.is_date(t):
            if isinstance(value, str):
                return _dt.date.fromisoformat(value.strip())
            if isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
                return value
        elif pa.types.is_timestamp(t):
            if isinstance(value, str):
                value = _parse_datetime(value, t)
            elif isinstance(value, _dt.datetime):
                value = _fit_timezone(value, t)
            elif isinstance(value, _dt.date):
                value = _fit_timezone(_dt.datetime(value.year, value.month, value.day), t)
            if isinstance(value, _dt.datetime):
                scalar = pa.scalar(value, pa.timestamp("us", t.tz))
                return pc.cast(scalar, t, safe=True).as_py()
        elif pa.types.is_time(t):
            if isinstance(value, str):
                value = _dt.time.fromisoformat(value.strip())
            if isinstance(value, _dt.time):
                return pa.scalar(value, t).as_py()
    except SqlError:
        raise
    except (pa.ArrowException, ValueError, TypeError, OverflowError, decimal.InvalidOperation) as exc:
        raise _mismatch(value, t, column, str(exc).splitlines()[0]) from None
    raise _mismatch(value, t, column)


def render_value(value: Any) -> str:
    """A value as SQL literal text (deterministic, for plan explanations and messages)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, _dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, _dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, _dt.time):
        return f"TIME '{value.isoformat()}'"
    if isinstance(value, (bytes, bytearray)):
        return f"X'{bytes(value).hex()}'"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(render_value(v) for v in value) + ")"
    return repr(value)
