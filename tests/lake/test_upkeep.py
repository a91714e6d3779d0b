"""The lake's upkeep: snapshot expiry (with the files only expired snapshots referenced) and orphan
files, run by the server's tierer after a round; reads of an expired snapshot fail cleanly."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.errors import LakeFileMissing, NotFound
from flightstore.lake import LakeSettings, LakeTierer, lake_snapshots, plan_lake_files, read_lake
from flightstore.lake.layout import lake_schema
from flightstore.lake.offsets import committed_offsets, tiering_snapshots
from flightstore.lake.read import read_data_files
from flightstore.lake.union import read_union, union_split
from flightstore.lake.upkeep import expirable, referenced_files, remove_orphans, upkeep
from flightstore.sql.execute import Executor
from tests.lake.conftest import LakeServer, create_events, events
from tests.lake.test_pk_tiering import COLUMNS, Model, create_pk, rows_of
from tests.waiting import distinct_millisecond

FAR_FUTURE_MS = int(time.time() * 1000) + 10**10
HOUR_MS = 3_600_000


def _seqs(table: pa.Table) -> list[int]:
    return sorted(table.column("seq").to_pylist())


def _files(lake_table) -> set[str]:
    """Every file under the lake table's location."""
    root = Path(lake_table.location().removeprefix("file://"))
    return {str(p) for p in root.rglob("*") if p.is_file()}


def _age(paths, ms: int) -> None:
    """Make ``paths`` look ``ms`` old (as files a round wrote long ago)."""
    then = time.time() - ms / 1000
    for path in paths:
        os.utime(path, (then, then))


@pytest.fixture
def keeper(store, data_dir):
    """A tierer that runs the lake upkeep after every round."""
    settings = LakeSettings.from_options(data_dir, {"datalake.maintenance.interval": "0"})
    tierer = LakeTierer(store, settings)
    yield tierer
    tierer.stop()


def _sql(store, tierer):
    executor = Executor(store, tierer.catalog, tierer)
    return lambda text: executor.execute_table(executor.plan(text))


def test_the_tierer_expires_old_snapshots_keeping_the_newest_and_what_rounds_resume_from(store, keeper):
    table = create_events(store, **{"table.datalake.snapshot.retention": "1ms",
                                    "table.datalake.snapshot.num-retained": "2"})
    ids, moments = [], []
    for first in range(0, 500, 100):
        table.append(events(first, 100))
        result = keeper.tier_now(table.path)
        ids.append(result.snapshot_id)
        moments.append(distinct_millisecond())  # earlier snapshots are past the retention next round
    last, error = keeper.last_upkeep(table.path)
    assert error is None and last is not None
    lake = keeper.catalog.load_table(table.path)
    # Only the newest two snapshots are live; each upkeep expired the one that fell out.
    assert [s.snapshot_id for s in lake.metadata.snapshots] == ids[-2:]
    assert [c.snapshot_id for c in lake_snapshots(keeper.catalog, table.descriptor)] == ids[-2:]
    assert last.expired_snapshots == (ids[-3],)
    assert last.files_removed and all(f.endswith(".avro") for f in last.files_removed)  # its manifest list
    # What rounds and union reads resume from still reads right; every row once.
    assert committed_offsets(lake) == table.end_offsets()
    assert _seqs(read_lake(keeper.catalog, table.descriptor)) == list(range(500))
    table.append(events(500, 7))
    assert keeper.tier_now(table.path).rows == 7
    assert _seqs(read_lake(keeper.catalog, table.descriptor)) == list(range(507))
    # Nothing unreferenced is left on disk.
    lake = keeper.catalog.load_table(table.path)
    assert _files(lake) - referenced_files(lake) == set()
    # $lake$snapshots lists only live snapshots; time travel to an expired one is NOT_FOUND.
    sql = _sql(store, keeper)
    live = [s.snapshot_id for s in lake.metadata.snapshots]
    assert sql("SELECT snapshot_id FROM events$lake$snapshots").column("snapshot_id").to_pylist() == live
    with pytest.raises(NotFound, match=f"no snapshot {ids[0]}"):
        sql(f"SELECT * FROM events$lake FOR SYSTEM_TIME AS OF {ids[0]}")
    with pytest.raises(NotFound, match="no snapshot at or before"):
        read_lake(keeper.catalog, table.descriptor, as_of_ms=moments[1])
    assert _seqs(read_lake(keeper.catalog, table.descriptor, as_of_ms=moments[4])) == list(range(500))
    assert _seqs(sql(f"SELECT seq FROM events$lake FOR SYSTEM_TIME AS OF {live[0]}")) == list(range(500))


def test_upkeep_runs_at_most_once_per_interval_and_keeps_young_snapshots(store, tierer):
    table = create_events(store, **{"table.datalake.snapshot.retention": "1ms"})
    for first in range(0, 300, 100):
        table.append(events(first, 100))
        tierer.tier_now(table.path)
        distinct_millisecond()
    # The default interval (1 h): only the upkeep after the first round ran (nothing to expire then).
    first, _ = tierer.last_upkeep(table.path)
    assert first is not None and first.expired_snapshots == ()
    assert len(tierer.catalog.load_table(table.path).metadata.snapshots) == 3
    # With the default retention (7 days), nothing young expires, whatever runs.
    lake = tierer.catalog.load_table(table.path)
    assert expirable(lake.metadata, int(time.time() * 1000), 7 * 86_400_000, 1) == []
    assert len(expirable(lake.metadata, FAR_FUTURE_MS, 7 * 86_400_000, 1)) == 2


def test_expiry_deletes_data_files_only_expired_snapshots_referenced(store, tierer):
    """A primary-key table rewritten copy-on-write: the old data files belong to old snapshots only;
    expiry deletes them, and a lake split planned on the old snapshot fails cleanly."""
    table = create_pk(store, buckets=2, **{"table.datalake.delete-compaction-ratio": "0"})
    model = Model()
    model.upsert(table, range(200), "a", 1)
    tierer.tier_now(table.path)
    planned = [task.file.file_path for task in plan_lake_files(tierer.catalog, table.descriptor)]
    old = tierer.catalog.load_table(table.path)
    old_snapshot = old.current_snapshot()
    model.upsert(table, range(0, 200, 3), "b", 2)
    tierer.tier_now(table.path)
    model.upsert(table, range(1, 200, 5), "c", 3)
    tierer.tier_now(table.path)
    lake = tierer.catalog.load_table(table.path)
    result = upkeep(lake, max_age_ms=HOUR_MS, num_retained=1, orphans_older_than_ms=HOUR_MS,
                    now_ms=FAR_FUTURE_MS)
    assert len(result.expired_snapshots) == 2 and old_snapshot.snapshot_id in result.expired_snapshots
    removed = {f.rsplit("/", 1)[-1] for f in result.files_removed}
    assert {p.rsplit("/", 1)[-1] for p in planned} <= removed  # every rewritten data file went
    for path in planned:
        assert not os.path.exists(path.removeprefix("file://"))
    lake = lake.refresh()
    assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
    assert _files(lake) - referenced_files(lake) == set()
    assert committed_offsets(lake) == table.end_offsets()
    # A Spark lake split planned before: a clear error, never a short answer.
    with pytest.raises(LakeFileMissing, match="expired meanwhile"):
        list(read_data_files(planned, {}, lake_schema(table.descriptor), COLUMNS))
    # A read still holding the expired snapshot: the same.
    from flightstore.lake.read import snapshot_batches
    with pytest.raises(LakeFileMissing, match=f"snapshot {old_snapshot.snapshot_id}"):
        list(snapshot_batches(old, old_snapshot, table.descriptor, COLUMNS))
    with pytest.raises(NotFound, match=f"no snapshot {old_snapshot.snapshot_id}"):
        read_lake(tierer.catalog, table.descriptor, snapshot_id=old_snapshot.snapshot_id)


def test_a_union_read_planned_on_a_snapshot_that_expires_fails_cleanly(store, tierer):
    table = create_events(store)
    table.append(events(0, 100))
    tierer.tier_now(table.path)
    split = union_split(tierer.catalog, table)
    table.append(events(100, 100))
    tierer.tier_now(table.path)
    lake = tierer.catalog.load_table(table.path)
    result = upkeep(lake, max_age_ms=HOUR_MS, num_retained=1, orphans_older_than_ms=HOUR_MS,
                    now_ms=FAR_FUTURE_MS)
    assert result.expired_snapshots == (split.snapshot.snapshot_id,)
    with pytest.raises(LakeFileMissing, match="run the read again"):
        list(read_union(tierer.catalog, table, ["seq"], split=split))
    # Planned again (what a plain SELECT does): every row once.
    rows = pa.Table.from_batches(list(read_union(tierer.catalog, table, ["seq"])))
    assert _seqs(rows) == list(range(200))
    assert [s.snapshot_id for s in tiering_snapshots(lake.refresh())] == [union_split(tierer.catalog, table)
                                                                           .snapshot.snapshot_id]


def test_orphans_of_a_round_that_died_before_its_commit_are_deleted_after_the_grace(store, data_dir):
    class Died(Exception):
        pass

    def die(phase: str) -> None:
        if phase == "after-write" and dying:
            raise Died(phase)

    dying = True
    settings = LakeSettings.from_options(data_dir, {"datalake.maintenance.interval": "0"})
    tierer = LakeTierer(store, settings, hook=die)
    try:
        table = create_events(store)
        table.append(events(0, 300))
        with pytest.raises(Exception, match="Died"):
            tierer.tier_now(table.path)
        lake = tierer.catalog.load_table(table.path)
        orphans = {f for f in _files(lake) if f.endswith(".parquet")}
        assert len(orphans) == 3  # one per bucket, referenced by nothing
        dying = False
        assert tierer.tier_now(table.path).rows == 300
        lake = lake.refresh()
        committed = {f for f in _files(lake) if f.endswith(".parquet")} - orphans
        assert len(committed) == 3
        # Young orphans survive the grace period (a round may be writing them right now).
        assert orphans <= _files(lake)
        _age(_files(lake), 2 * HOUR_MS)  # everything looks old: only what nothing references goes
        stray = Path(lake.location().removeprefix("file://")) / "data" / "stray.parquet"
        stray.write_bytes(b"not referenced")
        _age([stray], 2 * HOUR_MS)
        outside = data_dir / "lake" / "warehouse" / "outside.parquet"
        outside.write_bytes(b"not the table's")
        _age([outside], 2 * HOUR_MS)
        table.append(events(300, 10))
        assert tierer.tier_now(table.path).rows == 10
        last, error = tierer.last_upkeep(table.path)
        assert error is None
        assert set(last.orphans_removed) >= orphans | {str(stray)}
        assert not (set(last.orphans_removed) & referenced_files(lake.refresh()))
        assert not any(os.path.exists(f) for f in orphans) and not stray.exists()
        assert outside.exists()  # never outside the table's location
        assert committed <= _files(lake)
        assert _seqs(read_lake(tierer.catalog, table.descriptor)) == list(range(310))
    finally:
        tierer.stop()


def test_orphan_removal_spares_a_replaced_lake_table_at_the_same_location(store, tierer):
    table = create_events(store)
    table.append(events(0, 50))
    tierer.tier_now(table.path)
    old = tierer.catalog.load_table(table.path)
    store.drop_table(table.path)
    table = create_events(store)
    table.append(events(1000, 20))
    tierer.tier_now(table.path)
    new = tierer.catalog.load_table(table.path)
    replaced = [t for t in tierer.catalog.catalog.list_tables("default") if "__replaced_" in t[-1]]
    assert len(replaced) == 1
    assert new.location() == old.location()  # the replaced incarnation's files live in the same place
    _age(_files(new), 2 * HOUR_MS)
    removed = remove_orphans(new, HOUR_MS)
    assert not set(removed) & referenced_files(tierer.catalog.catalog.load_table(replaced[0]))
    assert sorted(tierer.catalog.catalog.load_table(replaced[0]).scan().to_arrow()
                  .column("seq").to_pylist()) == list(range(50))
    assert _seqs(read_lake(tierer.catalog, table.descriptor)) == list(range(1000, 1020))


def test_expiry_keeps_the_chain_back_to_the_newest_tiering_snapshot(store, tierer):
    """Another writer's snapshot on top (compaction, maintenance): the tiering snapshot under it,
    whose offsets the next round resumes from, is never expired, so nothing is tiered twice."""
    table = create_events(store)
    for first in range(0, 300, 100):
        table.append(events(first, 100))
        tierer.tier_now(table.path)
    lake = tierer.catalog.load_table(table.path)
    tiering = [s.snapshot_id for s in lake.metadata.snapshots]
    lake.append(lake_schema(table.descriptor).empty_table())  # a snapshot no tierer wrote
    lake = lake.refresh()
    foreign = lake.current_snapshot().snapshot_id
    assert foreign not in tiering
    assert sorted(expirable(lake.metadata, FAR_FUTURE_MS, HOUR_MS, 1)) == sorted(tiering[:2])
    upkeep(lake, max_age_ms=HOUR_MS, num_retained=1, orphans_older_than_ms=HOUR_MS, now_ms=FAR_FUTURE_MS)
    lake = lake.refresh()
    assert [s.snapshot_id for s in lake.metadata.snapshots] == [tiering[-1], foreign]
    assert committed_offsets(lake) == table.end_offsets()
    table.append(events(300, 5))
    assert tierer.tier_now(table.path).rows == 5
    assert _seqs(read_lake(tierer.catalog, table.descriptor)) == list(range(305))


def test_upkeep_with_the_warehouse_on_s3(data_dir, s3_options):
    from flightstore.store import Store
    with Store(data_dir) as store:
        tierer = LakeTierer(store, LakeSettings.from_options(data_dir, s3_options))
        try:
            table = create_pk(store, buckets=2, **{"table.datalake.delete-compaction-ratio": "0"})
            model = Model()
            model.upsert(table, range(100), "a", 1)
            tierer.tier_now(table.path)
            planned = [task.file.file_path for task in plan_lake_files(tierer.catalog, table.descriptor)]
            model.upsert(table, range(0, 100, 2), "b", 2)
            tierer.tier_now(table.path)
            lake = tierer.catalog.load_table(table.path)
            assert lake.location().startswith("s3://")
            stray = f"{lake.location()}/data/stray.parquet"
            with lake.io.new_output(stray).create() as out:
                out.write(b"not referenced")
            result = upkeep(lake, max_age_ms=HOUR_MS, num_retained=1, orphans_older_than_ms=HOUR_MS,
                            now_ms=FAR_FUTURE_MS)
            assert len(result.expired_snapshots) == 1
            assert not any(lake.io.new_input(path).exists() for path in planned)
            assert not lake.io.new_input(stray).exists()
            assert any(path.endswith("/data/stray.parquet") for path in result.orphans_removed)
            lake = lake.refresh()
            assert all(lake.io.new_input(task.file.file_path).exists()
                       for task in plan_lake_files(tierer.catalog, table.descriptor))
            assert rows_of(read_lake(tierer.catalog, table.descriptor)) == model.state()
            io = {k: v for k, v in lake.io.properties.items() if k.startswith("s3.")}
            with pytest.raises(LakeFileMissing, match="expired meanwhile"):
                list(read_data_files(planned, io, lake_schema(table.descriptor), COLUMNS))
        finally:
            tierer.stop()


def test_the_upkeep_shows_in_lake_status(store, keeper):
    table = create_events(store, **{"table.datalake.snapshot.retention": "1ms"})
    sql = _sql(store, keeper)
    table.append(events(0, 10))
    keeper.tier_now(table.path)
    status = sql("SELECT last_upkeep, upkeep_expired_snapshots, upkeep_removed_files, upkeep_error "
                 "FROM events$lake$status").to_pylist()
    assert len(status) == 3 and status[0]["last_upkeep"] is not None
    assert status[0]["upkeep_expired_snapshots"] == 0 and status[0]["upkeep_error"] is None
    distinct_millisecond()
    table.append(events(10, 10))
    keeper.tier_now(table.path)
    last, _ = keeper.last_upkeep(table.path)
    status = sql("SELECT last_upkeep, upkeep_expired_snapshots, upkeep_removed_files FROM events$lake$status")
    assert status.column("upkeep_expired_snapshots").to_pylist() == [1] * 3
    assert status.column("upkeep_removed_files").to_pylist() == [len(last.files_removed)] * 3
    assert last.files_removed
    assert round(status.column("last_upkeep")[0].as_py().timestamp() * 1000) == last.ran_at_ms
    assert keeper.status(table.path).to_dict()["upkeep_expired_snapshots"] == 1


def test_metadata_files_past_the_metadata_log_are_removed_as_orphans(store, tierer):
    table = create_events(store, **{"iceberg.write.metadata.previous-versions-max": "2"})
    for first in range(0, 60, 10):
        table.append(events(first, 10))
        tierer.tier_now(table.path)
    lake = tierer.catalog.load_table(table.path)
    metadata = {f for f in _files(lake) if f.endswith(".metadata.json")}
    assert len(metadata) > 3
    kept = {lake.metadata_location.removeprefix("file://")} | \
        {e.metadata_file.removeprefix("file://") for e in lake.metadata.metadata_log}
    assert len(kept) == 3
    _age(_files(lake), 2 * HOUR_MS)
    removed = remove_orphans(lake, HOUR_MS)
    assert set(removed) == metadata - kept  # nothing else: every other file is referenced
    assert {f for f in _files(lake) if f.endswith(".metadata.json")} == kept
    assert _seqs(read_lake(tierer.catalog, table.descriptor)) == list(range(60))
    assert [c.added_rows for c in lake_snapshots(tierer.catalog, table.descriptor)] == [10] * 6


def test_the_servers_tierer_expires_snapshots_and_flight_answers_not_found(data_dir):
    import flightstore
    from tests.waiting import wait_until

    settings = LakeSettings.from_options(data_dir, {"datalake.maintenance.interval": "0"})
    running = LakeServer(data_dir, settings)
    server = running.server
    try:
        with flightstore.connect(server.uri, timeout=60) as conn:
            conn.sql("CREATE TABLE events (k BIGINT, seq BIGINT, s STRING, ts TIMESTAMP(3)) WITH "
                     "('bucket.num' = '2', 'bucket.key' = 'k', 'table.datalake.enabled' = 'true', "
                     "'table.datalake.freshness' = '200ms', 'table.datalake.snapshot.retention' = '1ms')")
            client = conn.table("default.events")

            def snapshot_ids() -> list[int]:
                return conn.sql("SELECT snapshot_id FROM events$lake$snapshots").column(0).to_pylist()

            def lake_rows() -> int:
                return conn.sql("SELECT COUNT(*) AS n FROM events$lake").column(0).to_pylist()[0]

            client.append(events(0, 50))
            wait_until(lambda: lake_rows() == 50, "the first rows in the lake", timeout=60)
            first = snapshot_ids()[-1]
            for batch in (1, 2):
                client.append(events(batch * 50, 50))
                wait_until(lambda: lake_rows() == (batch + 1) * 50, "the rows in the lake", timeout=60)
            wait_until(lambda: first not in snapshot_ids(), "the first snapshot expiring", timeout=60)
            with pytest.raises(pa.ArrowKeyError, match=f"no snapshot {first}"):  # NOT_FOUND
                conn.sql(f"SELECT * FROM events$lake FOR SYSTEM_TIME AS OF {first}")
            assert _seqs(conn.sql("SELECT seq FROM events")) == list(range(150))
            status = conn.lake_status("default.events")[0]
            assert status["upkeep_error"] is None and status["last_upkeep_ms"] is not None
    finally:
        running.stop()


def test_the_retention_can_change_live(store, keeper):
    from flightstore.alter import SetOptions
    table = create_events(store)  # the default retention: 7 days
    for first in range(0, 30, 10):
        table.append(events(first, 10))
        keeper.tier_now(table.path)
        distinct_millisecond()
    assert len(keeper.catalog.load_table(table.path).metadata.snapshots) == 3
    store.alter_table(table.path, [SetOptions((("table.datalake.snapshot.retention", "1ms"),))])
    table = store.table(table.path)
    table.append(events(30, 10))
    keeper.tier_now(table.path)
    lake = keeper.catalog.load_table(table.path)
    assert [s.snapshot_id for s in lake.metadata.snapshots] == [lake.current_snapshot().snapshot_id]
    assert _seqs(read_lake(keeper.catalog, table.descriptor)) == list(range(40))
