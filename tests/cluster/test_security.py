"""One set of security rules across a cluster, over three real server processes speaking TLS with
mutual TLS, and a real ZooKeeper.

* Every client (ADBC, the Python client) reads and writes through any server; the servers call
  each other over TLS, verify each other and present their certificates (replication included);
  a client without a certificate the cluster CA signed is refused by every server.
* Internal calls (every peer read, write and action, the replication stream, the snapshot copy)
  are refused to a client with a token and READ, and change nothing.
* Users and grants are the cluster's (ZooKeeper): a user added through one server logs in at
  every server; a GRANT through one server lets the user read through another at once; after a
  REVOKE through a third every server refuses, and a running subscription ends within a second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
import warnings

import adbc_driver_flightsql as adbc_flightsql
import pyarrow as pa
import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.cluster.identity import PEER_HEADER
from flightstore.replica.protocol import FETCH_OP, SNAPSHOT_OP
from flightstore.server import tickets
from flightstore.server.users import UserStore
from tests.certs import make_certificates
from tests.cluster.conftest import Observer, Servers, describe
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(900)

SERVER_IDS = (1, 2, 3)
ADMIN = ("admin", "s3cret-admin")
OPTIONS = adbc_flightsql.DatabaseOptions


class SecureCluster:
    """Three TLS + mTLS servers whose users (admin, a super user) were seeded from a users file."""

    def __init__(self, root, address: str, certs) -> None:
        self.certs = certs
        self.address = address
        users = root / "users.json"
        UserStore.open(users, create=True).add(*ADMIN)
        self.servers = Servers(root, address)
        self.observer = Observer(address)
        tls = ("--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
               "--tls-client-ca", str(certs.ca), "--tls-root", str(certs.ca))
        self.uris = {i: self.servers.start(i, *tls, "--users-file", str(users), "--super-user", "admin").uri
                     for i in SERVER_IDS}
        self.observer.wait(lambda v: set(v.servers) == set(SERVER_IDS) and v.coordinator is not None,
                           "three servers and a coordinator")

    def tls(self, *, certificate: bool = True) -> dict:
        kwargs = {"tls_root_certs": self.certs.ca.read_bytes()}
        if certificate:
            kwargs.update(cert_chain=self.certs.client_cert.read_bytes(),
                          private_key=self.certs.client_key.read_bytes())
        return kwargs

    def connect(self, server: int, user: str, password: str) -> flightstore.Connection:
        return flightstore.connect(self.uris[server], username=user, password=password, timeout=60,
                                   tls_root_certs=self.certs.ca, cert_chain=self.certs.client_cert,
                                   private_key=self.certs.client_key)

    def token(self, server: int, user: str, password: str) -> str:
        client = flight.FlightClient(self.uris[server], **self.tls())
        try:
            return client.authenticate_basic_token(user, password, flight.FlightCallOptions(timeout=60))[1] \
                .decode().split(" ", 1)[1]
        finally:
            client.close()

    def adbc(self, server: int, user: str, password: str):
        kwargs = {OPTIONS.TLS_ROOT_CERTS.value: self.certs.ca.read_text(),
                  OPTIONS.MTLS_CERT_CHAIN.value: self.certs.client_cert.read_text(),
                  OPTIONS.MTLS_PRIVATE_KEY.value: self.certs.client_key.read_text(),
                  "username": user, "password": password}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return dbapi.connect(self.uris[server], db_kwargs=kwargs, autocommit=True)

    def describe(self, server: int, table: str | None = None) -> dict:
        token = self.token(server, *ADMIN)
        options = flight.FlightCallOptions(timeout=60, headers=[(b"authorization", f"Bearer {token}".encode())])
        return describe(self.uris[server], table, options=options, **self.tls())

    def close(self) -> None:
        self.servers.stop_all()
        self.observer.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper):
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    running = SecureCluster(tmp_path_factory.mktemp("secure"), f"{zookeeper.address}/t-{uuid.uuid4().hex[:10]}",
                            certs)
    yield running
    running.close()


def test_a_tls_cluster_serves_every_client_through_every_server_and_replicates(cluster):
    with cluster.connect(1, *ADMIN) as admin:
        admin.sql("CREATE DATABASE tls")
        admin.sql("CREATE TABLE tls.kv (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) "
                  "WITH ('bucket.num' = '6', 'table.replication.factor' = '2')")
    view = cluster.describe(2, "tls.kv")
    leaders = {b["leader"] for b in view["tables"]["tls.kv"]["buckets"]}
    assert leaders == set(SERVER_IDS)  # the rows below span every leader
    assert all(b["uri"].startswith("grpc+tls://") for b in view["tables"]["tls.kv"]["buckets"])
    keys = list(range(60))
    for server in SERVER_IDS:  # ADBC through each server: writes and reads span every leader
        mine = [k for k in keys if k % 3 == server - 1]
        with cluster.adbc(server, *ADMIN) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO tls.kv VALUES " + ", ".join(f"({k}, 'adbc')" for k in mine))
            cur.execute("SELECT COUNT(*), SUM(k) FROM tls.kv")
            written = [k for k in keys if k % 3 <= server - 1]
            assert cur.fetchall() == [(len(written), sum(written))]
    for server in SERVER_IDS:  # the Python client: straight to each bucket's leader over TLS
        with cluster.connect(server, *ADMIN) as conn:
            table = conn.table("tls.kv")
            table.upsert(pa.table({"k": pa.array(keys, pa.int64()), "v": [f"py{server}"] * len(keys)}))
            assert table.lookup({"k": keys})["v"].to_pylist() == [f"py{server}"] * len(keys)
            assert sorted(table.scan(["k"])["k"].to_pylist()) == keys
            assert conn.sql("SELECT v, COUNT(*) AS n FROM tls.kv GROUP BY v").to_pylist() == \
                [{"v": f"py{server}", "n": len(keys)}]

    def replicated() -> bool:  # each bucket's follower holds what its leader holds
        held = [b for s in SERVER_IDS for b in cluster.describe(s, "tls.kv")["replicas"]]
        leaders = {b["bucket"]: b for b in held if b["role"] == "leader"}
        followers = {b["bucket"]: b for b in held if b["role"] == "follower"}
        return len(leaders) == len(followers) == 6 and sum(b["rows"] for b in leaders.values()) == len(keys) \
            and all(followers[n]["log_end"] == leaders[n]["log_end"] and followers[n]["rows"] == leaders[n]["rows"]
                    for n in leaders)
    wait_until(replicated, "every bucket's follower catching up with its leader over TLS")

    # No certificate, or one of a CA the cluster does not trust: every server refuses the connection.
    for server in SERVER_IDS:
        for kwargs in ({}, {"cert_chain": cluster.certs.rogue_cert, "private_key": cluster.certs.rogue_key}):
            with pytest.raises(flight.FlightError):
                flightstore.connect(cluster.uris[server], username=ADMIN[0], password=ADMIN[1], timeout=10,
                                    tls_root_certs=cluster.certs.ca, **kwargs)


def _options(token: str, *headers: tuple[bytes, bytes]) -> flight.FlightCallOptions:
    return flight.FlightCallOptions(timeout=60, headers=[(b"authorization", f"Bearer {token}".encode()),
                                                         *headers])


def _refused(call) -> str:
    """The error of ``call()`` (which must fail)."""
    try:
        call()
    except flight.FlightError as exc:
        return type(exc).__name__ + ": " + str(exc).split(". Detail")[0]
    raise AssertionError("an internal call was served to a client")


def _state(cluster: SecureCluster) -> dict:
    """What a client's internal calls must not change, on every server."""
    state = {}
    for server in SERVER_IDS:
        with cluster.connect(server, *ADMIN) as admin:
            state[server] = (admin.sql("SELECT current_setting('memory_limit') AS m, "
                                       "current_setting('threads') AS t").to_pylist(),
                             admin.sql("SHOW TABLES FROM peer").to_pylist(),
                             admin.sql("SELECT * FROM peer.t ORDER BY k").to_pylist())
    return state


def test_internal_calls_are_refused_to_a_client_and_change_nothing(cluster):
    with cluster.connect(1, *ADMIN) as admin:
        admin.sql("CREATE DATABASE peer")
        admin.sql("CREATE TABLE peer.t (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
        admin.sql("INSERT INTO peer.t VALUES " + ", ".join(f"({k}, 'v{k}')" for k in range(12)))
        admin.add_user("reader", "s3cret-reader")
        admin.sql("GRANT READ ON DATABASE peer TO reader")
    table_id = cluster.describe(1, "peer.t")["tables"]["peer.t"]["table_id"]
    before = _state(cluster)
    keys = tickets.encode_table(pa.table({"k": pa.array([1, 2], pa.int64())}))
    common = {"table": "peer.t", "table_id": table_id, "buckets": [0, 1, 2], "peer": True}
    reads = [  # every read kind of flightstore.server.peer, a replica snapshot copy, and SQL text
        {"op": "lookup", "keys_ipc": keys}, {"op": "prefix_lookup", "keys_ipc": keys}, {"op": "scan"},
        {"op": "partial", "columns": ["k"], "plan": {"keys": [], "aggregates": [["COUNT", None]]}},
        {"op": "partial", "partial": "SET memory_limit = '500GB'", "name": "rows"},
        {"op": "subscribe", "start": {"0": 0}}, {"op": "changelog", "bucket": 0},
        {"op": "snapshot", "bucket": 0, "at": 1}, {"op": "count"}, {"op": SNAPSHOT_OP, "key": [table_id, -1, 0]}]
    writes = [{"op": op, "writer_id": "w", "sequence": 0} for op in ("append", "upsert", "delete", "write")]
    actions = [("flightstore.offsets", {"which": "end"}), ("flightstore.writer", {"writer_id": "w"}),
               ("flightstore.upkeep", {"task": "undo", "args": {"writer_id": "w", "after_sequence": -1}}),
               ("flightstore.upkeep", {"task": "snapshot", "args": {"force": True}})]
    rows = pa.table({"k": pa.array([100], pa.int64()), "v": ["intruder"], "_change_type": ["+I"]})
    answers = []
    for server in SERVER_IDS:
        token = cluster.token(server, "reader", "s3cret-reader")
        client = flight.FlightClient(cluster.uris[server], **cluster.tls())
        try:
            for payload in reads:
                for marked in (True, False) if payload["op"] in ("partial", SNAPSHOT_OP) else (True,):
                    body = {**common, **payload} if marked else {k: v for k, v in {**common, **payload}.items()
                                                                 if k != "peer"}
                    ticket = flight.Ticket(tickets.encode_custom(body))
                    answers.append(_refused(lambda: client.do_get(ticket, _options(token)).read_all()))
            for payload in writes:
                descriptor = flight.FlightDescriptor.for_command(tickets.encode_custom({**common, **payload}))

                def put(descriptor=descriptor) -> None:
                    writer, reader = client.do_put(descriptor, rows.schema, _options(token))
                    writer.write_table(rows)
                    writer.done_writing()
                    reader.read()
                    writer.close()
                answers.append(_refused(put))
            for kind, payload in actions:
                body = tickets.encode_custom({**common, "op": kind, **payload})
                answers.append(_refused(lambda: list(client.do_action(flight.Action(kind, body), _options(token)))))
            exchange = flight.FlightDescriptor.for_command(tickets.encode_custom(
                {"op": FETCH_OP, "follower": server % 3 + 1, "peer": True}))

            def fetch() -> None:
                writer, reader = client.do_exchange(exchange, _options(token))
                writer.write_metadata(pa.py_buffer(b'{"fetch": [], "wait_ms": 10}'))
                reader.read_chunk()
            answers.append(_refused(fetch))
            # A forged peer credential is no credential at all.
            forged = flight.Ticket(tickets.encode_custom({**common, "op": "count"}))
            fake = (PEER_HEADER.encode(), b"1.99999999999999.x")
            answer = _refused(lambda: client.do_get(forged, _options(token, fake)).read_all())
            assert answer.startswith("FlightUnauthenticatedError") and "peer credential" in answer, answer
        finally:
            client.close()
    marked_both_ways = sum(p["op"] in ("partial", SNAPSHOT_OP) for p in reads)
    expected = 3 * (len(reads) + marked_both_ways + len(writes) + len(actions) + 1)
    assert len(answers) == expected
    wrong = [a for a in answers if not (a.startswith("FlightUnauthorizedError")
                                        and "open to the cluster's servers only" in a)]
    assert not wrong, wrong
    assert _state(cluster) == before  # memory limit, threads, tables and rows: all as they were


class Following:
    """A subscription read in a thread: its first batch, then how (and when) it ended."""

    def __init__(self, conn: flightstore.Connection, table: str) -> None:
        self.subscription = conn.table(table).subscribe("earliest")
        self.first = threading.Event()
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()
        wait_until(self.first.is_set, "the first batch of the subscription")

    def _follow(self) -> None:
        try:
            for _ in self.subscription:
                self.first.set()
        except flight.FlightError as exc:
            self.error = exc
        self.ended_at = time.monotonic()


def _cli_user(cluster: SecureCluster, *args: str, password: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if password is not None:
        env["FLIGHTSTORE_PASSWORD"] = password
    done = subprocess.run([sys.executable, "-m", "flightstore", "user", *args, "--zookeeper", cluster.address],
                          capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_users_and_grants_are_the_clusters(cluster):
    with cluster.connect(2, *ADMIN) as admin:
        admin.sql("CREATE DATABASE acl")
        admin.sql("CREATE TABLE acl.g (k BIGINT, v STRING, PRIMARY KEY (k) NOT ENFORCED) WITH ('bucket.num' = '3')")
        admin.sql("INSERT INTO acl.g VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        admin.add_user("carol", "s3cret-carol")  # through server 2: every server has carol when it returns
    for server in SERVER_IDS:
        with cluster.connect(server, "carol", "s3cret-carol") as carol, \
                pytest.raises(pa.ArrowKeyError, match="does not exist"):  # no grant yet: no table
            carol.sql("SELECT COUNT(*) FROM acl.g")
    with cluster.connect(3, "carol", "s3cret-carol") as carol:
        with cluster.connect(1, *ADMIN) as admin:
            admin.sql("GRANT READ ON TABLE acl.g TO carol")  # through server 1 ...
        assert carol.sql("SELECT COUNT(*) AS n FROM acl.g").to_pylist() == [{"n": 3}]  # ... read at 3 at once
        following = Following(carol, "acl.g")
        with cluster.connect(2, *ADMIN) as admin:
            admin.sql("REVOKE READ ON TABLE acl.g FROM carol")  # through server 2
        cut = time.monotonic()
        wait_until(lambda: following.ended_at is not None, "the subscription's end", timeout=30)
        took = following.ended_at - cut
        following.subscription.close()
        assert isinstance(following.error, flight.FlightUnauthorizedError), following.error
        assert took < 1.0, f"the subscription outlived REVOKE by {took:.2f} s"
    for server in SERVER_IDS:  # every server refuses carol now (the table is hidden from her again)
        with cluster.connect(server, "carol", "s3cret-carol") as carol, \
                pytest.raises(pa.ArrowKeyError, match="does not exist"):
            carol.sql("SELECT COUNT(*) FROM acl.g")

    # `flightstore user add --zookeeper`: dave logs in at every server when the command returns;
    # removed the same way, his token is refused everywhere.
    assert "user dave added" in _cli_user(cluster, "add", "dave", password="s3cret-dave")
    assert "dave" in _cli_user(cluster, "list").split()
    tokens = {server: cluster.token(server, "dave", "s3cret-dave") for server in SERVER_IDS}
    _cli_user(cluster, "remove", "dave")
    for server in SERVER_IDS:
        client = flight.FlightClient(cluster.uris[server], **cluster.tls())
        try:
            ticket = flight.Ticket(tickets.encode_custom({"op": "sql", "sql": "SELECT 1 AS one"}))
            with pytest.raises(flight.FlightUnauthenticatedError, match="no longer exists"):
                client.do_get(ticket, _options(tokens[(server % 3) + 1])).read_all()  # another server's token
        finally:
            client.close()
