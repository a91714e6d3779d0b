"""flightstore.streams.read_batches: the DoGet loop of the client, cluster forwarding and the Spark
connector, against a bare pyarrow Flight server on a free loopback port."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.streams import read_batches
from tests.waiting import wait_until

SCHEMA = pa.schema([("x", pa.int64())])


class _Server(flight.FlightServerBase):
    """``rows``: three batches, the middle one empty; ``endless``: batches until the client goes
    away (then ``closed`` is set); ``fails``: one batch, then an error."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.closed = threading.Event()

    def do_get(self, context, ticket):
        kind = ticket.ticket.decode()
        if kind == "rows":
            batches = [pa.record_batch([pa.array([1, 2])], schema=SCHEMA),
                       pa.record_batch([pa.array([], pa.int64())], schema=SCHEMA),
                       pa.record_batch([pa.array([3])], schema=SCHEMA)]
            return flight.GeneratorStream(SCHEMA, iter(batches))
        if kind == "endless":
            return flight.GeneratorStream(SCHEMA, self._endless(context))
        return flight.GeneratorStream(SCHEMA, self._failing())

    def _endless(self, context):
        try:
            while not context.is_cancelled():
                yield pa.record_batch([pa.array(range(1000))], schema=SCHEMA)
        finally:
            self.closed.set()

    def _failing(self):
        yield pa.record_batch([pa.array([1])], schema=SCHEMA)
        raise flight.FlightUnavailableError("the source went away")


@pytest.fixture(scope="module")
def client():
    server = _Server()
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    with flight.FlightClient(f"grpc://127.0.0.1:{server.port}") as connected:
        yield server, connected
    server.shutdown()
    thread.join(timeout=30)


def _get(connected: flight.FlightClient, kind: str) -> flight.FlightStreamReader:
    return connected.do_get(flight.Ticket(kind.encode()), flight.FlightCallOptions(timeout=60))


def test_empty_batches_are_skipped_unless_kept(client):
    _, connected = client
    assert [b.num_rows for b in read_batches(_get(connected, "rows"))] == [2, 1]
    assert [b.num_rows for b in read_batches(_get(connected, "rows"), keep_empty=True)] == [2, 0, 1]


def test_an_error_goes_through_the_callers_mapping(client):
    _, connected = client

    class Mapped(Exception):
        pass

    with pytest.raises(flight.FlightUnavailableError, match="went away"):
        list(read_batches(_get(connected, "fails")))
    batches = read_batches(_get(connected, "fails"), map_error=lambda exc: Mapped(f"mapped: {exc}"))
    assert next(batches).num_rows == 1
    with pytest.raises(Mapped, match="mapped: .*went away"):
        next(batches)


def test_a_stream_left_early_is_cancelled(client):
    server, connected = client
    server.closed.clear()
    reader = _get(connected, "endless")  # held here: only the cancel can end the stream
    batches = read_batches(reader)
    assert next(batches).num_rows == 1000
    batches.close()  # the consumer stops: the server's generator must end, not run forever
    wait_until(server.closed.is_set, "the server's stream ending after the client cancelled it", timeout=60)
