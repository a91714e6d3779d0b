"""The delta join's backfill from the lake (``--startup-mode lake``): the two tables' lake snapshots
joined in Spark batch mode, then the streaming delta join from exactly the offsets those snapshots
recorded. From the backfill through the streaming phase the sink equals the batch join of the two
tables, across kill -9 of the Spark job at each phase and a restart of the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from flightstore_spark import _flight
from flightstore_spark.pipelines import backfill as lake_backfill

from flightstore.client import connect
from flightstore.lake import LakeSettings
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.lake.conftest import free_port
from tests.spark.conftest import spark_job_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


class RestartableServer:
    """A lake-enabled server on a fixed port, stopped and started again on the same data."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.port = data_dir, free_port()
        self.uri = f"grpc://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        self.store = Store(self.data_dir)
        self.server = FlightSqlServer(self.store, self.uri, lake=LakeSettings.from_options(self.data_dir, {}))
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=30)
        self.store.close()

    def tier(self, *tables: str) -> None:
        for table in tables:
            self.server.tierer.tier_now(table)


@pytest.fixture
def lake(tmp_path):
    running = RestartableServer(tmp_path / "data")
    yield running
    running.stop()


def _setup(conn) -> None:
    lake_on = "'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1h'"
    conn.sql("CREATE TABLE orders (cust BIGINT, oid BIGINT, amount DOUBLE, PRIMARY KEY (cust, oid) NOT ENFORCED) "
             f"WITH ('bucket.num' = '2', 'bucket.key' = 'cust', {lake_on})")
    conn.sql("CREATE TABLE customers (cust BIGINT, name STRING, PRIMARY KEY (cust) NOT ENFORCED) "
             f"WITH ('bucket.num' = '2', {lake_on})")
    conn.sql("CREATE TABLE wide (cust BIGINT, oid BIGINT, amount DOUBLE, name STRING, "
             "PRIMARY KEY (cust, oid) NOT ENFORCED) WITH ('bucket.num' = '2', 'bucket.key' = 'cust')")


def _changes(conn, step: int) -> None:
    """Updates on both sides: new orders, changed and deleted orders and customers."""
    orders, customers = conn.table("orders"), conn.table("customers")
    base = step * 100
    customers.upsert({"cust": [c for c in range(12)], "name": [f"c{c}-{step}" for c in range(12)]})
    orders.upsert({"cust": [(base + i) % 15 for i in range(40)], "oid": [base + i for i in range(40)],
                   "amount": [float(step * 1000 + i) for i in range(40)]})
    if step:
        orders.upsert({"cust": [(base - 100 + i) % 15 for i in range(0, 40, 3)],
                       "oid": [base - 100 + i for i in range(0, 40, 3)], "amount": [-1.0] * 14})
        orders.delete({"cust": [(base - 100 + i) % 15 for i in range(1, 40, 7)],
                       "oid": [base - 100 + i for i in range(1, 40, 7)]})
        customers.delete({"cust": [step % 12]})


def _batch_join(conn) -> list[tuple]:
    names = {r["cust"]: r["name"] for r in conn.table("customers").scan().to_pylist()}
    orders = conn.table("orders").scan().to_pylist()
    return sorted((r["cust"], r["oid"], r["amount"], names.get(r["cust"])) for r in orders)


def _sink(conn) -> list[tuple]:
    return sorted((r["cust"], r["oid"], r["amount"], r["name"]) for r in conn.table("wide").scan().to_pylist())


def _job(uri: str, checkpoint: Path, trigger: str) -> subprocess.Popen:
    log = open(checkpoint.parent / "job.log", "ab")  # never a pipe nobody reads: Spark logs a lot
    return subprocess.Popen([sys.executable, "-m", "flightstore_spark.pipelines.delta_join", "--uri", uri,
                             "--left", "orders", "--right", "customers", "--key", "cust", "--sink", "wide",
                             "--checkpoint", str(checkpoint), "--startup-mode", "lake", "--trigger", trigger,
                             "--master", "local[2]"],
                            env=spark_job_env(), stdout=log, stderr=log, start_new_session=True)


def _kill(job: subprocess.Popen) -> None:
    os.killpg(job.pid, signal.SIGKILL)  # the driver and its JVM and Python workers
    job.wait(timeout=60)


def _state(checkpoint: Path) -> str | None:
    path = checkpoint / lake_backfill.RECORD
    return json.loads(path.read_text())["state"] if path.exists() else None


@pytest.mark.timeout(1500)  # three Spark jobs, each a JVM start, on a busy 2-core machine
def test_lake_backfill_then_stream_survives_kill_9_at_each_phase_and_a_server_restart(lake, tmp_path):
    conn = connect(lake.uri)
    _setup(conn)
    _changes(conn, 0)
    lake.tier("default.orders", "default.customers")
    _changes(conn, 1)
    lake.tier("default.orders", "default.customers")
    _changes(conn, 2)  # after the snapshots: only the stream brings these (a gap would lose them)
    planned = _flight.lake_split(conn, "orders", lake_only=True)
    assert any(f["deletes"] for f in planned["files"])  # the executors apply position deletes
    checkpoint = tmp_path / "ck"

    job = _job(lake.uri, checkpoint, "0.5")  # killed during the backfill
    wait_until(lambda: _state(checkpoint) == "planned" or job.poll() is not None, "the backfill planned", 300)
    _kill(job)
    conn.close()
    lake.stop()  # and the server restarts
    lake.start()
    conn = connect(lake.uri)
    _changes(conn, 3)

    job = _job(lake.uri, checkpoint, "0.5")  # killed while streaming, after the backfill
    commits = checkpoint / "stream" / "commits"
    wait_until(lambda: (commits.exists() and any(commits.iterdir())) or job.poll() is not None,
               "a streamed micro-batch", 300)
    _changes(conn, 4)
    _kill(job)
    record = json.loads((checkpoint / lake_backfill.RECORD).read_text())
    assert record["state"] == "written"
    assert {int(b): o for b, o in record["left"]["offsets"].items()} != conn.table("orders").offsets("end")

    _changes(conn, 5)
    job = _job(lake.uri, checkpoint, "availableNow")  # drains and stops
    job.wait(timeout=600)
    assert job.returncode == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert _sink(conn) == _batch_join(conn)
    with pytest.raises(ValueError, match="not empty"):  # a fresh backfill into a written sink is refused
        lake_backfill.backfill(None, lake.uri, "orders", "customers", ["cust"], "wide", str(tmp_path / "other"))
    conn.close()
