"""Arrow tables as aligned text for terminals (``flightstore sql``), without pandas.

A display concern only: it runs once per statement on at most ``max_rows`` rows, so a plain loop
over them is fine. Wider results are cut with a ``(N rows, M shown)`` footer.
"""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa

__all__ = ["SHOWN_ROWS", "format_table"]

SHOWN_ROWS = 200  # rows of a result printed; the footer counts the others


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


def format_table(table: pa.Table, max_rows: int = SHOWN_ROWS, total_rows: int | None = None) -> str:
    """``table`` as a psql-like text grid: a header, a rule, one line per row (numbers aligned
    right), then ``(N rows)``; ``total_rows``: the result's row count when ``table`` holds only
    its first rows (``flightstore sql`` keeps no more than it prints)."""
    shown = table.slice(0, max_rows)
    total = table.num_rows if total_rows is None else total_rows
    columns = [[_cell(v) for v in column.to_pylist()] for column in shown.columns]
    names = table.column_names
    widths = [max([len(name)] + [len(c) for c in cells]) for name, cells in zip(names, columns)]
    right = [_numeric(field.type) for field in table.schema]

    def line(cells: list[str]) -> str:
        return " | ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    lines = [line(names), "-+-".join("-" * w for w in widths)]
    lines += [line([column[i] for column in columns]) for i in range(shown.num_rows)]
    count = f"{total} row{'s' if total != 1 else ''}"
    lines.append(f"({count}, {shown.num_rows} shown)" if shown.num_rows < total else f"({count})")
    return "\n".join(lines)
