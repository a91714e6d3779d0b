"""Batch and streaming writes; a replayed micro-batch applies nothing twice."""

from __future__ import annotations

import os

import pytest

from flightstore.client import connect

pytestmark = pytest.mark.slow


def _rows(table) -> list[tuple]:
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def _save(df, server, table, **options):
    writer = df.write.format("flightstore").option("uri", server.uri).option("table", table).mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_batch_writes_append_upsert_partial_and_delete(spark, server):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE lg (id BIGINT, name STRING) WITH ('bucket.num' = '2')")
    conn.sql("CREATE TABLE kv (k BIGINT, a STRING, b BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2')")
    _save(spark.range(0, 5000).selectExpr("id", "concat('n', id) AS name"), server, "lg")
    assert conn.sql("SELECT COUNT(*) AS c FROM lg").column(0)[0].as_py() == 5000
    _save(spark.createDataFrame([(1, "x", 10), (2, "y", 20), (3, "z", 30)], "k long, a string, b long"), server, "kv")
    _save(spark.createDataFrame([(1, 11), (4, 44)], "k long, b long"), server, "kv", columns="k,b")
    _save(spark.createDataFrame([(2, None, None, "-D"), (3, "z3", 33, "+U"), (5, "v", 5, "+I")],
                                "k long, a string, b long, _change_type string"), server, "kv")
    assert _rows(conn.sql("SELECT * FROM kv")) == [(1, "x", 11), (3, "z3", 33), (4, None, 44), (5, "v", 5)]
    with pytest.raises(Exception, match="overwrite"):
        (spark.range(1).selectExpr("id", "'a' AS name").write.format("flightstore").option("uri", server.uri)
         .option("table", "lg").mode("overwrite").save())


def test_streaming_write_replayed_batch_applies_once(spark, server, tmp_path):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE src (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2')")
    conn.sql("CREATE TABLE copy (k BIGINT, v BIGINT, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '2')")
    conn.sql("CREATE TABLE audit (k BIGINT, v BIGINT) WITH ('bucket.num' = '2')")
    src = conn.table("src")
    src.upsert({"k": list(range(50)), "v": list(range(50))})
    checkpoint = str(tmp_path / "ck")

    def run(table: str, ck: str) -> None:
        stream = (spark.readStream.format("flightstore").option("uri", server.uri).option("table", "src")
                  .option("startup.mode", "earliest").option("columns", "k,v").load())
        if table == "audit":  # a log sink: any duplicate would show as an extra row
            stream = stream.select("k", "v")
        query = (stream.writeStream.format("flightstore").option("uri", server.uri).option("table", table)
                 .option("checkpointLocation", ck).trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    run("audit", checkpoint)
    run("copy", str(tmp_path / "ck-copy"))
    assert conn.sql("SELECT COUNT(*) AS c FROM audit").column(0)[0].as_py() == 50
    # force a retry of the last micro-batch: forget that it was committed, then restart
    commits = os.path.join(checkpoint, "commits")
    last = max(int(name) for name in os.listdir(commits) if name.isdigit())
    os.remove(os.path.join(commits, str(last)))
    if os.path.exists(os.path.join(commits, f".{last}.crc")):
        os.remove(os.path.join(commits, f".{last}.crc"))
    run("audit", checkpoint)
    assert os.path.exists(os.path.join(commits, str(last))), "the forgotten micro-batch was not re-run"
    assert conn.sql("SELECT COUNT(*) AS c FROM audit").column(0)[0].as_py() == 50
    # new changes flow once, including deletes into the primary-key copy
    src.upsert({"k": [1, 60], "v": [100, 60]})
    src.delete({"k": [2]})
    run("audit", checkpoint)
    run("copy", str(tmp_path / "ck-copy"))
    assert conn.sql("SELECT COUNT(*) AS c FROM audit").column(0)[0].as_py() == 50 + 4
    assert _rows(conn.sql("SELECT * FROM copy")) == _rows(conn.sql("SELECT * FROM src"))
