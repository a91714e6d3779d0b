"""Spark reads through the flightstore connector, each against a peer measured in the same run.

* a Spark batch read of a narrow table (every row materialized by the ``noop`` sink) through the
  connector vs Spark reading the same rows from Parquet files on local disk (goal >= 0.8x);
* the same read of a 100-column table with ``columns`` = 10 of them vs all 100 (goal >= 8x);
* streaming aggregation into storage vs Spark's streaming groupBy (goal >= 1x events/s), and the
  state each keeps: Spark's state store vs what flightstore keeps because of the job (goal <= 1x).

The two reads of each pair run interleaved (best of rounds), so a busy moment on a shared machine
slows one round of each rather than every run of one of them.

``BENCH_SPARK_MEASURES=read,pruning,aggregation,delta_join,backfill`` (any of them, comma-separated;
default all; the last two are :mod:`bench.bench_spark_join`'s) runs only those measures, e.g.
``BENCH_SPARK_MEASURES=read python -m bench spark`` to profile the read, or
``BENCH_SPARK_MEASURES=backfill python -m bench spark`` for the lake backfill alone (its peer, the
changelog replay, still runs beside it). An unknown name fails the benchmark.

The session's Python workers import pip's pyspark compiled, as the pipelines' own sessions do
(:mod:`flightstore_spark.spark_home`); ``SPARK_HOME=<pip's pyspark directory>`` measures Spark's
default instead (workers compile ``pyspark.zip``), what a user's own SparkSession gets.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.report import Row, best_interleaved
from flightstore.client import connect
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store

NARROW_ROWS = 5_000_000
WIDE_ROWS = 300_000
WIDE_COLUMNS = 100
BUCKETS = 4
CHUNK = 500_000
MEASURES = ("read", "pruning", "aggregation", "delta_join", "backfill")


def wanted_measures() -> list[str]:
    """The measures ``BENCH_SPARK_MEASURES`` names (all by default); an unknown name fails loudly."""
    names = [n.strip() for n in os.environ.get("BENCH_SPARK_MEASURES", "").split(",") if n.strip()]
    unknown = [n for n in names if n not in MEASURES]
    if unknown:
        raise SystemExit(f"BENCH_SPARK_MEASURES: unknown measure {unknown[0]!r} (known: {', '.join(MEASURES)})")
    return names or list(MEASURES)


def _narrow(start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    return pa.table({"id": pa.array(np.arange(start, start + n), pa.int64()),
                     "user": pa.array(rng.integers(0, 10_000, n), pa.int64()),
                     "amount": pa.array(rng.random(n))})


def _spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import flightstore_spark
    from flightstore_spark.spark_home import use_compiled_pyspark
    from pyspark.sql import SparkSession

    # As the pipelines' own sessions do (local_spark): Spark's Python workers import pip's pyspark
    # compiled, not pyspark.zip. One session runs both sides of every measure, peers included.
    use_compiled_pyspark()

    spark = (SparkSession.builder.master("local[2]").appName("flightstore-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    flightstore_spark.register(spark)
    return spark


def timed_query(start, attempts: int = 20) -> tuple[float, object]:
    """Seconds a streaming query ``start()`` takes to finish, and the query. Each new streaming
    query starts a Python source runner that Spark gives a fixed 10 s to connect back; a busy
    shared machine can miss that before the first micro-batch (nothing processed): start again."""
    for attempt in range(attempts):
        began = time.perf_counter()
        query = start()
        try:
            query.awaitTermination()
            return time.perf_counter() - began, query
        except Exception as exc:  # noqa: BLE001 - only the connect-back failure is retried
            if "failed to connect back" not in str(exc) or query.recentProgress or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def warm(spark, uri: str, tmp: Path, attempts: int = 20) -> None:
    """Start every kind of Spark Python worker the measures use (a daemon per kind) before any
    clock runs, ours and the peers' alike: the reader's, ``mapInArrow``'s, and the flightstore
    writer's (batch and streaming: its tasks and the driver's commit runner). Spark gives a
    starting daemon a fixed 10 s to connect back, which a busy machine can miss once; a started
    daemon stays, and its import of pyspark (compiled from pyspark.zip in every new process)
    is paid once per application, not per measure."""
    conn = connect(uri)
    conn.sql("CREATE TABLE IF NOT EXISTS warm_up (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) "
             "WITH ('bucket.num' = '1')")
    conn.table("warm_up").upsert({"k": [1, 2], "v": [1, 2]})
    conn.close()
    for attempt in range(attempts):
        try:
            table = spark.read.format("flightstore").option("uri", uri).option("table", "warm_up").load()
            table.collect()
            table.write.format("flightstore").option("uri", uri).option("table", "warm_up").mode("append").save()
            query = (spark.readStream.format("flightstore").option("uri", uri).option("table", "warm_up")
                     .load().writeStream.foreachBatch(lambda df, _: df.mapInArrow(lambda b: b, df.schema).collect())
                     .option("checkpointLocation", str(tmp / f"warm-{attempt}")).trigger(availableNow=True).start())
            query.awaitTermination()
            query = (spark.readStream.format("flightstore").option("uri", uri).option("table", "warm_up")
                     .load().select("k", "v").writeStream.format("flightstore").option("uri", uri)
                     .option("table", "warm_up").option("checkpointLocation", str(tmp / f"warm-write-{attempt}"))
                     .trigger(availableNow=True).start())
            query.awaitTermination()
            return
        except Exception:  # noqa: BLE001 - "Python worker failed to connect back": start it again
            if attempt == attempts - 1:
                raise


def run() -> list[Row]:
    if not {"read", "pruning", "aggregation"} & set(wanted_measures()):
        return []  # only bench_spark_join's measures: no server, no Spark session here
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "data")
        server = FlightSqlServer(store, "grpc://127.0.0.1:0")
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        spark = _spark()
        try:
            warm(spark, server.uri, Path(tmp))
            return _measure(spark, server.uri, Path(tmp))
        finally:
            spark.stop()
            server.shutdown()
            thread.join(timeout=10)
            store.close()


def _measure(spark, uri: str, tmp: Path) -> list[Row]:
    conn = connect(uri)
    wanted = wanted_measures()
    rows = []
    if "read" in wanted:
        rows.extend(_narrow_read(spark, conn, uri, tmp))
    if "pruning" in wanted:
        rows.extend(_pruned_read(spark, conn, uri))
    if "aggregation" in wanted:
        rows.extend(_aggregation_vs_groupby(spark, conn, uri, tmp))
    conn.close()
    return rows


def _narrow_read(spark, conn, uri: str, tmp: Path) -> list[Row]:
    """A Spark batch read of the narrow table through the connector vs of the same rows in Parquet."""
    conn.sql(f"CREATE TABLE narrow (id BIGINT, user BIGINT, amount DOUBLE) WITH ('bucket.num' = '{BUCKETS}')")
    parquet_dir = tmp / "narrow_parquet"
    parquet_dir.mkdir()
    narrow = conn.table("narrow")
    for i, start in enumerate(range(0, NARROW_ROWS, CHUNK)):
        part = _narrow(start, min(CHUNK, NARROW_ROWS - start))
        narrow.append(part)
        pq.write_table(part, parquet_dir / f"part-{i:03d}.parquet")

    def read_connector() -> None:
        (spark.read.format("flightstore").option("uri", uri).option("table", "narrow").load()
         .write.format("noop").mode("overwrite").save())

    def read_parquet() -> None:
        spark.read.parquet(str(parquet_dir)).write.format("noop").mode("overwrite").save()

    read_connector()
    read_parquet()  # warm both (JVM, Python workers, page cache)
    best = best_interleaved({"ours": read_connector, "peer": read_parquet}, 3)
    return [Row(f"Spark batch read, {NARROW_ROWS:,} narrow rows (rows/s)", NARROW_ROWS / best["ours"],
                NARROW_ROWS / best["peer"], "rows/s", "Spark Parquet local disk", True, ">=0.8x")]


def _pruned_read(spark, conn, uri: str) -> list[Row]:
    """The wide table read with ``columns`` = 10 of its 100 columns vs all of them."""
    names = [f"c{i}" for i in range(WIDE_COLUMNS)]
    conn.sql(f"CREATE TABLE wide ({', '.join(f'{n} DOUBLE' for n in names)}) WITH ('bucket.num' = '{BUCKETS}')")
    rng = np.random.default_rng(1)
    wide = conn.table("wide")
    for start in range(0, WIDE_ROWS, 50_000):
        n = min(50_000, WIDE_ROWS - start)
        wide.append(pa.table({name: rng.random(n) for name in names}))

    def read_wide(columns: str | None) -> None:
        reader = spark.read.format("flightstore").option("uri", uri).option("table", "wide")
        if columns:
            reader = reader.option("columns", columns)
        reader.load().write.format("noop").mode("overwrite").save()

    ten = ",".join(names[:10])
    read_wide(ten)
    best = best_interleaved({"pruned": lambda: read_wide(ten), "full": lambda: read_wide(None)}, 3)
    return [Row(f"Spark read, 10 of {WIDE_COLUMNS} columns, {WIDE_ROWS:,} rows (s)", best["pruned"],
                best["full"], "s", f"all {WIDE_COLUMNS} columns via the connector", False, ">=8x")]


AGG_EVENTS = 1_000_000
AGG_KEYS = 50_000
AGG_LOG_TTL = "1 h"  # as a user sets it on an aggregation table that only queries read
AGG_ROUNDS = 3


def _aggregation_vs_groupby(spark, conn, uri: str, tmp: Path) -> list[Row]:
    """Issue 4: the same events aggregated in storage (Spark keeps no state) vs by Spark's own
    streaming groupBy (its state store holds every key). Each run is one availableNow query into a
    fresh sink; the two alternate for AGG_ROUNDS rounds and the best of each counts, as the reads'
    do: the first query in the JVM compiles what the later ones run, whichever side it is."""
    from flightstore_spark.pipelines.aggregation import spark_groupby, start

    conn.sql("CREATE TABLE events (user_id BIGINT, clicks BIGINT, amount DOUBLE) "
             f"WITH ('bucket.num' = '{BUCKETS}')")
    rng = np.random.default_rng(3)
    events = conn.table("events")
    for start_row in range(0, AGG_EVENTS, 250_000):
        n = min(250_000, AGG_EVENTS - start_row)
        events.append(pa.table({"user_id": rng.integers(0, AGG_KEYS, n), "clicks": np.ones(n, np.int64),
                                "amount": np.round(rng.random(n), 2)}))
    ours, peer, queries = float("inf"), float("inf"), []
    for round_ in range(AGG_ROUNDS):  # interleaved, best of each: the first run of either warms the JVM
        sink = "per_user" if round_ == 0 else f"per_user_{round_}"
        conn.sql(f"CREATE TABLE {sink} (user_id BIGINT, clicks BIGINT, amount DOUBLE, "
                 "PRIMARY KEY (user_id) NOT ENFORCED) WITH ('bucket.num' = '4', "
                 "'table.merge-engine' = 'aggregation', 'fields.clicks.agg' = 'sum', 'fields.amount.agg' = 'sum', "
                 f"'table.log.ttl' = '{AGG_LOG_TTL}')")
        seconds, query = timed_query(lambda: start(spark, uri, "events", sink, ["user_id", "clicks", "amount"],
                                                   str(tmp / f"agg-ckpt-{round_}")))
        ours, queries = min(ours, seconds), [*queries, query]
        seconds, grouped = timed_query(lambda: spark_groupby(spark, uri, "events", ["user_id"], ["clicks", "amount"],
                                                             str(tmp / f"gb-ckpt-{round_}"), "bench_groupby",
                                                             wait=False))
        peer = min(peer, seconds)
        # every timed run counts, so every run's answer is checked: each event exactly once
        total = conn.sql(f"SELECT SUM(clicks) AS c FROM {sink}").column("c")[0].as_py()
        expected = spark.sql("SELECT SUM(clicks) AS c FROM bench_groupby").collect()[0]["c"]
        assert total == expected == AGG_EVENTS, (round_, total, expected)
        if round_ < AGG_ROUNDS - 1:
            grouped.stop()
    state = [op for p in grouped.recentProgress for op in p["stateOperators"]]
    state_bytes = max((op.get("memoryUsedBytes", 0) for op in state), default=0)
    state_rows = max((op.get("numRowsTotal", 0) for op in state), default=0)
    spark_state = sum(op.get("memoryUsedBytes", 0) for query in queries for p in query.recentProgress
                      for op in p["stateOperators"])
    assert spark_state == 0, "the aggregation-in-storage job kept Spark state"
    # Our job keeps its state in flightstore: per_user's KV (RocksDB and its snapshots' own files)
    # plus the changelog beyond its newest KV snapshot (recovery needs it; below the snapshot the
    # changelog stays only for readers, until table.log.ttl). The server snapshots every
    # kv.snapshot.interval; the bench takes that snapshot now instead of waiting for it.
    per_user = conn.table("per_user")
    snapshots = per_user.snapshot()
    usage = per_user.usage()
    stored, first, end = usage["bytes"], usage["start_offsets"], usage["end_offsets"]
    retained = sum(end[b] - first[b] for b in end)
    beyond = sum(end[b] - (snapshots[b]["offset"] if snapshots.get(b) else first[b]) for b in end)
    log_beyond = stored["log"] * beyond // retained if retained else 0
    state = stored["kv"] + stored["snapshots"] + log_beyond
    return [
        Row(f"streaming aggregation of {AGG_EVENTS:,} events into storage (events/s)", AGG_EVENTS / ours,
            AGG_EVENTS / peer, "events/s", "Spark streaming groupBy (complete mode)", True, ">=1x"),
        Row(f"  job state: KV {stored['kv']:,} + snapshots {stored['snapshots']:,} + changelog beyond the "
            f"snapshot {log_beyond:,} B vs Spark's {state_rows:,} rows", float(state), float(state_bytes), "bytes",
            "Spark state store memoryUsedBytes", False, "<=1x"),
        Row(f"  + changelog kept for readers until table.log.ttl = {AGG_LOG_TTL} ({stored['log'] - log_beyond:,} B)",
            float(stored["total"]), float(state_bytes), "bytes", "Spark state store memoryUsedBytes", False),
    ]
