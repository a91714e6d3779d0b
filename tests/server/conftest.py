"""A real flightstore Flight SQL server on a free loopback port, one per test."""

from __future__ import annotations

import threading

import pytest

from flightstore.server.service import FlightSqlServer
from flightstore.store import Store


class RunningServer:
    def __init__(self, data_dir) -> None:
        self.store = Store(data_dir, fsync=False)  # durability: tests/log/test_durability.py
        self.server = FlightSqlServer(self.store, "grpc://127.0.0.1:0")
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()
        self.uri = self.server.uri

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)
        self.store.close()


@pytest.fixture
def server(tmp_path):
    running = RunningServer(tmp_path / "data")
    yield running
    running.stop()
