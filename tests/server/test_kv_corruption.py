"""A corrupted KV file is reported as DATA_LOSS naming table and bucket, never answered short.

One byte of a bucket's RocksDB ``.sst`` is flipped while the server is down. RocksDB iterators
stop silently at a block whose checksum fails (``valid()`` turns false and only ``status()`` tells
why), so a scan that does not check would return fewer rows with no error. Every read that can meet
the bad block (a range, a prefix lookup, a point lookup, a RocksDB scan) must fail with DATA_LOSS;
reads of the healthy bucket, ``COUNT(*)`` (kept in RocksDB's meta column family) and full scans
(plain and analytic: they fold the bucket's changelog, held from offset 0, see
``KvTablet.full_scan``) still answer, in full.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import flight
from rocksdict import AccessType, Options, Rdict

import flightstore
from flightstore.bucketing import bucket_ids
from flightstore.catalog import read_table_dir
from flightstore.errors import DataLoss
from flightstore.expressions import Comparison
from tests.server.conftest import RunningServer

ROWS_PER_GROUP = 6_000
TIMEOUT = 60


def _groups_in_two_buckets() -> tuple[int, int]:
    """Two values of the bucket key ``g`` that hash to bucket 0 and bucket 1 of 2."""
    candidates = pa.table({"g": pa.array(range(20), pa.int64())})
    buckets = bucket_ids(candidates, ["g"], 2)
    return int(buckets.tolist().index(0)), int(buckets.tolist().index(1))


def _flip_a_data_byte(kv_dir: Path) -> None:
    """Flip one byte a third into the bucket's rows (its largest SST file; the meta column family
    has its own small one): inside the data blocks."""
    sst = max(kv_dir.glob("*.sst"), key=lambda path: path.stat().st_size)
    data = bytearray(sst.read_bytes())
    data[len(data) // 3] ^= 0xFF
    sst.write_bytes(bytes(data))


def _readable_ids(kv_dir: Path) -> list[int]:
    """The ids a plain (unchecked) RocksDB iteration returns: the short answer the bug gave."""
    options = Options(raw_mode=True)
    db = Rdict(str(kv_dir), options=options, access_type=AccessType.read_only())
    try:
        keys = list(db.keys())
    finally:
        db.close()
    return [int.from_bytes(key[8:16], "big") ^ (1 << 63) for key in keys]


@pytest.fixture
def corrupted(tmp_path):
    """A server over a data dir whose table ``p`` has a flipped byte in bucket 1's SST."""
    g0, g1 = _groups_in_two_buckets()
    first = RunningServer(tmp_path / "data")
    try:
        with flightstore.connect(first.uri, timeout=TIMEOUT) as conn:
            conn.sql("CREATE TABLE p (g BIGINT, id BIGINT, name STRING, PRIMARY KEY (g, id) NOT ENFORCED) "
                     "WITH ('bucket.num' = '2', 'bucket.key' = 'g')")
            ids = pa.array(range(ROWS_PER_GROUP), pa.int64())
            for g in (g0, g1):
                conn.table("p").upsert(pa.table({
                    "g": pa.array([g] * ROWS_PER_GROUP, pa.int64()), "id": ids,
                    "name": pa.array([f"name-{g}-{i:08d}" for i in range(ROWS_PER_GROUP)])}))
    finally:
        first.stop()  # closing the store flushes the memtables into .sst files
    kv_dir = read_table_dir(tmp_path / "data", "p") / "bucket-1" / "kv"
    _flip_a_data_byte(kv_dir)
    readable = _readable_ids(kv_dir)
    assert 0 < len(readable) < ROWS_PER_GROUP, "the flipped byte must cut a plain iteration short"
    server = RunningServer(tmp_path / "data")
    yield server, g0, g1, readable[-1] + 1  # the first id RocksDB cannot read
    server.stop()


def _data_loss(call) -> str:
    with pytest.raises(flight.FlightInternalError) as info:
        call()
    message = str(info.value)
    assert "DATA_LOSS" in message and "default.p" in message and "bucket 1" in message, message
    assert "/bucket-1/" not in message, "the server's paths stay in its log"
    return message


def test_every_read_of_the_corrupt_bucket_is_data_loss(corrupted):
    server, g0, g1, bad_id = corrupted
    with flightstore.connect(server.uri, timeout=TIMEOUT) as conn:
        table = conn.table("p")
        message = _data_loss(lambda: conn.sql(f"SELECT * FROM p WHERE g = {g1}"))  # prefix lookup
        assert "checksum" in message or "Corruption" in message  # RocksDB's own words are kept
        _data_loss(lambda: conn.sql(f"SELECT * FROM p WHERE g = {g1} AND id >= 0"))  # range
        _data_loss(lambda: conn.sql(f"SELECT name FROM p WHERE g = {g1} AND id = {bad_id}"))  # point
        # Full scans, plain or analytic (residual), read the bucket's changelog, held from offset
        # 0, instead of RocksDB: they never meet the bad block and answer in full.
        counts = conn.sql("SELECT g, COUNT(*) AS n FROM p GROUP BY g ORDER BY g").to_pylist()
        assert counts == [{"g": g, "n": ROWS_PER_GROUP} for g in sorted((g0, g1))]
        assert conn.sql("SELECT * FROM p").num_rows == 2 * ROWS_PER_GROUP
        assert conn.sql("SELECT id FROM p WHERE name <> 'x'").num_rows == 2 * ROWS_PER_GROUP
        assert len(table.scan(columns=["id"])) == 2 * ROWS_PER_GROUP
        _data_loss(lambda: table.prefix_lookup({"g": [g1]}))
        _data_loss(lambda: table.lookup({"g": [g1], "id": [bad_id]}))
        # The healthy bucket and the maintained count still answer, in full.
        healthy = conn.sql(f"SELECT id FROM p WHERE g = {g0}")
        assert sorted(healthy.column("id").to_pylist()) == list(range(ROWS_PER_GROUP))
        assert table.lookup({"g": [g0], "id": [bad_id]}).num_rows == 1
        assert conn.sql("SELECT COUNT(*) AS n FROM p").to_pylist() == [{"n": 2 * ROWS_PER_GROUP}]


def test_a_write_that_must_read_a_corrupt_row_is_refused_and_changes_nothing(corrupted):
    server, _, g1, bad_id = corrupted
    with flightstore.connect(server.uri, timeout=TIMEOUT) as conn:
        table = conn.table("p")
        before = table.offsets()
        _data_loss(lambda: table.upsert(pa.table({"g": [g1], "id": [bad_id], "name": ["new"]})))
        assert table.offsets() == before  # nothing reached the log
        assert list(itertools.islice(server.store.table("p").logs[1].read(before[1]), 1)) == []


def test_the_scan_filter_does_not_hide_the_corruption(corrupted):
    server = corrupted[0]
    table = server.store.table("p")
    with pytest.raises(DataLoss, match="bucket 1"):  # a RocksDB scan whose filter drops every row
        list(table.kvs[1].scan(["id"], Comparison("id", "<", 0).bind(table.schema)))
