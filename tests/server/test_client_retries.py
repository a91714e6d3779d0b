"""TableClient writes retry until the server acknowledges them or ``client.writer.delivery-timeout``
passes, and a batch whose outcome is unknown keeps its writer sequence (issue 20 item 3; the kill -9
test with 8 writer processes is in tests/kv/test_aggregation_exactly_once.py)."""

from __future__ import annotations

import socket
import threading

import pyarrow as pa
import pytest

import flightstore
from flightstore.errors import DeliveryTimeout, InvalidOption
from flightstore.server.service import FlightSqlServer
from flightstore.store import Store
from tests.waiting import wait_until

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int64())])


class Restartable:
    """A server on a fixed port that can go away and come back (the same data directory)."""

    def __init__(self, data_dir) -> None:
        self.data_dir = data_dir
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.uri = f"grpc://127.0.0.1:{self.port}"
        self.server = None

    def start(self) -> None:
        self.store = Store(self.data_dir, fsync=False)
        self.server = FlightSqlServer(self.store, self.uri)
        self.thread = threading.Thread(target=self.server.serve, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.thread.join(timeout=30)
            self.store.close()
            self.server = None


class Refusing:
    """What a client meets while a server restarts: connections to the port are accepted and
    closed at once. Counts them, so a test can wait until the client tried several times."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.accepted = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(timeout=10)


@pytest.fixture
def server(tmp_path):
    running = Restartable(tmp_path / "data")
    running.start()
    running.store.create_table("kv", SCHEMA, primary_key=["k"],
                               options={"bucket.num": 2, "table.merge-engine": "aggregation",
                                        "fields.n.agg": "sum"})
    yield running
    running.stop()


def _sums(server) -> dict:
    return {r["k"]: r["n"] for r in server.store.table("kv").scan_table().to_pylist()}


def test_a_write_outlasts_a_server_restart_and_is_applied_once(server) -> None:
    with flightstore.connect(server.uri) as conn:
        table = conn.table("kv", writer_id="w")
        table.upsert({"k": [1, 2], "n": [1, 1]})
        server.stop()
        refusing = Refusing(server.port)
        done: list = []
        writer = threading.Thread(target=lambda: done.append(table.upsert({"k": [1, 2], "n": [10, 10]})))
        writer.start()
        try:  # far more failed attempts than the 3 tries the client used to give up after
            wait_until(lambda: refusing.accepted >= 8, "the client retrying", timeout=60)
        finally:
            refusing.close()
        server.start()
        writer.join(timeout=120)
        assert done and done[0]["sequence"] == 1
        assert _sums(server) == {1: 11, 2: 11}
        table.upsert({"k": [1], "n": [100]})
        assert _sums(server) == {1: 111, 2: 11} and table.sequence == 2


def test_a_batch_whose_outcome_is_unknown_keeps_its_sequence(server) -> None:
    options = {"client.writer.delivery-timeout": "300ms", "client.writer.retry-backoff.max": "50ms"}
    with flightstore.connect(server.uri, options=options) as conn:
        table = conn.table("kv", writer_id="w")
        table.upsert({"k": [1], "n": [1]})
        server.stop()
        with pytest.raises(DeliveryTimeout, match="batch 1 of writer 'w'.*do not send it again"):
            table.upsert({"k": [1], "n": [10]})
        assert table.sequence == 0  # batch 1 is not acknowledged, and its sequence is not reused
        with pytest.raises(DeliveryTimeout):  # the next write delivers batch 1 first: still down
            table.upsert({"k": [1], "n": [100]})
        server.start()
        answer = table.upsert({"k": [2], "n": [1000]})  # batch 1, then this one as batch 2
        assert answer["sequence"] == 2 and table.flush() is None
        assert _sums(server) == {1: 11, 2: 1000}
        assert server.store.table("kv").writer_sequence("w") == 2


def test_client_options_are_checked() -> None:
    with pytest.raises(InvalidOption, match="unknown client option 'client.writer.retries'"):
        flightstore.connect("grpc://127.0.0.1:1", options={"client.writer.retries": 3})
    with pytest.raises(InvalidOption, match="client.writer.delivery-timeout"):
        flightstore.connect("grpc://127.0.0.1:1", options={"client.writer.delivery-timeout": "soon"})


class SlowHandshake:
    """A TCP proxy in front of a server whose first answer on each connection (the server's HTTP/2
    SETTINGS frame) reaches the client only ``delay`` seconds late: a server starved of CPU on a
    loaded machine, or one that is paused."""

    def __init__(self, port: int, delay: float) -> None:
        self.target, self.delay = port, delay
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.uri = f"grpc://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, self.delay), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, delay: float) -> None:
        try:
            first = True
            while data := source.recv(65536):
                if first and self.stopping.wait(delay):
                    return
                first = False
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.stopping.set()
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def test_a_server_slow_to_answer_the_handshake_is_still_reached(server) -> None:
    """A connection attempt gets ``client.connect-timeout`` (5 s) for the server's handshake. It used
    to get 100 ms (gRPC takes its minimum reconnect backoff as the minimum connect timeout), so a
    server starved on a loaded machine was answered with UNAVAILABLE: "connection attempt timed
    out before receiving SETTINGS frame"."""
    proxy = SlowHandshake(server.port, delay=0.6)
    try:
        with flightstore.connect(proxy.uri, timeout=30) as conn:
            assert sorted(conn.table("kv").describe()["end_offsets"]) == [0, 1]
    finally:
        proxy.close()


def test_a_server_that_does_not_answer_within_the_connect_timeout_is_passed_over(server) -> None:
    paused = SlowHandshake(server.port, delay=60)
    try:
        options = {"client.connect-timeout": "300ms"}
        with flightstore.connect(f"{paused.uri},{server.uri}", timeout=30, options=options) as conn:
            assert sorted(conn.table("kv").describe()["end_offsets"]) == [0, 1]
            assert conn.uri == server.uri  # the paused one counted as unreachable: moved on
    finally:
        paused.close()
