"""flightstore's SQL types <-> SQLAlchemy types, both ways.

Reflection reads the type text ``DESCRIBE`` answers (``BIGINT``, ``DECIMAL(10, 2)``,
``TIMESTAMP(3)``, ``TIMESTAMP_LTZ(6)``, ``STRING`` ...); DDL writes the Flink SQL names the server
parses. Dates and timestamps also render as typed literals (``DATE '2026-01-31'``), which
SQLAlchemy's generic compiler does not do and BI tools need (they compile with literal binds).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.sql.compiler import GenericTypeCompiler

__all__ = ["COLSPECS", "Date", "DateTime", "FlightstoreTypeCompiler", "type_from_sql"]


class Date(sqltypes.Date):
    """DATE whose literal is ``DATE 'yyyy-mm-dd'``."""

    def literal_processor(self, dialect: Any) -> Callable[[Any], str]:
        def process(value: Any) -> str:
            if isinstance(value, dt.datetime):
                value = value.date()
            return f"DATE '{value.isoformat()}'"
        return process


class DateTime(sqltypes.DateTime):
    """TIMESTAMP whose literal is ``TIMESTAMP 'yyyy-mm-dd hh:mm:ss[.ffffff]'``."""

    def literal_processor(self, dialect: Any) -> Callable[[Any], str]:
        def process(value: Any) -> str:
            if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
                value = dt.datetime(value.year, value.month, value.day)
            return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
        return process


COLSPECS: dict[type, type] = {sqltypes.Date: Date, sqltypes.DateTime: DateTime}

_SIMPLE: dict[str, Any] = {
    "BOOLEAN": sqltypes.BOOLEAN, "TINYINT": sqltypes.SMALLINT, "SMALLINT": sqltypes.SMALLINT,
    "INT": sqltypes.INTEGER, "INTEGER": sqltypes.INTEGER, "BIGINT": sqltypes.BIGINT,
    "FLOAT": sqltypes.REAL, "DOUBLE": sqltypes.FLOAT, "STRING": sqltypes.TEXT, "VARCHAR": sqltypes.TEXT,
    "BYTES": sqltypes.LargeBinary, "DATE": sqltypes.DATE, "TIME": sqltypes.TIME,
}


def type_from_sql(text: str) -> sqltypes.TypeEngine:
    """The SQLAlchemy type of a flightstore column type as ``DESCRIBE`` prints it."""
    match = re.fullmatch(r"\s*([A-Z_]+)\s*(?:\((\d+)(?:\s*,\s*(\d+))?\))?\s*", text.upper())
    if match is None:
        return sqltypes.NullType()
    name, p, s = match.group(1), match.group(2), match.group(3)
    if name == "DECIMAL":
        return sqltypes.DECIMAL(int(p or 10), int(s or 0))
    if name == "TIMESTAMP":
        return sqltypes.TIMESTAMP(timezone=False)
    if name == "TIMESTAMP_LTZ":
        return sqltypes.TIMESTAMP(timezone=True)
    kind = _SIMPLE.get(name)
    return kind() if kind is not None else sqltypes.NullType()


class FlightstoreTypeCompiler(GenericTypeCompiler):
    """SQLAlchemy types as the Flink SQL names flightstore's DDL takes."""

    def _string(self, type_: Any, **kw: Any) -> str:
        return "STRING"

    visit_string = visit_VARCHAR = visit_NVARCHAR = visit_CHAR = visit_NCHAR = _string
    visit_text = visit_TEXT = visit_unicode = visit_unicode_text = visit_CLOB = _string

    def visit_BIGINT(self, type_: Any, **kw: Any) -> str:
        return "BIGINT"

    def visit_INTEGER(self, type_: Any, **kw: Any) -> str:
        return "INT"

    def visit_SMALLINT(self, type_: Any, **kw: Any) -> str:
        return "SMALLINT"

    def visit_FLOAT(self, type_: Any, **kw: Any) -> str:
        return "DOUBLE"

    visit_DOUBLE = visit_DOUBLE_PRECISION = visit_float = visit_double = visit_FLOAT

    def visit_REAL(self, type_: Any, **kw: Any) -> str:
        return "FLOAT"

    def visit_NUMERIC(self, type_: Any, **kw: Any) -> str:
        if type_.precision is None:
            return "DECIMAL(38, 10)"
        return f"DECIMAL({type_.precision}, {type_.scale or 0})"

    visit_DECIMAL = visit_numeric = visit_NUMERIC

    def visit_BOOLEAN(self, type_: Any, **kw: Any) -> str:
        return "BOOLEAN"

    def visit_DATETIME(self, type_: Any, **kw: Any) -> str:
        return "TIMESTAMP_LTZ(6)" if getattr(type_, "timezone", False) else "TIMESTAMP(6)"

    visit_TIMESTAMP = visit_datetime = visit_DATETIME

    def visit_TIME(self, type_: Any, **kw: Any) -> str:
        return "TIME"

    def visit_large_binary(self, type_: Any, **kw: Any) -> str:
        return "BYTES"

    visit_BLOB = visit_BINARY = visit_VARBINARY = visit_LargeBinary = visit_large_binary
