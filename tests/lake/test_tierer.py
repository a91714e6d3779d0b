"""The server tiers by itself: background rounds per datalake-enabled table, freshness, leases,
status, and the retention guard (untiered records are never deleted)."""

from __future__ import annotations

import time

import pytest

import flightstore
from flightstore.errors import TieringLeaseHeld
from flightstore.lake import LakeCatalog, LakeTierer, LeaseStore
from tests.lake.conftest import LakeServer, create_events, events, lake_seqs
from tests.waiting import wait_until


@pytest.fixture
def lake_server(data_dir, settings):
    running = LakeServer(data_dir, settings)
    yield running
    running.stop()


def test_the_server_tiers_written_rows_by_itself(lake_server, settings):
    with flightstore.connect(lake_server.uri, timeout=60) as conn:
        conn.sql("CREATE TABLE events (k BIGINT, seq BIGINT, s STRING, ts TIMESTAMP(3)) WITH "
                 "('bucket.num' = '3', 'bucket.key' = 'k', 'table.datalake.enabled' = 'true', "
                 "'table.datalake.freshness' = '200ms')")
        conn.sql("CREATE TABLE plain (k BIGINT, seq BIGINT, s STRING, ts TIMESTAMP(3))")
        events_client, plain = conn.table("default.events"), conn.table("default.plain")
        for first in range(0, 3000, 500):
            events_client.append(events(first, 500))
            plain.append(events(first, 500))
        table = lake_server.store.table("default.events")
        catalog = LakeCatalog(settings)
        wait_until(lambda: lake_seqs(catalog, table) == list(range(3000)), "every row in the lake")
        events_client.append(events(3000, 7))
        wait_until(lambda: lake_seqs(catalog, table) == list(range(3007)), "the new rows in the lake")
        # Only datalake-enabled tables are tiered.
        assert ("default", "plain") not in catalog.catalog.list_tables("default")
        # The status over Flight (what `flightstore lake status` prints).
        (status,) = conn.lake_status("default.events")
        assert status["lag_records"] == 0 and status["last_error"] is None
        assert [b["tiered_offset"] for b in status["buckets"]] == list(table.end_offsets().values())
        assert status["last_commit_ms"] <= time.time() * 1000
        assert [s["table"] for s in conn.lake_status()] == ["default.events"]


def test_cli_lake_status_prints_every_bucket(lake_server):
    import subprocess
    import sys
    table = create_events(lake_server.store)
    table.append(events(0, 100))
    lake_server.server.tierer.wake()
    wait_until(lambda: lake_server.server.tierer.status(table.path).lag_records == 0, "tiering")
    table.append(events(100, 5))
    out = subprocess.run([sys.executable, "-m", "flightstore", "lake", "status", "--uri", lake_server.uri],
                         check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("table\tbucket\ttiered_offset\tlog_end_offset\tlag_records")
    rows = [line.split("\t") for line in lines[1:]]
    assert [r[1] for r in rows] == ["0", "1", "2"]
    assert sum(int(r[4]) for r in rows) in (0, 5)  # the server may have tiered the 5 rows already


def test_freshness_sets_how_often_a_table_is_tiered(store, tierer):
    slow = create_events(store, "default.slow", table_datalake_freshness="1h")
    fast = create_events(store, "default.fast", table_datalake_freshness="100ms")
    slow.append(events(0, 10))
    fast.append(events(0, 10))
    first = {r.path.table: r.rows for r in tierer.run_due()}
    assert first == {"slow": 10, "fast": 10}  # every table is due at start
    slow.append(events(10, 5))
    fast.append(events(10, 5))
    wait_until(lambda: any(r.path.table == "fast" and r.rows == 5 for r in tierer.run_due()),
               "the fast table's next round")
    # The slow table is not due for an hour: its rows wait in the log, visible as lag.
    assert lake_seqs(tierer.catalog, slow) == list(range(10))
    assert tierer.status(slow.path).lag_records == 5
    assert tierer.status(fast.path).lag_records == 0


def test_a_round_asked_for_if_due_is_skipped_after_another_round_ran(store, tierer):
    """The background pass checks a table is due before it waits for the round lock; it asks for
    its round ``if_due``, re-checked under that lock, so a round a caller ran meanwhile is not
    followed at once by a second one cutting the rows written since into a round of their own."""
    table = create_events(store, "default.once", table_datalake_freshness="1h")
    table.append(events(0, 10))
    assert tierer.tier_now(table.path, if_due=True).rows == 10  # a new table is due at once
    table.append(events(10, 5))
    assert tierer.tier_now(table.path, if_due=True) is None  # tiered just now: due in an hour
    assert tierer.status(table.path).lag_records == 5
    assert tierer.tier_now(table.path).rows == 5  # a caller's round runs whatever the schedule


def test_a_second_tierer_is_refused_by_the_lease_with_a_clear_error(store, settings):
    table = create_events(store)
    table.append(events(0, 50))
    server = LakeTierer(store, settings)
    job = LakeTierer(store, settings, holder="spark:tiering-job-1")
    server.tier_now(table.path)
    table.append(events(50, 50))
    with pytest.raises(TieringLeaseHeld, match="being tiered by server:.*lease until"):
        job.tier_now(table.path)
    assert "TieringLeaseHeld" in job.status(table.path).last_error
    assert lake_seqs(server.catalog, table) == list(range(50))
    # Once the server stops (and gives its leases back) the job takes over.
    server.stop()
    assert job.tier_now(table.path).rows == 50
    assert lake_seqs(job.catalog, table) == list(range(100))
    job.stop()


def test_leases_expire_and_are_renewed_by_their_holder(settings):
    catalog = LakeCatalog(settings)
    leases = LeaseStore(catalog.catalog.engine)
    first = leases.acquire("db.t", "a", ttl_ms=1000, now_ms=10_000)
    assert first.expires_at_ms == 11_000
    assert leases.acquire("db.t", "a", ttl_ms=1000, now_ms=10_500).expires_at_ms == 11_500  # renewal
    with pytest.raises(TieringLeaseHeld, match="being tiered by a"):
        leases.acquire("db.t", "b", ttl_ms=1000, now_ms=11_499)
    assert leases.acquire("db.t", "b", ttl_ms=1000, now_ms=11_501).holder == "b"  # a's lease expired
    with pytest.raises(TieringLeaseHeld):
        leases.acquire("db.t", "a", ttl_ms=1000, now_ms=11_600)
    leases.release("db.t", "a")  # not a's to release
    assert leases.current("db.t").holder == "b"
    leases.release("db.t", "b")
    assert leases.current("db.t") is None
    assert leases.acquire("db.t", "a", ttl_ms=1000, now_ms=11_700).holder == "a"


def test_retention_never_deletes_untiered_records(store, tierer):
    table = create_events(store, table_log_ttl="1ms", table_log_segment_bytes=4096)
    for first in range(0, 2000, 100):
        table.append(events(first, 100))
    assert all(len(log._segments) > 2 for log in table.logs)
    far_future = int(time.time() * 1000) + 10**9
    # Nothing is tiered: every record has expired, none may be deleted.
    assert store.enforce_retention(far_future) == 0
    assert table.start_offsets() == {0: 0, 1: 0, 2: 0}
    tiered = tierer.tier_now(table.path).end_offsets
    for first in range(2000, 2500, 100):
        table.append(events(first, 100))  # untiered, in the newest segments
    dropped = store.enforce_retention(far_future)
    assert dropped > 0
    for bucket, log in enumerate(table.logs):
        assert 0 < log.start_offset <= tiered[bucket], "retention deleted untiered records"
    # Every row is still somewhere: the lake below the tiered offsets, the log from there on.
    tierer.tier_now(table.path)
    assert lake_seqs(tierer.catalog, table) == list(range(2500))
    # Once tiered, the rest may go too (all but each log's active segment).
    store.enforce_retention(far_future)
    assert all(log.start_offset > tiered[b] for b, log in enumerate(table.logs))


def test_retention_of_other_tables_is_unchanged(store):
    table = store.create_table("default.plain", events(0, 1).schema,
                               options={"table.log.ttl": "1ms", "table.log.segment.bytes": "4096"})
    for first in range(0, 1000, 100):
        table.append(events(first, 100))
    assert store.enforce_retention(int(time.time() * 1000) + 10**9) > 0


def _tiered_by_a_job(store, data_dir, path) -> None:
    """One round by another tierer (as the Spark job does: its own holder, same core)."""
    from flightstore.lake import LakeSettings
    job = LakeTierer(store, LakeSettings.from_options(data_dir), holder="spark-job:test")
    job.tier_now(path)
    job.stop()


def test_with_tiering_off_the_server_follows_a_jobs_commits_for_retention_and_status(store, data_dir):
    from flightstore.lake import LakeSettings
    following = LakeTierer(store, LakeSettings.from_options(data_dir, {"datalake.tiering.enabled": "false"}))
    table = create_events(store, table_log_segment_bytes=1024, table_log_ttl="1ms")
    for first in range(0, 300, 30):
        table.append(events(first, 30))
    assert not following.tier_now(table.path).committed  # it tiers nothing itself
    assert following.status(table.path).buckets[0].tiered_offset is None
    table.enforce_retention(now_ms=2**62)
    assert table.start_offsets() == {0: 0, 1: 0, 2: 0}  # nothing tiered: nothing deleted
    _tiered_by_a_job(store, data_dir, table.path)
    tiered = table.end_offsets()
    for first in range(300, 600, 30):
        table.append(events(first, 30))
    status = following.status(table.path)  # asks the lake: the job's offsets at once
    assert {b.bucket: b.tiered_offset for b in status.buckets} == tiered and status.lag_records == 300
    following.tier_now(table.path)  # its rounds do the same in the background
    table.enforce_retention(now_ms=2**62)
    starts = table.start_offsets()
    assert any(starts[b] > 0 for b in starts) and all(starts[b] <= tiered[b] for b in starts)
    _tiered_by_a_job(store, data_dir, table.path)
    assert lake_seqs(following.catalog, table) == list(range(600))  # nothing the job needed was gone
    following.stop()


def test_a_tierer_refused_by_the_lease_still_lets_tiered_records_go(store, settings):
    table = create_events(store, table_log_segment_bytes=1024, table_log_ttl="1ms")
    for first in range(0, 300, 30):
        table.append(events(first, 30))
    job = LakeTierer(store, settings, holder="spark-job:test")
    job.tier_now(table.path)  # and keeps the lease
    server_tierer = LakeTierer(store, settings)
    with pytest.raises(TieringLeaseHeld):
        server_tierer.tier_now(table.path)
    tiered = table.end_offsets()
    table.retention_floor = None
    with pytest.raises(TieringLeaseHeld):
        server_tierer.tier_now(table.path)
    assert table.retention_floor == tiered
    job.stop()
    server_tierer.stop()
