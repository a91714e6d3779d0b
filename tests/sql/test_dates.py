"""Date and time functions as DuckDB, PostgreSQL, Flink, JDBC/Tableau, Superset and Metabase write
them (flightstore/sql/dates.py, flightstore/sql/escapes.py): each expression, sent through ADBC to a
real server, answers what DuckDB answers for its DuckDB form on the same rows (values and type).

The rows cover a leap day, month ends, year boundaries, times of day, an end before its start and
NULLs, so that a unit or an argument order read wrongly changes some answer.
"""

from __future__ import annotations

import datetime as dt
import warnings

import duckdb
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi

from flightstore.server.sql_info import DATETIME_FUNCTIONS
from tests.server.conftest import RunningServer

ROWS = pa.table({
    "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
    "d": pa.array([dt.date(2024, 1, 31), dt.date(2023, 12, 25), dt.date(2024, 2, 29), None,
                   dt.date(2000, 1, 1), dt.date(2025, 6, 15)], pa.date32()),
    "e": pa.array([dt.date(2024, 3, 1), dt.date(2025, 1, 1), dt.date(2024, 2, 29), dt.date(2024, 1, 1),
                   dt.date(2024, 12, 31), dt.date(2025, 5, 20)], pa.date32()),
    "ts": pa.array([dt.datetime(2024, 1, 31, 23, 59, 59, 500000), dt.datetime(2023, 12, 25, 8, 0),
                    dt.datetime(2024, 2, 29, 12, 30, 15), None, dt.datetime(1999, 12, 31, 23, 0),
                    dt.datetime(2025, 6, 15, 6, 45, 30, 250)], pa.timestamp("us")),
    "te": pa.array([dt.datetime(2024, 3, 1, 0, 0, 1), dt.datetime(2025, 1, 1, 7, 59),
                    dt.datetime(2024, 2, 29, 12, 30, 15), dt.datetime(2024, 1, 1),
                    dt.datetime(2031, 7, 4, 1, 2, 3), dt.datetime(2025, 6, 14, 18, 0)], pa.timestamp("us")),
    "n": pa.array([1, -2, 0, 3, 40, None], pa.int32()),
    "s": pa.array(["2024-01-31", "2023-12-25 08:00:00", "2024-02-29", None, "2000-01-01", "2025-06-15"]),
})
DDL = ("CREATE TABLE dates (id BIGINT, d DATE, e DATE, ts TIMESTAMP(6), te TIMESTAMP(6), n INT, s STRING, "
       "PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")

UNITS = ["microsecond", "millisecond", "second", "minute", "hour", "day", "week", "month", "quarter", "year",
         "decade", "century", "millennium"]

# (as written by a client, DuckDB's form of it; None: DuckDB's form is the same text)
EXPRESSIONS = [
    # DATE_DIFF / DATEDIFF: DuckDB, PostgreSQL-style and Snowflake/SQL Server forms, every unit
    *[(f"DATE_DIFF('{unit}', ts, te)", None) for unit in UNITS],
    *[(f"DATEDIFF('{unit}', d, e)", f"date_diff('{unit}', d, e)") for unit in UNITS],
    *[(f"DATEDIFF({unit.upper()}, ts, te)", f"date_diff('{unit}', ts, te)") for unit in UNITS],
    ("DATE_DIFF('DAYS', d, e)", "date_diff('day', d, e)"),
    ("DATEDIFF(dd, d, e)", "date_diff('day', d, e)"),              # SQL Server abbreviations
    ("DATEDIFF(mm, d, e)", "date_diff('month', d, e)"),
    ("DATEDIFF(yyyy, ts, te)", "date_diff('year', ts, te)"),
    ("DATEDIFF(e, d)", "date_diff('day', d, e)"),                  # MySQL, Spark: days, end first
    ("DATEDIFF(te, ts)", "date_diff('day', ts, te)"),
    ("DATE_DIFF(e, d, MONTH)", "date_diff('month', d, e)"),        # BigQuery: unit last
    ("DATE_DIFF('day', d, CURRENT_DATE) > 0", None),
    # DATE_SUB (DuckDB's whole units), TIMESTAMPDIFF (JDBC, Flink, MySQL: whole units)
    *[(f"DATE_SUB('{unit}', ts, te)", None) for unit in UNITS],
    *[(f"TIMESTAMPDIFF({unit.upper()}, ts, te)", f"date_sub('{unit}', ts, te)") for unit in UNITS],
    ("TIMESTAMPDIFF(SQL_TSI_DAY, d, e)", "date_sub('day', d, e)"),
    ("TIMESTAMPDIFF(SQL_TSI_FRAC_SECOND, ts, te)", "date_sub('microsecond', ts, te)"),
    ("{fn TIMESTAMPDIFF(SQL_TSI_MONTH, ts, te)}", "date_sub('month', ts, te)"),
    # adding: DATE_ADD / DATE_SUB with intervals (DuckDB, MySQL), days (Spark), DATEADD, TIMESTAMPADD
    ("DATE_ADD(d, INTERVAL 1 DAY)", None),
    ("DATE_ADD(ts, INTERVAL '3' MONTH)", None),
    ("DATE_SUB(d, INTERVAL 1 DAY)", "d - INTERVAL 1 DAY"),
    ("DATE_SUB(ts, INTERVAL '2' HOUR)", "ts - INTERVAL 2 HOUR"),
    ("DATE_ADD(d, 3)", "d + 3"),
    ("DATE_ADD(ts, n)", "CAST(ts AS DATE) + n"),
    ("DATE_SUB(d, 3)", "d - 3"),
    ("DATEADD(day, 1, ts)", "ts + INTERVAL 1 DAY"),
    ("DATEADD('month', 2, d)", "d + INTERVAL 2 MONTH"),
    ("DATEADD(qq, n, d)", "d + INTERVAL (n) QUARTER"),
    ("TIMESTAMPADD(DAY, 1, ts)", "ts + INTERVAL 1 DAY"),
    ("TIMESTAMPADD(SQL_TSI_MONTH, n, d)", "d + INTERVAL (n) MONTH"),
    ("TIMESTAMPADD(WEEK, -1, te)", "te + INTERVAL (-1) WEEK"),
    ("TIMESTAMPADD(MINUTE, n, ts)", "ts + INTERVAL (n) MINUTE"),
    ("{fn TIMESTAMPADD(SQL_TSI_HOUR, 5, ts)}", "ts + INTERVAL 5 HOUR"),
    # truncation
    *[(f"DATE_TRUNC('{unit}', ts)", None) for unit in ("second", "minute", "hour", "day", "week", "month",
                                                        "quarter", "year", "decade", "century")],
    ("DATE_TRUNC('month', d)", None),
    ("DATE_TRUNC(MONTH, ts)", "date_trunc('month', ts)"),
    ("DATE_TRUNC(d, MONTH)", "date_trunc('month', d)"),           # BigQuery
    ("FLOOR(ts TO DAY)", "date_trunc('day', ts)"),                  # Flink, Calcite
    ("FLOOR(ts TO HOUR)", "date_trunc('hour', ts)"),
    ("CEIL(ts TO DAY)", "CASE WHEN date_trunc('day', ts) = ts THEN date_trunc('day', ts) "
                        "ELSE date_trunc('day', ts) + INTERVAL 1 DAY END"),
    ("DATE_TRUNC('week', ts + INTERVAL '1 day') - INTERVAL '1 day'", None),  # Metabase's Sunday weeks
    # parts
    *[(f"DATE_PART('{part}', ts)", None) for part in ("year", "quarter", "month", "week", "day", "hour",
                                                       "minute", "second", "millisecond", "dow", "isodow",
                                                       "doy", "epoch", "isoyear")],
    ("DATEPART(year, ts)", "date_part('year', ts)"),
    ("DATEPART(dow, d)", "date_part('dow', d)"),
    *[(f"EXTRACT({part} FROM ts)", None) for part in ("YEAR", "QUARTER", "MONTH", "WEEK", "DAY", "HOUR",
                                                       "MINUTE", "SECOND", "DOW", "DOY", "EPOCH")],
    ("CAST(EXTRACT(dow FROM ts) AS INTEGER) + 1", None),           # Metabase's day of week
    *[(f"{name}(d)", None) for name in ("YEAR", "QUARTER", "MONTH", "WEEK", "DAY", "DAYOFWEEK", "DAYOFYEAR",
                                         "DAYOFMONTH", "DAYNAME", "MONTHNAME", "LAST_DAY")],
    *[(f"{name}(ts)", None) for name in ("HOUR", "MINUTE", "SECOND", "EPOCH", "EPOCH_MS")],
    ("{fn DAYOFWEEK(d)}", "dayofweek(d) + 1"),                     # JDBC: 1 (Sunday) to 7
    ("{fn QUARTER(d)}", "quarter(d)"),
    ("{fn YEAR(ts)}", "year(ts)"),
    # construction, formatting, parsing
    ("MAKE_DATE(2024, 1, CAST(id AS INTEGER))", "make_date(2024, 1, CAST(id AS INTEGER))"),
    ("MAKE_TIMESTAMP(2024, 1, id, 1, 2, 3.5)", None),
    ("MAKE_TIME(1, 2, 3.5)", None),
    ("STRFTIME(ts, '%Y-%m-%d %H')", None),
    ("STRPTIME('2024-01-02', '%Y-%m-%d')", None),
    ("TO_TIMESTAMP(1700000000 + id)", None),                       # seconds since the epoch (Superset)
    ("TO_TIMESTAMP('2024-01-02 10:11:12')", "TIMESTAMP '2024-01-02 10:11:12'"),  # Flink
    ("TO_TIMESTAMP('02.01.2024 10:11', 'dd.MM.yyyy HH:mm')", "strptime('02.01.2024 10:11', '%d.%m.%Y %H:%M')"),
    ("TO_TIMESTAMP('2024-01-02 10:11', 'YYYY-MM-DD HH24:MI')", "strptime('2024-01-02 10:11', '%Y-%m-%d %H:%M')"),
    ("TO_DATE('2024-01-02')", "DATE '2024-01-02'"),
    ("TO_DATE('02/01/2024', 'dd/MM/yyyy')", "CAST(strptime('02/01/2024', '%d/%m/%Y') AS DATE)"),
    ("TO_DATE(s)", "CAST(s AS DATE)"),
    ("DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm')", "strftime(ts, '%Y-%m-%d %H:%M')"),  # Flink, Spark
    ("DATE_FORMAT(ts, 'EEE, d MMM yyyy')", "strftime(ts, '%a, %-d %b %Y')"),
    ("DATE_FORMAT(ts, '%Y-%m %H:%i')", "strftime(ts, '%Y-%m %H:%M')"),          # MySQL
    ("TO_CHAR(ts, 'YYYY-MM-DD HH24:MI:SS')", "strftime(ts, '%Y-%m-%d %H:%M:%S')"),  # PostgreSQL
    ("AGE(te, ts)", None),
    # interval arithmetic and casts
    ("ts + INTERVAL '1' DAY", None),
    ("ts + INTERVAL 1 DAY", None),
    ("ts - INTERVAL '2 hours'", None),
    ("ts + INTERVAL '-30 day'", None),
    ("d + INTERVAL '1' MONTH", None),
    ("ts + INTERVAL (n) HOUR", None),
    ("ts + INTERVAL '1-2' YEAR TO MONTH", "ts + INTERVAL '1 years 2 months'"),  # ANSI, Flink
    ("ts - INTERVAL '1 10:30:00' DAY TO SECOND", "ts - INTERVAL '1 days 10:30:00'"),
    ("d + 1", None),
    ("e - d", None),
    ("te - ts", None),
    ("CAST(ts AS DATE)", None),
    ("ts::date", None),
    ("CAST(d AS TIMESTAMP)", None),
    ("{d '2024-01-02'} + n", "DATE '2024-01-02' + n"),
    ("{ts '2024-01-02 10:00:00'} > ts", "TIMESTAMP '2024-01-02 10:00:00' > ts"),
    # now
    ("CURRENT_DATE > d", None),
    ("CURRENT_TIMESTAMP > ts", None),
    ("NOW() > ts", None),
    ("LOCALTIMESTAMP > ts", None),
    ("LOCALTIME IS NOT NULL", None),
    ("CURRENT_TIME IS NOT NULL", None),
    ("CURTIME() IS NOT NULL", "current_time IS NOT NULL"),
    ("CURDATE() > d", "current_date > d"),
    ("{fn CURDATE()} > d", "current_date > d"),
    ("{fn NOW()} > ts", "now() > ts"),
]

# whole queries: dates in WHERE (pushed filters), GROUP BY (partial aggregates), ORDER BY, parameters
QUERIES = [
    "SELECT id FROM dates WHERE DATE_DIFF('day', d, e) > 30 ORDER BY id",
    "SELECT id FROM dates WHERE ts >= CURRENT_DATE - INTERVAL '100' YEAR AND TIMESTAMPDIFF(HOUR, ts, te) < 24 "
    "ORDER BY id",
    "SELECT DATE_TRUNC('year', d) AS y, COUNT(*) AS c, SUM(n) AS s FROM dates GROUP BY 1 ORDER BY 1",
    "SELECT EXTRACT(YEAR FROM ts) AS y, MAX(DATEDIFF(day, ts, te)) AS m FROM dates GROUP BY 1 ORDER BY 1",
    "SELECT id, DATE_FORMAT(ts, 'yyyy-MM') AS m FROM dates ORDER BY DATEDIFF(e, d) DESC, id",
]


def _duckdb_query(sql: str) -> str:
    """The DuckDB form of a whole query in QUERIES."""
    return (sql.replace("DATE_DIFF('day', d, e)", "date_diff('day', d, e)")
               .replace("TIMESTAMPDIFF(HOUR, ts, te)", "date_sub('hour', ts, te)")
               .replace("DATEDIFF(day, ts, te)", "date_diff('day', ts, te)")
               .replace("DATE_FORMAT(ts, 'yyyy-MM')", "strftime(ts, '%Y-%m')")
               .replace("DATEDIFF(e, d)", "date_diff('day', d, e)"))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """(an ADBC connection to a server holding ROWS, DuckDB holding the same rows)."""
    running = RunningServer(tmp_path_factory.mktemp("dates") / "data")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cannot disable autocommit"
        conn = dbapi.connect(running.uri, autocommit=True)
    with conn.cursor() as cur:
        cur.execute(DDL)
        cur.adbc_ingest("dates", ROWS, mode="append")
    db = duckdb.connect()
    db.register("dates", ROWS)
    yield conn, db
    conn.close()
    db.close()
    running.stop()


def _server(conn, sql: str, params=None) -> pa.Table:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetch_arrow_table()


def _duckdb(db, sql: str) -> pa.Table:
    answer = db.sql(sql).arrow()
    return answer.read_all() if isinstance(answer, pa.RecordBatchReader) else answer


def _same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.types == want.schema.types, (got.schema, want.schema)
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("written,duckdb_form", EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
def test_expression_answers_what_duckdb_answers(engines, written, duckdb_form) -> None:
    conn, db = engines
    got = _server(conn, f"SELECT id, {written} AS v FROM dates ORDER BY id")
    want = _duckdb(db, f"SELECT id, {duckdb_form or written} AS v FROM dates ORDER BY id")
    _same(got, want)


@pytest.mark.parametrize("sql", QUERIES)
def test_query_answers_what_duckdb_answers(engines, sql) -> None:
    conn, db = engines
    _same(_server(conn, sql), _duckdb(db, _duckdb_query(sql)))


def test_units_and_values_as_parameters(engines) -> None:
    conn, db = engines
    got = _server(conn, "SELECT id, DATE_DIFF(?, d, e) AS a, TIMESTAMPADD(DAY, ?, ts) AS b FROM dates "
                        "WHERE d < ? ORDER BY id", ("month", 2, dt.date(2025, 1, 1)))
    want = _duckdb(db, "SELECT id, date_diff('month', d, e) AS a, ts + INTERVAL 2 DAY AS b FROM dates "
                       "WHERE d < DATE '2025-01-01' ORDER BY id")
    _same(got, want)


@pytest.mark.parametrize("sql,words", [
    ("SELECT TIMESTAMPDIFF(fortnight, ts, te) FROM dates", ["TIMESTAMPDIFF", "'fortnight' is not a unit"]),
    ("SELECT DATEADD(nope, 1, ts) FROM dates", ["DATEADD", "'nope' is not a unit"]),
    ("SELECT DATE_DIFF('day', d) FROM dates", ["DATE_DIFF takes (unit, start, end) or (end, start)"]),
    ("SELECT DATE_FORMAT(ts, s) FROM dates", ["DATE_FORMAT needs its format as a string literal"]),
    ("SELECT ts + INTERVAL '1:2' YEAR TO MONTH FROM dates", ["does not read as YEAR TO MONTH"]),
    ("SELECT {fn CURDATE() FROM dates", ["JDBC escape", "not closed"]),
])
def test_a_misread_date_function_is_an_error_that_says_why(engines, sql, words) -> None:
    conn, _ = engines
    with conn.cursor() as cur, pytest.raises(dbapi.ProgrammingError) as raised:
        cur.execute(sql)
        cur.fetch_arrow_table()
    message = str(raised.value)
    assert "INVALID_ARGUMENT" in message
    for word in words:
        assert word in message, (word, message)


def test_every_advertised_date_function_is_tested_here() -> None:
    """What GetSqlInfo advertises to JDBC tools (SQL_DATETIME_FUNCTIONS) is called above."""
    written = " ".join(e[0] for e in EXPRESSIONS).upper()
    assert [name for name in DATETIME_FUNCTIONS if name not in written] == []
