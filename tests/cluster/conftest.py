"""A real ZooKeeper (Debian's 3.8, one JVM per test session) and real flightstore server processes.

``make test`` on a fresh machine installs the ``zookeeper`` package with apt-get (as root) when it
is missing. Each test gets its own chroot in the shared ZooKeeper, so tests never see each other's
clusters. Server processes run with a 6 s ZooKeeper session (in-process members 4 s): a kill -9 shows
within seconds, and a busy machine does not expire a live server.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from pyarrow import flight

from flightstore.cluster.layout import ZkAddress, ZkPaths
from flightstore.cluster.member import ClusterConfig, ClusterMember
from flightstore.cluster.metadata import MetadataCache
from flightstore.cluster.store import ClusterStore
from flightstore.cluster.zookeeper import ZooKeeperServer
from flightstore.server import tickets
from tests.forked_server import ForkedServerProcess
from tests.server.test_flightsql_dbapi import dbapi_python  # noqa: F401 - fixture of test_data_path
from tests.spark.conftest import spark  # noqa: F401 - fixture of test_data_path's Spark test

SESSION_TIMEOUT = "6s"
CALL = flight.FlightCallOptions(timeout=60)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def zk_address(zookeeper) -> str:
    """A fresh chroot of the shared ZooKeeper: one cluster per test."""
    return f"{zookeeper.address}/t-{uuid.uuid4().hex[:10]}"


class Observer:
    """The test's own view of a cluster, through the production metadata cache."""

    def __init__(self, address: str) -> None:
        parsed = ZkAddress.parse(address)
        self.paths = ZkPaths(parsed.root)
        self.client = KazooClient(hosts=parsed.hosts, timeout=10)
        self.client.start(timeout=60)
        for parent in self.paths.persistent_parents():
            self.client.ensure_path(parent)
        self.cache = MetadataCache(self.client, self.paths)
        self.cache.start()

    def wait(self, predicate, what: str, timeout: float = 120):
        view = self.cache.wait_for(predicate, timeout)
        assert view is not None, f"{what} did not happen within {timeout:.0f} s; view: {self.cache.view()}"
        return view

    def close(self) -> None:
        self.cache.stop()
        self.client.stop()
        self.client.close()


@pytest.fixture
def observer(zk_address):
    watching = Observer(zk_address)
    yield watching
    watching.close()


class Servers:
    """flightstore server processes of one test's cluster, by server id: ``flightstore serve``
    forked from the preloaded fork server (tests/forked_server.py), a process of its own per start,
    its output and errors in ``server-<id>.log`` (a restart appends)."""

    def __init__(self, root: Path, address: str) -> None:
        self.root = root
        self.address = address
        self.running: dict[int, ForkedServerProcess] = {}
        self.secret_file = root / "cluster-secret"  # every server's: the signing secret derives from it
        self.secret_file.write_bytes(os.urandom(32).hex().encode())

    def args(self, server_id: int, *extra: str) -> list[str]:
        return ["--zookeeper", self.address, "--server-id", str(server_id),
                "--data-dir", str(self.root / f"server-{server_id}"), "--port", "0",
                "--zookeeper-session-timeout", SESSION_TIMEOUT, "--ddl-timeout", "60s",
                "--cluster-secret-file", str(self.secret_file), *extra]

    def start(self, server_id: int, *extra: str) -> ForkedServerProcess:
        process = ForkedServerProcess(self.args(server_id, *extra), log=self.root / f"server-{server_id}.log")
        self.running[server_id] = process
        return process.start()

    def stop_all(self) -> None:
        for process in self.running.values():
            process.kill()


@pytest.fixture
def servers(tmp_path, zk_address):
    cluster = Servers(tmp_path, zk_address)
    yield cluster
    cluster.stop_all()


def describe(uri: str, table: str | None = None, *, options: flight.FlightCallOptions = CALL,
             **client_args) -> dict:
    """A server's own view of the cluster (the ``flightstore.cluster`` Flight action);
    ``client_args`` (TLS) and ``options`` (credentials) as a FlightClient takes them."""
    client = flight.FlightClient(uri, **client_args)
    try:
        body = tickets.encode_custom({"op": "flightstore.cluster", **({"table": table} if table else {})})
        results = list(client.do_action(flight.Action("flightstore.cluster", body), options))
        return tickets.decode_custom(results[0].body.to_pybytes())
    finally:
        client.close()


def in_sync(uris: dict[int, str], table: str, members: set[int]) -> bool:
    """Every bucket of ``table`` has ``members`` in sync, and every follower holds its leader's log
    (log end and high watermark), as each server describes its replicas."""
    status = {i: {r["bucket"]: r for r in describe(uri, table)["replicas"]} for i, uri in uris.items()}
    leaders = {b: r for s in status.values() for b, r in s.items() if r["role"] == "leader"}
    if not leaders:
        return False
    for bucket, lead in leaders.items():
        if set(lead["isr"]) != members:
            return False
        for server in members:
            mine = status.get(server, {}).get(bucket)
            if mine is None or mine["log_end"] != lead["log_end"] or mine["high_watermark"] != lead["high_watermark"]:
                return False
    return True


class Members:
    """In-process cluster members (a ClusterStore + ClusterMember each), for protocol tests that
    need to reach inside: the member objects are the production ones, over the real ZooKeeper."""

    def __init__(self, root: Path, address: str) -> None:
        self.root = root
        self.address = ZkAddress.parse(address)
        self.running: dict[int, ClusterMember] = {}

    def start(self, server_id: int, data_dir: Path | None = None, *, uri: str | None = None,
              start_timeout: float | None = None, **config) -> ClusterMember:
        store = ClusterStore(data_dir or self.root / f"member-{server_id}")
        settings = {"session_timeout_ms": 4000, "ddl_timeout_ms": 60_000, **config}
        member = ClusterMember(ClusterConfig(self.address, server_id,
                                             uri or f"grpc://127.0.0.1:{9000 + server_id}", **settings), store)
        try:
            member.start(start_timeout)
        except BaseException:
            store.close()
            raise
        self.running[server_id] = member
        return member

    def stop(self, server_id: int) -> None:
        member = self.running.pop(server_id)
        member.stop()
        member.store.close()

    def stop_all(self) -> None:
        for server_id in list(self.running):
            self.stop(server_id)


@pytest.fixture
def members(tmp_path, zk_address):
    cluster = Members(tmp_path, zk_address)
    yield cluster
    cluster.stop_all()
