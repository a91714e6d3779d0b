"""Tiering rounds of log tables against a real pyiceberg SQL catalog and real Parquet files."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitFailedException

from flightstore.errors import DataLoss, LakeUnavailable
from flightstore.lake import LakeCatalog, LakeTierer, lake_snapshots, read_lake, tier_log_round
from flightstore.lake.offsets import OFFSETS_PROPERTY, committed_offsets
from tests.lake.conftest import EVENTS, create_events, events, lake_seqs


def test_rounds_tier_every_row_once_and_record_offsets(store, tierer):
    table = create_events(store)
    table.append(events(0, 500))
    first = tierer.tier_now(table.path)
    assert first.committed and first.rows == 500
    assert first.end_offsets == table.end_offsets()
    table.append(events(500, 300))
    table.append(events(800, 1))
    second = tierer.tier_now(table.path)
    assert second.start_offsets == first.end_offsets and second.rows == 301
    assert lake_seqs(tierer.catalog, table) == list(range(801))
    # Each commit's summary records every bucket's offset; the lake's offsets are the log's end.
    lake = tierer.catalog.load_table(table.path)
    assert committed_offsets(lake) == table.end_offsets()
    commits = lake_snapshots(tierer.catalog, table.descriptor)
    assert [c.added_rows for c in commits] == [500, 301]
    assert [c.offsets for c in commits] == [first.end_offsets, second.end_offsets]
    # Nothing new: no commit, same offsets.
    idle = tierer.tier_now(table.path)
    assert not idle.committed and idle.rows == 0 and idle.snapshot_id == second.snapshot_id
    assert len(lake_snapshots(tierer.catalog, table.descriptor)) == 2


def test_lake_rows_equal_the_log_with_offsets_and_timestamps(store, tierer):
    table = create_events(store)
    for first in range(0, 400, 100):
        table.append(events(first, 100))
    tierer.tier_now(table.path)
    lake = read_lake(tierer.catalog, table.descriptor).sort_by([("__bucket", "ascending"),
                                                                ("__offset", "ascending")])
    expected = []
    for bucket in range(table.num_buckets):
        for bucket_batch in table.read_changelog(bucket):
            rows = bucket_batch.to_pylist()
            for row in rows:
                expected.append({**{c: row[c] for c in EVENTS.names}, "__bucket": bucket,
                                 "__offset": row["_log_offset"],
                                 "__timestamp": row["_commit_timestamp"]})
    assert lake.to_pylist() == expected
    assert lake.schema.field("ts").type == pa.timestamp("ms")  # the table's own types come back


def test_next_round_starts_from_the_last_committed_snapshot_not_from_memory(store, settings):
    """A second tierer (another process, a restart) continues where the lake says, exactly."""
    table = create_events(store)
    table.append(events(0, 200))
    LakeTierer(store, settings).tier_now(table.path)
    table.append(events(200, 50))
    fresh = LakeTierer(store, settings)
    result = fresh.tier_now(table.path)
    assert result.rows == 50
    assert lake_seqs(fresh.catalog, table) == list(range(250))
    fresh.stop()


def test_a_backlog_larger_than_a_round_takes_several_commits(store, data_dir):
    from flightstore.lake import LakeSettings
    settings = LakeSettings.from_options(data_dir, {"datalake.tiering.max-round-rows": "120"})
    tierer = LakeTierer(store, settings)
    table = create_events(store)
    for first in range(0, 1000, 50):
        table.append(events(first, 50))
    rounds = []
    while True:
        result = tierer.tier_now(table.path)
        if not result.committed:
            break
        assert result.rows <= 120 + 50  # a round stops after the record that reaches the budget
        rounds.append(result)
    assert len(rounds) >= 1000 // 170 and rounds[-1].backlog_left is False
    assert all(r.backlog_left for r in rounds[:-1])
    assert lake_seqs(tierer.catalog, table) == list(range(1000))
    tierer.stop()


def test_two_tierers_racing_on_one_base_commit_once(store, settings):
    """Even without the lease, a commit asserts its base snapshot: the loser fails, no row doubles."""
    table = create_events(store)
    table.append(events(0, 100))
    catalog = LakeCatalog(settings)
    lake = catalog.ensure_table(table.descriptor, table.directory.name)
    stale = catalog.load_table(table.path)  # loaded before the other commit
    tier_log_round(table, lake)
    table.append(events(100, 10))

    def refresh_is_too_late(phase: str) -> None:
        if phase == "before-write":  # the other tierer commits while this one writes
            tier_log_round(table, catalog.load_table(table.path))

    stale.refresh = lambda: stale  # this tierer does not see the newer snapshot
    with pytest.raises(LakeUnavailable) as failure:
        tier_log_round(table, stale, hook=refresh_is_too_late)
    assert isinstance(failure.value.__cause__, CommitFailedException)
    assert lake_seqs(catalog, table) == list(range(110))


def test_rows_expired_before_tiering_are_reported_not_skipped(store, tierer):
    table = create_events(store, table_log_segment_bytes=1024)
    for first in range(0, 300, 30):
        table.append(events(first, 30))
    tierer.tier_now(table.path)
    # Pretend the lake is behind a log whose old segments are gone (the guard prevents this).
    lake = tierer.catalog.load_table(table.path)
    with lake.transaction() as transaction:
        transaction.append(pa.Table.from_batches([], schema=lake.schema().as_arrow()),
                           snapshot_properties={OFFSETS_PROPERTY: '{"0": 0, "1": 0, "2": 0}'})
    table.retention_floor = None
    for log in table.logs:
        log.ttl_ms = 1
        log.enforce_retention(now_ms=2**62)
    assert any(log.start_offset > 0 for log in table.logs)
    with pytest.raises(DataLoss, match="deleted before they were tiered"):
        tierer.tier_now(table.path)
    assert "DataLoss" in tierer.status(table.path).last_error


def test_a_recreated_table_gets_a_new_lake_table_and_the_old_one_is_kept(store, tierer):
    table = create_events(store)
    table.append(events(0, 20))
    tierer.tier_now(table.path)
    old_id = table.directory.name
    store.drop_table(table.path)
    table = create_events(store)
    table.append(events(1000, 5))
    tierer.tier_now(table.path)
    assert lake_seqs(tierer.catalog, table) == list(range(1000, 1005))
    names = tierer.catalog.catalog.list_tables("default")
    replaced = ("default", f"events__replaced_{old_id.replace('-', '_')}")
    assert replaced in names
    old = tierer.catalog.catalog.load_table(replaced)
    assert sorted(old.scan(selected_fields=("seq",)).to_arrow().column("seq").to_pylist()) == list(range(20))
