"""Aggregation in storage equals Spark's own streaming groupBy, with no double counting on restart."""

from __future__ import annotations

import pytest
from flightstore_spark.pipelines import aggregation

from flightstore.client import connect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # three streaming queries on a busy machine


def test_aggregation_table_equals_spark_groupby(spark, server, tmp_path):
    conn = connect(server.uri)
    conn.sql("CREATE TABLE clicks (user_id BIGINT, clicks BIGINT, amount DOUBLE) WITH ('bucket.num' = '2')")
    conn.sql("CREATE TABLE per_user (user_id BIGINT, clicks BIGINT, amount DOUBLE, "
             "PRIMARY KEY (user_id) NOT ENFORCED) WITH ('bucket.num' = '2', "
             "'table.merge-engine' = 'aggregation', 'fields.clicks.agg' = 'sum', 'fields.amount.agg' = 'sum')")
    clicks = conn.table("clicks")
    columns = ["user_id", "clicks", "amount"]
    for round_ in range(2):
        clicks.append({"user_id": [u % 5 for u in range(40)], "clicks": [1] * 40,
                       "amount": [float(u + round_) for u in range(40)]})
        query = aggregation.start(spark, server.uri, "clicks", "per_user", columns, str(tmp_path / "agg"))
        query.awaitTermination()
        assert query.exception() is None
        if round_ == 0:  # each of 2 tasks folds its events to a row per key: +I, then -U/+U (75 unfolded)
            assert sum(conn.table("per_user").offsets("end").values()) <= 5 + 5 * 2
    aggregation.spark_groupby(spark, server.uri, "clicks", ["user_id"], ["clicks", "amount"],
                              str(tmp_path / "spark"), "spark_agg")
    ours = sorted(tuple(r.values()) for r in conn.sql("SELECT * FROM per_user").to_pylist())
    theirs = sorted(tuple(r) for r in spark.sql("SELECT user_id, clicks, amount FROM spark_agg").collect())
    assert ours == theirs and len(ours) == 5 and sum(r[1] for r in ours) == 80
