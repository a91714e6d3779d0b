"""A real flightstore Flight SQL server on a free loopback port, one per test: in the test's process
(``RunningServer``: the test may reach into its store), or as its own process (``ServerProcess``)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flightstore.server.service import FlightSqlServer
from flightstore.store import Store


class RunningServer:
    def __init__(self, data_dir, options: dict | None = None) -> None:
        """``options``: server options of the store (partition limits, auto-partition interval)."""
        self.store = Store(data_dir, fsync=False, options=options)  # durability: tests/log/test_durability.py
        self.server = FlightSqlServer(self.store, "grpc://127.0.0.1:0")
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.store.close()


class ServerProcess:
    """``flightstore serve`` as its own process, as ``make run`` starts it. For tests whose other side
    is heavy in the test's process (a Spark driver, a page of docs that may leave streams open): the
    server neither competes with it for the GIL nor takes the test worker down when it stops."""

    ROOT = Path(__file__).resolve().parents[2]

    def __init__(self, data_dir: Path, options: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-m", "flightstore", "serve", "--data-dir", str(data_dir), "--port", "0",
                   "--no-fsync"]
        for key, value in (options or {}).items():
            command += ["--option", f"{key}={value}"]
        self.data_dir = Path(data_dir)
        self.process = subprocess.Popen(command, cwd=self.ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        line = self.process.stdout.readline()  # "flightstore serving grpc://..." once it listens
        match = re.search(r"grpc://127\.0\.0\.1:\d+", line)
        if match is None:
            self.process.kill()
            self.process.wait(timeout=30)
            raise AssertionError(f"the server did not start: {line!r}")
        self.uri = match.group(0)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: a clean shutdown that releases the data directory
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.process.stdout.close()


@pytest.fixture
def server(tmp_path):
    running = RunningServer(tmp_path / "data")
    yield running
    running.stop()
