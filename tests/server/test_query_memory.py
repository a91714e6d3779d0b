"""A real `flightstore serve` process keeps its memory bounded whatever a query asks, and SIGTERM
stops it within its grace period even while a query runs.

Peak memory is the server process's VmHWM (/proc/PID/status), reset before each query by writing
5 to /proc/PID/clear_refs. The tables are LZ4-compressed: compressed log records are decoded into
the process's own memory, where uncompressed ones are read through a file mapping whose page-cache
pages would count in VmHWM as the table is read (memory the kernel reclaims at will)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.server import protocol
from flightstore.store import Store

pytestmark = pytest.mark.slow

BIG_ROWS = 16_000_000
GROUPS = 1_000_000
READ_BYTES = BIG_ROWS * 16  # the two 8-byte columns the GROUP BY reads: 256 MB
SMALL_ROWS = 200_000  # the self cross join: 40 G rows
CAP = 2_000_000
MEMORY_LIMIT = "32MB"
GRACE_S = 2.0
MB = 1024 * 1024


class Server:
    """`python -m flightstore serve` on a free port with server ``options``."""

    def __init__(self, data_dir: Path, options: dict[str, str]) -> None:
        command = [sys.executable, "-m", "flightstore", "serve", "--data-dir", str(data_dir), "--port", "0",
                   "--no-fsync"]
        for key, value in options.items():
            command += ["--option", f"{key}={value}"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()
        match = re.search(r"grpc://127\.0\.0\.1:\d+", line)
        assert match, f"the server did not start: {line!r}"
        self.client = flight.FlightClient(match.group(0))

    def peak_bytes(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024

    def reset_peak(self) -> int:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")
        return self.peak_bytes()

    def reader(self, sql: str) -> flight.FlightStreamReader:
        command = protocol.pack_any(protocol.CommandStatementQuery(query=sql))
        info = self.client.get_flight_info(flight.FlightDescriptor.for_command(command))
        return self.client.do_get(info.endpoints[0].ticket)

    def query(self, sql: str) -> pa.Table:
        return self.reader(sql).read_all()

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=60)


COMPRESSED = {"bucket.num": "2", "table.log.arrow.compression.type": "LZ4_FRAME"}
SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("v", pa.float64())])


def _write_small_table(store: Store) -> None:
    ids = np.arange(SMALL_ROWS, dtype=np.int64)
    store.create_table("t", SCHEMA, options=COMPRESSED).append(
        pa.table({"id": ids, "g": ids % 10, "v": ids.astype(np.float64)}))


def _write_tables(data_dir: Path) -> None:
    with Store(data_dir, fsync=False) as store:
        big = store.create_table("big", SCHEMA, options=COMPRESSED)
        for start in range(0, BIG_ROWS, 250_000):
            ids = np.arange(start, start + 250_000, dtype=np.int64)
            big.append(pa.table({"id": ids, "g": ids * 7919 % GROUPS, "v": (ids % 1000).astype(np.float64)}))
        _write_small_table(store)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("memory") / "data"
    _write_tables(path)
    return path


@pytest.fixture(scope="module")
def server(data_dir):
    running = Server(data_dir, {"query.memory-limit": MEMORY_LIMIT, "query.max-result-rows": str(CAP)})
    yield running
    running.stop()


def _expected_groups() -> tuple[np.ndarray, np.ndarray]:
    sums, counts = np.zeros(GROUPS), np.zeros(GROUPS, dtype=np.int64)
    for start in range(0, BIG_ROWS, 4_000_000):
        ids = np.arange(start, start + 4_000_000, dtype=np.int64)
        groups = ids * 7919 % GROUPS
        sums += np.bincount(groups, weights=(ids % 1000).astype(np.float64), minlength=GROUPS)
        counts += np.bincount(groups, minlength=GROUPS)
    return sums, counts


def test_group_by_over_a_table_larger_than_the_memory_limit_streams_in_bounded_memory(server) -> None:
    before = server.reset_peak()
    result = server.query("SELECT g, sum(v) AS s, count(*) AS n FROM big GROUP BY g")
    grown = server.peak_bytes() - before
    assert result.num_rows == GROUPS
    result = result.sort_by("g")
    sums, counts = _expected_groups()
    assert np.array_equal(result.column("g").to_numpy(), np.arange(GROUPS))
    assert np.array_equal(result.column("n").to_numpy(), counts)
    assert np.allclose(result.column("s").to_numpy(), sums)
    # Materializing the inputs alone would grow the server by READ_BYTES (256 MB); streamed, it
    # holds the engine's 32 MB, a few input batches and result batches in flight.
    assert grown < READ_BYTES / 2, f"the server grew by {grown / MB:.0f} MB"


def test_the_self_cross_join_is_refused_in_bounded_memory_and_the_server_keeps_serving(server) -> None:
    before = server.reset_peak()
    reader = server.reader("SELECT a.id, b.id, a.v FROM t a, t b")
    rows = 0
    with pytest.raises(flight.FlightInternalError, match="RESOURCE_EXHAUSTED.*query.max-result-rows"):
        while True:
            rows += reader.read_chunk().data.num_rows
    assert rows <= CAP
    grown = server.peak_bytes() - before
    assert grown < 200 * MB, f"the server grew by {grown / MB:.0f} MB"
    assert server.query("SELECT count(*) AS n FROM t WHERE id < 10").to_pylist() == [{"n": 10}]


def test_sigterm_stops_a_server_running_a_long_query_within_its_grace(tmp_path) -> None:
    with Store(tmp_path / "data", fsync=False) as store:
        _write_small_table(store)
    running = Server(tmp_path / "data", {"server.shutdown-grace": f"{GRACE_S:g}s", "query.timeout": "0"})
    try:
        # 40 G rows streaming: nothing but the shutdown stops it (no timeout, no row cap hit soon).
        reader = running.reader("SELECT a.id, b.id FROM t a, t b")
        assert reader.read_chunk().data.num_rows > 0  # the query is running
        signalled = time.monotonic()
        running.process.send_signal(signal.SIGTERM)
        with pytest.raises(flight.FlightUnavailableError, match="shutting down"):
            while True:
                reader.read_chunk()
        assert running.process.wait(timeout=GRACE_S + 30) == 0
        # The grace, then the stopped query ends at its next batch; a server waiting for the
        # query would run for hours.
        assert time.monotonic() - signalled < GRACE_S + 20
    finally:
        running.stop()
