"""Date and time functions as DuckDB, PostgreSQL, Flink, MySQL/JDBC and the BI tools write them,
rewritten while parsing into the DuckDB forms the embedded engine runs.

sqlglot's default dialect reads several of these with other argument orders than their authors
meant (``DATE_DIFF('day', a, b)`` became ``DATE_DIFF('B', a, CAST('day' AS DATE))``), reads a unit
written as a bare word (``DATEDIFF(day, a, b)``) as a column, and drops a ``TO_CHAR`` format. The
builders here (:data:`FUNCTIONS`, installed in :class:`~flightstore.sql.parse.FlinkSql`'s parser)
and :func:`normalize` (after parsing) decide each form by its arguments:

============================================  ===============================================
written                                       runs as (DuckDB)
============================================  ===============================================
``DATE_DIFF|DATEDIFF(unit, a, b)``            ``date_diff(unit, a, b)``: unit boundaries crossed
``DATEDIFF(end, start)`` (MySQL, Spark)       ``date_diff('day', start, end)``
``DATE_DIFF(end, start, DAY)`` (BigQuery)     ``date_diff('day', start, end)``
``DATE_SUB(unit, a, b)`` (DuckDB)             ``date_sub(unit, a, b)``: whole units between
``TIMESTAMPDIFF(unit, a, b)`` (JDBC, Flink)   ``date_sub(unit, a, b)``: whole units, as MySQL
``DATE_ADD|DATE_SUB(x, INTERVAL ...)``        ``x + INTERVAL ...`` / ``x - INTERVAL ...``
``DATE_ADD|DATE_SUB(x, n)`` (Spark)           ``CAST(x AS DATE) + n`` / ``- n`` (days, a DATE)
``DATEADD|TIMESTAMPADD(unit, n, x)``          ``x + INTERVAL (n) unit``
``DATE_TRUNC(unit, x)``, ``DATE_TRUNC(x, MONTH)``, ``FLOOR(x TO unit)``   ``date_trunc(unit, x)``
``CEIL(x TO unit)``                           the next unit boundary at or after ``x``
``DATE_PART|DATEPART(unit, x)``               ``date_part(unit, x)``
``DATE_FORMAT(x, 'yyyy-MM-dd')`` (Flink)      ``strftime(x, '%Y-%m-%d')`` (MySQL ``%`` formats too)
``TO_CHAR(x, 'YYYY-MM-DD')`` (PostgreSQL)     ``strftime(x, '%Y-%m-%d')``
``TO_DATE(s[, fmt])``, ``TO_TIMESTAMP(s, fmt)``  ``CAST(s AS DATE)`` / ``strptime(s, fmt)``
``CURDATE()``, ``CURTIME()``                  ``CURRENT_DATE``, ``CURRENT_TIME``
``INTERVAL '1-2' YEAR TO MONTH`` (ANSI)       ``INTERVAL '1 years 2 months'``
============================================  ===============================================

A unit is a string (``'day'``, ``'DAYS'``, ``'dd'``) or a bare word (``DAY``, ``SQL_TSI_DAY``,
``dd``); a bare word that is not a unit stays a column. Everything else (``EXTRACT``, ``YEAR(x)``,
``LAST_DAY``, ``MAKE_DATE``, ``STRFTIME``, ``INTERVAL`` arithmetic, ``CURRENT_TIMESTAMP``...) is
DuckDB's already and keeps DuckDB's meaning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from sqlglot import exp
from sqlglot.dialects.mysql import MySQL
from sqlglot.dialects.postgres import Postgres
from sqlglot.time import format_time

from flightstore.errors import SqlError

__all__ = ["FUNCTIONS", "normalize", "unit_of"]

# Unit spellings -> DuckDB's name. Strings accept every spelling; bare words all but one-letter
# ones (a column named ``d`` or ``m`` stays a column).
_SPELLINGS = {
    "microsecond": ("microseconds", "us", "usec", "usecs", "mcs", "microsec", "frac_second"),
    "millisecond": ("milliseconds", "ms", "msec", "msecs", "millisec"),
    "second": ("seconds", "s", "sec", "secs", "ss"),
    "minute": ("minutes", "m", "min", "mins", "mi", "n"),
    "hour": ("hours", "h", "hr", "hrs", "hh"),
    "day": ("days", "d", "dd", "dayofmonth"),
    "week": ("weeks", "w", "wk", "ww", "weekofyear"),
    "month": ("months", "mon", "mons", "mm"),
    "quarter": ("quarters", "q", "qq", "qtr"),
    "year": ("years", "y", "yr", "yrs", "yy", "yyyy"),
    "decade": ("decades",),
    "century": ("centuries",),
    "millennium": ("millennia", "millenniums"),
}
UNITS = {spelling: unit for unit, others in _SPELLINGS.items() for spelling in (unit, *others)}
# Parts DATE_PART / EXTRACT also know (not units of arithmetic).
_PARTS = {"dow": "dow", "isodow": "isodow", "doy": "doy", "dayofyear": "doy", "dayofweek": "dow",
          "weekday": "dow", "epoch": "epoch", "isoyear": "isoyear", "yearweek": "yearweek",
          "julian": "julian", "era": "era", "timezone": "timezone", "timezone_hour": "timezone_hour",
          "timezone_minute": "timezone_minute"}
_INTERVAL_UNITS = {"microsecond": "MICROSECOND", "millisecond": "MILLISECOND", "second": "SECOND",
                   "minute": "MINUTE", "hour": "HOUR", "day": "DAY", "week": "WEEK", "month": "MONTH",
                   "quarter": "QUARTER", "year": "YEAR", "decade": "DECADE", "century": "CENTURY",
                   "millennium": "MILLENNIUM"}


def _word(node: exp.Expression) -> str | None:
    """The text of a bare word (an unqualified, unquoted column or a keyword), else None."""
    if isinstance(node, exp.Var):
        return node.name
    if isinstance(node, exp.Column) and not node.table and isinstance(node.this, exp.Identifier) \
            and not node.this.quoted:
        return node.name
    return None


def unit_of(node: exp.Expression, parts: bool = False) -> str | None:
    """DuckDB's name of the unit ``node`` spells (``'days'``, ``DAY``, ``SQL_TSI_DAY``), else None.
    With ``parts``, also the parts only DATE_PART knows (``dow``, ``epoch``...)."""
    if isinstance(node, exp.Literal) and node.is_string:
        text, bare = node.name, False
    else:
        text, bare = _word(node), True
        if text is None:
            return None
    text = text.strip().lower()
    if bare and text.startswith("sql_tsi_"):
        text = text[len("sql_tsi_"):]
    if bare and len(text) == 1:
        return None
    return UNITS.get(text) or (_PARTS.get(text) if parts else None)


def _is_string_like(node: exp.Expression) -> bool:
    """A string literal or a parameter: what DuckDB's own ``date_diff(part, ...)`` takes first."""
    return (isinstance(node, exp.Literal) and node.is_string) or isinstance(node, exp.Placeholder)


def _call(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def _unit_call(name: str, unit: str, *args: exp.Expression) -> exp.Expression:
    return _call(name, exp.Literal.string(unit), *args)


def _interval(amount: exp.Expression, unit: str) -> exp.Interval:
    if _INTERVAL_UNITS.get(unit) is None:
        raise SqlError(f"cannot add or subtract '{unit}' units; use one of {', '.join(_INTERVAL_UNITS)}")
    return exp.Interval(this=amount if isinstance(amount, exp.Literal) else exp.Paren(this=amount),
                        unit=exp.var(_INTERVAL_UNITS[unit]))


def _as_date(value: exp.Expression) -> exp.Expression:
    return exp.Cast(this=value, to=exp.DataType.build("DATE"))


def _days(amount: exp.Expression) -> exp.Expression:
    return exp.Cast(this=amount, to=exp.DataType.build("INTEGER"))


def _arity(name: str, args: Sequence[exp.Expression], counts: tuple[int, ...], forms: str) -> None:
    if len(args) not in counts:
        raise SqlError(f"{name} takes {forms}; got {len(args)} argument(s)")


def _date_diff(name: str) -> Callable[[list], exp.Expression]:
    def build(args: list) -> exp.Expression:
        _arity(name, args, (2, 3), "(unit, start, end) or (end, start)")
        if len(args) == 2 and unit_of(args[0]) is not None:
            raise SqlError(f"{name} takes (unit, start, end) or (end, start); {args[0].sql()} is a unit "
                           "without its start and end")
        if len(args) == 2:  # MySQL, Spark, Hive: days from the second to the first
            return _unit_call("date_diff", "day", args[1], args[0])
        unit = unit_of(args[0])
        if unit is not None:
            return _unit_call("date_diff", unit, args[1], args[2])
        if not _is_string_like(args[0]):
            unit = unit_of(args[2])
            if unit is not None and _word(args[2]) is not None:  # BigQuery: (end, start, UNIT)
                return _unit_call("date_diff", unit, args[1], args[0])
        return _call("date_diff", *args)  # DuckDB's own form; DuckDB names a part it does not know
    return build


def _timestamp_diff(args: list) -> exp.Expression:
    _arity("TIMESTAMPDIFF", args, (3,), "(unit, start, end)")
    unit = unit_of(args[0])
    if unit is None:
        raise SqlError(f"TIMESTAMPDIFF: {args[0].sql()!r} is not a unit; use one of {', '.join(_INTERVAL_UNITS)}")
    return _unit_call("date_sub", unit, args[1], args[2])


def _date_add(name: str, sign: int) -> Callable[[list], exp.Expression]:
    """DATE_ADD / DATE_SUB (and Databricks' two-argument DATEADD)."""
    operator = exp.Add if sign > 0 else exp.Sub

    def build(args: list) -> exp.Expression:
        _arity(name, args, (2, 3), "(date, INTERVAL ...), (date, days) or (unit, a, b)")
        if len(args) == 3:
            unit = unit_of(args[0])
            if sign < 0:  # DuckDB's date_sub(part, start, end): whole parts between
                return _unit_call("date_sub", unit, args[1], args[2]) if unit else _call("date_sub", *args)
            if unit is None:
                raise SqlError(f"{name}: {args[0].sql()!r} is not a unit; use one of {', '.join(_INTERVAL_UNITS)}")
            return exp.Add(this=args[2], expression=_interval(args[1], unit))
        value, amount = args
        if isinstance(amount, exp.Interval):
            return operator(this=value, expression=amount)
        return operator(this=_as_date(value), expression=_days(amount))  # Spark: whole days, a DATE
    return build


def _unit_add(name: str) -> Callable[[list], exp.Expression]:
    """DATEADD / TIMESTAMPADD (unit, amount, value)."""
    def build(args: list) -> exp.Expression:
        if name == "DATEADD" and len(args) == 2:
            return _date_add(name, 1)(args)
        _arity(name, args, (3,), "(unit, amount, value)")
        unit = unit_of(args[0])
        if unit is None:
            raise SqlError(f"{name}: {args[0].sql()!r} is not a unit; use one of {', '.join(_INTERVAL_UNITS)}")
        return exp.Add(this=args[2], expression=_interval(args[1], unit))
    return build


def _date_trunc(args: list) -> exp.Expression:
    _arity("DATE_TRUNC", args, (2,), "(unit, value)")
    unit = unit_of(args[0])
    if unit is not None:
        return exp.DateTrunc(unit=exp.Literal.string(unit), this=args[1])
    unit = unit_of(args[1])
    if unit is not None and _word(args[1]) is not None:  # BigQuery: DATE_TRUNC(value, MONTH)
        return exp.DateTrunc(unit=exp.Literal.string(unit), this=args[0])
    return _call("date_trunc", *args)


def _date_part(name: str) -> Callable[[list], exp.Expression]:
    def build(args: list) -> exp.Expression:
        _arity(name, args, (2,), "(part, value)")
        part = unit_of(args[0], parts=True)
        if part is not None:
            return _unit_call("date_part", part, args[1])
        return _call("date_part", *args)
    return build


# ---- formats --------------------------------------------------------------------------------
_JAVA = re.compile(r"'[^']*'|yyyy|yy|MMMM|MMM|MM|M|dd|d|HH|H|hh|h|mm|m|ss|s|SSSSSS|SSS|a|EEEE|EEE|DDD|D|u|Z|z|%")
_JAVA_CODES = {"yyyy": "%Y", "yy": "%y", "MMMM": "%B", "MMM": "%b", "MM": "%m", "M": "%-m", "dd": "%d",
               "d": "%-d", "HH": "%H", "H": "%-H", "hh": "%I", "h": "%-I", "mm": "%M", "m": "%-M",
               "ss": "%S", "s": "%-S", "SSSSSS": "%f", "SSS": "%g", "a": "%p", "EEEE": "%A", "EEE": "%a",
               "DDD": "%j", "D": "%-j", "u": "%u", "Z": "%z", "z": "%Z", "%": "%%"}


def _java_format(pattern: str) -> str:
    """A Java ``DateTimeFormatter`` / ``SimpleDateFormat`` pattern (Flink, Spark, Hive) as strftime."""
    def code(match: re.Match) -> str:
        text = match.group()
        if text.startswith("'"):
            return text[1:-1].replace("%", "%%") or "'"
        return _JAVA_CODES[text]
    return _JAVA.sub(code, pattern)


def _format_literal(name: str, node: exp.Expression) -> str:
    if not (isinstance(node, exp.Literal) and node.is_string):
        raise SqlError(f"{name} needs its format as a string literal, not {node.sql()!r}")
    return node.name


def _strftime_format(name: str, node: exp.Expression, dialect: str) -> exp.Literal:
    """The strftime pattern of a format written for ``dialect`` ('java', 'mysql' or 'postgres');
    a pattern with ``%`` codes is strftime's (MySQL's codes where they differ)."""
    pattern = _format_literal(name, node)
    if "%" in pattern:
        converted = format_time(pattern, MySQL.TIME_MAPPING, MySQL.TIME_TRIE) if dialect == "mysql" else pattern
    elif dialect == "postgres":
        converted = format_time(pattern, Postgres.TIME_MAPPING, Postgres.TIME_TRIE)
    else:
        converted = _java_format(pattern)
    return exp.Literal.string(converted)


def _date_format(args: list) -> exp.Expression:
    _arity("DATE_FORMAT", args, (2,), "(value, format)")
    return _call("strftime", args[0], _strftime_format("DATE_FORMAT", args[1], "mysql"))


def _to_char(args: list) -> exp.Expression:
    _arity("TO_CHAR", args, (2,), "(value, format)")
    return _call("strftime", args[0], _strftime_format("TO_CHAR", args[1], "postgres"))


def _parse_format(name: str, node: exp.Expression) -> exp.Literal:
    pattern = _format_literal(name, node)
    dialect = "postgres" if re.search(r"YYYY|HH24|MI|DD", pattern) and not re.search(r"yyyy|dd", pattern) \
        else "java"
    return _strftime_format(name, node, dialect)


def _to_date(args: list) -> exp.Expression:
    _arity("TO_DATE", args, (1, 2), "(text) or (text, format)")
    if len(args) == 1:
        return _as_date(args[0])
    return _as_date(_call("strptime", args[0], _parse_format("TO_DATE", args[1])))


def _to_timestamp(args: list) -> exp.Expression:
    _arity("TO_TIMESTAMP", args, (1, 2), "(epoch seconds), (text) or (text, format)")
    if len(args) == 2:
        return _call("strptime", args[0], _parse_format("TO_TIMESTAMP", args[1]))
    if isinstance(args[0], exp.Literal) and args[0].is_string:  # Flink: TO_TIMESTAMP('2024-01-01 10:00:00')
        return exp.Cast(this=args[0], to=exp.DataType.build("TIMESTAMP"))
    return _call("to_timestamp", args[0])  # DuckDB, PostgreSQL: seconds since the epoch


FUNCTIONS: dict[str, Callable[[list], exp.Expression]] = {
    "DATE_DIFF": _date_diff("DATE_DIFF"),
    "DATEDIFF": _date_diff("DATEDIFF"),
    "TIMESTAMPDIFF": _timestamp_diff,
    "TIMESTAMP_DIFF": _timestamp_diff,
    "DATE_ADD": _date_add("DATE_ADD", 1),
    "DATE_SUB": _date_add("DATE_SUB", -1),
    "DATEADD": _unit_add("DATEADD"),
    "TIMESTAMPADD": _unit_add("TIMESTAMPADD"),
    "TIMESTAMP_ADD": _unit_add("TIMESTAMPADD"),
    "DATE_TRUNC": _date_trunc,
    "DATE_PART": _date_part("DATE_PART"),
    "DATEPART": _date_part("DATEPART"),
    "DATE_FORMAT": _date_format,
    "TO_CHAR": _to_char,
    "TO_DATE": _to_date,
    "TO_TIMESTAMP": _to_timestamp,
    "CURDATE": lambda args: exp.CurrentDate(),
    "CURTIME": lambda args: exp.CurrentTime(),
}


# ---- after parsing --------------------------------------------------------------------------
_SPAN = {("YEAR", "MONTH"): (r"(-?)(\d+)-(\d+)", "{0}{1} years {0}{2} months"),
         ("DAY", "HOUR"): (r"(-?)(\d+) (\d+)", "{0}{1} days {0}{2} hours"),
         ("DAY", "MINUTE"): (r"(-?)(\d+) (\d+:\d+)", "{0}{1} days {0}{2}"),
         ("DAY", "SECOND"): (r"(-?)(\d+) (\d+:\d+:\d+(?:\.\d+)?)", "{0}{1} days {0}{2}"),
         ("HOUR", "MINUTE"): (r"(-?)(\d+:\d+)", "{0}{1}"),
         ("HOUR", "SECOND"): (r"(-?)(\d+:\d+:\d+(?:\.\d+)?)", "{0}{1}"),
         ("MINUTE", "SECOND"): (r"(-?)(\d+:\d+(?:\.\d+)?)", "{0}00:{1}")}


def _span_interval(node: exp.Interval) -> exp.Expression:
    """``INTERVAL '1-2' YEAR TO MONTH`` (ANSI, Flink) as the interval string DuckDB reads."""
    span = node.args["unit"]
    key = (span.this.name.upper(), span.expression.name.upper())
    if key not in _SPAN or not (isinstance(node.this, exp.Literal) and node.this.is_string):
        raise SqlError(f"INTERVAL ... {key[0]} TO {key[1]} is not supported; write e.g. INTERVAL '1 day 2 hours'")
    pattern, text = _SPAN[key]
    match = re.fullmatch(pattern, node.this.name.strip())
    if match is None:
        raise SqlError(f"INTERVAL {node.this.sql()} {key[0]} TO {key[1]}: the value does not read as "
                       f"{key[0]} TO {key[1]}")
    return exp.Interval(this=exp.Literal.string(text.format(*match.groups())))


def _floor_or_ceil(node: exp.Floor | exp.Ceil) -> exp.Expression:
    """``FLOOR(x TO unit)`` / ``CEIL(x TO unit)`` (Flink, Calcite)."""
    unit = unit_of(node.args["to"])
    if unit is None:
        raise SqlError(f"{node.key.upper()}(... TO {node.args['to'].sql()}): not a unit")
    floor = exp.DateTrunc(unit=exp.Literal.string(unit), this=node.this)
    if isinstance(node, exp.Floor):
        return floor
    value = node.this
    return exp.If(this=exp.EQ(this=floor.copy(), expression=value.copy()), true=floor.copy(),
                  false=exp.Add(this=floor, expression=_interval(exp.Literal.number(1), unit)))


def normalize(statement: exp.Expression) -> exp.Expression:
    """Rewrite the date forms the parser builds as syntax rather than calls (``FLOOR(x TO DAY)``,
    interval spans); returns the statement (changed in place where possible)."""
    def rewrite(node: exp.Expression) -> exp.Expression:
        if isinstance(node, (exp.Floor, exp.Ceil)) and node.args.get("to") is not None:
            return _floor_or_ceil(node)
        if isinstance(node, exp.Interval) and isinstance(node.args.get("unit"), exp.IntervalSpan):
            return _span_interval(node)
        return node

    if next(statement.find_all(exp.Floor, exp.Ceil, exp.IntervalSpan), None) is None:
        return statement
    return statement.transform(rewrite, copy=False)
