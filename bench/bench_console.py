"""The web console at 1,000 tables x 16 buckets: how fast its pages answer, and what one browser
polling every 5 s costs the server.

Issue 25's goals: every page (its ``/api/...`` answer, which is what the page waits for) answers in
under 200 ms with 1,000 tables of 16 buckets; serving the console to one browser that refreshes
every 5 s costs the Flight server under 2% of a core.

The data directory is made with the embedded Store (950 log tables and 50 primary-key tables, 16
buckets each, a few rows in 100 of them), then ``flightstore serve --console-port`` runs it in its
own process with a users file; the bench logs in once (the session cookie, as a browser) and:

* times each page's API answer from this process (loopback HTTP): the tables list (reads the
  catalog), a table's page the first time (the server opens the table: 16 logs, and RocksDB for a
  primary-key table) and again (open), the lake, the rates and the running queries. p50 and p99
  against the 200 ms goal (the "peer" column is the goal).
* measures the server process's CPU (user + system, ``/proc/<pid>/stat``) over the same wall time
  idle, then while one poller asks what an open console page asks every 5 s (the tables list, the
  rates and the running queries: three calls, more than one page needs), and reports both as % of
  one core; the idle server is the peer.

    python -m bench console
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.report import Row
from flightstore.server.users import UserStore
from flightstore.store import Store

TABLES, PK_TABLES, BUCKETS = 1000, 50, 16
POLL_S = 5.0
WINDOW_S = float(os.environ.get("BENCH_CONSOLE_WINDOW_S", "60"))
SAMPLES = 60
HERE = Path(__file__).parent
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _make(data_dir: Path) -> list[str]:
    """1,000 tables of 16 buckets (50 with a primary key), rows in 100 of them; their names."""
    schema = pa.schema([("id", pa.int64()), ("v", pa.string())])
    names = []
    started = time.perf_counter()
    with Store(data_dir, fsync=False) as store:
        store.create_database("shop")
        for i in range(TABLES):
            name = f"shop.t{i:04d}"
            pk = i < PK_TABLES
            table = store.create_table(name, schema, primary_key=["id"] if pk else [],
                                       options={"bucket.num": str(BUCKETS)})
            if i % 10 == 0:
                ids = np.arange(200, dtype=np.int64)
                rows = pa.table({"id": ids, "v": [f"v{j}" for j in range(200)]}, schema=schema)
                (table.upsert if pk else table.append)(rows)
            names.append(name)
            table.close()  # 16,000 logs and 800 RocksDBs need not stay open in this process
            store._tables.pop(table.path)
    print(f"  made {TABLES} tables x {BUCKETS} buckets in {time.perf_counter() - started:.0f} s",
          file=sys.stderr, flush=True)
    return names


class _Console:
    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def login(self) -> None:
        request = urllib.request.Request(self.base + "/api/login", method="POST",
                                         data=json.dumps({"user": "admin", "password": "bench-pw"}).encode(),
                                         headers={"Content-Type": "application/json"})
        with self.opener.open(request, timeout=120) as answer:
            assert answer.status == 200

    def get(self, path: str) -> float:
        """Seconds until ``path``'s whole answer arrived."""
        started = time.perf_counter()
        with self.opener.open(self.base + path, timeout=120) as answer:
            answer.read()
            if answer.status != 200:
                raise RuntimeError(f"{path}: {answer.status}")
        return time.perf_counter() - started


def _percentiles(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 50)) * 1000, float(np.percentile(values, 99)) * 1000


def _cpu_percent(pid: int, seconds: float, work=None) -> float:
    """% of one core the server used over ``seconds`` of wall time (``work()`` every POLL_S)."""
    before, started = _cpu_s(pid), time.monotonic()
    deadline = started + seconds
    while True:
        if work is not None:
            work()
        pause = (POLL_S if work is not None else seconds)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        time.sleep(min(pause, remaining))
    elapsed = time.monotonic() - started
    return (_cpu_s(pid) - before) / elapsed * 100


def run() -> list[Row]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-console-"))
    process = None
    try:
        names = _make(workdir / "data")
        users = UserStore.open(workdir / "users.json", create=True)
        users.add("admin", "bench-pw")
        port, console_port = _free_port(), _free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "flightstore", "serve", "--data-dir", str(workdir / "data"), "--port", str(port),
             "--no-fsync", "--users-file", str(workdir / "users.json"), "--super-user", "admin",
             "--console-port", str(console_port)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=HERE.parent)
        for _ in range(2):
            line = process.stdout.readline()
        if "console at" not in line:
            raise RuntimeError(f"the server did not start its console: {line!r}")
        console = _Console(f"http://127.0.0.1:{console_port}")
        console.login()
        pages: dict[str, list[float]] = {}
        sample = random.Random(25).sample(names, SAMPLES)
        pages["tables list"] = [console.get("/api/tables") for _ in range(SAMPLES)]
        pages["table page, first visit"] = [console.get(f"/api/table?name={n}") for n in sample]
        pages["table page, open table"] = [console.get(f"/api/table?name={n}") for n in sample]
        pages["lake"] = [console.get("/api/lake") for _ in range(SAMPLES)]
        pages["rates"] = [console.get("/api/rates") for _ in range(SAMPLES)]
        pages["running queries"] = [console.get("/api/queries") for _ in range(SAMPLES)]
        rows = []
        for page, times in pages.items():
            p50, p99 = _percentiles(times)
            for label, value in (("p50", p50), ("p99", p99)):
                rows.append(Row(f"console {page} {label} ({TABLES}x{BUCKETS})", value, 200.0, "ms",
                                "goal", higher_is_better=False, goal="< 200 ms"))

        def poll() -> None:
            for path in ("/api/tables", "/api/rates", "/api/queries"):
                console.get(path)

        time.sleep(POLL_S)  # let the page timings' work settle before the idle window
        idle = _cpu_percent(process.pid, WINDOW_S)
        polled = _cpu_percent(process.pid, WINDOW_S, poll)
        rows.append(Row("console: server CPU with one poller every 5 s (% of a core)", polled, idle, "%",
                        "same server idle", higher_is_better=False, goal=f"< idle + 2 (idle {idle:.2f})"))
        rows.append(Row("console: poller's extra server CPU (% of a core)", polled - idle, 2.0, "%",
                        "goal", higher_is_better=False, goal="< 2"))
        return rows
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(workdir, ignore_errors=True)
