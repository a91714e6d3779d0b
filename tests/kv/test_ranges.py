"""Primary-key range scans (flightstore/kv/ranges.py, KvTablet.scan(key_range=...)).

The property tests draw random rows of composite keys (negative and extreme integers, strings with
NUL bytes and non-ASCII characters, floats with -0.0 and infinities) and random ranges (equalities
on leading key columns, one or two bounds on the next), and compare:

* the encoded seek range with the predicates, key by key (exact: a key is in the RocksDB range iff
  its row satisfies them);
* a store's range scan with a filter over its full scan (NaN keys included);
* SQL through the planner (which must pick a RangeScan) with DuckDB over the full table.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from flightstore.expressions import Comparison, and_all
from flightstore.kv.encoding import encode_keys
from flightstore.kv.ranges import (
    KeyRange,
    encode_range,
    key_range,
    pinned_bucket,
    prefix_successor,
    residual_predicates,
)
from flightstore.schema import TableDescriptor
from flightstore.sql import PrefixLookup, RangeScan
from flightstore.sql.execute import Executor
from flightstore.store import Store

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64()), ("v", pa.int32())])
PK = ("a", "b", "c")
OPS = ("<", "<=", ">", ">=")

ints = st.one_of(st.integers(-4, 4), st.sampled_from([-2**63, 2**63 - 1, -1000, 1000]))
texts = st.text(alphabet=["a", "b", "\x00", "\x7f", "é", "\U0001d11e"], max_size=3)
floats = st.one_of(st.sampled_from([-0.0, 0.0, 1.5, -1.5, math.inf, -math.inf]),
                   st.floats(-5, 5, allow_nan=False))
VALUES = {"a": ints, "b": texts, "c": floats}


def _descriptor(buckets: int = 3) -> TableDescriptor:
    return TableDescriptor.create("default.t", SCHEMA, primary_key=PK,
                                  options={"bucket.num": str(buckets), "bucket.key": "a"})


@st.composite
def rows_and_predicates(draw, value_strategies=VALUES, nan: bool = False):
    """Rows (possibly sharing key prefixes) and a conjunction that pins a key prefix and bounds
    the next key column; values for the predicates come from the rows or are fresh."""
    c_values = st.one_of(value_strategies["c"], st.just(math.nan)) if nan else value_strategies["c"]
    row = st.tuples(value_strategies["a"], value_strategies["b"], c_values, st.integers(-9, 9))
    rows = draw(st.lists(row, max_size=40))
    pinned = draw(st.integers(0, 2))
    predicates = []

    def value_for(index: int):
        existing = [r[index] for r in rows if not (isinstance(r[index], float) and math.isnan(r[index]))]
        fresh = value_strategies[PK[index]]
        return draw(st.one_of(st.sampled_from(existing), fresh) if existing else fresh)

    for index in range(pinned):
        predicates.append(Comparison(PK[index], "=", value_for(index)))
    for _ in range(draw(st.integers(0 if pinned else 1, 2))):
        predicates.append(Comparison(PK[pinned], draw(st.sampled_from(OPS)), value_for(pinned)))
    return rows, predicates


def _table(rows) -> pa.Table:
    columns = list(zip(*rows)) if rows else [[], [], [], []]
    return pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(columns, SCHEMA)],
                                schema=SCHEMA)


def _sorted(table: pa.Table) -> list[tuple]:
    """Rows as tuples of reprs (NaN equals NaN, -0.0 keeps its sign), sorted."""
    return sorted(tuple(repr(v) for v in row.values()) for row in table.to_pylist())


# ---- the encoded range is exact -----------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(rows_and_predicates())
def test_a_key_is_in_the_seek_range_iff_its_row_satisfies_the_predicates(case):
    rows, predicates = case
    assume(rows)
    found = key_range(predicates, _descriptor())
    assert found is not None
    lower, upper = encode_range(found, SCHEMA)
    table = _table(rows)
    keys = encode_keys(table, PK)
    in_range = [(lower is None or k >= lower) and (upper is None or k < upper) for k in keys]
    numbered = table.append_column("i", pa.array(range(len(rows))))
    matches = numbered.filter(and_all(predicates).bind(SCHEMA).to_arrow()).column("i").to_pylist()
    assert [i for i, inside in enumerate(in_range) if inside] == matches
    # What the range decides is left out of the filter; the rest still decides the others.
    residual = and_all(residual_predicates(predicates, found, SCHEMA))
    checked = numbered.filter(pa.array(in_range))
    if residual is not None:
        checked = checked.filter(residual.bind(SCHEMA).to_arrow())
    assert checked.column("i").to_pylist() == matches


# ---- the store reads the range ------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_and_predicates(nan=True), st.booleans())
@example(([(1, "a", math.nan, 1), (1, "a", 2.0, 2), (1, "a", -1.0, 3)],  # NaN sorts past +inf
          [Comparison("a", "=", 1), Comparison("b", "=", "a"), Comparison("c", ">", 0.5)]), False)
def test_a_range_scan_equals_the_filter_over_the_full_scan(case, with_value_filter):
    rows, predicates = case
    if with_value_filter:
        predicates = predicates + [Comparison("v", ">=", 0)]
    where = and_all(predicates).bind(SCHEMA)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
        table = store.create_table("t", SCHEMA, primary_key=list(PK),
                                   options={"bucket.num": "3", "bucket.key": "a"})
        if rows:
            table.upsert(_table(rows))
        full = table.scan_table()
        expected = full.filter(where.to_arrow())
        found = key_range(where, table.descriptor)
        assert found is not None
        assert _sorted(table.scan_table(None, where)) == _sorted(expected)
        # The planner's split: the range, and only what it does not decide as the filter.
        residual = and_all(residual_predicates(where, found, SCHEMA))
        split = pa.Table.from_batches(list(table.scan(None, residual, None, None, found)),
                                      schema=table.schema)
        assert _sorted(split) == _sorted(expected)
        limited = table.scan_table(None, where, limit=3)
        assert limited.num_rows == min(3, expected.num_rows)
        assert set(_sorted(limited)) <= set(_sorted(expected))


SQL_VALUES = {"a": ints, "b": st.text(alphabet=["a", "b", "é", "Z", " ", "'"], max_size=3),
              "c": st.one_of(st.sampled_from([-0.0, 0.0, 1.5, -1.5]), st.floats(-5, 5, allow_nan=False))}


def _literal(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)"
    return str(value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows_and_predicates(SQL_VALUES), st.sampled_from(["*", "b, v"]))
def test_sql_range_queries_equal_duckdb_over_the_full_table(case, projection):
    rows, predicates = case
    where = " AND ".join(f"{p.column} {p.op} {_literal(p.value)}" for p in predicates)
    sql = f"SELECT {projection} FROM t WHERE {where}"
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
        table = store.create_table("t", SCHEMA, primary_key=list(PK),
                                   options={"bucket.num": "3", "bucket.key": "a"})
        if rows:
            table.upsert(_table(rows))
        executor = Executor(store)
        plan = executor.plan(sql)
        # A range (the bucket key alone pinned by "=" keeps its prefix lookup), never a full scan.
        assert isinstance(plan, (RangeScan, PrefixLookup)), plan.explain()
        ours = executor.execute_table(plan)
        connection = duckdb.connect()
        connection.register("t", table.scan_table())
        theirs = connection.sql(sql).to_arrow_table()
        connection.close()
    assert sorted(map(repr, ours.to_pylist())) == sorted(map(repr, theirs.to_pylist()))


# ---- reads stay in the range ---------------------------------------------------------------------

@pytest.fixture
def numbers(store):
    table = store.create_table("n", pa.schema([("g", pa.int64()), ("id", pa.int64()), ("x", pa.string())]),
                               primary_key=["g", "id"], options={"bucket.num": "3", "bucket.key": "g"})
    n = 20_000
    table.upsert(pa.table({"g": pa.array(np.arange(n) % 4, pa.int64()),
                           "id": pa.array(np.arange(n) - n // 2, pa.int64()),
                           "x": pa.array([f"x{i}" for i in range(n)])}))
    return table


def _rows_read(table) -> int:
    return sum(kv.io_stats()["rows_read"] for kv in table.kvs)


def test_a_range_reads_only_its_rows_and_a_limit_stops_early(numbers):
    where = Comparison("g", "=", 1) & Comparison("id", ">=", -100) & Comparison("id", "<", 900)
    before = _rows_read(numbers)
    result = numbers.scan_table(["id"], where)
    assert sorted(result.column("id").to_pylist()) == [i for i in range(-100, 900) if (i + 10_000) % 4 == 1]
    assert _rows_read(numbers) - before == result.num_rows == 250
    pinned = pinned_bucket(where, numbers.descriptor)
    assert [kv.io_stats()["rows_read"] > 0 for kv in numbers.kvs] == [b == pinned for b in range(3)]
    before = _rows_read(numbers)
    assert numbers.scan_table(["id"], Comparison("g", ">=", 0), limit=5).num_rows == 5
    assert _rows_read(numbers) - before == 5


def test_sql_range_query_and_explain(store, numbers):
    executor = Executor(store)
    plan = executor.plan("SELECT id FROM n WHERE g = 2 AND id BETWEEN -3 AND 10 LIMIT 100")
    assert plan.explain() == (
        "RangeScan(table=default.n, columns=[id], range={g: 2, id: [-3, 10]}, "
        f"buckets=[{pinned_bucket(Comparison('g', '=', 2), numbers.descriptor)}], "
        "filter=None, limit=100)")
    before = _rows_read(numbers)
    result = executor.execute_table(plan)
    assert sorted(result.column("id").to_pylist()) == [-2, 2, 6, 10]
    assert _rows_read(numbers) - before == 4
    explained = executor.execute_table(executor.plan("EXPLAIN SELECT * FROM n WHERE g < 2"))
    assert explained.column("plan")[0].as_py().startswith("RangeScan(table=default.n, columns=[g, id, x], "
                                                         "range={g: (-inf, 2)}, buckets=all")


# ---- the pieces ------------------------------------------------------------------------------------

def test_prefix_successor():
    assert prefix_successor(b"ab") == b"ac"
    assert prefix_successor(b"a\xff\xff") == b"b"
    assert prefix_successor(b"\xff\xff") is None
    assert prefix_successor(b"") is None


def test_key_range_rules():
    d = _descriptor()
    assert key_range([Comparison("b", "<", "x")], d) is None  # not the leading column
    assert key_range([Comparison("a", "=", None)], d) is None  # NULL never matches: no range
    r = key_range([Comparison("a", "=", 1), Comparison("c", "<", 1.0), Comparison("b", ">", "q")], d)
    assert r == KeyRange(columns=("a", "b"), prefix=(1,), lower="q", lower_inclusive=False)
    r = key_range([Comparison("a", "=", 1), Comparison("b", "=", "x"), Comparison("c", "<=", math.nan)], d)
    assert r == KeyRange(columns=("a", "b"), prefix=(1, "x"))  # NaN bounds nothing
    lower, upper = encode_range(KeyRange(columns=("a",), lower=5, lower_inclusive=True,
                                         upper=3, upper_inclusive=True), SCHEMA)
    assert lower >= upper  # an empty range reads nothing


def test_residual_keeps_what_the_range_does_not_decide():
    d = _descriptor()
    where = [Comparison("a", "=", 1), Comparison("a", "=", 2), Comparison("b", ">=", "k"),
             Comparison("b", ">", "a"), Comparison("b", "<", "z"), Comparison("v", ">", 0)]
    found = key_range(where, d)
    assert found == KeyRange(columns=("a", "b"), prefix=(1,), lower="k", upper="z")
    assert residual_predicates(where, found, SCHEMA) == [Comparison("a", "=", 2), Comparison("v", ">", 0)]
    floats = [Comparison("a", "=", 1), Comparison("b", "=", "x"), Comparison("c", ">", 0.5)]
    assert residual_predicates(floats, key_range(floats, d), SCHEMA) == [Comparison("c", ">", 0.5)]


def test_pinned_bucket_needs_the_whole_bucket_key_and_no_floats():
    d = _descriptor()
    assert pinned_bucket([Comparison("b", "=", "x")], d) is None
    assert pinned_bucket([Comparison("a", "=", 7)], d) in (0, 1, 2)
    floaty = TableDescriptor.create("default.f", SCHEMA, primary_key=("c", "a", "b"),
                                    options={"bucket.num": "3", "bucket.key": "c"})
    assert pinned_bucket([Comparison("c", "=", 0.0)], floaty) is None
