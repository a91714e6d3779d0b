"""DataFrame libraries over ADBC against a real server: polars (``write_database`` /
``read_database``) and pandas (``to_sql`` / ``read_sql``), as a data scientist would use them.

polars sends strings as ``string_view``; the server stores view, large and dictionary layouts as
their plain types, and a bulk ingest that creates its table is one step: if the rows cannot be
written, the table it created is gone again (no empty, half-created table is left behind).
"""

from __future__ import annotations

import datetime as dt
import warnings

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi


@pytest.fixture
def conn(server):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cannot disable autocommit" when transactions are absent
        connection = dbapi.connect(server.uri, autocommit=True)
    yield connection
    connection.close()


def _frame() -> pl.DataFrame:
    return pl.DataFrame({
        "id": [1, 2, 3],
        "name": ["ann", None, "cid"],
        "tag": pl.Series(["x", "y", "x"], dtype=pl.Categorical),
        "score": [1.5, 2.5, None],
        "day": [dt.date(2026, 1, 1), dt.date(2026, 1, 2), None],
        "at": [dt.datetime(2026, 1, 1, 10), None, dt.datetime(2026, 1, 3, 12)],
        "blob": [b"\x00\x01", b"", None],
        "tags": [["a"], [], None],
    })


def test_polars_write_database_then_read_database(server, conn) -> None:
    frame = _frame()  # polars' ADBC ingest sends string_view columns and dictionaries of them
    assert frame.write_database("people", connection=conn, engine="adbc") == 3
    stored = server.store.table("people").schema
    assert stored.field("name").type == pa.string()
    assert stored.field("tag").type == pa.string()
    assert stored.field("blob").type == pa.binary()
    assert stored.field("tags").type == pa.list_(pa.string())
    back = pl.read_database("SELECT * FROM people ORDER BY id", connection=conn)
    expected = frame.with_columns(pl.col("tag").cast(pl.String))
    assert back.to_dicts() == expected.to_dicts()
    # append, then replace: the same types again, and replace starts over
    frame.write_database("people", connection=conn, engine="adbc", if_table_exists="append")
    assert pl.read_database("SELECT COUNT(*) AS n FROM people", connection=conn).item() == 6
    frame.head(1).write_database("people", connection=conn, engine="adbc", if_table_exists="replace")
    assert pl.read_database("SELECT id, name FROM people", connection=conn).to_dicts() == [
        {"id": 1, "name": "ann"}]


def test_polars_replace_with_a_bad_schema_keeps_the_old_table(server, conn) -> None:
    """``replace`` with columns the server refuses (a reserved name) fails before dropping."""
    _frame().write_database("people", connection=conn, engine="adbc")
    bad = pl.DataFrame({"id": [9], "_log_offset": [1]})
    with pytest.raises(Exception, match="_log_offset"):
        bad.write_database("people", connection=conn, engine="adbc", if_table_exists="replace")
    assert pl.read_database("SELECT COUNT(*) AS n FROM people", connection=conn).item() == 3


def test_failed_ingest_leaves_no_table_behind(server, conn) -> None:
    """Create-then-ingest is atomic: when the rows cannot be written (here a column declared NOT
    NULL holds nulls), the table the ingest created is removed again."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    bad = pa.table([pa.array([1, None]), pa.array(["a", "b"])], schema=schema)
    with conn.cursor() as cur, pytest.raises(Exception, match="'id' .*must not be null"):
        cur.adbc_ingest("half", bad, mode="create")
    assert "half" not in server.store.list_tables("default")
    with conn.cursor() as cur:  # the same name is free, and run-end encoded columns are decoded
        run_end = pa.table({"id": pa.array([1, 2]), "v": pa.RunEndEncodedArray.from_arrays([2], ["r"])})
        assert cur.adbc_ingest("half", run_end, mode="create") == 2
    assert server.store.table("half").scan_table().column("v").to_pylist() == ["r", "r"]


def test_pandas_to_sql_then_read_sql(server, conn) -> None:
    frame = pd.DataFrame({"id": [1, 2, 3], "city": ["oslo", "lima", None], "amount": [1.25, 2.5, 4.0],
                          "at": pd.to_datetime(["2026-01-01 10:00", "2026-01-02 11:00", None])})
    assert frame.to_sql("sales", conn, index=False) == 3
    back = pd.read_sql("SELECT * FROM sales ORDER BY id", conn)
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)
    totals = pd.read_sql("SELECT city, SUM(amount) AS total FROM sales GROUP BY city ORDER BY city", conn)
    assert totals["total"].tolist() == [2.5, 1.25, 4.0]
    assert totals["city"].tolist()[:2] == ["lima", "oslo"] and pd.isna(totals["city"].iloc[2])
    frame.to_sql("sales", conn, index=False, if_exists="append")
    assert pd.read_sql("SELECT COUNT(*) AS n FROM sales", conn)["n"].tolist() == [6]
