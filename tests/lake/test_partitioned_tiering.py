"""Tiering partitioned tables: the lake partitions by identity(partition columns) then the bucket
transform; ``__bucket`` is the table-wide bucket number; log retention of each partition waits for
the lake."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.transforms import BucketTransform, IdentityTransform

from flightstore.bucketing import bucket_ids
from flightstore.lake import read_lake
from flightstore.lake.offsets import committed_offsets
from flightstore.partitioning import split_bucket_id
from tests.waiting import wait_until

SCHEMA = pa.schema([("dt", pa.string()), ("user", pa.int64()), ("seq", pa.int64())])
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]


def _rows(first: int, count: int) -> pa.Table:
    seq = np.arange(first, first + count, dtype=np.int64)
    return pa.table({"dt": [DAYS[i % 3] for i in seq], "user": seq * 13 % 997, "seq": seq}, schema=SCHEMA)


def _files(lake_table):
    io = PyArrowFileIO(lake_table.io.properties)
    for task in lake_table.scan().plan_files():
        with io.new_input(task.file.file_path).open() as handle:
            yield task.file, pq.read_table(handle)


def test_partitioned_log_table_tiers_by_partition_then_bucket(store, tierer):
    table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 4, "bucket.key": "user", "table.datalake.enabled": "true"})
    table.append(_rows(0, 600))
    first = tierer.tier_now(table.path)
    table.append(_rows(600, 300))
    second = tierer.tier_now(table.path)
    assert first.rows == 600 and second.rows == 300
    lake_table = tierer.catalog.load_table(table.path)
    spec = lake_table.spec().fields
    assert [type(f.transform) for f in spec] == [IdentityTransform, BucketTransform]
    assert [lake_table.schema().find_field(f.source_id).name for f in spec] == ["dt", "user"]
    assert spec[1].transform.num_buckets == 4
    partition_ids = {p.name: p.id for p in table.descriptor.partitions}
    files = 0
    for data_file, rows in _files(lake_table):
        files += 1
        day, key_bucket = data_file.partition[0], data_file.partition[1]
        assert set(rows.column("dt").to_pylist()) == {day}
        local = bucket_ids(rows.select(["user"]), ["user"], 4)
        assert set(local.tolist()) == {key_bucket}  # Iceberg's bucket transform == flightstore's
        (global_bucket,) = set(rows.column("__bucket").to_pylist())
        assert split_bucket_id(global_bucket, 4) == (partition_ids[day], key_bucket)
        offsets = rows.column("__offset").to_numpy()
        assert (np.diff(offsets) > 0).all()
    assert files >= 12  # 3 partitions x 4 buckets, two rounds
    lake = read_lake(tierer.catalog, table.descriptor)
    assert sorted(lake.column("seq").to_pylist()) == list(range(900))
    assert committed_offsets(lake_table) == table.end_offsets()
    table.append(_rows(900, 5))
    status = tierer.status(table.path)  # per table-wide bucket, like the offsets
    assert [b.bucket for b in status.buckets] == sorted(table.end_offsets())
    assert [b.tiered_offset for b in status.buckets] == [second.end_offsets[b] for b in sorted(table.end_offsets())]
    assert status.lag_records == 5


def test_partitioned_log_table_without_bucket_key_uses_identity_bucket(store, tierer):
    table = store.create_table("default.raw", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "table.datalake.enabled": "true"})
    table.append(_rows(0, 90))
    tierer.tier_now(table.path)
    lake_table = tierer.catalog.load_table(table.path)
    assert [f.name for f in lake_table.spec().fields] == ["dt", "__bucket"]
    for data_file, rows in _files(lake_table):
        assert set(rows.column("__bucket").to_pylist()) == {data_file.partition[1]}
    assert sorted(read_lake(tierer.catalog, table.descriptor).column("seq").to_pylist()) == list(range(90))


def test_partitioned_primary_key_table_tiers_the_kv_and_deletes_in_one_partition(store, tierer):
    table = store.create_table("default.orders", SCHEMA, primary_key=["dt", "user"], partition_keys=["dt"],
                               options={"bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true"})
    table.upsert(_rows(0, 300))
    tierer.tier_now(table.path)
    before = {f.file_path: f.partition[0] for f, _ in _files(tierer.catalog.load_table(table.path))}
    table.upsert(pa.table({"dt": [DAYS[0]] * 3, "user": [13, 26, 5000], "seq": [-1, -2, -3]}, schema=SCHEMA))
    table.delete(pa.table({"dt": [DAYS[0]], "user": [39]}))
    result = tierer.tier_now(table.path)
    # Merge-on-read: position delete files in that day's partition only, no data file rewritten.
    assert result.files_removed == 0 and result.delete_files >= 1 and result.deleted == 1
    lake_table = tierer.catalog.load_table(table.path)
    after = {f.file_path for f, _ in _files(lake_table)}
    assert set(before) <= after
    deletes = {d.file_path: d for task in lake_table.scan().plan_files() for d in task.delete_files}
    assert len(deletes) == result.delete_files and {d.partition[0] for d in deletes.values()} == {DAYS[0]}
    lake = read_lake(tierer.catalog, table.descriptor, columns=SCHEMA.names)
    assert lake.sort_by([("dt", "ascending"), ("user", "ascending")]).to_pylist() == \
        table.scan_table().sort_by([("dt", "ascending"), ("user", "ascending")]).to_pylist()


def test_each_partition_keeps_its_untiered_log(store, tierer):
    table = store.create_table("default.ttl", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 1, "table.datalake.enabled": "true", "table.log.segment.bytes": 1024})
    for first in range(0, 300, 30):
        table.append(_rows(first, 30))
    tierer.tier_now(table.path)  # tells every partition what the lake holds
    for first in range(300, 600, 30):
        table.append(_rows(first, 30))
    for unit in table.units.values():
        for log in unit.logs:
            log.ttl_ms = 1
    table.enforce_retention(now_ms=2**62)
    tiered = committed_offsets(tierer.catalog.load_table(table.path))
    starts = table.start_offsets()
    assert any(starts[b] > 0 for b in starts)  # tiered segments went
    assert all(starts[b] <= tiered[b] for b in tiered)  # untiered ones stayed
    tierer.tier_now(table.path)
    assert sorted(read_lake(tierer.catalog, table.descriptor).column("seq").to_pylist()) == list(range(600))


# ---- dropped partitions leave the lake ----------------------------------------------------------

def _sql(store, tierer):
    from flightstore.sql.execute import Executor
    executor = Executor(store, tierer.catalog, tierer)
    return lambda text: executor.execute_table(executor.plan(text))


def _seqs(rows: pa.Table) -> list[int]:
    return sorted(rows.column("seq").to_pylist())


def _seqs_of(model: pa.Table, days) -> list[int]:
    return _seqs(model.filter(pc.is_in(model["dt"], pa.array(list(days)))))


def test_a_dropped_partition_leaves_the_lake_by_whole_files(store, tierer):
    sql = _sql(store, tierer)
    table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true"})
    table.append(_rows(0, 600))
    tierer.tier_now(table.path)
    gone = next(p for p in table.descriptor.partitions if p.name == DAYS[1])
    gone_buckets = (gone.id * 2, gone.id * 2 + 1)
    before = committed_offsets(tierer.catalog.load_table(table.path))
    assert set(gone_buckets) <= set(before)
    sql(f"ALTER TABLE clicks DROP PARTITION (dt = '{DAYS[1]}')")
    result = tierer.tier_now(table.path)  # nothing new to tier: the drop alone is the round's work
    assert result.committed and result.rows == 0 and result.dropped_buckets == gone_buckets
    lake_table = tierer.catalog.load_table(table.path)
    delete, append = lake_table.snapshots()[-2:]
    assert delete.summary.operation.value == "delete"  # whole files out of the manifests, nothing written
    assert int(delete.summary["deleted-data-files"]) == 2
    assert "added-data-files" not in delete.summary.additional_properties
    assert int(delete.summary["deleted-records"]) == 200
    kept_offsets = {b: o for b, o in before.items() if b not in gone_buckets}
    assert committed_offsets(lake_table, delete) == kept_offsets  # the others' offsets intact
    assert committed_offsets(lake_table) == kept_offsets == table.end_offsets()
    kept = _seqs_of(_rows(0, 600), [DAYS[0], DAYS[2]])
    assert _seqs(sql("SELECT seq FROM clicks$lake")) == kept
    assert _seqs(lake_table.scan(selected_fields=("seq",)).to_arrow()) == kept  # pyiceberg
    assert _seqs(sql("SELECT seq FROM clicks")) == kept  # the union read
    assert [b.bucket for b in tierer.status(table.path).buckets] == sorted(table.end_offsets())
    # The next round resumes from the others' offsets (no duplicate), and a partition of the same
    # value created again starts empty: only its own rows reach the lake.
    table.append(_rows(600, 90))
    again = tierer.tier_now(table.path)
    assert again.rows == 90 and not again.dropped_buckets
    expected = sorted(kept + list(range(600, 690)))
    assert _seqs(sql("SELECT seq FROM clicks$lake")) == expected
    assert _seqs(sql("SELECT seq FROM clicks")) == expected
    assert _seqs(sql(f"SELECT seq FROM clicks$lake WHERE dt = '{DAYS[1]}'")) == \
        _seqs_of(_rows(600, 90), [DAYS[1]])
    assert committed_offsets(tierer.catalog.load_table(table.path)) == table.end_offsets()


def test_a_drop_while_the_lake_is_down_is_applied_when_it_is_back(store, tierer, data_dir):
    from flightstore.errors import LakeUnavailable
    from tests.lake.test_unavailable import _break_catalog
    sql = _sql(store, tierer)
    table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 1, "table.datalake.enabled": "true"})
    table.append(_rows(0, 300))
    tierer.tier_now(table.path)
    restore = _break_catalog(data_dir)
    try:
        sql(f"ALTER TABLE clicks DROP PARTITION (dt = '{DAYS[0]}')")
        table.append(_rows(300, 30))  # DAYS[0] comes back as a new partition, while the lake is down
        with pytest.raises(LakeUnavailable):
            tierer.tier_now(table.path)
    finally:
        restore()
    result = tierer.tier_now(table.path)
    assert result.committed and len(result.dropped_buckets) == 1 and result.rows == 30
    model = pa.concat_tables([_rows(0, 300).filter(pc.not_equal(_rows(0, 300)["dt"], DAYS[0])),
                              _rows(300, 30)])
    assert _seqs(sql("SELECT seq FROM clicks$lake")) == _seqs(model)  # no resurrection, nothing lost
    assert _seqs(sql(f"SELECT seq FROM clicks$lake WHERE dt = '{DAYS[0]}'")) == _seqs_of(_rows(300, 30), [DAYS[0]])
    assert _seqs(sql("SELECT seq FROM clicks")) == _seqs(model)
    assert committed_offsets(tierer.catalog.load_table(table.path)) == table.end_offsets()


def test_auto_partition_expiry_drops_the_partition_from_the_lake(store, tierer):
    import datetime as dt
    day_ms = 86_400_000
    now_ms = 1_790_000_000_000  # a fixed day: the test does not depend on the clock
    today = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.timezone.utc).strftime("%Y%m%d")
    table = store.create_table("default.daily", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "table.datalake.enabled": "true", "table.auto-partition.enabled": "true",
        "table.auto-partition.time-unit": "DAY", "table.auto-partition.time-zone": "UTC",
        "table.auto-partition.num-precreate": "2", "table.auto-partition.num-retention": "1"})
    store.auto_partition(now_ms)  # today and tomorrow (tomorrow stays empty)
    rows = pa.table({"dt": [today] * 50, "user": np.arange(50), "seq": np.arange(50)}, schema=SCHEMA)
    table.append(rows)
    tierer.tier_now(table.path)
    assert _seqs(read_lake(tierer.catalog, table.descriptor)) == list(range(50))
    assert store.auto_partition(now_ms + 3 * day_ms)[str(table.path)][1] == 2  # today and tomorrow expire
    result = tierer.tier_now(table.path)
    assert len(result.dropped_buckets) == 4  # the empty partition's buckets leave the offsets too
    lake_table = tierer.catalog.load_table(table.path)
    assert read_lake(tierer.catalog, table.descriptor).num_rows == 0
    assert lake_table.scan().to_arrow().num_rows == 0
    assert committed_offsets(lake_table) == table.end_offsets()


def test_a_primary_key_round_changes_one_partition_and_drops_another_in_one_commit(store, tierer):
    sql = _sql(store, tierer)
    table = store.create_table("default.orders", SCHEMA, primary_key=["dt", "user"], partition_keys=["dt"],
                               options={"bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true"})
    table.upsert(_rows(0, 300))
    tierer.tier_now(table.path)
    before = len(tierer.catalog.load_table(table.path).snapshots())
    sql(f"ALTER TABLE orders DROP PARTITION (dt = '{DAYS[2]}')")
    table.upsert(pa.table({"dt": [DAYS[0]] * 2, "user": [13, 5000], "seq": [-1, -2]}, schema=SCHEMA))
    table.delete(pa.table({"dt": [DAYS[0]], "user": [39]}))
    result = tierer.tier_now(table.path)
    # merge-on-read: the changed keys' old rows go by position delete files, no file is rewritten
    assert len(result.dropped_buckets) == 2 and result.deleted == 1
    assert result.delete_files >= 1 and result.position_deletes >= 1 and result.files_removed == 0
    lake_table = tierer.catalog.load_table(table.path)
    assert [s.summary.operation.value for s in lake_table.snapshots()[before:]] == ["delete", "overwrite"]
    key = [("dt", "ascending"), ("user", "ascending")]
    lake = read_lake(tierer.catalog, table.descriptor, columns=SCHEMA.names)
    assert lake.sort_by(key).to_pylist() == table.scan_table().sort_by(key).to_pylist()
    assert committed_offsets(lake_table) == table.end_offsets()


def test_a_dropped_partition_leaves_the_lake_at_once_not_a_freshness_later(store, tierer):
    sql = _sql(store, tierer)
    table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true", "table.datalake.freshness": "1h"})
    table.append(_rows(0, 600))
    tierer.start()  # its first pass tiers the table, the next is due in an hour
    wait_until(lambda: _seqs(sql("SELECT seq FROM clicks$lake")) == list(range(600)), "the first round", 60)
    sql(f"ALTER TABLE clicks DROP PARTITION (dt = '{DAYS[1]}')")
    kept = _seqs_of(_rows(0, 600), [DAYS[0], DAYS[2]])
    wait_until(lambda: _seqs(sql("SELECT seq FROM clicks$lake")) == kept, "the dropped partition leaving the lake", 60)


def test_an_expired_auto_partition_leaves_the_lake_at_once(store, tierer):
    import datetime as dt

    from flightstore.server.partition_manager import AutoPartitionManager
    day_ms = 86_400_000
    now_ms = 1_790_000_000_000
    today = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.timezone.utc).strftime("%Y%m%d")
    table = store.create_table("default.daily", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "table.datalake.enabled": "true", "table.datalake.freshness": "1h",
        "table.auto-partition.enabled": "true", "table.auto-partition.time-unit": "DAY",
        "table.auto-partition.time-zone": "UTC", "table.auto-partition.num-precreate": "2",
        "table.auto-partition.num-retention": "1"})
    manager = AutoPartitionManager(store)  # the server's, not started: the test drives its checks
    manager.on_dropped = tierer.due_now
    manager.check(now_ms)
    table.append(pa.table({"dt": [today] * 50, "user": np.arange(50), "seq": np.arange(50)}, schema=SCHEMA))
    tierer.start()  # its first pass tiers the table, the next is due in an hour
    wait_until(lambda: read_lake(tierer.catalog, table.descriptor).num_rows == 50, "the first round", 60)
    assert manager.check(now_ms + 3 * day_ms)[str(table.path)][1] == 2
    wait_until(lambda: read_lake(tierer.catalog, table.descriptor).num_rows == 0, "the expiry reaching the lake", 60)


def test_a_drop_during_a_round_after_its_commit_keeps_the_table_due(store, tierer):
    """A partition dropped while a round runs, once its commit is visible, is not seen by that round:
    the table must stay due at once, not a freshness interval later (the round's own bookkeeping
    overwrote the request; the drop then waited an hour)."""
    table = store.create_table("default.clicks", SCHEMA, partition_keys=["dt"], options={
        "bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true", "table.datalake.freshness": "1h"})
    table.append(_rows(0, 60))
    tierer.hook = lambda phase: tierer.due_now(table.path) if phase == "after-commit" else None
    assert tierer.tier_now(table.path).rows == 60
    tierer.hook = None
    assert [r.rows for r in tierer.run_due()] == [0]  # due at once: the round after runs now
    assert tierer.run_due() == []  # and then a freshness interval later, as usual
