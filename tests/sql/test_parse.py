"""Parsing: dialect coverage, statement splitting, parameters and error messages."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from sqlglot import exp

from flightstore import errors
from flightstore.sql.literals import cast_value, datatype_to_arrow, literal_value
from flightstore.sql.parse import Explain, Show, bind_parameters, parse_statement, placeholders, value_to_sql


def test_flink_ddl_parses() -> None:
    statement = parse_statement(
        "CREATE TABLE IF NOT EXISTS `shop`.`orders` (order_id BIGINT, status STRING, b BYTES, "
        "ts TIMESTAMP_LTZ(3), PRIMARY KEY (order_id) NOT ENFORCED) COMMENT 'c' "
        "PARTITIONED BY (status) WITH ('bucket.num' = '4', 'table.log.ttl' = '2d');")
    assert isinstance(statement, exp.Create)
    assert statement.this.this.name == "orders"
    props = statement.args["properties"].expressions
    options = {p.this.this: p.args["value"].this for p in props if type(p) is exp.Property}
    assert options == {"bucket.num": "4", "table.log.ttl": "2d"}


@pytest.mark.parametrize("type_text, arrow_type", [
    ("BOOLEAN", pa.bool_()), ("TINYINT", pa.int8()), ("SMALLINT", pa.int16()), ("INT", pa.int32()),
    ("INTEGER", pa.int32()), ("BIGINT", pa.int64()), ("FLOAT", pa.float32()),
    ("DOUBLE", pa.float64()), ("DECIMAL(12, 3)", pa.decimal128(12, 3)), ("STRING", pa.string()),
    ("VARCHAR(10)", pa.string()), ("CHAR(2)", pa.string()), ("BYTES", pa.binary()),
    ("BINARY", pa.binary()), ("VARBINARY", pa.binary()), ("DATE", pa.date32()),
    ("TIME", pa.time64("us")), ("TIMESTAMP", pa.timestamp("us")),
    ("TIMESTAMP(3)", pa.timestamp("ms")), ("TIMESTAMP(9)", pa.timestamp("ns")),
    ("TIMESTAMP_LTZ(3)", pa.timestamp("ms", tz="UTC")),
    ("TIMESTAMP(6) WITH LOCAL TIME ZONE", pa.timestamp("us", tz="UTC")),
])
def test_every_column_type(type_text: str, arrow_type: pa.DataType) -> None:
    statement = parse_statement(f"CREATE TABLE t (c {type_text})")
    column = statement.this.expressions[0]
    assert datatype_to_arrow(column.args["kind"]) == arrow_type


@pytest.mark.parametrize("type_text", ["MAP<STRING, INT>", "TIMESTAMP(12)", "DECIMAL(50, 2)"])
def test_unsupported_types_are_invalid_input(type_text: str) -> None:
    statement = parse_statement(f"CREATE TABLE t (c {type_text})")
    with pytest.raises(errors.InvalidInput):
        datatype_to_arrow(statement.this.expressions[0].args["kind"])


def test_backtick_and_double_quoted_identifiers() -> None:
    for sql in ("SELECT * FROM `shop`.`orders$changelog`", 'SELECT * FROM "shop"."orders$changelog"'):
        table = parse_statement(sql).find(exp.Table)
        assert (table.db, table.name) == ("shop", "orders$changelog")


def test_show_and_explain() -> None:
    assert parse_statement("SHOW DATABASES") == Show("databases")
    assert parse_statement("show tables") == Show("tables")
    assert parse_statement("SHOW TABLES IN `shop`;") == Show("tables", "shop")
    assert parse_statement("SHOW TABLES FROM shop") == Show("tables", "shop")
    explained = parse_statement("EXPLAIN PLAN FOR SELECT 1")
    assert isinstance(explained, Explain) and isinstance(explained.statement, exp.Select)
    with pytest.raises(errors.SqlError, match="SHOW TABLES"):
        parse_statement("SHOW TABLES IN a b")
    with pytest.raises(errors.Unsupported, match="SHOW FUNCTIONS"):
        parse_statement("SHOW FUNCTIONS")
    with pytest.raises(errors.SqlError, match="EXPLAIN needs"):
        parse_statement("EXPLAIN")


def test_syntax_error_points_at_the_text() -> None:
    with pytest.raises(errors.SqlError) as info:
        parse_statement("SELECT * FROM t WHERE")
    message = str(info.value)
    assert "line 1, column 21" in message and "'WHERE'" in message
    assert "WHERE needs an expression after it" in message
    assert "sqlglot" not in message and "Required keyword" not in message
    with pytest.raises(errors.SqlError, match="line 2"):
        parse_statement("SELECT a\nFROM t WHERE (b = 1")


def test_unterminated_string_is_sql_error() -> None:
    with pytest.raises(errors.SqlError, match="cannot read"):
        parse_statement("SELECT 'abc")


def test_one_statement_only() -> None:
    with pytest.raises(errors.SqlError, match="got 2"):
        parse_statement("SELECT 1; SELECT 2")
    with pytest.raises(errors.SqlError, match="empty"):
        parse_statement("  ;  ")
    assert isinstance(parse_statement("SELECT 1;"), exp.Select)


@pytest.mark.parametrize("sql, kind", [
    ("CREATE VIEW v AS SELECT 1", "CREATE"), ("ALTER VIEW v AS SELECT 1", "ALTER VIEW"),
    ("TRUNCATE TABLE t", "TRUNCATE"), ("SET 'a' = 'b'", "SET"), ("CALL proc()", "CALL"),
])
def test_unsupported_statements_name_their_kind(sql: str, kind: str) -> None:
    from flightstore.sql.plan import plan
    from tests.sql.catalog import sample_catalog

    with pytest.raises(errors.Unsupported, match=kind):
        plan(sql, sample_catalog())


def test_question_marks_are_numbered_in_text_order() -> None:
    statement = parse_statement("SELECT a FROM t WHERE b = ? AND c IN (?, ?) LIMIT ?")
    assert [index for _, index in placeholders(statement)] == [0, 1, 2, 3]
    bind_parameters(statement, [1, "x", -2.5, 10])
    assert statement.sql() == "SELECT a FROM t WHERE b = 1 AND c IN ('x', -2.5) LIMIT 10"


def test_question_mark_inside_string_is_not_a_parameter() -> None:
    statement = parse_statement("SELECT '?' FROM t WHERE a = ?")
    assert len(placeholders(statement)) == 1


def test_dollar_parameters() -> None:
    statement = parse_statement("SELECT * FROM t WHERE a = $2 AND b = $1 AND c = $2")
    bind_parameters(statement, ["one", 2])
    assert statement.sql() == "SELECT * FROM t WHERE a = 2 AND b = 'one' AND c = 2"


def test_named_parameters_are_refused() -> None:
    with pytest.raises(errors.SqlError, match="unsupported parameter"):
        placeholders(parse_statement("SELECT * FROM t WHERE a = :x"))


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 2**40, 1.5, -0.25, "it's",
                                   dt.date(2024, 2, 29), dt.datetime(2024, 1, 1, 8, 30, 1, 5000),
                                   b"\x00\xff"])
def test_value_to_sql_round_trips(value) -> None:
    assert literal_value(value_to_sql(value)) == value


@pytest.mark.parametrize("value, arrow_type", [
    ("5", pa.int64()), (5, pa.string()), (1.5, pa.int32()), (True, pa.int64()), (1, pa.bool_()),
    (300, pa.int8()), ("2024-02-30", pa.date32()), (dt.datetime(2024, 1, 1), pa.date32()),
    ("abc", pa.binary()), (1.005, pa.decimal128(5, 2)),
])
def test_cast_value_refuses_mismatches(value, arrow_type: pa.DataType) -> None:
    with pytest.raises(errors.SqlError, match="'col'"):
        cast_value(value, arrow_type, "col")


@pytest.mark.parametrize("value, arrow_type, expected", [
    (5, pa.float64(), 5.0), (5, pa.int8(), 5), (2.0, pa.int64(), 2),
    ("2024-01-02", pa.date32(), dt.date(2024, 1, 2)),
    (dt.date(2024, 1, 2), pa.timestamp("ms"), dt.datetime(2024, 1, 2)),
    ("2024-01-02 03:04:05", pa.timestamp("s", tz="UTC"),
     dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)),
    ("12:30:00", pa.time64("us"), dt.time(12, 30)),
])
def test_cast_value_accepts_compatible_values(value, arrow_type: pa.DataType, expected) -> None:
    assert cast_value(value, arrow_type, "col") == expected


def test_cast_literals_evaluate() -> None:
    select = parse_statement("SELECT CAST('42' AS BIGINT), DATE '2024-01-01', -(3), X'ff', "
                             "CAST(1.5 AS DECIMAL(4, 2))")
    values = [literal_value(e) for e in select.expressions]
    assert values[:4] == [42, dt.date(2024, 1, 1), -3, b"\xff"]
    assert str(values[4]) == "1.50"
    with pytest.raises(errors.SqlError, match="CAST"):
        literal_value(parse_statement("SELECT CAST('x' AS INT)").expressions[0])
