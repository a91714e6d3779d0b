"""kill -9 anywhere in a tiering round: the next round redoes it, no row doubled, none missing.

Two kinds of kill: at the exact points of a round (before the data files are written, after they are
written but before the catalog commit, after the commit) in a child process that tiers, with
several seeds; and of a real server process tiering by itself while a client writes to it, at
random moments tied to the server's progress.
"""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import flightstore
from flightstore.lake import LakeCatalog, LakeSettings, LakeTierer, read_lake
from flightstore.lake.offsets import committed_offsets, tiering_snapshots
from flightstore.lake.tiering import PHASES
from flightstore.store import Store
from tests.forked_server import ForkedServer
from tests.lake import tier_child
from tests.lake.conftest import EVENTS, create_events, events
from tests.waiting import wait_until


def _lake_state(data_dir: Path, options: dict | None = None) -> tuple[list[int], dict[int, int], dict]:
    """(sorted seqs in the lake, committed offsets, {bucket: sorted lake offsets}) read from the
    lake alone (no Store: a server may hold the data directory)."""
    settings = LakeSettings.from_options(data_dir, options)
    catalog = LakeCatalog(settings)
    from flightstore.schema import TableDescriptor
    descriptor = TableDescriptor.create("default.events", EVENTS, options={"bucket.num": 1})
    lake = read_lake(catalog, descriptor, columns=["seq", "__bucket", "__offset"])
    try:
        offsets = committed_offsets(catalog.load_table(descriptor.path))
    except flightstore.errors.TableNotFound:
        offsets = {}
    per_bucket: dict = {}
    for bucket, offset in zip(lake.column("__bucket").to_pylist(), lake.column("__offset").to_pylist()):
        per_bucket.setdefault(bucket, []).append(offset)
    catalog.reset()
    return sorted(lake.column("seq").to_pylist()), offsets, {b: sorted(o) for b, o in per_bucket.items()}


def _assert_consistent(data_dir: Path, options: dict | None = None) -> list[int]:
    """The lake holds, per bucket, exactly the offsets below its committed offset, each once."""
    seqs, offsets, per_bucket = _lake_state(data_dir, options)
    assert len(seqs) == len(set(seqs)), "a row was tiered twice"
    for bucket, got in per_bucket.items():
        assert got == list(range(offsets[bucket])), f"bucket {bucket}: lake offsets have a gap or extra"
    assert sum(offsets.values()) == len(seqs)
    return seqs


def _parquet_files(data_dir: Path, options: dict) -> int:
    """Data files in the warehouse, referenced by a snapshot or not."""
    warehouse = LakeSettings.from_options(data_dir, options).warehouse
    if warehouse.startswith("s3://"):
        import boto3
        bucket, _, prefix = warehouse[len("s3://"):].partition("/")
        client = boto3.client("s3", endpoint_url=options["datalake.iceberg.s3.endpoint"],
                              aws_access_key_id="testing", aws_secret_access_key="testing",
                              region_name="us-east-1")
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sum(1 for page in pages for o in page.get("Contents", []) if o["Key"].endswith(".parquet"))
    return sum(1 for _ in (data_dir / "lake" / "warehouse").rglob("*.parquet"))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [23])  # the s3 variant below is a second seed
def test_kill_at_every_point_of_a_round_loses_and_doubles_nothing(tmp_path, seed):
    _kill_at_every_point(tmp_path / "data", random.Random(seed), {})


@pytest.mark.slow
def test_kill_at_every_point_of_a_round_with_the_warehouse_on_s3(tmp_path, s3_options):
    _kill_at_every_point(tmp_path / "data", random.Random(99), s3_options)


def _kill_at_every_point(data_dir: Path, rng: random.Random, options: dict) -> None:
    written = 0
    with Store(data_dir) as store:
        create_events(store, bucket_num=rng.randint(1, 4))
    phases = list(PHASES) * 2
    rng.shuffle(phases)
    for phase in phases:
        with Store(data_dir) as store:
            table = store.table("default.events")
            for _ in range(rng.randint(2, 6)):
                count = rng.randint(1, 400)
                table.append(events(written, count))
                written += count
        files_before = _parquet_files(data_dir, options)
        committed_before = _lake_state(data_dir, options)[1]
        kill_round = rng.randint(1, 2)
        code, report = tier_child.tier(str(data_dir), str(rng.randint(50, 600)), kill_round, phase, options)
        if code == 0:  # the backlog took fewer rounds than the kill round
            assert report.startswith("done")
        else:
            assert code == -signal.SIGKILL, report
            committed_after = _lake_state(data_dir, options)[1]
            if phase == "after-write":  # data files were written, the commit never happened
                assert _parquet_files(data_dir, options) > files_before
            if phase == "after-commit":
                assert committed_after != committed_before
        _assert_consistent(data_dir, options)
    code, report = tier_child.tier(str(data_dir), "1000000", 0, "none", options)
    assert code == 0, report
    assert _assert_consistent(data_dir, options) == list(range(written))


def tiering_server(data_dir: Path, options: dict[str, str]) -> ForkedServer:
    """``flightstore serve`` with ``options``, tiering by itself (forked from a fork server that
    imported flightstore once: five starts per test)."""
    return ForkedServer(data_dir, *[arg for key, value in options.items() for arg in ("--option", f"{key}={value}")])


@pytest.mark.slow
@pytest.mark.parametrize("seed,warehouse", [(5, "local"), (13, "s3")])
def test_kill_minus_nine_of_a_tiering_server_loses_and_doubles_nothing(tmp_path, request, seed, warehouse):
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    options = {"datalake.tiering.max-round-rows": "20000"}
    if warehouse == "s3":
        options.update(request.getfixturevalue("s3_options"))
    server = tiering_server(data_dir, options)
    with flightstore.connect(server.uri, timeout=60) as conn:
        conn.sql("CREATE TABLE events (k BIGINT, seq BIGINT, s STRING, ts TIMESTAMP(3)) WITH "
                 "('bucket.num' = '3', 'bucket.key' = 'k', 'table.datalake.enabled' = 'true', "
                 "'table.datalake.freshness' = '100ms')")
    acked = 0
    for _ in range(4):
        commits_before = _lake_state(data_dir, options)[1]
        with flightstore.connect(server.uri, timeout=60) as conn:
            table = conn.table("default.events")
            for _ in range(rng.randint(3, 8)):
                count = rng.randint(2000, 9000)
                table.append(events(acked, count))
                acked += count
        # Kill once the server tiered something new, then a little later: inside a round or not.
        wait_until(lambda before=commits_before: _lake_state(data_dir, options)[1] != before,
                   "the server tiering new rows")
        threading.Event().wait(rng.uniform(0, 0.3))
        server.kill()
        _assert_consistent(data_dir, options)
        server = tiering_server(data_dir, options)
    wait_until(lambda: _lake_state(data_dir, options)[0] == list(range(acked)),
               "every written row in the lake", timeout=180)
    _assert_consistent(data_dir, options)
    server.stop()


PK_ROWS = EVENTS.remove(0).insert(0, pa.field("k", pa.int64(), nullable=False))


def _pk_lake_matches_the_kv(data_dir: Path, options: dict) -> dict[int, int]:
    """The lake of ``default.pk`` holds, per bucket, exactly the KV's rows at the bucket's committed
    offset (no key twice, none missing, no stale value). Returns the committed offsets."""
    catalog = LakeCatalog(LakeSettings.from_options(data_dir, options))
    with Store(data_dir) as store:
        table = store.table("default.pk")
        try:
            offsets = committed_offsets(catalog.load_table(table.path))
        except flightstore.errors.TableNotFound:
            offsets = {}
        lake = read_lake(catalog, table.descriptor)
        for bucket in range(table.num_buckets):
            mine = lake.filter(pc.equal(lake.column("__bucket"), bucket)).select(PK_ROWS.names)
            assert mine.num_rows == len(set(mine.column("k").to_pylist())), "a key is in the lake twice"
            if bucket not in offsets:
                assert mine.num_rows == 0
                continue
            kv = pa.Table.from_batches(list(table.rows_at(bucket, offsets[bucket])), schema=PK_ROWS)
            assert mine.sort_by("k").to_pylist() == kv.sort_by("k").to_pylist(), f"bucket {bucket} differs"
    catalog.reset()
    return offsets


@pytest.mark.slow
@pytest.mark.parametrize("seed", [17])
def test_kill_during_primary_key_rounds_loses_and_doubles_nothing(tmp_path, seed):
    rng = random.Random(seed)
    data_dir, options = tmp_path / "data", {}
    with Store(data_dir) as store:
        # Ratio 1: the rounds after the first write position delete files (they change about half
        # the keys; the default 0.2 would compact every bucket each time).
        store.create_table("default.pk", PK_ROWS, primary_key=["k"], options={
            "bucket.num": rng.randint(2, 4), "table.datalake.enabled": "true",
            "table.datalake.delete-compaction-ratio": "1"})
    phases = list(PHASES)
    rng.shuffle(phases)
    written = 0
    for phase in phases:  # the first kill falls in the round where the buckets enter the lake
        with Store(data_dir) as store:
            table = store.table("default.pk")
            for _ in range(rng.randint(2, 5)):
                count = rng.randint(1, 300)
                rows = events(written, count)
                keys = pa.array([rng.randrange(0, 800) for _ in range(count)], pa.int64())
                table.upsert(rows.set_column(0, pa.field("k", pa.int64(), nullable=False), keys))
                written += count
                table.delete(pa.table({"k": pa.array(rng.sample(range(800), 20), pa.int64())}))
            if rng.random() < 0.5:
                table.snapshot(force=True)
        committed_before = _pk_lake_matches_the_kv(data_dir, options)
        code, report = tier_child.tier(str(data_dir), str(rng.randint(50, 400)), 1, phase, options, "default.pk")
        assert code == -signal.SIGKILL, report
        committed_after = _pk_lake_matches_the_kv(data_dir, options)
        assert (committed_after != committed_before) == (phase == "after-commit")
    with Store(data_dir) as store:  # the last round in this process: the lake catches up exactly
        tierer = LakeTierer(store, LakeSettings.from_options(data_dir, options))
        while tierer.tier_now("default.pk").committed:
            pass
        tierer.stop()
        table = store.table("default.pk")
        lake = read_lake(LakeCatalog(LakeSettings.from_options(data_dir, options)), table.descriptor)
        assert lake.select(PK_ROWS.names).sort_by("k").to_pylist() == \
            table.scan_table().sort_by("k").to_pylist()
        end = table.end_offsets()
        summaries = [s.summary.additional_properties for s in tiering_snapshots(
            LakeCatalog(LakeSettings.from_options(data_dir, options)).load_table(table.path))]
    assert any("added-position-delete-files" in s for s in summaries)  # merge-on-read rounds ran
    assert _pk_lake_matches_the_kv(data_dir, options) == end
