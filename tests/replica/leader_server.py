"""A bare Flight server in front of a leader's replica manager, for replication tests that run
a follower's real fetch stream without a whole flightstore server."""

from __future__ import annotations

from pyarrow import flight

from flightstore.replica.manager import ReplicaManager


class LeaderServer(flight.FlightServerBase):
    """Routes follower 2's fetch stream to the leader's replica manager (what the server's
    DoExchange does for a peer)."""

    def __init__(self, manager: ReplicaManager) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self._manager = manager

    def do_exchange(self, context, descriptor, reader, writer):
        self._manager.serve_fetch(2, reader, writer, context.is_cancelled)
