"""Superset's engine spec for flightstore (entry point ``superset.db_engine_specs``).

Time grains make time-series charts work: flightstore answers GROUP BY queries in embedded DuckDB,
so each grain is a ``DATE_TRUNC`` (weeks start on Monday, as ISO weeks and Superset's ``P1W``).
Temporal filters are typed literals (``TIMESTAMP '...'``, ``DATE '...'``) that the server's
planner also pushes down to storage. Only importable where Superset is installed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import types
from superset.constants import TimeGrain
from superset.db_engine_specs.base import BaseEngineSpec

__all__ = ["FlightstoreEngineSpec"]


class FlightstoreEngineSpec(BaseEngineSpec):
    """flightstore over its ``flightstore://`` SQLAlchemy dialect (ADBC Flight SQL)."""

    engine = "flightstore"
    engine_name = "flightstore"
    default_driver = "adbc"
    sqlalchemy_uri_placeholder = "flightstore://host:8815/database"
    supports_multivalues_insert = True
    allows_joins = True
    allows_subqueries = True
    allows_alias_in_select = True
    allows_alias_in_orderby = True

    _time_grain_expressions = {
        None: "{col}",
        TimeGrain.SECOND: "DATE_TRUNC('second', {col})",
        TimeGrain.MINUTE: "DATE_TRUNC('minute', {col})",
        TimeGrain.HOUR: "DATE_TRUNC('hour', {col})",
        TimeGrain.DAY: "DATE_TRUNC('day', {col})",
        TimeGrain.WEEK: "DATE_TRUNC('week', {col})",
        TimeGrain.MONTH: "DATE_TRUNC('month', {col})",
        TimeGrain.QUARTER: "DATE_TRUNC('quarter', {col})",
        TimeGrain.YEAR: "DATE_TRUNC('year', {col})",
    }

    @classmethod
    def epoch_to_dttm(cls) -> str:
        return "TO_TIMESTAMP({col})"

    @classmethod
    def convert_dttm(cls, target_type: str, dttm: datetime,
                     db_extra: dict[str, Any] | None = None) -> str | None:
        sqla_type = cls.get_sqla_column_type(target_type)
        if isinstance(sqla_type, types.Date) and not isinstance(sqla_type, types.DateTime):
            return f"DATE '{dttm.date().isoformat()}'"
        if isinstance(sqla_type, types.DateTime):
            return f"TIMESTAMP '{dttm.isoformat(sep=' ', timespec='microseconds')}'"
        return None
