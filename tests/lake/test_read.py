"""Reading the lake: time travel, column pruning, filters pushed to pyiceberg (file pruning), and
the same rows through other engines (pyiceberg's own catalog, DuckDB's iceberg_scan)."""

from __future__ import annotations

import json
import os
import subprocess

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flightstore.errors import InvalidInput, NotFound
from flightstore.expressions import And, Comparison, In, IsNull, Or, StartsWith
from flightstore.lake import LakeCatalog, LakeSettings, LakeTierer, lake_snapshots, plan_lake_files, read_lake
from tests.lake.conftest import create_events, events
from tests.server.test_flightsql_dbapi import client_venv
from tests.waiting import distinct_millisecond

DUCKDB_REQUIREMENTS = ["duckdb==1.5.5", "duckdb-extension-iceberg==1.5.5", "duckdb-extension-avro==1.5.5",
                       "duckdb-extension-httpfs==1.5.5", "duckdb-extensions==1.5.5"]


def _seqs(table: pa.Table) -> list[int]:
    return sorted(table.column("seq").to_pylist())


def test_time_travel_by_snapshot_id_and_by_timestamp(store, tierer):
    table = create_events(store)
    moments = []
    for first in (0, 100, 250):
        table.append(events(first, 100 if first < 250 else 5))
        tierer.tier_now(table.path)
        moments.append(distinct_millisecond())
    commits = lake_snapshots(tierer.catalog, table.descriptor)
    assert [c.added_rows for c in commits] == [100, 100, 5]
    ends = [100, 200, 205]
    expected = [list(range(100)), list(range(200)), list(range(200)) + list(range(250, 255))]
    for commit, moment, rows in zip(commits, moments, expected):
        assert _seqs(read_lake(tierer.catalog, table.descriptor, snapshot_id=commit.snapshot_id)) == rows
        assert _seqs(read_lake(tierer.catalog, table.descriptor, as_of_ms=moment)) == rows
        assert sum(commit.offsets.values()) == ends[commits.index(commit)]
    assert _seqs(read_lake(tierer.catalog, table.descriptor)) == expected[-1]
    with pytest.raises(NotFound, match="no snapshot 42"):
        read_lake(tierer.catalog, table.descriptor, snapshot_id=42)
    with pytest.raises(NotFound, match="no snapshot at or before"):
        read_lake(tierer.catalog, table.descriptor, as_of_ms=commits[0].timestamp_ms - 1)
    with pytest.raises(InvalidInput, match="not both"):
        read_lake(tierer.catalog, table.descriptor, snapshot_id=commits[0].snapshot_id, as_of_ms=1)


def test_filters_prune_files_and_filter_rows_exactly(store, tierer):
    table = create_events(store, bucket_num=8)
    data = events(0, 4000)
    data = data.set_column(2, "s", pc.if_else(pc.equal(pc.bit_wise_and(data.column("seq"), 15), 0),
                                              pa.nulls(4000, pa.string()), data.column("s")))
    for start in range(0, 4000, 500):
        table.append(data.slice(start, 500))
    tierer.tier_now(table.path)
    every_file = plan_lake_files(tierer.catalog, table.descriptor)
    assert len(every_file) == 8
    # A bucket-key equality reads only that bucket's files (partition pruning).
    key = 7 * 123 % 1000
    assert len(plan_lake_files(tierer.catalog, table.descriptor, filter=Comparison("k", "=", key))) == 1
    # Statistics prune too: no file holds seq above the maximum.
    assert plan_lake_files(tierer.catalog, table.descriptor, filter=Comparison("seq", ">", 10**6)) == []
    rows = data.to_pylist()
    cases = [
        (Comparison("k", "=", key), lambda r: r["k"] == key),
        (Comparison("seq", ">=", 3990), lambda r: r["seq"] >= 3990),
        (And(Comparison("seq", "<", 100), Comparison("k", "!=", 0)), lambda r: r["seq"] < 100 and r["k"] != 0),
        (Or(In("seq", (1, 2, 3999)), IsNull("s")), lambda r: r["seq"] in (1, 2, 3999) or r["s"] is None),
        (StartsWith("s", "v12"), lambda r: r["s"] is not None and r["s"].startswith("v12")),
        (Comparison("ts", "<", "1970-01-01 00:00:00.010"), lambda r: r["seq"] < 10),
        (Comparison("s", "=", None), lambda r: False),
    ]
    for predicate, keep in cases:
        got = read_lake(tierer.catalog, table.descriptor, columns=["seq", "s"], filter=predicate)
        assert got.column_names == ["seq", "s"]
        assert _seqs(got) == sorted(r["seq"] for r in rows if keep(r)), predicate
    with pytest.raises(InvalidInput, match="unknown column"):
        read_lake(tierer.catalog, table.descriptor, columns=["nope"])


def test_column_pruning_reads_only_the_requested_columns(store, tierer):
    table = create_events(store)
    table.append(events(0, 50))
    tierer.tier_now(table.path)
    only = read_lake(tierer.catalog, table.descriptor, columns=["__offset", "k"])
    assert only.schema.names == ["__offset", "k"] and only.num_rows == 50
    assert only.schema.field("k").type == pa.int64()


def test_a_table_not_tiered_yet_reads_empty(store, tierer):
    table = create_events(store)
    got = read_lake(tierer.catalog, table.descriptor, columns=["seq"])
    assert got.num_rows == 0 and got.schema.names == ["seq"]


def test_pyiceberg_with_its_own_catalog_reads_the_same_rows(store, tierer, settings):
    from pyiceberg.catalog import load_catalog
    table = create_events(store)
    table.append(events(0, 321))
    tierer.tier_now(table.path)
    # A SqlCatalog keys its rows by catalog name: readers open it as "flightstore".
    other = load_catalog("flightstore", type="sql", uri=settings.catalog_uri, warehouse=settings.warehouse)
    theirs = other.load_table("default.events").scan().to_arrow()
    ours = read_lake(tierer.catalog, table.descriptor)
    key = [("__bucket", "ascending"), ("__offset", "ascending")]
    assert theirs.sort_by(key).select(["k", "seq", "s", "__bucket", "__offset"]).to_pylist() == \
        ours.sort_by(key).select(["k", "seq", "s", "__bucket", "__offset"]).to_pylist()


@pytest.fixture(scope="module")
def duckdb_python():
    return client_venv("duckdb-iceberg", DUCKDB_REQUIREMENTS)


DUCKDB_SCRIPT = """
import json, sys
import duckdb
from duckdb_extensions import import_extension
con = duckdb.connect()
for name in ("avro", "iceberg", "httpfs"):
    import_extension(name, con=con)
con.sql("LOAD iceberg")
options = json.loads(sys.argv[2])
if options:
    con.sql("LOAD httpfs")
    con.sql(f"CREATE SECRET lake (TYPE s3, KEY_ID '{options['key']}', SECRET '{options['secret']}', "
            f"REGION '{options['region']}', ENDPOINT '{options['endpoint']}', URL_STYLE 'path', USE_SSL false)")
rows = con.sql(sys.argv[3].format(location=sys.argv[1])).fetchall()
print(json.dumps(rows))
"""


EVENTS_QUERY = "SELECT seq, k, s, __bucket, __offset FROM iceberg_scan('{location}') ORDER BY __bucket, __offset"


def _duckdb_rows(python, tmp_path, metadata_location: str, s3: dict | None = None,
                 query: str = EVENTS_QUERY) -> list[list]:
    script = tmp_path / "duckdb_read.py"
    script.write_text(DUCKDB_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([str(python), str(script), metadata_location, json.dumps(s3 or {}), query],
                          check=False, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _ours(catalog, table) -> list[list]:
    ours = read_lake(catalog, table.descriptor, columns=["seq", "k", "s", "__bucket", "__offset"])
    ours = ours.sort_by([("__bucket", "ascending"), ("__offset", "ascending")])
    return [list(row.values()) for row in ours.to_pylist()]


@pytest.mark.slow
def test_duckdb_iceberg_scan_reads_the_same_rows(store, tierer, duckdb_python, tmp_path):
    table = create_events(store)
    table.append(events(0, 400))
    tierer.tier_now(table.path)
    table.append(events(400, 40))
    tierer.tier_now(table.path)
    location = tierer.catalog.load_table(table.path).metadata_location
    assert _duckdb_rows(duckdb_python, tmp_path, location) == _ours(tierer.catalog, table)


@pytest.mark.slow
def test_duckdb_reads_a_lake_on_s3(store, data_dir, s3_options, duckdb_python, tmp_path):
    settings = LakeSettings.from_options(data_dir, s3_options)
    tierer = LakeTierer(store, settings)
    table = create_events(store)
    table.append(events(0, 250))
    tierer.tier_now(table.path)
    location = tierer.catalog.load_table(table.path).metadata_location
    assert location.startswith("s3://")
    s3 = {"key": "testing", "secret": "testing", "region": "us-east-1",
          "endpoint": s3_options["datalake.iceberg.s3.endpoint"].removeprefix("http://")}
    assert _duckdb_rows(duckdb_python, tmp_path, location, s3) == _ours(LakeCatalog(settings), table)
    tierer.stop()
