"""The read cache of decoded lake data files (``datalake.read-cache.size``): union reads fill it
and are then answered from it; it stays within its size; it never serves rows of another file
(a re-created lake table reusing a data file path), nor a partly written or corrupt file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flightstore.lake import LakeCatalog, LakeSettings
from flightstore.lake.cache import ReadCache
from flightstore.lake.layout import lake_schema
from flightstore.lake.read import snapshot_batches
from flightstore.lake.union import read_union
from flightstore.store import Store
from tests.lake.conftest import EVENTS, create_events, events

ROOT = Path(__file__).resolve().parents[2]


def _union_seqs(catalog, table) -> list[int]:
    rows = pa.Table.from_batches(list(read_union(catalog, table, table.schema.names)),
                                 schema=table.schema)
    return sorted(rows.column("seq").to_pylist())


def _tiered_events(store, tierer, rows: int = 3000):
    table = create_events(store)
    for first in range(0, rows, 1000):
        table.append(events(first, 1000))
    assert tierer.tier_now("default.events").committed
    table.append(events(rows, 100))  # a log tail
    return table


def _data_files(catalog, table) -> list[str]:
    lake_table = catalog.load_table(table.path)
    return [task.file.file_path for task in lake_table.scan().plan_files()]


def test_the_tierer_writes_its_rounds_through_to_the_cache(store, tierer):
    table = _tiered_events(store, tierer)
    catalog = tierer.catalog
    cache = catalog.read_cache
    files = _data_files(catalog, table)
    assert len(files) == 3 and len(list(cache.directory.glob("*.arrow"))) == 3 and cache.disk_bytes > 0
    assert _union_seqs(catalog, table) == list(range(3100))
    assert cache.hits == 3 and cache.misses == 0
    # The warehouse's data files gone, the cache alone answers the lake part...
    for location in files:
        Path(location.removeprefix("file://")).unlink()
    assert _union_seqs(catalog, table) == list(range(3100))
    assert cache.hits == 6 and catalog.damage.damaged("default.events") == {}
    # ... and without it the lake part cannot be read: the answer came from the cache. (The log
    # still holds every record, so it answers now, and the missing files are reported.)
    cache.clear()
    assert cache.disk_bytes == 0
    assert _union_seqs(catalog, table) == list(range(3100))
    assert sorted(catalog.damage.damaged("default.events")) == [0, 1, 2]


def test_union_read_fills_the_cache_then_is_answered_from_it(store, tierer):
    table = _tiered_events(store, tierer)
    catalog = tierer.catalog
    cache = catalog.read_cache
    cache.clear()  # as after an eviction
    assert _union_seqs(catalog, table) == list(range(3100))
    assert cache.hits == 0 and cache.misses == 3
    assert len(list(cache.directory.glob("*.arrow"))) == 3 and cache.disk_bytes > 0
    for location in _data_files(catalog, table):
        Path(location.removeprefix("file://")).unlink()
    assert _union_seqs(catalog, table) == list(range(3100))
    assert cache.hits == 3


def test_a_read_stopped_early_leaves_no_cache_file(store, tierer):
    table = _tiered_events(store, tierer)
    catalog = tierer.catalog
    catalog.read_cache.clear()
    assert sum(b.num_rows for b in read_union(catalog, table, ["seq"], limit=10)) == 10
    assert list(catalog.read_cache.directory.iterdir()) == []
    assert _union_seqs(catalog, table) == list(range(3100))  # and a whole read fills it
    assert len(list(catalog.read_cache.directory.glob("*.arrow"))) == 3


def test_the_cache_stays_within_its_size_least_recently_used_first(tmp_path):
    schema = pa.schema([("x", pa.int64())])
    batch = pa.record_batch([pa.array(np.arange(10_000, dtype=np.int64))], schema=schema)
    probe = ReadCache(tmp_path / "probe", 10**9)
    fill = probe.fill("probe", schema, batch.num_rows)
    fill.write(batch)
    assert fill.commit()
    one = probe.disk_bytes
    cache = ReadCache(tmp_path / "c", 2 * one + one // 2)  # room for two files
    for key in ("a", "b"):
        fill = cache.fill(key, schema, batch.num_rows)
        fill.write(batch)
        assert fill.commit()
    assert cache.read("a", schema, batch.num_rows) is not None  # "b" is now the least recently used
    fill = cache.fill("c", schema, batch.num_rows)
    fill.write(batch)
    assert fill.commit()
    assert cache.disk_bytes == 2 * one <= cache.max_bytes
    assert sorted(p.name for p in cache.directory.iterdir()) == ["a.arrow", "c.arrow"]
    assert cache.read("b", schema, batch.num_rows) is None
    # A fill with fewer rows than its data file holds is never admitted.
    fill = cache.fill("d", schema, batch.num_rows + 1)
    fill.write(batch)
    assert not fill.commit() and cache.read("d", schema, batch.num_rows + 1) is None
    # A restarted cache finds its files, most recently used last.
    again = ReadCache(tmp_path / "c", cache.max_bytes)
    assert again.disk_bytes == 2 * one and list(again._entries) == ["a", "c"]


def test_size_zero_disables_the_cache(store, data_dir):
    settings = LakeSettings.from_options(data_dir, {"datalake.read-cache.size": "0"})
    from flightstore.lake import LakeTierer
    tierer = LakeTierer(store, settings)
    try:
        table = _tiered_events(store, tierer)
        assert tierer.catalog.read_cache is None
        assert _union_seqs(tierer.catalog, table) == list(range(3100))
        assert not settings.read_cache_dir.exists()
    finally:
        tierer.stop()


def _same_size_file(path: Path, descriptor, first: int, rows: int) -> None:
    """A data file of ``rows`` rows whose byte size depends on ``rows`` only (plain encoding, no
    compression, fixed-width values)."""
    seq = np.arange(first, first + rows, dtype=np.int64)
    data = pa.table({"k": seq, "seq": seq, "s": pa.array([f"v{i:08d}" for i in seq]),
                     "ts": pa.array(seq, pa.timestamp("ms")), "__bucket": pa.array(np.zeros(rows, np.int32)),
                     "__offset": pa.array(np.arange(rows, dtype=np.int64)),
                     "__timestamp": pa.array(seq * 1000, pa.timestamp("us", tz="UTC"))})
    pq.write_table(data.cast(lake_schema(descriptor)), path, compression="none", use_dictionary=False)


def test_a_recreated_lake_table_reusing_a_file_path_never_reads_the_old_rows(store, data_dir, tmp_path):
    table = store.create_table("default.plain", EVENTS, options={"bucket.num": 1, "table.datalake.enabled": "true"})
    descriptor = table.descriptor
    catalog = LakeCatalog(LakeSettings.from_options(data_dir, {}))
    cache = catalog.read_cache
    path = tmp_path / "shared.parquet"
    columns = ["seq"]

    def seqs(lake_table) -> list[int]:
        batches = snapshot_batches(lake_table, lake_table.current_snapshot(), descriptor, columns, cache=cache)
        return sorted(pa.Table.from_batches(list(batches)).column("seq").to_pylist())

    _same_size_file(path, descriptor, 0, 500)
    first = catalog.ensure_table(descriptor, "first-incarnation")
    first.add_files([str(path)])
    assert seqs(first.refresh()) == list(range(500)) == seqs(first.refresh())
    assert cache.hits == 1
    size = path.stat().st_size
    # The table is dropped and created again; its new lake table adds a file at the same path,
    # of the same size and row count, holding other rows.
    catalog.catalog.drop_table(catalog.identifier(descriptor.path))
    _same_size_file(path, descriptor, 10_000, 500)
    assert path.stat().st_size == size
    second = catalog.ensure_table(descriptor, "second-incarnation")
    assert second.metadata.table_uuid != first.metadata.table_uuid
    second.add_files([str(path)])
    assert seqs(second.refresh()) == list(range(10_000, 10_500))


def test_a_fill_killed_midway_is_never_served(store, tierer, data_dir):
    _tiered_events(store, tierer, rows=60_000)
    tierer.catalog.read_cache.clear()
    store.close()
    done = subprocess.run([sys.executable, "-m", "tests.lake.cache_child", str(data_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == -9 and "killing" in done.stdout, (done.returncode, done.stdout, done.stderr)
    cache_dir = LakeSettings.from_options(data_dir, {}).read_cache_dir
    assert [p for p in cache_dir.iterdir() if p.name.endswith(".partial")]  # the kill left it behind
    with Store(data_dir) as reopened:
        catalog = LakeCatalog(LakeSettings.from_options(data_dir, {}))
        table = reopened.table("default.events")
        assert _union_seqs(catalog, table) == list(range(60_100))
        cache = catalog.read_cache
        assert not [p for p in cache_dir.iterdir() if p.name.endswith(".partial")]
        assert cache.hits == 0 and len(list(cache_dir.glob("*.arrow"))) == 3


def test_a_truncated_or_garbage_cache_file_is_rejected_and_read_from_the_lake(store, tierer):
    table = _tiered_events(store, tierer)
    catalog = tierer.catalog
    cache = catalog.read_cache
    assert _union_seqs(catalog, table) == list(range(3100))
    truncated, garbage, kept = sorted(cache.directory.glob("*.arrow"))
    with open(truncated, "r+b") as file:
        file.truncate(truncated.stat().st_size // 2)
    garbage.write_bytes(os.urandom(garbage.stat().st_size))
    hits = cache.hits
    assert _union_seqs(catalog, table) == list(range(3100))
    assert cache.rejected == 2 and cache.hits == hits + 1
    # Both were filled again from the lake: the next read is served by the cache alone.
    assert _union_seqs(catalog, table) == list(range(3100))
    assert cache.hits == hits + 4 and cache.rejected == 2
