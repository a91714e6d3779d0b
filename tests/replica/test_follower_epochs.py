"""A follower whose leader epoch cache runs ahead of its log converges, and one that cannot append
what its leader sends backs off instead of spinning (found by the Jepsen-style test, seed 2: a server
restarted with a wiped disk briefly led a bucket from its empty log, which recorded "epoch 1 starts
at offset 0"; as a follower it fetched the leader's epoch-0 records from offset 0, could not append
them after epoch 1, and truncated "again" without dropping that entry: 38,698 times, for ever).

The follower side runs the production :class:`Fetcher` over a real Flight stream, answered by the
leader's production :class:`ReplicaManager` (a small Flight server routes the stream to it)."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from pyarrow import flight

from flightstore.cluster.store import ClusterStore
from flightstore.cluster.view import BucketAssignment, ClusterView, TableRecord
from flightstore.log import LogTablet
from flightstore.replica.fetcher import Fetcher
from flightstore.replica.manager import ReplicaManager
from flightstore.replica.replica import Leadership, Replica
from flightstore.schema import TablePath
from flightstore.store import new_table_descriptor
from tests.replica.leader_server import LeaderServer
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
PATH = TablePath.parse("default.t")
TABLE_ID = "t-1"


def _lead(me: int, leader: int, epoch: int) -> Leadership:
    return Leadership(me=me, leader=leader, epoch=epoch, replicas=(1, 2), isr=(1, 2), min_isr=1, replicated=True)


def _rows(n: int, first: int = 0) -> pa.Table:
    return pa.table({"k": pa.array(range(first, first + n), pa.int64()), "v": [f"v{i}" for i in range(n)]})


def _records(log: LogTablet) -> list[tuple[int, bytes]]:
    """Every stored record, committed or not: offset and payload."""
    return [(r.base_offset, bytes(r.payload)) for r in log.read_raw(0, 1 << 30)] if log.end_offset else []


def _empty_server_that_led(directory, epoch: int) -> Replica:
    """A replica as a wiped server leaves it when it took the leader role at ``epoch`` from its empty
    log before leaving the ISR, then became a follower of server 1 (at the same epoch: the test's
    leader never moved on)."""
    replica = Replica(LogTablet(directory, SCHEMA, fsync=False), None, 0, fsync=False)
    replica.become_leader(_lead(2, 2, epoch))
    assert replica.epochs.entries == [(epoch, 0)]
    replica.become_follower(_lead(2, 1, epoch))
    return replica


def test_truncation_drops_the_epochs_a_follower_recorded_past_its_log(tmp_path):
    """What the fetcher does, step by step: the truncation question, the cut, the append."""
    leader = Replica(LogTablet(tmp_path / "leader", SCHEMA, fsync=False), None, 0, fsync=False)
    leader.become_leader(_lead(1, 1, 0))
    leader.log.append(_rows(3))
    leader.become_leader(_lead(1, 1, 1))
    leader.log.append(_rows(2, 100))
    assert leader.epochs.entries == [(0, 0), (1, 3)]
    follower = _empty_server_that_led(tmp_path / "follower", 1)
    epoch, end = leader.epoch_end(follower.epochs.latest)
    follower.truncate(follower.truncation_point(epoch, end))
    assert follower.epochs.entries == []  # nothing of the log is cut, but the epoch past it goes
    records = leader.log.read_raw(0, 1 << 20)
    follower.append_fetched(records, [leader.epochs.epoch_at(r.base_offset) for r in records],
                            leader.log.end_offset, source=1)
    assert _records(follower.log) == _records(leader.log)
    assert follower.epochs.entries == leader.epochs.entries


def _view(epoch: int) -> ClusterView:
    descriptor = new_table_descriptor(PATH, SCHEMA, options={"bucket.num": "2"})
    bucket = BucketAssignment(leader=1, leader_epoch=epoch, replicas=(1, 2), isr=(1, 2))
    return ClusterView(version=1, tables={PATH: TableRecord(TABLE_ID, descriptor, (bucket, bucket))})


@pytest.fixture
def leader(tmp_path):
    """Server 1 leading both buckets of default.t: epoch 0 wrote offsets 0-2 of bucket 0 (one
    record) and 0-3 of bucket 1 (two records: 0-2, 3), epoch 2 the rest (5 rows each)."""
    store = ClusterStore(tmp_path / "leader", fsync=False)
    store.local_create_table(new_table_descriptor(PATH, SCHEMA, options={"bucket.num": "2"}))
    manager = ReplicaManager(store, 1, {}, uri_of=lambda _: None, connect=flight.connect,
                             call_options=flight.FlightCallOptions, adjust_isr=lambda *_: False)
    manager.apply(_view(0))
    logs = store.local_table(PATH).logs
    logs[0].append(_rows(3))
    logs[1].append(_rows(3))
    logs[1].append(_rows(1, 3))
    manager.apply(_view(2))
    logs[0].append(_rows(2, 100))
    logs[1].append(_rows(1, 100))
    server = LeaderServer(manager)
    yield store, server
    server.shutdown()
    manager.close()
    store.close()


def test_a_follower_converges_and_one_that_cannot_backs_off(tmp_path, leader, caplog):
    store, server = leader
    logs = store.local_table(PATH).logs
    replicas = store.local_table(PATH).replicas
    assert [r.epochs.entries for r in replicas] == [[(0, 0), (2, 3)], [(0, 0), (2, 4)]]
    # Bucket 0: the wiped server's replica, epoch 2 at offset 0 over an empty log.
    wiped = _empty_server_that_led(tmp_path / "wiped", 2)
    # Bucket 1: a replica that can never agree with its leader (offsets 0-2 of its own under the
    # same epoch 2, so it keeps them; at 3 the leader's log holds epoch 0): each append is refused.
    stuck = Replica(LogTablet(tmp_path / "stuck", SCHEMA, fsync=False), None, 1, fsync=False)
    stuck.become_leader(_lead(2, 2, 2))
    stuck.log.append(_rows(3, 500))
    stuck.become_follower(_lead(2, 1, 2))
    clients: dict[str, flight.FlightClient] = {}
    fetcher = Fetcher(2, 1, lambda _: f"grpc://127.0.0.1:{server.port}",
                      lambda uri: clients.setdefault(uri, flight.connect(uri)),
                      lambda: flight.FlightCallOptions(timeout=30), max_bytes=1 << 20, backoff_s=0.05)
    try:
        with caplog.at_level(logging.WARNING, logger="flightstore.replica"):
            fetcher.add((TABLE_ID, -1, 0), wiped)
            fetcher.add((TABLE_ID, -1, 1), stuck)
            wait_until(lambda: wiped.log.end_offset == 5, "the wiped replica catching up", timeout=30)
            assert _records(wiped.log) == _records(logs[0])
            assert wiped.epochs.entries == replicas[0].epochs.entries
            failures = lambda: [r for r in caplog.records if "cannot append" in r.getMessage()]  # noqa: E731
            wait_until(lambda: len(failures()) >= 4, "the stuck replica failing four times", timeout=30)
            logs[0].append(_rows(1, 200))  # the healthy replica goes on following meanwhile
            wait_until(lambda: wiped.log.end_offset == 6, "the wiped replica following", timeout=30)
    finally:
        fetcher.stop()
        for client in clients.values():
            client.close()
    # Each refused append waits 0.05, 0.1, 0.2 s (doubling) before truncating and fetching again,
    # where it went round at once (a few milliseconds), for ever.
    found = failures()
    gaps = [b.created - a.created for a, b in zip(found, found[1:4])]
    assert all(gap >= 0.9 * 0.05 * 2 ** i for i, gap in enumerate(gaps)), gaps
    assert "failure 3 in a row" in found[2].getMessage()
    assert stuck.log.end_offset == 3 and stuck.epochs.entries == [(2, 0)]  # nothing appended there
