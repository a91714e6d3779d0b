"""The lake goes away (warehouse not writable, catalog unreachable, object storage down) while
clients keep writing: writes and reads of fresh data go on, tiering retries with backoff, the lag
is visible in the status, and once the lake is back every row is tiered exactly once."""

from __future__ import annotations

import os
import threading

import pytest

import flightstore
from flightstore.lake import LakeCatalog, LakeSettings
from tests.lake.conftest import LakeServer, events, lake_seqs
from tests.waiting import wait_until


def _break_warehouse(data_dir):
    """A file where the warehouse directory was: nothing can be written (or read) under it."""
    warehouse = data_dir / "lake" / "warehouse"
    os.rename(warehouse, warehouse.with_name("warehouse.away"))
    warehouse.write_text("not a directory")

    def restore() -> None:
        warehouse.unlink()
        os.rename(warehouse.with_name("warehouse.away"), warehouse)
    return restore


def _break_catalog(data_dir):
    """A directory where the catalog database was: sqlite cannot open (or create) it."""
    catalog = data_dir / "lake" / "catalog.db"
    os.rename(catalog, catalog.with_name("catalog.db.away"))
    catalog.mkdir()

    def restore() -> None:
        catalog.rmdir()
        os.rename(catalog.with_name("catalog.db.away"), catalog)
    return restore


def _outage(data_dir, settings, breaker):
    server = LakeServer(data_dir, settings)
    tierer = server.server.tierer
    catalog = LakeCatalog(settings)
    try:
        with flightstore.connect(server.uri, timeout=60) as conn:
            conn.sql("CREATE TABLE events (k BIGINT, seq BIGINT, s STRING, ts TIMESTAMP(3)) WITH "
                     "('bucket.num' = '3', 'bucket.key' = 'k', 'table.datalake.enabled' = 'true', "
                     "'table.datalake.freshness' = '100ms')")
            client = conn.table("default.events")
            client.append(events(0, 300))
            table = server.store.table("default.events")
            wait_until(lambda: lake_seqs(catalog, table) == list(range(300)), "the first rows tiered")
            restore = breaker(data_dir)
            written = 300
            # Writes and reads of fresh data go on while tiering fails and retries.
            failures_seen = 0
            while failures_seen < 3:
                client.append(events(written, 50))
                written += 50
                assert sorted(conn.sql("SELECT seq FROM events").column("seq").to_pylist()) == \
                    list(range(written))
                status = tierer.status("default.events")
                failures_seen = status.consecutive_failures
                if status.last_error is None:
                    threading.Event().wait(0.05)
            status = conn.lake_status("default.events")[0]
            assert status["last_error"] and "LakeUnavailable" in status["last_error"]
            assert status["lag_records"] >= written - 300 - 50 * 2  # rows tiered before the failure
            assert status["lag_seconds"] > 0
            assert status["consecutive_failures"] >= 3
            restore()
            wait_until(lambda: tierer.status("default.events").lag_records == 0, "tiering to catch up")
            assert tierer.status("default.events").last_error is None
            assert lake_seqs(catalog, table) == list(range(written))
    finally:
        server.stop()


@pytest.mark.slow
def test_warehouse_not_writable(data_dir, settings):
    _outage(data_dir, settings, _break_warehouse)


@pytest.mark.slow
def test_catalog_unreachable(data_dir, settings):
    _outage(data_dir, settings, _break_catalog)


@pytest.mark.slow
def test_object_storage_down(data_dir, s3_options):
    """The warehouse on a real S3 endpoint that stops answering (moto's server on a port nothing
    else listens on), then comes back with its objects."""
    from moto.server import ThreadedMotoServer

    from tests.lake.conftest import free_port
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    moto.start()
    import boto3
    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="outage")
    options = {**s3_options, "datalake.iceberg.warehouse": "s3://outage/lake",
               "datalake.iceberg.s3.endpoint": f"http://127.0.0.1:{port}",
               "datalake.iceberg.s3.connect-timeout": "2", "datalake.iceberg.s3.request-timeout": "2",
               "datalake.tiering.retry-backoff.max": "200ms"}
    settings = LakeSettings.from_options(data_dir, options)
    state = {"server": moto}

    def stop_storage(_data_dir):
        state["server"].stop()

        def restore() -> None:
            state["server"] = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
            state["server"].start()
        return restore

    try:
        _outage(data_dir, settings, stop_storage)
    finally:
        state["server"].stop()
