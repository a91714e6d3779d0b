"""Pure parts of cluster mode: the ZooKeeper address, round-robin assignment, errors on the wire."""

from __future__ import annotations

import pytest
from pyarrow import flight

from flightstore.cluster.assignment import round_robin
from flightstore.cluster.layout import ZkAddress
from flightstore.cluster.store import ClusterStore
from flightstore.errors import BucketUnavailable, InvalidInput, Unavailable
from flightstore.server.service import FlightSqlServer, _translate


@pytest.mark.parametrize("text, hosts, root", [
    ("127.0.0.1:2181", "127.0.0.1:2181", "/flightstore"),
    ("zk1:2181,zk2:2181/prod/fs", "zk1:2181,zk2:2181", "/prod/fs"),
    ("localhost:2181/", "localhost:2181", "/flightstore"),
])
def test_zookeeper_address(text, hosts, root):
    assert ZkAddress.parse(text) == ZkAddress(hosts, root)


@pytest.mark.parametrize("text", ["", "zk", "zk:port", "/chroot", "zk:2181/a//b", "zk:2181/a/../b"])
def test_bad_zookeeper_address(text):
    with pytest.raises(InvalidInput):
        ZkAddress.parse(text)


def test_round_robin_continues_across_tables_over_live_servers():
    assert [b.leader for b in round_robin(6, [3, 1, 2])] == [1, 2, 3, 1, 2, 3]
    assert [b.leader for b in round_robin(4, [1, 2, 3], start=6 + 1)] == [2, 3, 1, 2]
    assert {(b.leader_epoch, b.replicas) for b in round_robin(2, [5])} == {(0, (5,))}
    with pytest.raises(Unavailable):
        round_robin(1, [])


def test_unavailable_answers_flight_unavailable(tmp_path):
    translated = _translate(BucketUnavailable("bucket 2 of table shop.t is unavailable: its leader, server 3, is down"))
    assert isinstance(translated, flight.FlightUnavailableError) and "server 3" in str(translated)
    # Through a real Flight call: DDL on a cluster store that has not joined its cluster yet.
    store = ClusterStore(tmp_path / "d")
    server = FlightSqlServer(store, "grpc://127.0.0.1:0")
    try:
        client = flight.FlightClient(server.uri)
        descriptor = flight.FlightDescriptor.for_command(_statement("CREATE TABLE t (a BIGINT)"))
        with pytest.raises(flight.FlightUnavailableError, match="has not joined its cluster"):
            client.get_flight_info(descriptor, flight.FlightCallOptions(timeout=30))
        assert store.list_tables() == []
        client.close()
    finally:
        server.shutdown()
        store.close()


def _statement(sql: str) -> bytes:
    from flightstore.server import protocol
    return protocol.pack_any(protocol.CommandStatementQuery(query=sql))
