"""DDL through the coordinator, against a real ZooKeeper with in-process members: the same answers
as a single server, nothing half-committed, requests that outlive their coordinator, fencing of a
deposed coordinator, and members that lose their ZooKeeper session."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest
from kazoo.client import KazooClient

from flightstore.cluster.ddl import DdlClient
from flightstore.cluster.layout import decode, encode
from flightstore.errors import (
    AlreadyExists,
    CoordinatorUnavailable,
    DatabaseNotFound,
    InvalidInput,
    InvalidOption,
    TableNotFound,
)
from flightstore.schema import TablePath
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _version(observer) -> int:
    return decode(observer.client.get(observer.paths.version)[0])["version"]


def test_ddl_answers_like_a_single_server_and_refusals_change_nothing(members, observer):
    first, second = members.start(1), members.start(2)
    store = second.store  # not the coordinator: its DDL travels to server 1
    assert first.is_coordinator and not second.is_coordinator
    store.create_database("shop")
    store.create_table("shop.users", SCHEMA, primary_key=["id"], options={"bucket.num": "4"})
    before = _version(observer)
    refusals = [
        (lambda: store.create_database("shop"), AlreadyExists, "database 'shop' already exists"),
        (lambda: store.create_table("shop.users", SCHEMA), AlreadyExists, "table shop.users already exists"),
        (lambda: store.create_table("nowhere.t", SCHEMA), DatabaseNotFound, "database 'nowhere'"),
        (lambda: store.drop_table("shop.missing"), TableNotFound, "table shop.missing does not exist"),
        (lambda: store.drop_database("shop"), InvalidInput, "CASCADE"),
        (lambda: store.create_table("shop.bad", SCHEMA, options={"bucket.num": "zero"}), InvalidOption,
         "bucket.num"),
        (lambda: store.create_database("bad-name"), InvalidInput, "invalid database name"),
    ]
    for call, error, words in refusals:
        with pytest.raises(error, match=words):
            call()
    assert _version(observer) == before  # no refusal committed anything
    store.create_database("shop", if_not_exists=True)
    store.create_table("shop.users", SCHEMA, if_not_exists=True)
    store.drop_table("shop.missing", if_exists=True)
    assert _version(observer) == before
    # Once DDL returns, both members' data directories have it.
    for member in (first, second):
        assert member.store.list_tables("shop") == ["users"]
        assert member.store.table("shop.users").num_buckets == 4
    first.store.drop_database("shop", cascade=True)
    for member in (first, second):
        assert "shop" not in member.store.list_databases()
    assert _version(observer) == before + 1
    assert observer.client.get_children(observer.paths.requests) == []
    assert observer.client.get_children(observer.paths.responses) == []


def test_a_pending_request_is_answered_by_the_next_coordinator(members, observer):
    requester = DdlClient(observer.client, observer.paths, requester=99)
    answers = {}
    thread = threading.Thread(target=lambda: answers.update(
        requester.submit({"op": "create_database", "name": "early"}, timeout_s=120)))
    thread.start()
    wait_until(lambda: observer.client.get_children(observer.paths.requests), "the request znode")
    member = members.start(1)  # the first coordinator bootstraps the catalog, then answers it
    thread.join(timeout=120)
    assert not thread.is_alive() and answers["ok"]
    assert member.mirror.wait_applied(answers["version"], timeout=60)
    assert "early" in member.store.list_databases()
    assert observer.client.get_children(observer.paths.responses) == []


def test_a_requester_that_gives_up_leaves_nothing_behind(members, observer):
    requester = DdlClient(observer.client, observer.paths, requester=99)
    with pytest.raises(CoordinatorUnavailable, match="nothing was changed"):
        requester.submit({"op": "create_database", "name": "ghost"}, timeout_s=0.5)
    assert observer.client.get_children(observer.paths.requests) == []
    member = members.start(1)
    member.store.create_database("real")  # the coordinator works, and never saw the withdrawn request
    assert "ghost" not in member.store.list_databases()
    assert "ghost" not in observer.wait(lambda v: "real" in v.databases, "the database").databases


def test_a_deposed_coordinator_is_fenced_and_commits_nothing(members, observer):
    member = members.start(1)
    epochs = []
    member.coordinator.on_lead = epochs.append
    elected = decode(observer.client.get(observer.paths.coordinator_epoch)[0])["epoch"]
    # A newer coordinator took office (as after this one's session expired unnoticed).
    _, stat = observer.client.get(observer.paths.coordinator_epoch)
    observer.client.set(observer.paths.coordinator_epoch, encode({"epoch": elected + 1, "server": 7}),
                        version=stat.version)
    member.store.create_database("shop")
    member.store.create_table("shop.t", SCHEMA, options={"bucket.num": "2"})
    # Its first commit failed on the epoch check; it stepped down, won again with a newer epoch,
    # and answered the request under that epoch: applied once, never under the deposed one.
    assert epochs == [elected + 2]
    table_id = observer.wait(lambda v: TablePath("shop", "t") in v.tables, "the table") \
        .table(TablePath("shop", "t")).table_id
    assignment = decode(observer.client.get(observer.paths.assignment(table_id))[0])
    assert assignment["coordinator_epoch"] == elected + 2
    assert observer.cache.view().databases == {"default", "shop"}


def _expire(member) -> int:
    """Expire ``member``'s ZooKeeper session the way ZooKeeper does it to a silent client: the
    same session, opened and closed by a second connection. Returns the expired session id."""
    session_id, password = member.client.client_id
    killer = KazooClient(hosts=member.config.zookeeper.hosts, client_id=(session_id, password), timeout=10)
    killer.start(timeout=60)
    killer.stop()
    killer.close()
    return session_id


def _owner(observer, server_id: int) -> int | None:
    """The session that holds ``server_id``'s registration (None: unregistered)."""
    stat = observer.client.exists(observer.paths.server(server_id))
    return None if stat is None else stat.ephemeralOwner


def test_members_register_again_and_reelect_after_losing_their_session(members, observer):
    first, second = members.start(1), members.start(2)
    first.store.create_database("shop")
    expired = _expire(second)
    wait_until(lambda: _owner(observer, 2) not in (None, expired), "server 2 registering again")
    observer.wait(lambda v: set(v.servers) == {1, 2}, "both servers registered")
    second.store.create_table("shop.after_expiry", SCHEMA)
    assert first.store.list_tables("shop") == ["after_expiry"]
    # The coordinator loses its session: an election follows and DDL works again.
    expired = _expire(first)
    wait_until(lambda: _owner(observer, 1) not in (None, expired), "server 1 registering again")
    observer.wait(lambda v: v.coordinator is not None and set(v.servers) == {1, 2},
                  "a coordinator and both servers after the coordinator's session expired")
    second.store.create_table("shop.after_reelection", SCHEMA)
    first.store.drop_table("shop.after_expiry")
    for member in (first, second):
        assert member.store.list_tables("shop") == ["after_reelection"]
    assert sum(m.is_coordinator for m in (first, second)) == 1
