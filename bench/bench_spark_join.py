"""The delta join on Spark (issue 24), each against a peer measured in the same run
(``python -m bench spark`` runs it with :mod:`bench.bench_spark`):

* the delta join (inner) of two changelogs vs Spark's own stream-stream join of the same two
  changelogs (``delta_join.stream_stream_join_state``'s shape: both sides' upserts, no watermark,
  so Spark keeps both sides in its state store): events/s (goal >= 1x), Spark state bytes of each
  (ours ~0), and beside them the bytes flightstore keeps for the join (the two inputs' KV, which
  the lookups read: the join's state lives there);
* the lake backfill of N days of changes (the two tables' lake snapshots joined by Spark's
  sort-merge join, the sink written) vs replaying the same days' changelog through the streaming
  delta join from ``earliest`` into an identical sink (goal >= 3x faster); both sinks are checked
  equal to the batch join. A small backfill and a small replay run first, so neither side pays
  alone for the JVM's and the Python workers' first use of its code (the backfill, measured
  first, used to).

``BENCH_SPARK_MEASURES=delta_join`` or ``=backfill`` runs one of the two (see :mod:`bench.bench_spark`).
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.bench_spark import BUCKETS, _spark, timed_query, wanted_measures, warm
from bench.report import Row
from flightstore.client import connect
from flightstore.lake import LakeSettings
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store

ORDERS = 200_000
CUSTOMERS = 20_000
DAYS = 4  # backfill: each day changes every order once


def run() -> list[Row]:
    wanted = wanted_measures()
    if not {"delta_join", "backfill"} & set(wanted):
        return []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        store = Store(data)
        server = FlightSqlServer(store, "grpc://127.0.0.1:0", lake=LakeSettings.from_options(data, {}))
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        spark = _spark()
        try:
            warm(spark, server.uri, Path(tmp))
            conn = connect(server.uri)
            rows = []
            if "delta_join" in wanted:
                rows += _delta_vs_stream_stream(spark, conn, server.uri, Path(tmp))
            if "backfill" in wanted:
                rows += _backfill_vs_replay(spark, conn, server, Path(tmp))
            conn.close()
            return rows
        finally:
            spark.stop()
            server.shutdown()
            thread.join(timeout=10)
            store.close()


def _tables(conn, suffix: str, options: str = "") -> tuple[str, str, str]:
    orders, customers, wide = f"orders{suffix}", f"customers{suffix}", f"wide{suffix}"
    extra = f", {options}" if options else ""
    conn.sql(f"CREATE TABLE {orders} (cust BIGINT, oid BIGINT, amount DOUBLE, status BIGINT, "
             f"PRIMARY KEY (cust, oid) NOT ENFORCED) WITH ('bucket.num' = '{BUCKETS}', 'bucket.key' = 'cust'{extra})")
    conn.sql(f"CREATE TABLE {customers} (cust BIGINT, name STRING, tier BIGINT, PRIMARY KEY (cust) NOT ENFORCED) "
             f"WITH ('bucket.num' = '{BUCKETS}'{extra})")
    conn.sql(f"CREATE TABLE {wide} (cust BIGINT, oid BIGINT, amount DOUBLE, status BIGINT, name STRING, tier BIGINT, "
             f"PRIMARY KEY (cust, oid) NOT ENFORCED) WITH ('bucket.num' = '{BUCKETS}', 'bucket.key' = 'cust')")
    return orders, customers, wide


def _day(conn, orders: str, customers: str, day: int) -> None:
    rng = np.random.default_rng(day)
    oid = np.arange(ORDERS, dtype=np.int64)
    for start in range(0, ORDERS, 100_000):
        part = oid[start:start + 100_000]
        conn.table(orders).upsert(pa.table({"cust": part % CUSTOMERS, "oid": part,
                                            "amount": np.round(rng.random(len(part)) * 100, 2),
                                            "status": np.full(len(part), day, dtype=np.int64)}))
    cust = np.arange(CUSTOMERS, dtype=np.int64)
    conn.table(customers).upsert(pa.table({"cust": cust, "name": pa.array([f"c{c}-{day}" for c in cust]),
                                           "tier": rng.integers(0, 5, CUSTOMERS)}))


def _changelog_rows(conn, *tables: str) -> int:
    return sum(sum(conn.table(t).offsets("end").values()) - sum(conn.table(t).offsets("start").values())
               for t in tables)


def _batch_join(conn, orders: str, customers: str) -> int:
    answer = conn.sql(f"SELECT COUNT(*) AS n FROM {orders} o JOIN {customers} c ON o.cust = c.cust")
    return answer.column("n")[0].as_py()


def _check_sink(conn, wide: str, orders: str, customers: str) -> None:
    mismatched = conn.sql(
        f"SELECT COUNT(*) AS n FROM {orders} o JOIN {customers} c ON o.cust = c.cust "
        f"LEFT JOIN {wide} w ON w.cust = o.cust AND w.oid = o.oid "
        f"WHERE w.amount IS DISTINCT FROM o.amount OR w.status IS DISTINCT FROM o.status "
        f"OR w.name IS DISTINCT FROM c.name OR w.tier IS DISTINCT FROM c.tier").column("n")[0].as_py()
    total = conn.sql(f"SELECT COUNT(*) AS n FROM {wide}").column("n")[0].as_py()
    assert mismatched == 0 and total == _batch_join(conn, orders, customers), (wide, mismatched, total)


def _delta_vs_stream_stream(spark, conn, uri: str, tmp: Path) -> list[Row]:
    from flightstore_spark.pipelines import delta_join

    orders, customers, wide = _tables(conn, "_dj")
    for day in range(2):
        _day(conn, orders, customers, day)
    events = _changelog_rows(conn, orders, customers)
    ours, query = timed_query(lambda: delta_join.start(spark, uri, orders, customers, ["cust"], wide,
                                                       str(tmp / "dj-ckpt"), join_type="inner"))
    _check_sink(conn, wide, orders, customers)
    ours_state = sum(op.get("memoryUsedBytes", 0) for p in query.recentProgress for op in p["stateOperators"])
    for attempt in range(5):  # a Python source runner that missed Spark's 10 s connect-back: again
        began = time.perf_counter()
        try:
            spark_state = delta_join.stream_stream_join_state(spark, uri, orders, customers, ["cust"],
                                                              str(tmp / f"ssj-ckpt-{attempt}"))
            break
        except Exception as exc:  # noqa: BLE001
            if "failed to connect back" not in str(exc) or attempt == 4:
                raise
    peer = time.perf_counter() - began
    kept = sum(conn.table(t).usage()["bytes"]["kv"] + conn.table(t).usage()["bytes"]["snapshots"]
               for t in (orders, customers))
    return [
        Row(f"delta join (inner) of {events:,} changelog rows (events/s)", events / ours, events / peer, "events/s",
            "Spark stream-stream join, same changelogs", True, ">=1x"),
        Row(f"  Spark state: delta join vs stream-stream join ({spark_state['numRowsTotal']:,} rows)",
            float(ours_state), float(spark_state["memoryUsedBytes"]), "bytes", "Spark state store memoryUsedBytes",
            False, "~0"),
        Row("  bytes flightstore keeps for the join (both inputs' KV, read by lookups)", float(kept),
            float(spark_state["memoryUsedBytes"]), "bytes", "Spark state store memoryUsedBytes", False),
    ]


def _replay_sink(conn, name: str) -> None:
    conn.sql(f"CREATE TABLE {name} (cust BIGINT, oid BIGINT, amount DOUBLE, status BIGINT, name STRING, "
             f"tier BIGINT, PRIMARY KEY (cust, oid) NOT ENFORCED) "
             f"WITH ('bucket.num' = '{BUCKETS}', 'bucket.key' = 'cust')")


def _warm_backfill_and_replay(spark, conn, server, tmp: Path, lake_on: str) -> None:
    """One small backfill and one small replay before either clock runs: the JVM compiles each
    side's plan (snapshot reads, sort-merge join, the streaming delta join) and the Python workers
    import each side's modules on first use, which the side measured first would pay alone."""
    from flightstore_spark.pipelines import delta_join
    from flightstore_spark.pipelines.backfill import backfill

    orders, customers, wide = _tables(conn, "_bfw", lake_on)
    _replay_sink(conn, "wide_replay_w")
    cust = np.arange(100, dtype=np.int64)
    conn.table(orders).upsert(pa.table({"cust": cust % 10, "oid": cust, "amount": cust * 1.0, "status": cust}))
    conn.table(customers).upsert(pa.table({"cust": cust[:10], "name": [f"c{c}" for c in range(10)],
                                           "tier": cust[:10]}))
    for table in (orders, customers):
        server.tierer.tier_now(f"default.{table}")
    backfill(spark, server.uri, orders, customers, ["cust"], wide, str(tmp / "bfw-ckpt"), join_type="inner")
    timed_query(lambda: delta_join.start(spark, server.uri, orders, customers, ["cust"], "wide_replay_w",
                                         str(tmp / "replay-w-ckpt"), join_type="inner"))
    _check_sink(conn, "wide_replay_w", orders, customers)


def _backfill_vs_replay(spark, conn, server, tmp: Path) -> list[Row]:
    from flightstore_spark.pipelines import delta_join
    from flightstore_spark.pipelines.backfill import backfill

    lake_on = "'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h'"
    _warm_backfill_and_replay(spark, conn, server, tmp, lake_on)
    orders, customers, wide = _tables(conn, "_bf", lake_on)
    _replay_sink(conn, "wide_replay")
    for day in range(DAYS):
        _day(conn, orders, customers, day)
        for table in (orders, customers):
            server.tierer.tier_now(f"default.{table}")
    events = _changelog_rows(conn, orders, customers)
    began = time.perf_counter()
    offsets = backfill(spark, server.uri, orders, customers, ["cust"], wide, str(tmp / "bf-ckpt"), join_type="inner")
    ours = time.perf_counter() - began
    assert offsets["left"] == conn.table(orders).offsets("end")  # everything was tiered: nothing to stream
    _check_sink(conn, wide, orders, customers)
    peer, _ = timed_query(lambda: delta_join.start(spark, server.uri, orders, customers, ["cust"], "wide_replay",
                                                   str(tmp / "replay-ckpt"), join_type="inner"))
    _check_sink(conn, "wide_replay", orders, customers)
    return [Row(f"lake backfill of {DAYS} days ({ORDERS:,} orders) vs replaying {events:,} changelog rows (s)",
                ours, peer, "s", "the streaming delta join from earliest", False, ">=3x")]
