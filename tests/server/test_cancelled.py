"""The cancelled-query memory is bounded (defect 11 of issue 10): past its size cap the oldest
cancellations are forgotten, and each is forgotten after its time to live."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.server import protocol
from flightstore.server.expiring import ExpiringSet


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_members_expire_after_their_time_to_live() -> None:
    clock = Clock()
    cancelled = ExpiringSet(ttl_s=10, max_size=100, clock=clock)
    cancelled.add(b"a")
    clock.now = 5
    cancelled.update([b"b", b"c"])
    assert b"a" in cancelled and len(cancelled) == 3
    clock.now = 10
    assert b"a" not in cancelled and b"b" in cancelled and len(cancelled) == 2
    cancelled.add(b"b")  # renewed
    clock.now = 15
    assert b"c" not in cancelled and b"b" in cancelled and len(cancelled) == 1


def test_size_stays_at_the_cap_keeping_the_newest() -> None:
    cancelled = ExpiringSet(ttl_s=3600, max_size=50, clock=Clock())
    for i in range(10_000):
        cancelled.add(i)
        assert len(cancelled._members) <= 50
    assert all(i in cancelled for i in range(9_950, 10_000))
    assert 9_949 not in cancelled and 0 not in cancelled


def test_many_cancels_through_flight_stay_bounded(server) -> None:
    with flightstore.connect(server.uri) as conn:
        conn.sql("CREATE TABLE t (id BIGINT) WITH ('bucket.num' = '2')")
        conn.table("t").append(pa.table({"id": pa.array(range(10), pa.int64())}))
    server.server._cancelled.max_size = 40  # the default (100,000) is too many to reach in a test
    client = flight.FlightClient(server.uri)
    command = protocol.pack_any(protocol.CommandStatementQuery(query="SELECT id FROM t"))
    infos = []
    for _ in range(100):
        info = client.get_flight_info(flight.FlightDescriptor.for_command(command))
        request = protocol.CancelFlightInfoRequest(info=info.serialize())
        list(client.do_action(flight.Action(protocol.CANCEL_FLIGHT_INFO, request.SerializeToString())))
        infos.append(info)
        assert len(server.server._cancelled) <= 40
    assert len(server.server._cancelled) == 40
    with pytest.raises(flight.FlightCancelledError):  # the newest cancellation still holds
        client.do_get(infos[-1].endpoints[0].ticket).read_all()
    # the oldest were forgotten (memory stays bounded); the newest 40 are the ones kept
    kept = server.server._cancelled
    assert infos[0].endpoints[0].ticket.ticket not in kept
    assert all(info.endpoints[0].ticket.ticket in kept for info in infos[-40:])
    client.close()
