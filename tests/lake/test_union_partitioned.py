"""Union read of PARTITIONED datalake-enabled log tables: a plain SELECT / COUNT(*) reads the lake
(Iceberg, ``__bucket`` = table-wide bucket id) below each partition bucket's tiered offset plus that
bucket's log from there, exactly once, also after log retention deleted tiered segments, with
partition pruning, a partition created after the last tiering round, and a dropped partition whose
rows the lake still holds before the next tiering round deletes them (they must not come back)."""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flightstore_spark import _flight

import flightstore
from flightstore.lake import read_lake
from flightstore.lake.union import plan_split, union_split
from flightstore.partitioning import split_bucket_id
from flightstore.sql.execute import Executor
from tests.lake.conftest import LakeServer

SCHEMA = pa.schema([("dt", pa.string()), ("user", pa.int64()), ("seq", pa.int64())])
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
NEW_DAY = "2026-01-04"
FAR_FUTURE_MS = int(time.time() * 1000) + 10**10


def _rows(first: int, count: int, day: str | None = None) -> pa.Table:
    seq = np.arange(first, first + count, dtype=np.int64)
    dt = [day or DAYS[i % 3] for i in seq]
    return pa.table({"dt": dt, "user": seq * 13 % 997, "seq": seq}, schema=SCHEMA)


def _seqs(table: pa.Table) -> list[int]:
    return sorted(table.column("seq").to_pylist())


@pytest.fixture
def executor(store, tierer):
    return Executor(store, tierer.catalog, tierer)


@pytest.fixture
def sql(executor):
    return lambda text: executor.execute_table(executor.plan(text))


@pytest.fixture
def tiered(store, tierer):
    """A partitioned datalake log table: 600 rows over 3 days tiered, 50 more only in the log,
    retention deleted tiered segments (the log alone has lost rows)."""
    table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true",
        "table.log.ttl": "1ms", "table.log.segment.bytes": 1024})
    for first in range(0, 600, 30):
        table.append(_rows(first, 30))
    tierer.tier_now(table.path)
    table.append(_rows(600, 50))
    assert store.enforce_retention(FAR_FUTURE_MS) > 0
    assert any(start > 0 for start in table.start_offsets().values())
    assert len(_seqs(table.scan_table(["seq"]))) < 650
    return table


def test_select_and_count_read_every_row_exactly_once_after_retention(tiered, sql):
    assert _seqs(sql("SELECT seq FROM clicks")) == list(range(650))
    assert sql("SELECT COUNT(*) AS n FROM clicks").column("n").to_pylist() == [650]
    assert sql("SELECT COUNT(*) AS n FROM clicks WHERE seq >= 0").column("n").to_pylist() == [650]
    assert sql("SELECT SUM(seq) AS s FROM clicks").column("s").to_pylist() == [sum(range(650))]
    model = _rows(0, 650)
    got = sql("SELECT dt, user, seq FROM clicks").sort_by("seq")
    assert got.to_pylist() == model.to_pylist()
    # A bucket-key filter and a range straddling the split point.
    user = 7 * 13 % 997
    assert _seqs(sql(f"SELECT seq FROM clicks WHERE user = {user}")) == \
        _seqs(model.filter(pc.equal(model["user"], user)))
    assert _seqs(sql("SELECT seq FROM clicks WHERE seq BETWEEN 550 AND 620")) == list(range(550, 621))


def test_partition_filter_prunes_both_parts_and_counts_right(tiered, sql, executor):
    model = _rows(0, 650)
    for day in DAYS:
        wanted = _seqs(model.filter(pc.equal(model["dt"], day)))
        assert _seqs(sql(f"SELECT seq FROM clicks WHERE dt = '{day}'")) == wanted
        assert sql(f"SELECT COUNT(*) AS n FROM clicks WHERE dt = '{day}'").column("n").to_pylist() == \
            [len(wanted)]
    both = _seqs(model.filter(pc.is_in(model["dt"], pa.array(DAYS[:2]))))
    assert _seqs(sql(f"SELECT seq FROM clicks WHERE dt IN ('{DAYS[0]}', '{DAYS[1]}')")) == both
    # One Flight endpoint per table-wide bucket: each reads its bucket's lake files and log tail.
    plan = executor.plan("SELECT seq FROM clicks")
    pieces = executor.partitions(plan)
    assert sorted(pieces) == sorted(tiered.start_offsets())
    by_bucket = [pa.concat_tables([pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b
                                   for b in executor.execute(plan, p)]) for p in pieces]
    assert sorted(s for t in by_bucket for s in t.column("seq").to_pylist()) == list(range(650))


def test_a_partition_not_tiered_yet_is_read_from_its_log(tiered, sql, tierer):
    tiered.append(_rows(1000, 40, NEW_DAY))
    split = union_split(tierer.catalog, tiered)
    new_buckets = set(tiered.start_offsets()) - {b for b, o in split.offsets.items() if o > 0}
    assert new_buckets  # the new partition's buckets start at 0 in the log
    expected = list(range(650)) + list(range(1000, 1040))
    assert _seqs(sql("SELECT seq FROM clicks")) == expected
    assert sql("SELECT COUNT(*) AS n FROM clicks").column("n").to_pylist() == [690]
    assert _seqs(sql(f"SELECT seq FROM clicks WHERE dt = '{NEW_DAY}'")) == list(range(1000, 1040))
    tierer.tier_now(tiered.path)
    assert _seqs(sql("SELECT seq FROM clicks")) == expected


def test_a_dropped_partition_does_not_come_back_from_the_lake(tiered, sql, tierer):
    dropped = next(p.id for p in tiered.descriptor.partitions if p.name == DAYS[1])
    files_before = len(plan_split(tierer.catalog, tiered)["files"])
    sql(f"ALTER TABLE clicks DROP PARTITION (dt = '{DAYS[1]}')")
    # The lake still holds its rows (until the next tiering round deletes them): every read leaves them out,
    # also the plan handed to readers elsewhere (Spark: data files and log-tail offsets).
    assert DAYS[1] in set(read_lake(tierer.catalog, tiered.descriptor).column("dt").to_pylist())
    planned = plan_split(tierer.catalog, tiered)
    assert {int(b) for b in planned["offsets"]} == set(tiered.start_offsets())
    assert all(split_bucket_id(int(b), 2)[0] != dropped for b in planned["offsets"])
    assert len(planned["files"]) == files_before - 2  # its 2 buckets' files are pruned
    model = _rows(0, 650)
    kept = _seqs(model.filter(pc.not_equal(model["dt"], DAYS[1])))
    assert _seqs(sql("SELECT seq FROM clicks")) == kept
    assert sql("SELECT COUNT(*) AS n FROM clicks").column("n").to_pylist() == [len(kept)]
    assert sql(f"SELECT seq FROM clicks WHERE dt = '{DAYS[1]}'").num_rows == 0
    # A new partition of the same values is a new partition (new bucket ids): only its rows.
    tiered.append(_rows(2000, 5, DAYS[1]))
    assert _seqs(sql(f"SELECT seq FROM clicks WHERE dt = '{DAYS[1]}'")) == list(range(2000, 2005))


def test_explain_shows_the_lake_and_log_parts_of_a_partitioned_table(tiered, sql):
    line, lake, log = sql(f"EXPLAIN SELECT seq FROM clicks WHERE dt = '{DAYS[0]}'").column("plan").to_pylist()
    assert line.startswith("UnionScan(table=default.clicks")
    # dt pins one partition: its 2 buckets' files are left after pruning.
    assert lake.startswith("lake: snapshot ") and " 2 data file(s) after pruning" in lake, lake
    pid = next(p.id for p in tiered.descriptor.partitions if p.name == DAYS[0])
    assert log.startswith(f"log: bucket {pid * 2} offsets [") and log.count("bucket ") == 2, log


def test_over_flight_sql_count_and_the_planned_lake_and_log_splits(data_dir, settings):
    """Through a real server: SQL, the client's count, and the plan readers elsewhere (Spark) get:
    lake data files read straight from the warehouse plus one log-tail split per table-wide bucket
    together hold every row once, the dropped partition's rows left out."""
    running = LakeServer(data_dir, settings)
    store, server = running.store, running.server
    try:
        table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
            "bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true",
            "table.datalake.freshness": "1h", "table.log.ttl": "1ms", "table.log.segment.bytes": 1024})
        for first in range(0, 300, 30):
            table.append(_rows(first, 30))
        server.tierer.tier_now(table.path)
        table.append(_rows(300, 20))
        assert store.enforce_retention(FAR_FUTURE_MS) > 0
        with flightstore.connect(server.uri, timeout=60) as conn:
            conn.sql(f"ALTER TABLE clicks DROP PARTITION (dt = '{DAYS[2]}')")
            model = _rows(0, 320)
            kept = _seqs(model.filter(pc.not_equal(model["dt"], DAYS[2])))
            assert _seqs(conn.sql("SELECT seq FROM clicks")) == kept
            assert conn.sql("SELECT COUNT(*) AS n FROM clicks").column("n").to_pylist() == [len(kept)]
            planned = _flight.lake_split(conn, "default.clicks")
            assert planned["union"] and planned["files"]
            lake = [b for b in _flight.read_lake_files([f["path"] for f in planned["files"]], planned["io"],
                                                       planned["schema"], ["seq"])]
            tails = [b for bucket, offset in planned["offsets"].items()
                     for b in _flight.read_payload(conn, {
                         "op": "scan", "table": "default.clicks", "columns": ["seq"],
                         "buckets": [int(bucket)], "log_from": {bucket: offset}})]
            assert _seqs(pa.Table.from_batches(lake + tails)) == kept
            # One log-tail split of every bucket at once (no "buckets"): table-wide ids, not 0..n-1.
            whole = list(_flight.read_payload(conn, {"op": "scan", "table": "default.clicks",
                                                     "columns": ["seq"], "log_from": planned["offsets"]}))
            assert _seqs(pa.Table.from_batches(lake + whole)) == kept
    finally:
        running.stop()
