"""Delta join pipeline: output equals a batch join of the final tables; state sizes vs Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flightstore_spark.pipelines import delta_join
from flightstore_spark.pipelines.join_cache import CacheSettings

from flightstore.client import connect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # four streaming queries on a busy machine


def _setup(conn):
    conn.sql("CREATE DATABASE dj")
    conn.sql("CREATE TABLE dj.orders (cust BIGINT, oid BIGINT, amount DOUBLE, item STRING, "
             "PRIMARY KEY (cust, oid) NOT ENFORCED) WITH ('bucket.num' = '2', 'bucket.key' = 'cust')")
    conn.sql("CREATE TABLE dj.customers (cust BIGINT, name STRING, tier BIGINT, "
             "PRIMARY KEY (cust) NOT ENFORCED) WITH ('bucket.num' = '2')")
    for sink in ("dj.wide", "dj.inner_wide"):
        conn.sql(f"CREATE TABLE {sink} (cust BIGINT, oid BIGINT, amount DOUBLE, item STRING, name STRING, "
                 "tier BIGINT, PRIMARY KEY (cust, oid) NOT ENFORCED) WITH ('bucket.num' = '2', 'bucket.key' = 'cust')")


def _batch_join(conn) -> list[tuple]:
    orders = conn.table("dj.orders").scan().to_pylist()
    customers = {r["cust"]: r for r in conn.table("dj.customers").scan().to_pylist()}
    rows = []
    for o in orders:
        c = customers.get(o["cust"], {})
        rows.append((o["cust"], o["oid"], o["amount"], o["item"], c.get("name"), c.get("tier")))
    return sorted(rows)


def _sink(conn, sink: str = "dj.wide") -> list[tuple]:
    rows = conn.table(sink).scan().to_pylist()
    return sorted((r["cust"], r["oid"], r["amount"], r["item"], r["name"], r["tier"]) for r in rows)


def test_delta_join_matches_batch_join_and_keeps_no_spark_state(spark, server, tmp_path):
    conn = connect(server.uri)
    _setup(conn)
    orders, customers = conn.table("dj.orders"), conn.table("dj.customers")
    customers.upsert({"cust": [1, 2, 3], "name": ["ann", "bob", "cy"], "tier": [1, 2, 3]})
    orders.upsert({"cust": [1, 1, 2, 4], "oid": [10, 11, 20, 40], "amount": [1.0, 2.0, 3.0, 4.0],
                   "item": ["a", "b", "c", "d"]})
    checkpoint = str(tmp_path / "ck")
    query = delta_join.start(spark, server.uri, "dj.orders", "dj.customers", ["cust"], "dj.wide", checkpoint)
    query.awaitTermination()
    assert query.exception() is None
    assert _sink(conn) == _batch_join(conn)
    delta_state = [op for op in (query.lastProgress or {}).get("stateOperators", [])]

    # changes on both sides, then a restart from the checkpoint
    customers.upsert({"cust": [1, 4], "name": ["anne", "dee"], "tier": [9, 4]})
    customers.delete({"cust": [2]})
    orders.upsert({"cust": [3, 1], "oid": [30, 10], "amount": [5.0, 1.5], "item": ["e", "a2"]})
    orders.delete({"cust": [1], "oid": [11]})
    customers.upsert(pa.table({"cust": [3], "tier": [33]}), columns=["cust", "tier"])
    query = delta_join.start(spark, server.uri, "dj.orders", "dj.customers", ["cust"], "dj.wide", checkpoint)
    query.awaitTermination()
    assert query.exception() is None
    expected = _batch_join(conn)
    assert _sink(conn) == expected
    assert (1, 10, 1.5, "a2", "anne", 9) in expected and (2, 20, 3.0, "c", None, None) in expected

    # the inner join of the same changelogs, from earliest, caches off
    query = delta_join.start(spark, server.uri, "dj.orders", "dj.customers", ["cust"], "dj.inner_wide",
                             str(tmp_path / "inner"), join_type="inner", cache=CacheSettings(False))
    query.awaitTermination()
    assert query.exception() is None
    assert _sink(conn, "dj.inner_wide") == [row for row in expected if row[4] is not None]

    spark_state = delta_join.stream_stream_join_state(spark, server.uri, "dj.orders", "dj.customers",
                                                      ["cust"], str(tmp_path / "ssj"))
    print(f"\nstate: delta join {len(delta_state)} state operators (0 bytes); Spark stream-stream join "
          f"{spark_state['numRowsTotal']} rows, {spark_state['memoryUsedBytes']} bytes")
    assert delta_state == []
    assert spark_state["numRowsTotal"] > 0 and spark_state["memoryUsedBytes"] > 0


def test_the_joins_stream_drops_update_befores_before_the_shuffle(spark, server, tmp_path):
    """A task applies a key's last +I/+U/-D only; the -U of every update (a third of an updated
    table's changelog) would be shuffled, sorted and handed to the tasks for nothing."""
    conn = connect(server.uri)
    _setup(conn)
    customers = conn.table("dj.customers")
    customers.upsert({"cust": [1, 2], "name": ["ann", "bob"], "tier": [1, 2]})
    customers.upsert({"cust": [1, 2], "name": ["anne", "bobby"], "tier": [1, 2]})
    customers.delete({"cust": [2]})
    conn.table("dj.orders").upsert({"cust": [1], "oid": [10], "amount": [1.0], "item": ["a"]})
    join = delta_join.DeltaJoin.resolve(server.uri, "dj.orders", "dj.customers", "dj.wide", ["cust"])
    query = (join.changes(spark).writeStream.format("memory").queryName("dj_changes")
             .option("checkpointLocation", str(tmp_path / "changes")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    kinds = sorted((r["_side"], r["_change_type"]) for r in spark.sql("SELECT * FROM dj_changes").collect())
    assert kinds == [("L", "+I"), ("R", "+I"), ("R", "+I"), ("R", "+U"), ("R", "+U"), ("R", "-D")]
