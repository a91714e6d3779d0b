"""The Spark tiering job: the same tiering core run by Spark against a real server (local mode), the
lease keeping it and the server's own tierer off each other's tables."""

from __future__ import annotations

import pyarrow as pa
import pytest

import flightstore
from flightstore.errors import TieringLeaseHeld
from flightstore.lake import LakeCatalog, LakeSettings, LakeTierer, read_lake
from flightstore.lake.offsets import committed_offsets
from flightstore_spark.pipelines.tiering import tier_tables
from tests.lake.conftest import EVENTS, events

pytestmark = pytest.mark.slow

PK = pa.schema([pa.field("k", pa.int64(), nullable=False), ("name", pa.string()), ("n", pa.int64())])


def test_the_job_tiers_log_and_primary_key_tables_like_the_server(spark, server):
    store = server.store
    log = store.create_table("default.events", EVENTS, options={
        "bucket.num": 3, "bucket.key": "k", "table.datalake.enabled": "true"})
    pk = store.create_table("default.users", PK, primary_key=["k"], options={
        "bucket.num": 2, "table.datalake.enabled": "true"})
    store.create_table("default.plain", EVENTS)  # not datalake-enabled: left alone
    with flightstore.connect(server.uri) as conn:
        conn.table("default.events").append(events(0, 500))
        conn.table("default.users").upsert(pa.table({"k": range(100), "name": [f"a{i}" for i in range(100)],
                                                     "n": range(100)}, schema=PK))
    settings = LakeSettings.from_options(store.data_dir)
    first = tier_tables(spark, server.uri, settings)
    assert sorted(first) == ["default.events", "default.users"]
    assert [r.rows for r in first["default.events"]] == [500]
    with flightstore.connect(server.uri) as conn:
        conn.table("default.events").append(events(500, 77))
        users = conn.table("default.users")
        users.upsert(pa.table({"k": [5, 500], "name": ["changed", "new"], "n": [-5, 500]}, schema=PK))
        users.upsert(pa.table({"k": [6], "n": [-6]}), columns=["k", "n"])
        users.delete(pa.table({"k": [7, 8]}))
    second = tier_tables(spark, server.uri, settings, ["default.events", "default.users"])
    assert second["default.users"][0].deleted == 2 and second["default.users"][0].files_removed >= 1
    catalog = LakeCatalog(settings)
    assert sorted(read_lake(catalog, log.descriptor, columns=["seq"]).column("seq").to_pylist()) == list(range(577))
    lake_users = read_lake(catalog, pk.descriptor, columns=PK.names).sort_by("k")
    assert lake_users.to_pylist() == pk.scan_table().sort_by("k").to_pylist()
    for table in (log, pk):
        assert committed_offsets(catalog.load_table(table.path)) == table.end_offsets()
    # The server's own tierer continues exactly where the job left off.
    pk.upsert(pa.table({"k": [9], "name": ["server"], "n": [9]}, schema=PK))
    tierer = LakeTierer(store, settings)
    assert tierer.tier_now(pk.path).rows == 1
    assert read_lake(catalog, pk.descriptor, columns=PK.names).sort_by("k").to_pylist() == \
        pk.scan_table().sort_by("k").to_pylist()
    # While the server holds the table's lease, the job refuses it clearly and tiers nothing.
    with flightstore.connect(server.uri) as conn:
        conn.table("default.users").upsert(pa.table({"k": [10], "name": ["x"], "n": [1]}, schema=PK))
    before = catalog.load_table(pk.path).current_snapshot().snapshot_id
    refused = tier_tables(spark, server.uri, settings, ["default.users"])
    assert isinstance(refused["default.users"], TieringLeaseHeld)
    assert "being tiered by server:" in str(refused["default.users"])
    assert catalog.load_table(pk.path).current_snapshot().snapshot_id == before
    tierer.stop()  # gives the lease back: the job may tier it again
    assert tier_tables(spark, server.uri, settings, ["default.users"])["default.users"][0].rows == 1
    catalog.reset()
