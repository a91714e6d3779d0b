"""The Iceberg layout: bucket-aligned partitions (flightstore's bucketing IS Iceberg's bucket
transform), meta columns, rows sorted by offset in each data file, read from the files themselves."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.transforms import BucketTransform, IdentityTransform

from flightstore.bucketing import bucket_ids
from flightstore.errors import Unsupported
from flightstore.lake.layout import bucket_transform_column, partition_spec
from tests.lake.conftest import lake_seqs

N = 3000
rng = np.random.default_rng(7)
KEY_COLUMNS = {
    "int64": pa.array(rng.integers(-2**62, 2**62, N), pa.int64()),
    "int32": pa.array(rng.integers(-2**31, 2**31 - 1, N), pa.int32()),
    "int16": pa.array(rng.integers(-2**15, 2**15 - 1, N), pa.int16()),
    "uint32": pa.array(rng.integers(0, 2**32 - 1, N), pa.uint32()),
    "string": pa.array([f"user-{i}-{'x' * (i % 13)}é" for i in rng.integers(0, 10**9, N)]),
    "binary": pa.array([bytes(rng.integers(0, 256, i % 17, dtype=np.uint8)) for i in range(N)], pa.binary()),
    "date": pa.array([dt.date(2000, 1, 1) + dt.timedelta(days=int(d)) for d in rng.integers(-5000, 20000, N)],
                     pa.date32()),
    "timestamp_ms": pa.array(rng.integers(-10**12, 4 * 10**12, N), pa.timestamp("ms")),
    "timestamp_us_tz": pa.array(rng.integers(-10**15, 4 * 10**15, N), pa.timestamp("us", tz="UTC")),
}


def _data_files(lake_table):
    """(partition record, rows) of every data file of the current snapshot, read from storage."""
    io = PyArrowFileIO(lake_table.io.properties)
    for task in lake_table.scan().plan_files():
        with io.new_input(task.file.file_path).open() as handle:
            yield task.file, pq.read_table(handle)


@pytest.mark.parametrize("kind", sorted(KEY_COLUMNS))
def test_every_data_file_holds_one_flightstore_bucket_by_icebergs_bucket_transform(store, tierer, kind):
    key = KEY_COLUMNS[kind]
    schema = pa.schema([("key", key.type), ("seq", pa.int64())])
    table = store.create_table("default.t", schema, options={
        "bucket.num": 7, "bucket.key": "key", "table.datalake.enabled": "true"})
    for part in range(3):
        rows = slice(part * N // 3, (part + 1) * N // 3)
        table.append(pa.table({"key": key[rows], "seq": pa.array(np.arange(N)[rows])}, schema=schema))
    tierer.tier_now(table.path)
    lake_table = tierer.catalog.load_table(table.path)
    (field,) = lake_table.spec().fields
    assert isinstance(field.transform, BucketTransform) and field.transform.num_buckets == 7
    assert lake_table.schema().find_field(field.source_id).name == "key"
    seen = 0
    for data_file, rows in _data_files(lake_table):
        partition = data_file.partition[0]
        ours = bucket_ids(rows.select(["key"]).cast(schema.remove(1)), ["key"], 7)
        assert set(ours.tolist()) == {partition}, "a data file mixes flightstore buckets"
        assert set(rows.column("__bucket").to_pylist()) == {partition}
        offsets = rows.column("__offset").to_numpy()
        assert (np.diff(offsets) > 0).all(), "rows are not in offset order within the file"
        seen += rows.num_rows
    assert seen == N
    assert lake_seqs(tierer.catalog, table) == list(range(N))


@pytest.mark.parametrize("case", ["no key", "two-column key", "double key", "time key"])
def test_tables_without_an_iceberg_bucket_key_partition_by_identity_bucket(store, tierer, case):
    columns = {"a": pa.array(np.arange(600) % 37), "b": pa.array([f"s{i % 11}" for i in range(600)]),
               "d": pa.array(np.arange(600) / 7.0),
               "t": pa.array(np.arange(600) * 1_000_003, pa.time64("us"))}
    data = pa.table(columns)
    key = {"no key": "", "two-column key": "a,b", "double key": "d", "time key": "t"}[case]
    options = {"bucket.num": 4, "table.datalake.enabled": "true"}
    if key:
        options["bucket.key"] = key
    table = store.create_table("default.t", data.schema, options=options)
    assert bucket_transform_column(table.descriptor) is None
    for part in range(6):
        table.append(data.slice(part * 100, 100))
    tierer.tier_now(table.path)
    lake_table = tierer.catalog.load_table(table.path)
    (field,) = lake_table.spec().fields
    assert isinstance(field.transform, IdentityTransform)
    assert lake_table.schema().find_field(field.source_id).name == "__bucket"
    buckets_seen = set()
    for data_file, rows in _data_files(lake_table):
        partition = data_file.partition[0]
        assert set(rows.column("__bucket").to_pylist()) == {partition}
        if key:
            ours = bucket_ids(rows.select(key.split(",")), key.split(","), 4)
            assert set(ours.tolist()) == {partition}
        assert (np.diff(rows.column("__offset").to_numpy()) > 0).all()
        buckets_seen.add(partition)
    assert buckets_seen == {b for b in range(4) if table.logs[b].end_offset}


def test_partition_spec_leads_with_identity_partition_columns(store):
    """Partitioned tables (a later issue) get identity(partition column) before the bucket field."""
    from flightstore.lake.layout import iceberg_schema
    from flightstore.schema import TableDescriptor
    schema = pa.schema([("region", pa.string()), ("id", pa.int64()), ("v", pa.float64())])
    descriptor = TableDescriptor.create("default.p", schema, primary_key=["region", "id"],
                                        partition_keys=["region"], options={"bucket.num": 5})
    ice = iceberg_schema(descriptor)
    spec = partition_spec(descriptor, ice)
    assert [(f.name, str(f.transform)) for f in spec.fields] == [("region", "identity"),
                                                                  ("id_bucket", "bucket[5]")]
    assert [ice.find_field(f.source_id).name for f in spec.fields] == ["region", "id"]
    assert [f.name for f in ice.fields][-3:] == ["__bucket", "__offset", "__timestamp"]
    assert ice.find_field("id").required and ice.find_field("__offset").required


def _codecs(lake_table) -> set[str]:
    io = PyArrowFileIO(lake_table.io.properties)
    codecs = set()
    for data_file, _ in _data_files(lake_table):
        with io.new_input(data_file.file_path).open() as handle:
            metadata = pq.ParquetFile(handle).metadata
            codecs |= {metadata.row_group(g).column(c).compression for g in range(metadata.num_row_groups)
                       for c in range(metadata.num_columns)}
    return codecs


def test_iceberg_table_options_become_iceberg_table_properties(store, tierer):
    table = store.create_table("default.t", pa.schema([("x", pa.int64())]), options={
        "table.datalake.enabled": "true", "iceberg.write.parquet.compression-codec": "zstd",
        "iceberg.commit.retry.num-retries": "7"})
    table.append({"x": [1, 2, 3]})
    tierer.tier_now(table.path)
    lake_table = tierer.catalog.load_table(table.path)
    assert lake_table.properties["write.parquet.compression-codec"] == "zstd"
    assert lake_table.properties["commit.retry.num-retries"] == "7"
    assert lake_table.properties["flightstore.table-id"] == table.directory.name
    assert _codecs(lake_table) == {"ZSTD"}


def test_the_lake_writes_snappy_parquet_by_default(store, tierer):
    table = store.create_table("default.t", pa.schema([("x", pa.int64()), ("s", pa.string())]),
                               options={"table.datalake.enabled": "true"})
    table.append({"x": [1, 2, 3], "s": ["a", "b", "c"]})
    tierer.tier_now(table.path)
    lake_table = tierer.catalog.load_table(table.path)
    assert lake_table.properties["write.parquet.compression-codec"] == "snappy"
    assert _codecs(lake_table) == {"SNAPPY"}


def test_a_column_iceberg_cannot_hold_is_a_clear_error_in_the_status(store, tierer):
    """Nanosecond timestamps need Iceberg v3; the table is not tiered and says why."""
    table = store.create_table("default.t", pa.schema([("n", pa.timestamp("ns"))]),
                               options={"table.datalake.enabled": "true"})
    table.append({"n": pa.array([1, 2], pa.timestamp("ns"))})
    with pytest.raises(Unsupported, match="cannot be tiered to Iceberg"):
        tierer.tier_now(table.path)
    status = tierer.status(table.path)
    assert "timestamp[ns]" in status.last_error and status.lag_records == 2
