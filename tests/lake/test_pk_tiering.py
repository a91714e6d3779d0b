"""Tiering primary-key tables: a KV snapshot's rows first, then the changelog as upserts and deletes:
merge-on-read (one position delete file per changed bucket, the upserts appended), compaction of
a bucket past its delete ratio, copy-on-write of the changed files in a format-version 1 lake.
Checked against a Python model of the table at every tiered offset (current snapshot and time
travel)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flightstore.alter import SetOptions
from flightstore.bucketing import bucket_ids
from flightstore.errors import LakeUnavailable
from flightstore.lake import lake_snapshots, read_lake, tier_round
from flightstore.lake.layout import BUCKET_COLUMN, OFFSET_COLUMN
from flightstore.lake.offsets import committed_offsets
from flightstore.sql.execute import Executor
from tests.lake.test_read import _duckdb_rows, duckdb_python  # noqa: F401 - the fixture is used

ROWS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                  ("score", pa.int32()), ("ts", pa.timestamp("ms"))])
COLUMNS = ROWS.names


def create_pk(store, name: str = "default.users", buckets: int = 3, **options):
    return store.create_table(name, ROWS, primary_key=["id"], options={
        "bucket.num": buckets, "table.datalake.enabled": "true", **options})


class Model:
    """What the table holds, key -> row dict, maintained by the test itself."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}

    def upsert(self, table, ids, name: str, score_base: int) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        data = pa.table({"id": ids, "name": [f"{name}{i}" for i in ids],
                         "score": pa.array((ids + score_base) % 1000, pa.int32()),
                         "ts": pa.array(ids * 1000 + score_base, pa.timestamp("ms"))}, schema=ROWS)
        table.upsert(data)
        for row in data.to_pylist():
            self.rows[row["id"]] = row

    def update_scores(self, table, ids, score: int) -> None:
        """A partial update: only ``score`` changes, the other columns keep their values."""
        ids = np.asarray(ids, dtype=np.int64)
        table.upsert(pa.table({"id": ids, "score": pa.array(np.full(len(ids), score), pa.int32())}),
                     columns=["id", "score"])
        for i in ids.tolist():
            if i in self.rows:
                self.rows[i] = {**self.rows[i], "score": score}
            else:
                self.rows[i] = {"id": i, "name": None, "score": score, "ts": None}

    def delete(self, table, ids) -> None:
        table.delete(pa.table({"id": pa.array(ids, pa.int64())}))
        for i in ids:
            self.rows.pop(int(i), None)

    def state(self) -> list[dict]:
        return [self.rows[k] for k in sorted(self.rows)]


def rows_of(table: pa.Table) -> list[dict]:
    return table.select(COLUMNS).sort_by("id").to_pylist()


def test_lake_follows_upserts_partial_updates_and_deletes_with_time_travel(store, tierer):
    # Random keys change every bucket each round; ratio 0.5: some rounds write delete files, a
    # bucket whose deletes pile up past half its live rows is compacted.
    table = create_pk(store, buckets=4, **{"table.datalake.delete-compaction-ratio": "0.5"})
    model = Model()
    rng = np.random.default_rng(3)
    model.upsert(table, np.arange(300), "a", 0)
    table.snapshot(force=True)  # the first round starts from a KV snapshot image...
    model.upsert(table, np.arange(250, 400), "b", 1)  # ...plus the changelog after it
    model.delete(table, [5, 6, 7, 260])
    history = []
    first = tierer.tier_now(table.path)
    assert first.committed and first.rows == 396
    history.append((first.snapshot_id, model.state()))

    merged, compacted = 0, set()
    for step in range(4):
        model.upsert(table, rng.choice(600, 60, replace=False), f"u{step}-", step * 7)
        model.update_scores(table, rng.choice(400, 30, replace=False), 900 + step)
        gone = rng.choice(400, 20, replace=False)
        model.delete(table, gone)
        model.upsert(table, gone[:5], f"back{step}-", step)  # deleted then upserted again in a round
        result = tierer.tier_now(table.path)
        assert result.committed and result.deleted > 0
        # Every changed bucket either got one delete file or was compacted.
        assert result.delete_files + len(result.compacted) == 4, result
        assert result.position_deletes > 0 or result.compacted
        merged += result.delete_files
        compacted.update(result.compacted)
        history.append((result.snapshot_id, model.state()))
    assert merged and compacted  # both paths ran

    assert rows_of(table.scan_table()) == model.state()
    current = read_lake(tierer.catalog, table.descriptor)
    assert rows_of(current) == model.state()  # one row per key, the KV's
    lake = tierer.catalog.load_table(table.path)
    assert committed_offsets(lake) == table.end_offsets()
    for snapshot_id, state in history:  # time travel: the table as it was at each tiered offset
        assert rows_of(read_lake(tierer.catalog, table.descriptor, snapshot_id=snapshot_id)) == state
    commits = lake_snapshots(tierer.catalog, table.descriptor)
    assert [c.snapshot_id for c in commits] == [s for s, _ in history]
    assert [c.total_rows for c in commits] == [len(state) for _, state in history]  # deletes subtracted
    # SQL sees the same through t$lake, time travel and t$lake$snapshots.
    executor = Executor(store, tierer.catalog, tierer)
    sql = lambda text: executor.execute_table(executor.plan(text))  # noqa: E731
    assert rows_of(sql("SELECT * FROM users$lake")) == model.state()
    for snapshot_id, state in history:
        assert rows_of(sql(f"SELECT * FROM users$lake FOR SYSTEM_TIME AS OF {snapshot_id}")) == state
    assert sql("SELECT total_rows FROM users$lake$snapshots").column("total_rows").to_pylist() == \
        [len(state) for _, state in history]
    # Meta columns: each row sits in its flightstore bucket; changelog rows carry their own offset.
    buckets = bucket_ids(current.select(["id"]), ["id"], 4)
    assert current.column(BUCKET_COLUMN).to_numpy().tolist() == buckets.tolist()
    log_rows = pa.concat_tables([pa.Table.from_batches(list(table.read_changelog(b)))
                                 for b in range(4)])
    latest = {}
    for row in log_rows.select(["id", "_change_type", "_log_offset"]).to_pylist():
        if row["_change_type"] != "-U":
            latest[row["id"]] = row["_log_offset"]
    tiered_by_changelog = current.filter(pc.greater_equal(current.column(OFFSET_COLUMN),
                                                          pa.scalar(max(first.end_offsets.values()))))
    for row in tiered_by_changelog.select(["id", OFFSET_COLUMN]).to_pylist():
        assert latest[row["id"]] == row[OFFSET_COLUMN]


def _files_by_bucket(lake) -> dict[int, set[str]]:
    files: dict[int, set[str]] = {}
    for task in lake.scan().plan_files():
        stats = task.file.lower_bounds
        field = lake.schema().find_field(BUCKET_COLUMN).field_id
        bucket = int.from_bytes(stats[field], "little", signed=True)
        files.setdefault(bucket, set()).add(task.file.file_path)
    return files


def _delete_files_by_bucket(lake) -> dict[int, set[str]]:
    """The position delete files that apply to each bucket's data files."""
    field = lake.schema().find_field(BUCKET_COLUMN).field_id
    files: dict[int, set[str]] = {}
    for task in lake.scan().plan_files():
        bucket = int.from_bytes(task.file.lower_bounds[field], "little", signed=True)
        files.setdefault(bucket, set()).update(f.file_path for f in task.delete_files)
    return files


def _bucket_keys(n: int, buckets: int, bucket: int) -> np.ndarray:
    ids = np.arange(n, dtype=np.int64)
    return ids[bucket_ids(pa.table({"id": ids}), ["id"], buckets) == bucket]


def test_a_round_deletes_by_position_in_the_changed_bucket_only(store, tierer):
    table = create_pk(store, buckets=4)
    model = Model()
    model.upsert(table, np.arange(2000), "a", 0)
    tierer.tier_now(table.path)
    lake = tierer.catalog.load_table(table.path)
    assert lake.metadata.format_version == 2
    before = _files_by_bucket(lake)
    in_bucket_1 = _bucket_keys(2000, 4, 1)
    model.upsert(table, in_bucket_1[:50], "changed", 5)
    model.update_scores(table, in_bucket_1[50:55], 77)
    model.delete(table, in_bucket_1[60:70])
    result = tierer.tier_now(table.path)
    assert (result.files_removed, result.delete_files, result.position_deletes, result.compacted) == (0, 1, 65, ())
    lake = lake.refresh()
    after = _files_by_bucket(lake)
    for bucket in (0, 2, 3):
        assert after[bucket] == before[bucket], f"bucket {bucket} was touched"
    assert before[1] < after[1]  # its old files stay, the 55 upserts are appended
    deletes = _delete_files_by_bucket(lake)
    assert not deletes[0] and not deletes[2] and not deletes[3] and len(deletes[1]) == 1
    # The delete file follows Iceberg's spec: file_path/pos with reserved ids, sorted.
    [location] = deletes[1]
    with lake.io.new_input(location).open() as stream:
        written = pq.read_table(stream)
    assert written.column_names == ["file_path", "pos"] and written.num_rows == 65
    assert [f.metadata[b"PARQUET:field_id"] for f in written.schema] == [b"2147483546", b"2147483545"]
    assert written.schema.field("pos").type == pa.int64()
    assert written.to_pylist() == sorted(written.to_pylist(), key=lambda r: (r["file_path"], r["pos"]))
    assert set(written.column("file_path").to_pylist()) <= before[1]
    summary = lake.current_snapshot().summary.additional_properties
    assert result.bytes_written == int(summary["added-files-size"]) == \
        sum(t.file.file_size_in_bytes for t in lake.scan().plan_files() if t.file.file_path not in
            set().union(*before.values())) + sum(f.file_size_in_bytes for t in lake.scan().plan_files()
                                                  for f in t.delete_files)
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
    # A second round in that bucket: its earlier deletes are respected (a key deleted before is
    # not found again), a new delete file is added beside the first.
    model.upsert(table, in_bucket_1[:10], "again", 9)
    model.delete(table, in_bucket_1[60:62])  # already deleted: nothing to delete in the lake
    second = tierer.tier_now(table.path)
    assert (second.delete_files, second.position_deletes, second.compacted) == (1, 10, ())
    assert len(_delete_files_by_bucket(lake.refresh())[1]) == 2
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
    # New keys only (nothing to delete): an append that touches no existing file.
    model.upsert(table, [5000, 5001], "new", 0)
    appended = tierer.tier_now(table.path)
    assert appended.files_removed == 0 and appended.delete_files == 0
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()


def test_a_bucket_past_its_delete_ratio_is_compacted(store, tierer):
    table = create_pk(store, buckets=2, **{"table.datalake.delete-compaction-ratio": "0.2"})
    model = Model()
    model.upsert(table, np.arange(1000), "a", 0)
    tierer.tier_now(table.path)
    in_bucket_0 = _bucket_keys(1000, 2, 0)
    live = len(in_bucket_0)
    first_batch = int(live * 0.15)  # 15% deleted: under the ratio, merge-on-read
    model.upsert(table, in_bucket_0[:first_batch], "b", 1)
    first = tierer.tier_now(table.path)
    assert (first.delete_files, first.compacted, first.files_removed) == (1, (), 0)
    before = _files_by_bucket(tierer.catalog.load_table(table.path))
    model.upsert(table, in_bucket_0[first_batch:2 * first_batch], "c", 2)  # 30% deleted: compact
    model.delete(table, in_bucket_0[-3:])
    second = tierer.tier_now(table.path)
    assert (second.delete_files, second.compacted) == ((0, (0,)))
    assert second.files_removed == len(before[0]) == 2  # the first file and the first round's upserts
    lake = tierer.catalog.load_table(table.path)
    after = _files_by_bucket(lake)
    deletes = _delete_files_by_bucket(lake)
    assert not deletes[0] and not deletes[1]  # bucket 0's delete file is gone with its data files
    assert not after[0] & before[0] and len(after[0]) == 1 and after[1] == before[1]
    summary = lake.current_snapshot().summary.additional_properties
    assert summary["total-position-deletes"] == "0" and summary["removed-position-delete-files"] == "1"
    assert sum(t.file.record_count for t in lake.scan().plan_files()) == len(model.rows)
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
    # Time travel to the merge-on-read snapshot still applies its delete file.
    assert len(read_lake(tierer.catalog, table.descriptor, snapshot_id=first.snapshot_id)) == 1000
    # The ratio changes live (ALTER TABLE SET): at 0, a single changed key compacts its bucket.
    store.alter_table(table.path, [SetOptions((("table.datalake.delete-compaction-ratio", "0"),))])
    model.upsert(table, _bucket_keys(1000, 2, 1)[:1], "d", 3)
    assert tierer.tier_now(table.path).compacted == (1,)
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()


def test_a_round_planned_on_a_stale_snapshot_does_not_commit(store, tierer):
    table = create_pk(store, buckets=2)
    model = Model()
    model.upsert(table, np.arange(200), "a", 0)
    tierer.tier_now(table.path)
    model.upsert(table, np.arange(0, 200, 10), "b", 1)
    stale = tierer.catalog.load_table(table.path)

    def another_tierer_commits_first() -> None:
        assert tier_round(table, tierer.catalog.load_table(table.path)).delete_files == 2

    # Its positions and offsets were planned on the old snapshot: it must not be rebased on the
    # new one (that would add the upserts twice).
    with pytest.raises(LakeUnavailable, match="changed since the round planned"):
        tier_round(table, stale, before_commit=another_tierer_commits_first)
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
    assert committed_offsets(tierer.catalog.load_table(table.path)) == table.end_offsets()


def test_a_format_version_1_lake_rewrites_only_the_files_of_changed_buckets(store, tierer):
    table = create_pk(store, buckets=4, **{"iceberg.format-version": "1"})
    model = Model()
    model.upsert(table, np.arange(2000), "a", 0)
    tierer.tier_now(table.path)
    assert tierer.catalog.load_table(table.path).metadata.format_version == 1
    in_bucket_1 = _bucket_keys(2000, 4, 1)
    before = _files_by_bucket(tierer.catalog.load_table(table.path))
    assert sorted(before) == [0, 1, 2, 3]
    model.upsert(table, in_bucket_1[:50], "changed", 5)
    model.delete(table, in_bucket_1[50:60])
    result = tierer.tier_now(table.path)
    assert result.files_removed == len(before[1]) and result.delete_files == 0
    after = _files_by_bucket(tierer.catalog.load_table(table.path))
    for bucket in (0, 2, 3):
        assert after[bucket] == before[bucket], f"bucket {bucket} was rewritten"
    assert not after[1] & before[1]
    assert result.bytes_written > 0
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
    # New keys only (nothing to delete): an append that touches no existing file.
    model.upsert(table, [5000, 5001], "new", 0)
    appended = tierer.tier_now(table.path)
    assert appended.files_removed == 0
    final = _files_by_bucket(tierer.catalog.load_table(table.path))
    assert all(after[b] <= final[b] for b in after)
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()


def test_changes_that_cancel_out_still_advance_the_offsets(store, tierer):
    table = create_pk(store)
    model = Model()
    model.upsert(table, np.arange(10), "a", 0)
    tierer.tier_now(table.path)
    model.upsert(table, [100, 101], "tmp", 0)
    model.delete(table, [100, 101])
    result = tierer.tier_now(table.path)
    assert result.committed and result.end_offsets == table.end_offsets()
    lake = tierer.catalog.load_table(table.path)
    assert committed_offsets(lake) == table.end_offsets()
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()


@pytest.mark.parametrize("merge_engine", ["first_row"])
def test_other_merge_engines_tier_what_the_kv_holds(store, tierer, merge_engine):
    table = store.create_table("default.fr", ROWS, primary_key=["id"], options={
        "bucket.num": 2, "table.datalake.enabled": "true", "table.merge-engine": merge_engine})
    Model().upsert(table, np.arange(50), "a", 0)
    tierer.tier_now(table.path)
    Model().upsert(table, np.arange(25, 75), "b", 1)
    tierer.tier_now(table.path)
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == rows_of(table.scan_table())


@pytest.mark.slow
def test_other_engines_read_the_lake_with_its_delete_files(store, tierer, settings, duckdb_python,  # noqa: F811
                                                           tmp_path):
    from pyiceberg.catalog import load_catalog
    table = create_pk(store, buckets=4, **{"table.datalake.delete-compaction-ratio": "0.3"})
    model = Model()
    rng = np.random.default_rng(11)
    model.upsert(table, np.arange(800), "a", 0)
    tierer.tier_now(table.path)
    kinds = set()
    for step in range(3):  # random keys: delete files in every bucket, then compaction
        model.upsert(table, rng.choice(900, 70, replace=False), f"s{step}-", step)
        model.delete(table, rng.choice(800, 20, replace=False))
        result = tierer.tier_now(table.path)
        kinds.update(["merge"] * bool(result.delete_files) + ["compact"] * bool(result.compacted))
        lake = tierer.catalog.load_table(table.path)
        ours = rows_of(read_lake(tierer.catalog, table.descriptor))
        assert ours == model.state()
        other = load_catalog("flightstore", type="sql", uri=settings.catalog_uri, warehouse=settings.warehouse)
        assert rows_of(other.load_table("default.users").scan().to_arrow()) == ours
        duck = _duckdb_rows(duckdb_python, tmp_path, lake.metadata_location, query=DUCKDB_PK_QUERY)
        assert duck == [[row["id"], row["name"], row["score"]] for row in ours]
    assert kinds == {"merge", "compact"}


DUCKDB_PK_QUERY = "SELECT id, name, score FROM iceberg_scan('{location}') ORDER BY id"


@pytest.mark.slow
def test_primary_key_tiering_with_the_warehouse_on_s3(data_dir, s3_options):
    from flightstore.lake import LakeSettings, LakeTierer
    from flightstore.store import Store
    with Store(data_dir) as store:
        tierer = LakeTierer(store, LakeSettings.from_options(data_dir, s3_options))
        table = create_pk(store, **{"table.datalake.delete-compaction-ratio": "1"})
        model = Model()
        model.upsert(table, np.arange(200), "a", 0)
        first = tierer.tier_now(table.path)
        before = model.state()
        model.upsert(table, np.arange(150, 260), "b", 1)
        model.update_scores(table, [1, 2, 3], 77)
        model.delete(table, [10, 11, 250])
        second = tierer.tier_now(table.path)
        assert second.files_removed == 0 and second.delete_files == 3 and second.deleted == 3
        assert tierer.catalog.load_table(table.path).location().startswith("s3://")
        assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state() == \
            rows_of(table.scan_table())
        assert rows_of(read_lake(tierer.catalog, table.descriptor, snapshot_id=first.snapshot_id)) == before
        tierer.stop()
