"""Fixtures of the lake tests: a store, its embedded lake (sqlite catalog + local warehouse), a real
S3 API endpoint (moto's server in its own process), and helpers to write and check rows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flightstore.lake import LakeCatalog, LakeSettings, LakeTierer
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.waiting import wait_until

EVENTS = pa.schema([("k", pa.int64()), ("seq", pa.int64()), ("s", pa.string()), ("ts", pa.timestamp("ms"))])


def events(first: int, count: int) -> pa.Table:
    """Rows with ``seq`` first..first+count-1 (the identity every test counts by)."""
    seq = np.arange(first, first + count, dtype=np.int64)
    return pa.table({"k": seq * 7 % 1000, "seq": seq, "s": pa.array([f"v{i}" for i in seq]),
                     "ts": pa.array(seq, pa.timestamp("ms"))}, schema=EVENTS)


def lake_seqs(catalog: LakeCatalog, table) -> list[int]:
    """Every ``seq`` in the lake table of ``table``, sorted (duplicates kept)."""
    from flightstore.lake import read_lake
    return sorted(read_lake(catalog, table.descriptor, columns=["seq"]).column("seq").to_pylist())


@pytest.fixture
def data_dir(tmp_path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data_dir):
    with Store(data_dir) as s:
        yield s


@pytest.fixture
def settings(data_dir) -> LakeSettings:
    return LakeSettings.from_options(data_dir, {"datalake.tiering.retry-backoff.max": "200ms"})


@pytest.fixture
def tierer(store, settings):
    """A tierer with no background thread: tests call tier_now / run_due themselves."""
    tierer = LakeTierer(store, settings)
    yield tierer
    tierer.stop()


def create_events(store: Store, name: str = "default.events", **options) -> object:
    opts = {"bucket.num": 3, "bucket.key": "k", "table.datalake.enabled": "true"}
    opts.update({k.replace("_", "."): v for k, v in options.items()})
    return store.create_table(name, EVENTS, options=opts)


class LakeServer:
    """A real Flight SQL server in this process with the lake of ``settings`` (its tierer runs in
    the background); ``server_options``: FlightSqlServer's keyword arguments."""

    def __init__(self, data_dir, settings: LakeSettings, **server_options) -> None:
        self.store = Store(data_dir)
        self.server = FlightSqlServer(self.store, "grpc://127.0.0.1:0", lake=settings, **server_options)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=30)
        self.store.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MotoServer:
    """moto's S3 API server (``moto_server``) on a free loopback port, in its own process, so it
    outlives the processes a test kills and is as real an endpoint as any S3 service."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        moto_server = Path(sys.executable).parent / "moto_server"
        self.process = subprocess.Popen([str(moto_server), "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._up, "moto's S3 server accepting connections", timeout=60)

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {self.process.returncode}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def create_bucket(self, name: str) -> None:
        import boto3
        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.create_bucket(Bucket=name)

    def options(self, bucket: str, prefix: str = "lake") -> dict[str, str]:
        """Server options putting the warehouse on this endpoint."""
        return {"datalake.iceberg.warehouse": f"s3://{bucket}/{prefix}",
                "datalake.iceberg.s3.endpoint": self.endpoint,
                "datalake.iceberg.s3.access-key-id": "testing",
                "datalake.iceberg.s3.secret-access-key": "testing",
                "datalake.iceberg.s3.region": "us-east-1"}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)


@pytest.fixture(scope="session")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture
def s3_options(moto, tmp_path) -> dict[str, str]:
    bucket = f"lake-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}"
    moto.create_bucket(bucket)
    return moto.options(bucket)
