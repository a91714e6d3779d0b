"""Partial aggregates (flightstore/sql/partial.py): per-bucket partials merged answer exactly what
the one-step query answers (DuckDB on all the rows), NULLs, empty buckets and empty tables included."""

from __future__ import annotations

import datetime as dt
import decimal
import math

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute
import pytest

from flightstore.sql import Residual
from flightstore.sql.execute import Executor

ROWS = 3_000
SCHEMA = pa.schema([("id", pa.int64()), ("grp", pa.string()), ("n", pa.int32()), ("x", pa.float64()),
                    ("price", pa.decimal128(12, 2)), ("day", pa.date32())])

PUSHED = [
    "SELECT grp, COUNT(*), COUNT(n), SUM(n), MIN(n), MAX(n), AVG(n) FROM {t} GROUP BY grp ORDER BY grp",
    "SELECT grp, SUM(x) AS sx, AVG(x) AS ax, MIN(x), MAX(x) FROM {t} WHERE n > 10 GROUP BY grp ORDER BY grp",
    "SELECT SUM(price), AVG(price), MIN(price), MAX(day), COUNT(day) FROM {t}",
    "SELECT COUNT(*) AS c, SUM(n) AS s, AVG(x) AS a, MAX(grp) AS m FROM {t} WHERE n > 1000000",  # no rows
    ("SELECT day, grp, SUM(n * 2 + 1) AS s, COUNT(*) AS c FROM {t} WHERE day >= DATE '2024-01-03' "
     "GROUP BY day, grp HAVING COUNT(*) > 3 ORDER BY s DESC, day, grp LIMIT 7"),
    "SELECT lower(grp) AS g, SUM(x) + COUNT(x) AS mixed FROM {t} GROUP BY lower(grp) ORDER BY g",
    "SELECT n % 3 AS r, AVG(n) FROM {t} GROUP BY n % 3 ORDER BY r",
    "SELECT grp, MIN(n) FROM {t} GROUP BY grp HAVING MIN(n) IS NULL OR MIN(n) < 5 ORDER BY 1",
]
NOT_PUSHED = [
    "SELECT grp, COUNT(DISTINCT n) FROM {t} GROUP BY grp ORDER BY grp",
    "SELECT grp, STDDEV(x) FROM {t} GROUP BY grp ORDER BY grp",
    "SELECT grp, SUM(n) FILTER (WHERE x > 0) FROM {t} GROUP BY grp ORDER BY grp",
]


def _rows(seed: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(ROWS)
    n = rng.integers(-50, 500, ROWS)
    x = rng.normal(0, 100, ROWS)
    grp = np.array(["a", "B", "c", "d"])[rng.integers(0, 4, ROWS)]
    null = rng.random(ROWS) < 0.15  # NULLs in every column but the key; group 'd' all NULL n
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "grp": pa.array(grp, mask=rng.random(ROWS) < 0.05),
        "n": pa.array(n.astype(np.int32), mask=null | (grp == "d")),
        "x": pa.array(x, mask=rng.random(ROWS) < 0.1),
        "price": pa.array([decimal.Decimal(int(v)) / 100 for v in rng.integers(0, 10**6, ROWS)],
                          pa.decimal128(12, 2), mask=rng.random(ROWS) < 0.1),
        "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=int(d)) for d in rng.integers(0, 9, ROWS)],
                        pa.date32(), mask=rng.random(ROWS) < 0.1),
    }, schema=SCHEMA)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from flightstore.store import Store

    data = _rows()
    with Store(tmp_path_factory.mktemp("partial") / "data", fsync=False) as store:
        store.create_table("logs", SCHEMA, options={"bucket.num": "3"}).append(data)
        pk = store.create_table("pk", SCHEMA, primary_key=["id"], options={"bucket.num": "4"})
        pk.upsert(data)
        pk.upsert(data.slice(0, 500))  # updates: the changelog holds -U/+U as well
        pk.delete({"id": list(range(2_900, 3_000))})
        # 16 buckets for 3 rows: most buckets are empty
        store.create_table("sparse", SCHEMA, primary_key=["id"], options={"bucket.num": "16"}).upsert(
            data.slice(10, 3))
        store.create_table("empty", SCHEMA, options={"bucket.num": "2"})
        # partitioned by grp (4 partitions of 2 buckets each)
        filled = data.set_column(1, SCHEMA.field("grp"), pa.compute.fill_null(data.column("grp"), "z"))
        store.create_table("parts", SCHEMA, primary_key=["grp", "id"], partition_keys=["grp"],
                           options={"bucket.num": "2"}).upsert(filled)
        expected = {"logs": data, "pk": data.slice(0, 2_900), "sparse": data.slice(10, 3),
                    "empty": SCHEMA.empty_table(), "parts": filled}
        yield Executor(store), expected


def _same(got: pa.Table, expected: pa.Table) -> None:
    assert got.schema.names == expected.schema.names
    assert got.schema.types == expected.schema.types
    assert got.num_rows == expected.num_rows
    for name in expected.column_names:
        for a, b in zip(got.column(name).to_pylist(), expected.column(name).to_pylist()):
            if isinstance(a, float) and isinstance(b, float):
                assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (name, a, b)
            else:
                assert a == b, (name, a, b)


def _one_step(sql: str, table: str, rows: pa.Table) -> pa.Table:
    connection = duckdb.connect()
    connection.register(table, rows)
    return connection.sql(sql.format(t=table)).to_arrow_table()


@pytest.mark.parametrize("table", ["logs", "pk", "sparse", "empty", "parts"])
@pytest.mark.parametrize("sql", PUSHED)
def test_pushed_aggregates_equal_the_one_step_answer(loaded, sql, table):
    executor, expected = loaded
    planned = executor.plan(sql.format(t=table))
    assert isinstance(planned, Residual) and planned.inputs[0].partial is not None, planned.explain()
    _same(executor.execute_table(planned), _one_step(sql, table, expected[table]))


@pytest.mark.parametrize("sql", NOT_PUSHED)
def test_aggregates_that_cannot_merge_are_not_pushed_and_still_answer(loaded, sql):
    executor, expected = loaded
    planned = executor.plan(sql.format(t="pk"))
    assert isinstance(planned, Residual) and planned.inputs[0].partial is None, planned.explain()
    _same(executor.execute_table(planned), _one_step(sql, "pk", expected["pk"]))


def test_explain_shows_the_partial_and_the_merge(loaded):
    executor, _ = loaded
    shown = executor.execute_table(executor.plan(
        "EXPLAIN SELECT grp, AVG(n) AS a FROM pk WHERE x > 0 GROUP BY grp")).column("plan")[0].as_py()
    assert "partial='SELECT grp AS \"__g0\", SUM(n) AS \"__a0\", COUNT(n) AS \"__a1\" FROM \"__t0\" AS \"pk\" " \
           "WHERE x > 0 GROUP BY grp'" in shown
    assert shown.startswith('Residual(sql=\'SELECT "__g0" AS "grp", CAST(SUM("__a0") AS DOUBLE) / SUM("__a1") '
                            'AS "a" FROM "__t0" GROUP BY "__g0"\'')


def test_the_partial_streams_the_rows_and_the_merge_reads_partial_rows(loaded, monkeypatch):
    from flightstore.sql.engine import SqlEngine

    executor, expected = loaded
    seen = []
    original = SqlEngine.run

    def recording(self, sql, inputs, *args, **kwargs):
        seen.append((sql, {name: "stream" if isinstance(data, tuple) else "table"
                           for name, data in inputs.items()}))
        return original(self, sql, inputs, *args, **kwargs)

    monkeypatch.setattr(SqlEngine, "run", recording)
    planned = executor.plan("SELECT grp, COUNT(*) AS c FROM pk GROUP BY grp ORDER BY grp")
    item = planned.inputs[0]
    got = executor.execute_table(planned)
    # All the rows are here: partial and merge run in one statement over the rows' stream.
    assert seen == [(f'WITH "__t0" AS ({item.partial}) {planned.sql}', {"__t0": "stream"})]
    assert sum(got.column("c").to_pylist()) == expected["pk"].num_rows
    # The two steps apart: the partial's rows (at most 5 groups) are all the merge reads.
    partial = executor.partials.data(item)
    assert 0 < partial.num_rows <= 5 and partial.column_names == ["__g0", "__a0"]
    merged = pa.Table.from_batches(list(original(executor.engine, planned.sql, {"__t0": partial})))
    assert merged.cast(got.schema).equals(got)


def test_a_storage_error_while_streaming_the_partial_keeps_its_kind(loaded, monkeypatch):
    from flightstore.errors import DataLoss
    from flightstore.store import Table

    executor, _ = loaded
    original = Table.scan

    def failing(self, *args, **kwargs):
        for index, batch in enumerate(original(self, *args, **kwargs)):
            if index == 1:
                raise DataLoss("table default.pk bucket 1: RocksDB read failed")
            yield batch

    monkeypatch.setattr(Table, "scan", failing)
    with pytest.raises(DataLoss, match="bucket 1"):
        executor.execute_table(executor.plan("SELECT grp, SUM(x) FROM pk GROUP BY grp"))
