"""A server's view of the catalog is read at one version, and a table's data goes only with its DROP.

Real ZooKeeper, in-process members (the production ClusterStore + ClusterMember; their tables'
rows are written to the leader's own table, as these members serve no Flight calls):

* a rename that commits while a server reads the catalog (forced between the listing and the
  entries) never shows that server a catalog without the table: its data stays;
* a view that lacks a table without a DROP record deletes nothing, and a view of another cluster
  is refused before anything is applied;
* a property test: random interleavings of RENAME, ADD/DROP PARTITION, CREATE, DROP and writes,
  issued concurrently through both servers while they restart; no table's rows are ever lost,
  and no table is ever recreated empty (its id never changes but by DROP and CREATE).
"""

from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import replace

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from flightstore.alter import AddPartition, DropPartition, RenameTable
from flightstore.cluster.layout import ZkAddress, ZkPaths
from flightstore.cluster.metadata import MetadataCache
from flightstore.cluster.mirror import CatalogMirror
from flightstore.cluster.store import ClusterStore
from flightstore.schema import TablePath
from tests.cluster.conftest import Members

pytestmark = pytest.mark.timeout(900)

SCHEMA = pa.schema([("dt", pa.string()), ("id", pa.int64()), ("v", pa.string())])
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})


class _ListingHook(KazooClient):
    """A ZooKeeper client that runs ``hook`` once, right after it listed ``path`` (and before the
    caller reads what the listing named): a DDL committing exactly there."""

    path: str | None = None
    hook = None

    def get_children_async(self, path, watch=None, include_data=False):
        result = super().get_children_async(path, watch=watch, include_data=include_data)
        if path == self.path and self.hook is not None:
            hook, self.hook = self.hook, None
            result.get()
            hook()
        return result


def test_a_rename_committing_while_the_catalog_is_read_keeps_the_tables_data(members, zk_address, tmp_path):
    member = members.start(1)
    member.store.create_database("shop")
    member.store.create_table("shop.a", SCHEMA, primary_key=["dt", "id"], options={"bucket.num": "1"})
    parsed = ZkAddress.parse(zk_address)
    client = _ListingHook(hosts=parsed.hosts, timeout=10)
    client.start(timeout=60)
    paths = ZkPaths(parsed.root)
    cache = MetadataCache(client, paths)
    follower = ClusterStore(tmp_path / "follower")  # a server's data directory following the catalog
    mirror = CatalogMirror(follower, server_id=9)
    seen: list[set[str]] = []  # the shop tables of every view the cache published
    cache.add_listener(lambda v: seen.append({p.table for p in v.tables if p.database == "shop"}))
    cache.add_listener(mirror.apply)
    try:
        cache.start()
        assert mirror.wait_applied(cache.wait_for(lambda v: TablePath("shop", "a") in v.tables, 60).version, 60)
        follower.local_table("shop.a").upsert(ROWS.add_column(0, "dt", pa.array(["d"] * 3)))
        # The next catalog read (of the CREATE of shop.x) lists shop's tables, and right then the
        # rename commits: shop.a's entry is gone before it is read, shop.b was not listed.
        client.path = paths.database("shop")
        client.hook = lambda: member.store.alter_table("shop.a", [RenameTable(TablePath("shop", "b"))])
        member.store.create_table("shop.x", SCHEMA, options={"bucket.num": "1"})
        view = cache.wait_for(lambda v: TablePath("shop", "b") in v.tables, 60)
        assert client.hook is None and mirror.wait_applied(view.version, 60)
        assert follower.list_tables("shop") == ["b", "x"]
        assert follower.local_table("shop.b").row_count() == 3  # renamed, never dropped in between
        since = next(i for i, tables in enumerate(seen) if "a" in tables)
        assert all(tables & {"a", "b"} for tables in seen[since:]), seen  # no view without the table
    finally:
        cache.stop()
        client.stop()
        client.close()
        follower.close()


def test_only_a_drop_deletes_data_and_another_clusters_view_is_refused(members, observer, tmp_path):
    member = members.start(1)
    member.store.create_database("shop")
    for name in ("kept", "dropped"):
        member.store.create_table(f"shop.{name}", SCHEMA, primary_key=["dt", "id"], options={"bucket.num": "1"})
        member.store.local_table(f"shop.{name}").upsert(ROWS.add_column(0, "dt", pa.array(["d"] * 3)))
    member.store.drop_table("shop.dropped")
    view = observer.wait(lambda v: TablePath("shop", "dropped") not in v.tables and v.dropped, "the DROP")
    assert member.mirror.applied_version >= view.version
    assert member.store.list_tables("shop") == ["kept"]  # its DROP record deleted shop.dropped
    mirror = member.mirror
    lacking = replace(view, version=view.version + 1, tables={})  # no DROP of shop.kept recorded
    mirror.apply(lacking)
    assert mirror.applied_version == view.version + 1
    assert member.store.local_table("shop.kept").row_count() == 3  # kept: no DROP removed it
    other = replace(view, version=view.version + 2, cluster_id="another-cluster", tables={}, databases=frozenset())
    mirror.apply(other)
    assert mirror.applied_version == view.version + 1 and "another-cluster" in mirror.last_error
    assert member.store.list_databases() == ["default", "shop"]
    assert member.store.local_table("shop.kept").row_count() == 3


DAYS = ("d1", "d2", "d3")
INDEX = st.integers(0, 7)  # which of the tables that exist when the step runs
OPS = st.one_of(
    st.tuples(st.just("create")),
    st.tuples(st.just("rename"), INDEX),
    st.tuples(st.just("add_partition"), INDEX, st.sampled_from(DAYS)),
    st.tuples(st.just("drop_partition"), INDEX, st.sampled_from(DAYS)),
    st.tuples(st.just("write"), INDEX, st.sampled_from(DAYS)),
    st.tuples(st.just("drop"), INDEX),
    st.tuples(st.just("restart"), st.sampled_from((1, 2))),
)


class Model:
    """What the cluster must hold: per table its id and rows per partition."""

    def __init__(self, members: Members) -> None:
        self.members = members
        self.tables: dict[str, dict] = {}  # name -> {"id", "rows": {day: count}}
        self.names = itertools.count()
        self.lock = threading.Lock()

    def _member(self, server_id: int):
        return self.members.running[server_id]

    def _view(self):
        return next(iter(self.members.running.values())).view()

    def _leader(self, name: str):
        view = self._view()
        record = view.tables[TablePath("shop", name)]
        return self._member(record.buckets[0].leader), record.table_id

    def resolve(self, op: tuple) -> tuple | None:
        """``op`` on concrete tables: an index names the i-th existing table (modulo), a create or
        a rename a new name; None when there is no table to act on."""
        kind = op[0]
        if kind == "restart":
            return op
        if kind == "create":
            return ("create", f"t{next(self.names)}")
        names = sorted(self.tables)
        if not names:
            return None
        name = names[op[1] % len(names)]
        if kind == "rename":
            return ("rename", name, f"t{next(self.names)}")
        return (kind, name, *op[2:])

    def run(self, op: tuple, via: int) -> None:
        """Apply ``op`` (resolved) through server ``via`` (or restart a server) and to the model."""
        kind = op[0]
        if kind == "restart":
            self.members.stop(op[1])
            self.members.start(op[1], data_dir=self.members.root / f"member-{op[1]}")
            return
        store = self._member(via).store
        name, path = op[1], f"shop.{op[1]}"
        table = self.tables.get(name)
        if kind == "create":
            store.create_table(path, SCHEMA, primary_key=["dt", "id"], partition_keys=["dt"],
                               options={"bucket.num": "1"})
            _, table_id = self._leader(name)
            table = {"id": table_id, "rows": {}}
            with self.lock:
                self.tables[name] = table
            self.run(("write", name, "d1"), via)
        elif kind == "rename":
            store.alter_table(path, [RenameTable(TablePath("shop", op[2]))])
            with self.lock:
                self.tables[op[2]] = self.tables.pop(name)
        elif kind == "add_partition" and op[2] not in table["rows"]:
            store.alter_table(path, [AddPartition((op[2],))])
            table["rows"][op[2]] = 0
        elif kind == "drop_partition" and op[2] in table["rows"]:
            store.alter_table(path, [DropPartition((op[2],))])
            del table["rows"][op[2]]
        elif kind == "write":
            leader, _ = self._leader(name)
            start = table["rows"].get(op[2], 0)
            rows = pa.table({"dt": [op[2]] * 2, "id": pa.array([start + 1, start + 2], pa.int64()),
                             "v": ["x", "y"]})
            leader.store.local_table(path).upsert(rows)  # creates the partition if it is new
            table["rows"][op[2]] = start + 2
        elif kind == "drop":
            store.drop_table(path)
            with self.lock:
                del self.tables[name]

    def check(self) -> None:
        """Every table holds its rows at its leader, under the id it was created with."""
        view = self._view()
        for member in self.members.running.values():  # every live server applied the latest catalog
            assert member.mirror.wait_applied(view.version, 60), member.mirror.last_error
        assert {p.table for p in view.tables if p.database == "shop"} == set(self.tables)
        for name, table in self.tables.items():
            leader, table_id = self._leader(name)
            assert table_id == table["id"], f"table {name} was recreated"
            local = leader.store.local_table(f"shop.{name}")
            assert local.row_count() == sum(table["rows"].values()), (name, table)
            for member in self.members.running.values():
                assert name in member.store.list_tables("shop")


def _pair(first: tuple | None, second: tuple | None) -> list[tuple[tuple, int]]:
    """The resolved operations of one step with the server each goes through: a restart of one
    server runs with an operation through the other; operations on the same table (or two
    restarts, or a write, whose leader may be the one restarting) run alone."""
    ops = [op for op in (first, second) if op is not None]
    if len(ops) < 2:
        return [(op, 1) for op in ops]
    first, second = ops
    if first[0] == "restart" or second[0] == "restart":
        restart, other = (first, second) if first[0] == "restart" else (second, first)
        if other[0] in ("restart", "write", "create"):
            return [(restart, 0)]
        return [(restart, 0), (other, 3 - restart[1])]
    if set(first[1:]) & set(second[1:]):
        return [(first, 1)]
    return [(first, 1), (second, 2)]


@pytest.mark.slow
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(st.tuples(OPS, OPS), min_size=4, max_size=8))
def test_random_ddl_and_restarts_never_lose_or_recreate_a_table(steps, zookeeper, tmp_path_factory):
    address = f"{zookeeper.address}/t-{uuid.uuid4().hex[:10]}"
    members = Members(tmp_path_factory.mktemp("property"), address)
    try:
        members.start(1)
        members.start(2)
        members.running[1].store.create_database("shop")
        model = Model(members)
        for _ in range(3):
            model.run(model.resolve(("create",)), 1)
        for first, second in steps:  # two operations at once, through different servers
            pair = _pair(model.resolve(first), model.resolve(second))
            errors: list[BaseException] = []

            def run(op: tuple, via: int) -> None:
                try:
                    model.run(op, via)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
            threads = [threading.Thread(target=run, args=item) for item in pair]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            assert not errors, errors
            model.check()
    finally:
        members.stop_all()
