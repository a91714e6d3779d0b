"""A wide table (issue 20, item 6): every read path of a real `flightstore serve` process stays
within ``query.memory-limit`` or refuses cleanly, and the server keeps serving.

A row count alone says nothing of a batch's size: 600 BIGINT columns make 4.8 KB rows, so the
65,536-row chunks, image batches and engine batches the server used to build would hold hundreds of
MB. Memory is the process's anonymous resident memory (RssAnon), sampled every few milliseconds
while a query runs: the log and KV images are memory-mapped files, whose page-cache pages count in
RSS as they are read but are the kernel's to reclaim, not the query's to hold."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.store import Store
from tests.server.test_query_memory import Server

COLUMNS = 600
ROWS = 6_000  # 4.8 KB per row: 29 MB per table
LIMIT = 32 * 1024 * 1024
MB = 1024 * 1024
OPTIONS = {"bucket.num": "1"}


def _rows(start: int, count: int) -> pa.Table:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.table({f"c{i}": ids if i == 0 else (ids * (i + 7)) % 1009 for i in range(COLUMNS)})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("wide") / "data"
    schema = _rows(0, 1).schema
    with Store(data_dir, fsync=False) as store:
        lg = store.create_table("lg", schema, options=OPTIONS)
        pk = store.create_table("pk", schema, primary_key=["c0"], options=OPTIONS)
        imaged = store.create_table("imaged", schema, primary_key=["c0"], options=OPTIONS)
        for start in range(0, ROWS, 1_000):
            part = _rows(start, 1_000)
            lg.append(part)
            pk.upsert(part)
            imaged.upsert(part)
        imaged.snapshot()  # a KV image (written in batches within the batch bytes too)
    running = Server(data_dir, {"query.memory-limit": str(LIMIT)})
    yield running
    running.stop()


def _anon(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"RssAnon:\s+(\d+) kB", status).group(1)) * 1024


class _Peak:
    """The peak RssAnon of a process while the block runs, above what it was before."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.grown = 0

    def __enter__(self) -> _Peak:
        self.before = self.peak = _anon(self.pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.002):
            self.peak = max(self.peak, _anon(self.pid))

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)
        self.peak = max(self.peak, _anon(self.pid))
        self.grown = self.peak - self.before


def _grown(server: Server, sql: str) -> tuple[int, int]:
    """(rows, bytes the server grew by) of ``sql``, run a second time: what the first run leaves
    for later queries (RocksDB's block cache, the plan cache) is the server's, not the query's."""
    server.query(sql)
    with _Peak(server.process.pid) as peak:
        rows = server.query(sql).num_rows
    return rows, peak.grown


@pytest.mark.parametrize("sql", [
    "SELECT * FROM lg",  # log records
    "SELECT * FROM pk",  # the changelog folded (no snapshot)
    "SELECT * FROM pk WHERE c0 >= 0",  # a range: RocksDB read in chunks
    "SELECT * FROM imaged",  # the KV image
    "SELECT * FROM pk WHERE c0 IN (" + ", ".join(str(i) for i in range(0, ROWS, 10)) + ")",  # 600 keys
])
def test_every_read_path_of_a_wide_table_stays_within_the_memory_limit(server, sql):
    expected = ROWS if "IN (" not in sql else ROWS // 10
    rows, grown = _grown(server, sql)
    assert rows == expected
    assert grown < LIMIT, f"{sql[:40]}: the server grew by {grown / MB:.0f} MB (limit {LIMIT / MB:.0f} MB)"


def test_what_cannot_fit_is_refused_cleanly_and_the_server_keeps_serving(server):
    every_key = "SELECT * FROM pk WHERE c0 IN (" + ", ".join(str(i) for i in range(ROWS)) + ")"
    for attempt in range(2):  # (the first plans the 6,000-value IN list: the plan cache keeps it)
        with _Peak(server.process.pid) as peak:
            with pytest.raises(flight.FlightInternalError, match="RESOURCE_EXHAUSTED: .*lookup of 6000 keys"):
                server.query(every_key)  # 29 MB of answer held whole, more than a query may hold
    assert peak.grown < LIMIT, f"the server grew by {peak.grown / MB:.0f} MB"
    with pytest.raises(flight.FlightInternalError, match="RESOURCE_EXHAUSTED"):
        server.query("SELECT * FROM lg ORDER BY c1")  # the engine sorts 29 MB of rows in 32 MB
    assert server.query("SELECT c0, c5 FROM pk WHERE c0 = 7").to_pylist() == [{"c0": 7, "c5": 7 * 12 % 1009}]
