"""Arrow tables as aligned text for terminals (``flightstore sql``), without pandas.

A display concern only: it runs once per statement on at most ``max_rows`` rows, so a plain loop
over them is fine. Wider results are cut with a ``(N rows, M shown)`` footer.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa

__all__ = ["format_table"]


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return "x'" + value.hex() + "'"
    return str(value)


def _numeric(arrow_type: pa.DataType) -> bool:
    t = pa.types
    return t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_decimal(arrow_type)


def format_table(table: pa.Table, max_rows: int = 200) -> str:
    """``table`` as a psql-like text grid: a header, a rule, one line per row (numbers aligned
    right), then ``(N rows)``."""
    shown = table.slice(0, max_rows)
    columns = [[_cell(v) for v in column.to_pylist()] for column in shown.columns]
    names = table.column_names
    widths = [max([len(name)] + [len(c) for c in cells]) for name, cells in zip(names, columns)]
    right = [_numeric(field.type) for field in table.schema]

    def line(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    lines = [line(names), "-+-".join("-" * w for w in widths)]
    lines += [line([column[i] for column in columns]) for i in range(shown.num_rows)]
    count = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    lines.append(f"({count}, {shown.num_rows} shown)" if shown.num_rows < table.num_rows else f"({count})")
    return "\n".join(lines)
