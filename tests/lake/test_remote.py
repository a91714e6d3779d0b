"""Tiering rounds reading a table through a server's Flight API (what the Spark job runs), with a
row budget: every round ends on a record boundary and leaves the lake equal to the KV at its
committed offsets; the result equals tiering from the store."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightstore
from flightstore.lake import LakeCatalog, LakeSettings, read_lake, tier_round
from flightstore.lake.offsets import committed_offsets
from flightstore.lake.remote import FlightSource
from tests.server.conftest import RunningServer

PK = pa.schema([pa.field("k", pa.int64(), nullable=False), ("name", pa.string()), ("n", pa.int64())])


@pytest.fixture
def server(tmp_path):
    running = RunningServer(tmp_path / "data")
    yield running
    running.stop()


def test_remote_rounds_with_a_budget_keep_the_lake_equal_to_the_kv(server):
    rng = random.Random(31)
    table = server.store.create_table("default.accounts", PK, primary_key=["k"], options={
        "bucket.num": 3, "table.datalake.enabled": "true"})
    catalog = LakeCatalog(LakeSettings.from_options(server.store.data_dir))
    lake_table = catalog.ensure_table(table.descriptor, table.directory.name)
    with flightstore.connect(server.uri) as conn:
        for step in range(4):
            keys = rng.sample(range(600), 200)
            table.upsert(pa.table({"k": keys, "name": [f"s{step}"] * 200, "n": keys}, schema=PK))
            table.upsert(pa.table({"k": keys[:20], "n": [-1] * 20}), columns=["k", "n"])
            table.delete(pa.table({"k": rng.sample(range(600), 30)}))
            rounds = 0
            while True:
                result = tier_round(FlightSource(conn, "default.accounts"), lake_table, max_rows=90)
                rounds += 1
                offsets = committed_offsets(lake_table.refresh())
                lake = read_lake(catalog, table.descriptor)
                for bucket in range(3):
                    mine = lake.filter(pc.equal(lake.column("__bucket"), bucket)).select(PK.names)
                    kv = pa.Table.from_batches(list(table.rows_at(bucket, offsets[bucket])), schema=PK)
                    assert mine.sort_by("k").to_pylist() == kv.sort_by("k").to_pylist()
                if not result.backlog_left:
                    break
            assert step == 0 or rounds >= 2  # the budget split the changelog into several rounds
    assert committed_offsets(lake_table.refresh()) == table.end_offsets()
    assert read_lake(catalog, table.descriptor, columns=PK.names).sort_by("k").to_pylist() == \
        table.scan_table().sort_by("k").to_pylist()
    catalog.reset()


def test_describe_gives_a_tiering_job_the_descriptor_incarnation_and_offsets(server):
    from flightstore.schema import TableDescriptor
    table = server.store.create_table("default.accounts", PK, primary_key=["k"], options={
        "bucket.num": 2, "table.datalake.enabled": "true"})
    table.upsert(pa.table({"k": [1, 2, 3], "name": ["a", "b", "c"], "n": [1, 2, 3]}, schema=PK))
    with flightstore.connect(server.uri) as conn:
        described = conn.table("default.accounts").describe()
        assert TableDescriptor.from_json(described["descriptor"]) == table.descriptor
        assert described["table_id"] == table.directory.name
        assert described["end_offsets"] == table.end_offsets()
        assert described["start_offsets"] == table.start_offsets()
        assert "flightstore.describe" in [a.type for a in conn._client.list_actions(conn._options)]
        with pytest.raises(pa.ArrowKeyError, match="nope"):
            conn.table("default.nope").describe()
