"""Tiering primary-key tables: a KV snapshot's rows first, then the changelog as upserts and deletes
that rewrite only the data files of the changed buckets. Checked against a Python model of the
table at every tiered offset (current snapshot and time travel)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightstore.bucketing import bucket_ids
from flightstore.lake import lake_snapshots, read_lake
from flightstore.lake.layout import BUCKET_COLUMN, OFFSET_COLUMN
from flightstore.lake.offsets import committed_offsets

ROWS = pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                  ("score", pa.int32()), ("ts", pa.timestamp("ms"))])
COLUMNS = ROWS.names


def create_pk(store, name: str = "default.users", buckets: int = 3):
    return store.create_table(name, ROWS, primary_key=["id"], options={
        "bucket.num": buckets, "table.datalake.enabled": "true"})


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
    table = create_pk(store)
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

    for step in range(3):
        model.upsert(table, rng.choice(600, 80, replace=False), f"u{step}-", step * 7)
        model.update_scores(table, rng.choice(400, 40, replace=False), 900 + step)
        gone = rng.choice(400, 30, replace=False)
        model.delete(table, gone)
        model.upsert(table, gone[:5], f"back{step}-", step)  # deleted then upserted again in a round
        result = tierer.tier_now(table.path)
        assert result.committed and result.deleted > 0 and result.files_removed > 0
        history.append((result.snapshot_id, model.state()))

    assert rows_of(table.scan_table()) == model.state()
    current = read_lake(tierer.catalog, table.descriptor)
    assert rows_of(current) == model.state()  # one row per key, the KV's
    lake = tierer.catalog.load_table(table.path)
    assert committed_offsets(lake) == table.end_offsets()
    for snapshot_id, state in history:  # time travel: the table as it was at each tiered offset
        assert rows_of(read_lake(tierer.catalog, table.descriptor, snapshot_id=snapshot_id)) == state
    commits = lake_snapshots(tierer.catalog, table.descriptor)
    assert [c.snapshot_id for c in commits] == [s for s, _ in history]
    # Meta columns: each row sits in its flightstore bucket; changelog rows carry their own offset.
    buckets = bucket_ids(current.select(["id"]), ["id"], 3)
    assert current.column(BUCKET_COLUMN).to_numpy().tolist() == buckets.tolist()
    log_rows = pa.concat_tables([pa.Table.from_batches(list(table.read_changelog(b)))
                                 for b in range(3)])
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


def test_a_round_rewrites_only_the_files_of_changed_buckets(store, tierer):
    table = create_pk(store, buckets=4)
    model = Model()
    model.upsert(table, np.arange(2000), "a", 0)
    tierer.tier_now(table.path)
    ids = np.arange(2000, dtype=np.int64)
    in_bucket_1 = ids[bucket_ids(pa.table({"id": ids}), ["id"], 4) == 1]
    before = _files_by_bucket(tierer.catalog.load_table(table.path))
    assert sorted(before) == [0, 1, 2, 3]
    model.upsert(table, in_bucket_1[:50], "changed", 5)
    model.delete(table, in_bucket_1[50:60])
    result = tierer.tier_now(table.path)
    assert result.files_removed == len(before[1])
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
def test_primary_key_tiering_with_the_warehouse_on_s3(data_dir, s3_options):
    from flightstore.lake import LakeSettings, LakeTierer
    from flightstore.store import Store
    with Store(data_dir) as store:
        tierer = LakeTierer(store, LakeSettings.from_options(data_dir, s3_options))
        table = create_pk(store)
        model = Model()
        model.upsert(table, np.arange(200), "a", 0)
        first = tierer.tier_now(table.path)
        before = model.state()
        model.upsert(table, np.arange(150, 260), "b", 1)
        model.update_scores(table, [1, 2, 3], 77)
        model.delete(table, [10, 11, 250])
        second = tierer.tier_now(table.path)
        assert second.files_removed > 0 and second.deleted == 3
        assert tierer.catalog.load_table(table.path).location().startswith("s3://")
        assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state() == \
            rows_of(table.scan_table())
        assert rows_of(read_lake(tierer.catalog, table.descriptor, snapshot_id=first.snapshot_id)) == before
        tierer.stop()
