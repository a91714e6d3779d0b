"""The aggregation merge engine through the Flight SQL server and the Python client."""

from __future__ import annotations

import threading

import adbc_driver_flightsql.dbapi as dbapi
import pyarrow as pa
import pytest

import flightstore

DDL = """
CREATE TABLE user_stats (
  user_id BIGINT, clicks BIGINT, max_amount DOUBLE, tags STRING, last_order_ts BIGINT,
  PRIMARY KEY (user_id) NOT ENFORCED
) WITH ('bucket.num' = '2', 'table.merge-engine' = 'aggregation',
        'fields.clicks.agg' = 'sum', 'fields.max_amount.agg' = 'max',
        'fields.tags.agg' = 'listagg', 'fields.tags.listagg.delimiter' = ';')
"""


def test_sql_create_insert_select_and_changelog(server):
    with dbapi.connect(server.uri, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(DDL)
        cur.execute("INSERT INTO user_stats VALUES (1, 1, 10.0, 'a', 100), (2, 5, 1.0, 'x', 7)")
        cur.execute("INSERT INTO user_stats VALUES (1, 2, 3.0, 'b', NULL), (1, 4, 30.0, NULL, 200)")
        cur.execute("SELECT * FROM user_stats WHERE user_id = 1")
        # clicks summed, max kept, listagg with ';', last_order_ts: default last non-null value
        assert cur.fetchall() == [(1, 7, 30.0, "a;b", 200)]
        cur.execute("SELECT user_id, _change_type, clicks FROM `user_stats$changelog` WHERE user_id = 1 "
                    "ORDER BY _log_offset")
        assert cur.fetchall() == [(1, "+I", 1), (1, "-U", 1), (1, "+U", 7)]
        with pytest.raises(dbapi.Error, match="field 's'.*sum does not support type string"):
            cur.execute("CREATE TABLE bad (k BIGINT, s STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ("
                        "'table.merge-engine' = 'aggregation', 'fields.s.agg' = 'sum')")
        cur.execute("SHOW TABLES")
        assert ("bad",) not in cur.fetchall()


def test_concurrent_partial_writers_build_one_wide_table(server):
    with flightstore.connect(server.uri) as conn:
        conn.sql(DDL)

    def write(column: str, values: list[int]) -> None:
        with flightstore.connect(server.uri) as c:
            t = c.table("user_stats", writer_id=f"writer-{column}")
            for i, v in enumerate(values):
                t.upsert(pa.table({"user_id": [i % 3], column: [v]}), columns=["user_id", column])

    clicks = threading.Thread(target=write, args=("clicks", [1] * 30))
    orders = threading.Thread(target=write, args=("last_order_ts", list(range(30))))
    clicks.start(), orders.start()
    clicks.join(), orders.join()
    with flightstore.connect(server.uri) as conn:
        rows = conn.sql("SELECT user_id, clicks, last_order_ts FROM user_stats ORDER BY user_id").to_pylist()
        assert rows == [{"user_id": 0, "clicks": 10, "last_order_ts": 27},
                        {"user_id": 1, "clicks": 10, "last_order_ts": 28},
                        {"user_id": 2, "clicks": 10, "last_order_ts": 29}]
        intruder = conn.table("user_stats", writer_id="intruder")
        with pytest.raises(pa.ArrowInvalid, match="clicks.*writer-clicks|writer-clicks.*clicks"):
            intruder.upsert(pa.table({"user_id": [0], "clicks": [100]}), columns=["user_id", "clicks"])
        owner = conn.table("user_stats", writer_id="writer-clicks")
        owner.release()
        intruder.upsert(pa.table({"user_id": [0], "clicks": [100]}), columns=["user_id", "clicks"])
        assert conn.sql("SELECT clicks FROM user_stats WHERE user_id = 0").to_pylist() == [{"clicks": 110}]


def test_client_undo_then_replay_counts_once(server):
    with flightstore.connect(server.uri) as conn:
        conn.sql(DDL)
        job = conn.table("user_stats", writer_id="job")
        batches = [pa.table({"user_id": [1, 2], "clicks": [i, 1]}) for i in range(6)]
        for batch in batches[:3]:
            job.upsert(batch, columns=["user_id", "clicks"])
        checkpoint = job.sequence
        for batch in batches[3:5]:  # written after the checkpoint, then the job "fails"
            job.upsert(batch, columns=["user_id", "clicks"])
        restarted = conn.table("user_stats", writer_id="job")
        assert restarted.undo(checkpoint) > 0
        for batch in batches[3:]:  # replay from the checkpoint, then continue
            restarted.upsert(batch, columns=["user_id", "clicks"])
        got = conn.sql("SELECT user_id, clicks FROM user_stats ORDER BY user_id").to_pylist()
        assert got == [{"user_id": 1, "clicks": sum(range(6))}, {"user_id": 2, "clicks": 6}]
