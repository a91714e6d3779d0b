"""A real flightstore Flight SQL server on a free loopback port, one per test: in the test's process
(``RunningServer``: the test may reach into its store), or as its own process (``ServerProcess``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.forked_server import ForkedServerProcess


class RunningServer:
    def __init__(self, data_dir, options: dict | None = None, **server: Any) -> None:
        """``options``: server options of the store (partition limits, auto-partition interval);
        ``server``: :class:`FlightSqlServer`'s own arguments (``users``, ``super_users``, ...)."""
        self.store = Store(data_dir, fsync=False, options=options)  # durability: tests/log/test_durability.py
        self.server = FlightSqlServer(self.store, "grpc://127.0.0.1:0", **server)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.store.close()


class ServerProcess(ForkedServerProcess):
    """``flightstore serve`` as its own process, as ``make run`` starts it (forked from the
    preloaded fork server: tests/forked_server.py), started; its output and errors in
    ``<data_dir>.server.log``. For tests whose other side is heavy in the test's process (a Spark
    driver, a page of docs that may leave streams open): the server neither competes with it for
    the GIL nor takes the test worker down when it stops."""

    ROOT = Path(__file__).resolve().parents[2]

    def __init__(self, data_dir: Path, options: dict[str, str] | None = None) -> None:
        args = ["--data-dir", str(data_dir), "--port", "0", "--no-fsync"]
        for key, value in (options or {}).items():
            args += ["--option", f"{key}={value}"]
        self.data_dir = Path(data_dir)
        super().__init__(args, log=self.data_dir.with_name(self.data_dir.name + ".server.log"), cwd=self.ROOT)
        self.start()  # stop(): SIGTERM, a clean shutdown that releases the data directory


@pytest.fixture
def server(tmp_path):
    running = RunningServer(tmp_path / "data")
    yield running
    running.stop()
