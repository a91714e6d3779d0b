"""Lake options in the registry: table options, `iceberg.*` pass-through, server options with the
embedded default, S3 by URI + credentials, and `serve --option` refusing bad ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.config import (
    TABLE_OPTIONS,
    options_markdown,
    validate_server_options,
    validate_table_options,
)
from flightstore.errors import InvalidOption
from flightstore.lake import LakeCatalog, LakeSettings
from flightstore.schema import TableDescriptor

ROOT = Path(__file__).resolve().parents[2]


def test_table_options_and_their_defaults():
    descriptor = TableDescriptor.create("db.t", pa.schema([("x", pa.int64())]))
    assert descriptor.option("table.datalake.enabled") is False
    assert descriptor.option("table.datalake.freshness") == 3 * 60_000
    assert descriptor.option("table.datalake.delete-compaction-ratio") == 0.2
    enabled = TableDescriptor.create("db.t", pa.schema([("x", pa.int64())]), options={
        "table.datalake.enabled": "TRUE", "table.datalake.freshness": "2 s",
        "iceberg.write.target-file-size-bytes": "1048576"})
    assert enabled.option("table.datalake.enabled") is True
    assert enabled.option("table.datalake.freshness") == 2000
    assert enabled.options["iceberg.write.target-file-size-bytes"] == "1048576"
    for bad, message in (({"table.datalake.enabled": "maybe"}, "not a boolean"),
                         ({"table.datalake.freshness": "soon"}, "not a duration"),
                         ({"table.datalake.freshness": "10ms"}, "below the minimum"),
                         ({"table.datalake.delete-compaction-ratio": "-0.1"}, "below the minimum"),
                         ({"table.datalake.delete-compaction-ratio": "nan"}, "not a finite number"),
                         ({"table.datalake.delete-compaction-ratio": "a lot"}, "could not convert"),
                         ({"iceberg.": "x"}, "unknown table option"),
                         ({"icebergs.x": "x"}, "unknown table option")):
        with pytest.raises(InvalidOption, match=message):
            validate_table_options(bad)


def test_server_options_and_the_embedded_default(tmp_path):
    settings = LakeSettings.from_options(tmp_path / "d")
    assert settings.format == "iceberg"
    assert settings.catalog_uri == f"sqlite:///{(tmp_path / 'd' / 'lake' / 'catalog.db').resolve()}"
    assert settings.warehouse == (tmp_path / "d" / "lake" / "warehouse").resolve().as_uri()
    assert settings.tiering_enabled and settings.lease_ms == 60_000
    # The embedded lake needs no other process: opening it creates the catalog db and warehouse.
    LakeCatalog(settings).catalog.create_namespace("probe")
    assert (tmp_path / "d" / "lake" / "catalog.db").is_file()
    assert (tmp_path / "d" / "lake" / "warehouse").is_dir()


def test_s3_warehouse_by_uri_and_credentials_passes_through_to_pyiceberg(tmp_path):
    settings = LakeSettings.from_options(tmp_path, {
        "datalake.iceberg.warehouse": "s3://bucket/lake/",
        "datalake.iceberg.s3.endpoint": "http://127.0.0.1:9000",
        "datalake.iceberg.s3.access-key-id": "AK", "datalake.iceberg.s3.secret-access-key": "SK",
        "datalake.iceberg.s3.region": "eu-west-1", "datalake.iceberg.s3.path-style-access": "true",
        "datalake.iceberg.uri": "sqlite:////tmp/elsewhere.db", "datalake.tiering.lease": "30s"})
    assert settings.pyiceberg_properties() == {
        "uri": "sqlite:////tmp/elsewhere.db", "warehouse": "s3://bucket/lake",
        "s3.endpoint": "http://127.0.0.1:9000", "s3.access-key-id": "AK", "s3.secret-access-key": "SK",
        "s3.region": "eu-west-1", "s3.path-style-access": "true"}
    assert settings.lease_ms == 30_000 and settings.local_warehouse is None


def test_bad_server_options_are_refused():
    for bad, message in (({"datalake.format": "paimon"}, "not one of iceberg"),
                         ({"datalake.tiering.enabled": "sometimes"}, "not a boolean"),
                         ({"datalake.lake": "x"}, "unknown server option"),
                         ({"datalake.tiering.max-round-rows": "0"}, "below the minimum")):
        with pytest.raises(InvalidOption, match=message):
            validate_server_options(bad)


def test_serve_refuses_a_bad_option_before_listening(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "d"),
                           "--port", "0", "--option", "datalake.format=delta"],
                          cwd=ROOT, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "datalake.format" in done.stderr and "not one of iceberg" in done.stderr
    done = subprocess.run([sys.executable, "-m", "flightstore", "serve", "--option", "no-equals-sign"],
                          cwd=ROOT, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "KEY=VALUE" in done.stderr


def test_the_option_table_lists_the_lake_options():
    table = options_markdown()
    for key in ("table.datalake.enabled", "table.datalake.freshness", "iceberg.<property>",
                "datalake.format", "datalake.iceberg.warehouse", "datalake.iceberg.s3.endpoint",
                "datalake.tiering.lease", "table.datalake.delete-compaction-ratio",
                "table.datalake.snapshot.retention", "table.datalake.snapshot.num-retained",
                "table.datalake.orphan-files.older-than", "datalake.maintenance.interval"):
        assert f"| `{key}` |" in table
    assert TABLE_OPTIONS["table.datalake.enabled"].default is False
