"""CREATE TABLE is refused at once, with nothing written, when it asks for more buckets than
``max.table-bucket.num`` (per table or partition) or ``max.bucket.num`` allow: ``'bucket.num' =
'1000000'`` used to create buckets (a RocksDB each on a primary-key table) until memory ran out."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

import flightstore
from flightstore.errors import InvalidInput
from flightstore.store import Store

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _files(root) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files} | \
        {d for d, _, _ in os.walk(root)}


def test_create_table_over_the_bucket_limits_is_refused_with_nothing_written(tmp_path) -> None:
    with Store(tmp_path / "data", fsync=False, options={"max.table-bucket.num": "4",
                                                         "max.bucket.num": "6"}) as store:
        before = _files(tmp_path / "data")
        version = store.catalog.version
        with pytest.raises(InvalidInput, match=r"'bucket.num' = 5 is more than max.table-bucket.num \(4\)"):
            store.create_table("k", SCHEMA, primary_key=["id"], options={"bucket.num": "5"})
        with pytest.raises(InvalidInput, match=r"'bucket.num' = 1000000"):
            store.create_table("k", SCHEMA, primary_key=["id"], options={"bucket.num": "1000000"})
        assert _files(tmp_path / "data") == before and store.catalog.version == version
        assert store.list_tables("default") == []
        store.create_table("k", SCHEMA, primary_key=["id"], options={"bucket.num": "4"})
        assert store.table("k").num_buckets == 4


def test_sql_create_table_with_a_million_buckets_is_invalid_argument(server) -> None:
    with flightstore.connect(server.uri) as conn:
        with pytest.raises(pa.ArrowInvalid, match=r"max.table-bucket.num \(1024\)"):  # INVALID_ARGUMENT
            conn.sql("CREATE TABLE big (id BIGINT, PRIMARY KEY (id) NOT ENFORCED) "
                     "WITH ('bucket.num' = '1000000')")
        assert "big" not in conn.sql("SHOW TABLES").column("table_name").to_pylist()
        conn.sql("CREATE TABLE ok (id BIGINT) WITH ('bucket.num' = '8')")
        assert server.store.table("ok").num_buckets == 8
