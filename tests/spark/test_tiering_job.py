"""The Spark tiering job: the same tiering core run by Spark against a real server (local mode), the
lease keeping it and the server's own tierer off each other's tables."""

from __future__ import annotations

import pyarrow as pa
import pytest
from flightstore_spark.pipelines.tiering import tier_tables

import flightstore
from flightstore.errors import TieringLeaseHeld
from flightstore.lake import LakeCatalog, LakeSettings, LakeTierer, read_lake
from flightstore.lake.offsets import committed_offsets
from tests.lake.conftest import EVENTS, events
from tests.server.conftest import RunningServer

pytestmark = pytest.mark.slow



@pytest.fixture
def server(tmp_path):
    """In this process: these tests reach into the server's store and run its tierer beside the job."""
    running = RunningServer(tmp_path / "data")
    yield running
    running.stop()


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
    # Merge-on-read through the job too: the changed buckets get position delete files.
    assert second["default.users"][0].deleted == 2 and second["default.users"][0].delete_files >= 1
    assert second["default.users"][0].files_removed == 0
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


def _lake_matches_the_kv_at_its_offsets(catalog, table) -> dict[int, int]:
    """Per bucket, the lake holds exactly the KV's rows at the bucket's committed offset."""
    import pyarrow.compute as pc
    try:
        offsets = committed_offsets(catalog.load_table(table.path))
    except flightstore.errors.TableNotFound:
        return {}
    lake = read_lake(catalog, table.descriptor)
    for bucket in range(table.num_buckets):
        mine = lake.filter(pc.equal(lake.column("__bucket"), bucket)).select(PK.names).sort_by("k")
        expected = pa.Table.from_batches(list(table.rows_at(bucket, offsets[bucket])), schema=PK).sort_by("k") \
            if bucket in offsets else PK.empty_table()
        assert mine.to_pylist() == expected.to_pylist(), f"bucket {bucket}: the lake is not the KV at its offset"
    return offsets


def test_kill_minus_nine_of_the_job_mid_round_loses_and_doubles_nothing(spark, server):
    import fcntl
    import os
    import pty
    import random
    import signal
    import struct
    import subprocess
    import sys
    import termios
    import threading
    import time
    from pathlib import Path

    from flightstore.lake.lease import LeaseStore
    from tests.spark.conftest import spark_job_env
    from tests.waiting import wait_until

    rng = random.Random(31)
    table = server.store.create_table("default.accounts", PK, primary_key=["k"], options={
        "bucket.num": 3, "table.datalake.enabled": "true"})
    data_dir = server.store.data_dir
    options = {"datalake.tiering.max-round-rows": "150", "datalake.tiering.lease": "3s"}
    settings = LakeSettings.from_options(data_dir, options)
    catalog = LakeCatalog(settings)
    for step in range(6):
        keys = rng.sample(range(1500), 300)
        table.upsert(pa.table({"k": keys, "name": [f"s{step}"] * 300, "n": keys}, schema=PK))
        table.delete(pa.table({"k": rng.sample(range(1500), 30)}))
        if step == 0:  # the buckets enter the lake; the job then follows the changelog, 150 rows a round
            tierer = LakeTierer(server.store, settings)
            tierer.tier_now(table.path)
            tierer.stop()
    base = _lake_matches_the_kv_at_its_offsets(catalog, table)

    def offsets() -> dict[int, int]:
        return committed_offsets(catalog.load_table(table.path))
    args = [sys.executable, "-m", "flightstore_spark.pipelines.tiering", "--uri", server.uri,
            "--data-dir", str(data_dir), "--tables", "default.accounts", "--master", "local[2]"]
    for key, value in options.items():
        args += ["--lake-option", f"{key}={value}"]
    root = Path(__file__).resolve().parents[2]
    env = spark_job_env(TERM="xterm-256color", COLUMNS="120")
    # The job runs on a terminal, as a user starts it: it shows its progress there (rich, on stderr).
    terminal, job_side = pty.openpty()
    fcntl.ioctl(job_side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    job = subprocess.Popen(args, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=job_side, stderr=job_side)
    os.close(job_side)
    shown = bytearray()

    def read_terminal() -> None:
        while True:
            try:
                data = os.read(terminal, 65536)
            except OSError:  # EIO: every process holding the job's side is gone
                return
            if not data:
                return
            shown.extend(data)
    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        wait_until(lambda: offsets() != base or job.poll() is not None,
                   "the job's first commit", timeout=240)
        threading.Event().wait(rng.uniform(0.2, 1.5))  # then kill it, inside a round or between two
        assert job.poll() is None, "the job finished before it was killed; give it more rounds"
        wait_until(lambda: b"tier default.accounts" in shown, "the job's progress on its terminal", timeout=60)
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    reader.join(timeout=60)  # its Spark JVM leaves once its driver is gone
    os.close(terminal)
    text = shown.decode(errors="replace")
    assert "\x1b[" in text and "/1 tables" in text, text[-3000:]  # a rich bar, counting the table
    killed_at = _lake_matches_the_kv_at_its_offsets(catalog, table)
    assert killed_at != table.end_offsets()  # it was stopped short
    leases = LeaseStore(catalog.catalog.engine)
    wait_until(lambda: leases.current("default.accounts").expires_at_ms < time.time() * 1000,
               "the killed job's lease to expire", timeout=30)
    # The next run (here in the session's Spark, the rest in one round) redoes the interrupted round.
    rerun = tier_tables(spark, server.uri, LakeSettings.from_options(data_dir, {"datalake.tiering.lease": "3s"}),
                        ["default.accounts"])
    assert not isinstance(rerun["default.accounts"], Exception), rerun
    assert _lake_matches_the_kv_at_its_offsets(catalog, table) == table.end_offsets()
    assert read_lake(catalog, table.descriptor, columns=PK.names).sort_by("k").to_pylist() == \
        table.scan_table().sort_by("k").to_pylist()
    catalog.reset()


def test_log_table_files_are_written_by_executor_tasks_and_dropped_partitions_leave(spark, server):
    """One Spark task per bucket writes that bucket's data files (the tasks report each file they
    wrote through an accumulator: Spark's partition id and the path); the driver commits exactly
    those files in one snapshot. A round that dies after the tasks wrote commits nothing (their
    files are orphans) and the re-run commits no duplicate. A dropped partition leaves the lake."""
    import numpy as np
    import pyarrow.parquet as pq
    from flightstore_spark.pipelines.tiering import SparkBucketWriter
    from pyiceberg.io.pyarrow import PyArrowFileIO

    from flightstore.errors import LakeUnavailable

    schema = pa.schema([("dt", pa.string()), ("user", pa.int64()), ("seq", pa.int64())])
    days = ["2026-01-01", "2026-01-02", "2026-01-03"]

    def rows(first: int, count: int) -> pa.Table:
        seq = np.arange(first, first + count, dtype=np.int64)
        return pa.table({"dt": [days[i % 3] for i in seq], "user": seq * 13 % 997, "seq": seq}, schema=schema)

    table = server.store.create_table("default.clicks", schema, partition_keys=["dt"], options={
        "bucket.num": 2, "bucket.key": "user", "table.datalake.enabled": "true"})
    settings = LakeSettings.from_options(server.store.data_dir)
    catalog = LakeCatalog(settings)
    writers: list[SparkBucketWriter] = []

    def writer(*args) -> SparkBucketWriter:
        writers.append(SparkBucketWriter(*args))
        return writers[-1]

    def die_after_write(phase: str) -> None:
        if phase == "after-write":
            raise LakeUnavailable("injected: the job died after its tasks wrote the files")

    def lake_seqs() -> list[int]:
        return sorted(read_lake(catalog, table.descriptor, columns=["seq"]).column("seq").to_pylist())

    with flightstore.connect(server.uri) as conn:
        conn.table("default.clicks").append(rows(0, 600))
        # A round that dies between the tasks' writes and the commit: nothing visible.
        died = tier_tables(spark, server.uri, settings, ["default.clicks"], hook=die_after_write, writer=writer)
        assert isinstance(died["default.clicks"], LakeUnavailable)
        orphans = {path for _, path in writers[-1].written.value}
        assert len(orphans) == 6
        assert lake_seqs() == []
        first = tier_tables(spark, server.uri, settings, ["default.clicks"], writer=writer)
        assert [r.rows for r in first["default.clicks"]] == [600]
        lake_table = catalog.load_table(table.path)
        committed = {task.file.file_path for task in lake_table.scan().plan_files()}
        by_task = writers[-1].written.value
        assert {path for _, path in by_task} == committed and not committed & orphans
        assert sorted(task for task, _ in by_task) == list(range(6))  # one task per bucket, one file each
        assert lake_table.current_snapshot().summary["added-data-files"] == "6"
        io = PyArrowFileIO(lake_table.io.properties)
        for path in committed:
            with io.new_input(path).open() as handle:
                written = pq.read_table(handle)
            assert len(set(written.column("__bucket").to_pylist())) == 1
            assert (np.diff(written.column("__offset").to_numpy()) > 0).all()
        assert lake_seqs() == list(range(600))  # exactly once after the failed round
        assert committed_offsets(lake_table) == table.end_offsets()
        # Drop a partition, write more: the job's next round deletes its rows and tiers the rest.
        gone = next(p.id for p in table.descriptor.partitions if p.name == days[1])
        conn.sql(f"ALTER TABLE clicks DROP PARTITION (dt = '{days[1]}')")
        conn.table("default.clicks").append(rows(600, 90))
    second = tier_tables(spark, server.uri, settings, ["default.clicks"], writer=writer)
    assert second["default.clicks"][0].dropped_buckets == (gone * 2, gone * 2 + 1)
    model = pa.concat_tables([rows(0, 600), rows(600, 90)])
    kept = model.filter(pa.compute.or_(pa.compute.not_equal(model["dt"], days[1]),
                                       pa.compute.greater_equal(model["seq"], 600)))
    assert lake_seqs() == sorted(kept.column("seq").to_pylist())
    assert committed_offsets(catalog.load_table(table.path)) == table.end_offsets()
    catalog.reset()
