"""The executor's plan cache and point-lookup templates return the same plans as the planner."""

from __future__ import annotations

import pyarrow as pa

from flightstore.sql import nodes
from flightstore.sql.execute import Executor, StoreCatalog
from flightstore.sql.plan import plan as plan_sql


def test_cached_and_templated_plans_equal_fresh_plans(store):
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.float64())])
    store.create_table("t", schema, primary_key=["a", "b"])
    executor = Executor(store)
    sql = "SELECT v, a FROM t WHERE a = ? AND b = ?"
    first = executor.plan(sql, [1, "x"])
    assert isinstance(first, nodes.PointLookup)
    for params in ([2, "y"], [3, "z\x00"], [1, "x"]):
        got = executor.plan(sql, params)
        fresh = plan_sql(sql, StoreCatalog(store), params)
        assert got.explain() == fresh.explain()
    # A value of the wrong kind still goes through the planner and its error.
    import pytest

    from flightstore.errors import SqlError
    with pytest.raises(SqlError):
        executor.plan(sql, ["not-a-number", "y"])
    # DDL changes the catalog version: cached plans of the old table are not reused.
    store.drop_table("t")
    store.create_table("t", pa.schema([("a", pa.int64()), ("b", pa.string())]), primary_key=["a", "b"])
    assert executor.plan(sql.replace("v, a", "a"), [5, "q"]).columns == ("a",)
    from flightstore import errors
    with pytest.raises(errors.SqlError):
        executor.plan(sql, [1, "x"])  # column v is gone


def test_literal_point_lookups_share_the_plan_of_their_shape(store):
    import pytest

    from flightstore.errors import FlightstoreError
    from flightstore.sql.parse import literal_shape

    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.float64())])
    store.create_table("t", schema, primary_key=["a", "b"])
    executor = Executor(store)
    first = executor.plan("SELECT v FROM t WHERE a = 1 AND b = 'x'")
    assert isinstance(first, nodes.PointLookup)
    shape, values = literal_shape("SELECT v FROM t WHERE a = 1 AND b = 'x'")
    assert (shape, values) == ("SELECT v FROM t WHERE a = ? AND b = ?", [1, "x"])
    assert executor.plan_cache.from_template(shape, [9, "q"], "default") is not None  # learned
    for sql in ["SELECT v FROM t WHERE a = 2 AND b = 'it''s'",
                "SELECT v FROM t WHERE a = 3 AND b = '?'",
                "SELECT v FROM t WHERE a = -4 AND b = 'x'",  # '-' stays in the shape: planner
                "SELECT v FROM t WHERE a = 5 AND b = 'x' AND v > 1",  # a filter: not a template
                "SELECT v FROM t WHERE a = 1.0 AND b = 'x'"]:
        assert executor.plan(sql).explain() == plan_sql(sql, StoreCatalog(store)).explain(), sql
    # A literal of the wrong kind is refused exactly as the planner refuses it.
    for sql in ["SELECT v FROM t WHERE a = 'seven' AND b = 'x'",
                "SELECT v FROM t WHERE a = 99999999999999999999999 AND b = 'x'"]:
        with pytest.raises(FlightstoreError) as fresh:
            plan_sql(sql, StoreCatalog(store))
        with pytest.raises(type(fresh.value)):
            executor.plan(sql)


def test_a_thousand_distinct_literal_lookups_skip_the_parser_and_keep_the_caches_bounded(store, monkeypatch):
    """Issue 15: literal point lookups of a known shape are answered from their shape's template
    (the planner, and so sqlglot, runs only to learn a shape), every cache stays within
    ``cache_entries``, and tricky literals (quotes, negative numbers, NULL) answer correctly."""
    from flightstore.cache import LruCache
    from flightstore.sql.execute import plan_cache

    store.create_table("t", pa.schema([("id", pa.int64()), ("name", pa.string())]), primary_key=["id"])
    store.create_table("s", pa.schema([("name", pa.string()), ("n", pa.int64())]), primary_key=["name"])
    ids = list(range(-300, 300))
    names = [f"o'brien \"{i}\" -- ?" for i in range(400)]
    store.table("t").upsert(pa.table({"id": ids, "name": [f"n{i}" for i in ids]}))
    store.table("s").upsert(pa.table({"name": names, "n": list(range(400))}))
    executor = Executor(store, cache_entries=50)
    planned = []
    real_plan = plan_cache.plan_sql
    monkeypatch.setattr(plan_cache, "plan_sql", lambda *a, **k: planned.append(a[0]) or real_plan(*a, **k))

    def answer(sql: str) -> list:
        return executor.execute_table(executor.plan(sql)).to_pylist()

    for i in ids:  # 600 lookups by number, negative ones included
        assert answer(f"SELECT name FROM t WHERE id = {i}") == [{"name": f"n{i}"}]
    for i, name in enumerate(names):  # 400 by strings holding quotes, "--" and "?"
        quoted = name.replace("'", "''")
        assert answer(f"SELECT n FROM s WHERE name = '{quoted}'") == [{"n": i}]
    assert len(planned) <= 4, planned  # learning the two shapes; nothing per literal
    assert answer("SELECT name FROM t WHERE id = NULL") == []
    assert answer("SELECT name FROM t WHERE id = 12345") == []
    assert answer("SELECT name FROM t WHERE id = - 7") == [{"name": "n-7"}]
    for i in range(60):  # distinct statements of no template shape go through the plan cache
        assert answer(f"SELECT COUNT(*) AS c FROM t WHERE id > {i} AND name <> 'x'") == [{"c": 299 - i}]
    caches = [value for part in (executor.plan_cache, executor.context) for value in vars(part).values()
              if isinstance(value, LruCache)]
    assert len(caches) == 3 and all(len(cache) <= 50 for cache in caches)
