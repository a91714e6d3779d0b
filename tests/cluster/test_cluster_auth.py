"""Authentication across a cluster: bearer tokens are signed with the cluster secret, so a token
minted by one server is accepted by every other, and a server forwarding a call to a bucket's
leader sends the caller's token (the leader authenticates and authorizes the caller)."""

from __future__ import annotations

import base64

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.server import tickets
from flightstore.server.users import UserStore
from tests.cluster.conftest import CALL

pytestmark = pytest.mark.timeout(600)


def _with_token(token: str | None) -> flight.FlightCallOptions:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(timeout=60, headers=headers)


def test_tokens_work_on_every_server_and_travel_with_forwarded_calls(servers, observer, tmp_path):
    users = tmp_path / "users.json"
    store = UserStore.open(users, create=True)
    store.add("admin", "s3cret-admin")
    store.add("eve", "s3cret-eve")
    extra = ("--users-file", str(users), "--super-user", "admin")
    uris = {i: servers.start(i, *extra).uri for i in (1, 2)}
    observer.wait(lambda v: set(v.servers) == {1, 2} and v.coordinator is not None, "two servers")

    with flightstore.connect(uris[1], username="admin", password="s3cret-admin") as conn:
        conn.sql("CREATE TABLE t (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '4')")
        conn.sql("INSERT INTO t VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(40)))  # forwarded
        assert conn.sql("SELECT COUNT(*) AS n FROM t").to_pylist() == [{"n": 40}]
        assert conn.table("t").lookup({"k": list(range(40))}).num_rows == 40  # direct and forwarded

    # A token minted by server 1 is accepted by server 2 (no login there), and is the caller's.
    client = flight.FlightClient(uris[1])
    header = client.authenticate_basic_token("admin", "s3cret-admin", CALL)
    token = header[1].decode().split(" ", 1)[1]
    client.close()
    other = flight.FlightClient(uris[2])
    try:
        ticket = flight.Ticket(tickets.encode_custom({"op": "count", "table": "t"}))
        assert other.do_get(ticket, _with_token(token)).read_all().column(0)[0].as_py() == 40
        # Without a token, or with a forged one, a server refuses, forwarded command or not.
        forwarded = flight.Ticket(tickets.encode_custom({"op": "count", "table": "t", "peer": True,
                                                         "table_id": "x", "buckets": [0]}))
        with pytest.raises(flight.FlightUnauthenticatedError):
            other.do_get(forwarded, _with_token(None)).read_all()
        forged = token.rsplit(".", 1)[0] + "." + base64.urlsafe_b64encode(b"x" * 32).decode().rstrip("=")
        with pytest.raises(flight.FlightUnauthenticatedError, match="invalid"):
            other.do_get(ticket, _with_token(forged)).read_all()
        # eve authenticates, but is no super user and holds no grant: t does not exist for her on
        # any server, including for the parts server 1 would forward.
        eve = flight.FlightClient(uris[1])
        eve_token = eve.authenticate_basic_token("eve", "s3cret-eve", CALL)[1].decode().split(" ", 1)[1]
        eve.close()
        with pytest.raises(pa.ArrowKeyError, match="does not exist"):
            other.do_get(ticket, _with_token(eve_token)).read_all()
        # Only a peer may send a forwarded part: a client marking its call so is refused, even
        # with a super user's token.
        partial = flight.Ticket(tickets.encode_custom({
            "op": "partial", "table": "t", "columns": ["k"], "buckets": [0], "peer": True, "table_id": "x",
            "partial": "SELECT COUNT(*) AS n FROM rows", "name": "rows"}))
        for who in (eve_token, token):
            with pytest.raises(flight.FlightUnauthorizedError, match="cluster's servers only"):
                other.do_get(partial, _with_token(who)).read_all()
    finally:
        other.close()
    with flightstore.connect(uris[2], username="eve", password="s3cret-eve") as conn, \
            pytest.raises(pa.ArrowKeyError, match="does not exist"):
        conn.table("t").upsert(pa.table({"k": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}))
    with flightstore.connect(uris[2], username="admin", password="s3cret-admin") as conn:
        assert conn.sql("SELECT v FROM t WHERE k = 1").to_pylist() == [{"v": "v1"}]
        # A GROUP BY's partial runs on the other leader with the caller's token.
        assert conn.sql("SELECT k % 2 AS g, COUNT(*) AS n, SUM(k) AS s FROM t GROUP BY k % 2 ORDER BY g"
                        ).to_pylist() == [{"g": 0, "n": 20, "s": 380}, {"g": 1, "n": 20, "s": 400}]
