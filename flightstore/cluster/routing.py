"""The owner-only data path: a bucket's rows live only on its leader; other servers forward.

In cluster mode :meth:`ClusterStore.table` answers a :class:`RoutedTable`: the same methods as a
local :class:`~flightstore.store.Table`, but every write, lookup, scan, count, changelog read and
subscription is split by bucket and each part is served by the bucket's leader: this server's own
table for the buckets it leads, a Flight call to the leader for the others. SQL (DML, lookups,
scans feeding residual SQL), bulk ingest and the Python client's commands all go through it, so
any server answers any call with whole results.

Forwarded calls are flightstore's own commands with ``"local": true``: the receiver serves them
from its own data only, after checking that it leads every bucket they touch (a sender with a
stale view gets UNAVAILABLE instead of writing to a non-leader). They carry the caller's bearer
token, which every server of the cluster accepts (tokens are signed with the cluster secret, see
:mod:`flightstore.server.auth`), so the leader authorizes the original caller.

Before anything is written or streamed, every bucket involved must have a live leader; otherwise
the call fails with UNAVAILABLE naming the server (no partial answer, nothing half-written). A
write that spans several servers is applied per server: each part is atomic and durable before it
is acknowledged, and a retry with the same writer id and sequence is applied once, which is how a
client completes a write cut by a server that died in the middle.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.batches import limited_sources
from flightstore.cluster.peers import Peers
from flightstore.cluster.view import BucketLocation, ClusterView
from flightstore.errors import BucketUnavailable, InvalidInput, TableNotFound
from flightstore.expressions import Predicate
from flightstore.kv import ranges
from flightstore.schema import as_table
from flightstore.server import tickets
from flightstore.server.auth import CALLER_TOKEN
from flightstore.store import Table, WriteResult

__all__ = ["RoutedTable"]


class RoutedTable:
    """A table of the cluster as seen from one server: ``local`` holds the buckets this server
    leads; the others are served by their leaders (see the module doc)."""

    def __init__(self, local: Table, server_id: int, view: Callable[[], ClusterView], peers: Peers) -> None:
        self.local = local
        self.server_id = server_id
        self._view = view
        self.peers = peers
        self._round_robin = itertools.count()
        self._placed: tuple[ClusterView | None, list[BucketLocation], np.ndarray] = (None, [], np.zeros(0))

    def __getattr__(self, name: str) -> Any:  # descriptor, schema, projection, bucket_ids, ...
        return getattr(self.local, name)

    # ---- where buckets live -------------------------------------------------------------------
    def locations(self) -> list[BucketLocation]:
        """Each bucket's leader (by bucket number within a partition) in the current view."""
        return self._placement()[0]

    def _placement(self) -> tuple[list[BucketLocation], np.ndarray]:
        """The locations and leader ids of the current view (computed once per view)."""
        view = self._view()
        cached = self._placed
        if cached[0] is view:
            return cached[1], cached[2]
        try:
            places = view.locations(self.local.path)
        except TableNotFound:  # not in this view yet (the mirror runs ahead): nothing to route
            places = []
        leaders = np.array([p.leader for p in places], dtype=np.int64)
        self._placed = (view, places, leaders)
        return places, leaders

    def location(self, bucket: int) -> BucketLocation | None:
        """The leader of table-wide bucket ``bucket``; None when this server serves it itself."""
        places = self.locations()
        if not places:
            return None
        place = places[int(bucket) % len(places)]
        return None if place.leader == self.server_id else place

    def owned(self) -> list[int]:
        """Bucket numbers (within a partition) this server leads."""
        places = self.locations()
        if not places:
            return list(range(self.local.num_buckets))
        return [p.bucket for p in places if p.leader == self.server_id]

    def _leaders(self, buckets: np.ndarray) -> tuple[np.ndarray, list[BucketLocation]]:
        places, leaders = self._placement()
        if not places:
            return np.full(len(buckets), self.server_id), []
        return leaders[np.asarray(buckets, dtype=np.int64) % len(places)], places

    def _place_of(self, server_id: int, places: list[BucketLocation]) -> BucketLocation:
        return next(p for p in places if p.leader == server_id)

    def _require(self, buckets: Sequence[int]) -> None:
        """UNAVAILABLE naming the first down leader among ``buckets`` (before anything happens)."""
        places = self.locations()
        for bucket in buckets:
            if places:
                places[int(bucket) % len(places)].require()

    # ---- owner side: what a forwarded call may touch ---------------------------------------------
    def check_owned(self, buckets: Sequence[int]) -> Table:
        """The local table, once every bucket of ``buckets`` is led here (else UNAVAILABLE)."""
        places = self.locations()
        for bucket in buckets:
            if places:
                place = places[int(bucket) % len(places)]
                if place.leader != self.server_id:
                    raise BucketUnavailable(
                        f"server {self.server_id} does not lead bucket {bucket} of table {self.local.path} "
                        f"(server {place.leader} does): the sender's cluster view is stale; retry")
        return self.local

    def owner_side_keys(self, keys: pa.Table) -> Table:
        """The local table for a forwarded (prefix) lookup of ``keys``, once their buckets are
        led here."""
        local = self.local
        key = local.descriptor.primary_key[:keys.num_columns]
        if keys.num_rows == 0 or tuple(keys.column_names) != tuple(key):
            return local  # nothing to route, or the single server's refusal
        self.check_owned(np.unique(local.buckets_of(local._pk_table(keys, key))).tolist())
        return local

    def owner_side(self, data: pa.Table, columns: Sequence[str] | None, op: str) -> Table:
        """The local table for a forwarded write of ``data``, after checking that this server
        leads the bucket of every row; a log table without bucket key appends to its own buckets."""
        local = self.local
        if not local.descriptor.bucket_key:
            local.round_robin_buckets = self.owned() or None
            return local
        conformed = self._conformed(op, data, columns)
        self.check_owned(np.unique(local.buckets_of(conformed)).tolist())
        return local

    def accept_gap(self, writer_id: str | None, sequence: int | None) -> None:
        """Let ``writer_id``'s batch ``sequence`` follow whatever this server saw of it before.

        A writer's batches are split by leader, so a server sees only those with rows in its
        buckets: a gap in its sequence is another server's share, not a lost batch. A retried
        batch is still applied once (its sequence is not above what the buckets applied)."""
        if writer_id is None or sequence is None or int(sequence) <= 0:
            return
        local = self.local
        last = local._writers.sequence(writer_id)
        if last is None or last < int(sequence) - 1:
            local._writers.note(writer_id, int(sequence) - 1, local._clock())

    def writer_sequence(self, writer_id: str) -> int | None:
        """The last batch sequence of ``writer_id`` any leader of this table applied."""
        known = [self.local.writer_sequence(writer_id)]
        token = CALLER_TOKEN.get()
        for place in self._servers():
            known.append(self.peers.action(place, "flightstore.writer",
                                           {"table": str(self.local.path), "writer_id": writer_id},
                                           token)["sequence"])
        found = [s for s in known if s is not None]
        return max(found) if found else None

    def _conformed(self, op: str, data: Any, columns: Sequence[str] | None) -> pa.Table:
        local = self.local
        if op == "append" or not local.has_primary_key:
            return local.conform(as_table(data))[0]
        if op == "write":
            data = as_table(data)
            if changetype.CHANGE_TYPE_COLUMN in data.column_names:
                data = data.drop_columns([changetype.CHANGE_TYPE_COLUMN])
            return local.conform(data, columns)[0]
        return local._conform_pk(data, columns, keys_only=op == "delete" and columns is None)[0]

    # ---- writes -------------------------------------------------------------------------------
    def append(self, data: Any, *, writer_id: str | None = None, sequence: int | None = None) -> WriteResult:
        if self.local.has_primary_key:
            return self.local.append(data)  # refuses, as a single server does
        return self._write("append", as_table(data), None, None, writer_id, sequence)

    def upsert(self, data: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> WriteResult:
        return self._write("upsert", as_table(data), columns, None, writer_id, sequence)

    def delete(self, keys: Any, columns: Sequence[str] | None = None, *, writer_id: str | None = None,
               sequence: int | None = None) -> WriteResult:
        return self._write("delete", as_table(keys), columns, None, writer_id, sequence)

    def write(self, data: Any, kinds: Any = None, columns: Sequence[str] | None = None, *,
              writer_id: str | None = None, sequence: int | None = None, overwrite: bool = False,
              conformed: bool = False) -> WriteResult:
        if overwrite or not self.local.has_primary_key:
            return self.local.write(data, kinds, columns, writer_id=writer_id, sequence=sequence,
                                    overwrite=overwrite, conformed=conformed)
        table = as_table(data)
        if kinds is None:
            kinds = np.full(table.num_rows, changetype.UPDATE_AFTER, dtype=np.int8)
        codes = pa.array(np.asarray(kinds.to_numpy(zero_copy_only=False)
                                    if isinstance(kinds, (pa.Array, pa.ChunkedArray)) else kinds), pa.int8())
        if len(codes) != table.num_rows:
            raise InvalidInput("one change type per row is required")
        return self._write("write", table, columns, codes, writer_id, sequence)

    def _write(self, op: str, data: pa.Table, columns: Sequence[str] | None, kinds: pa.Array | None,
               writer_id: str | None, sequence: int | None) -> WriteResult:
        local = self.local
        token = CALLER_TOKEN.get()
        places = self.locations()
        if not local.descriptor.bucket_key:  # log table, round robin: one server takes the batch
            servers = sorted({p.leader for p in places}) or [self.server_id]
            leader = servers[next(self._round_robin) % len(servers)]
            parts = [(leader, data, kinds)]
        else:
            data = self._conformed(op, data, columns)  # validates, and types the bucket key
            leaders, places = self._leaders(local.buckets_of(data))
            servers = np.unique(leaders)
            if len(servers) == 1:
                parts = [(int(servers[0]), data, kinds)]
            else:
                parts = [(int(leader), data.filter(pa.array(leaders == leader)),
                          None if kinds is None else kinds.filter(pa.array(leaders == leader)))
                         for leader in servers]
        for leader, _, _ in parts:  # every leader live, or nothing is written
            if leader != self.server_id:
                self._place_of(leader, places).require()
        result = WriteResult()
        touched: list[int] = []
        for leader, part, part_kinds in parts:
            if leader == self.server_id:
                outcome = self._write_local(op, part, columns, part_kinds, writer_id, sequence)
                result.update(outcome)
                result.duplicate |= bool(outcome.duplicate)
                touched += list(outcome.touched)
                continue
            sent = part if part_kinds is None else part.append_column(
                changetype.CHANGE_TYPE_COLUMN, changetype.to_strings(part_kinds))
            answer = self.peers.put(self._place_of(leader, places),
                                    {"op": op, "table": str(local.path),
                                     "columns": list(columns) if columns else None,
                                     "writer_id": writer_id, "sequence": sequence}, sent, token)
            result.update({int(b): o for b, o in answer.get("offsets", {}).items()})
            result.duplicate |= bool(answer.get("duplicate"))
        result.touched = touched
        return result

    def _write_local(self, op: str, part: pa.Table, columns: Sequence[str] | None, kinds: pa.Array | None,
                     writer_id: str | None, sequence: int | None) -> WriteResult:
        local = self.local
        self.accept_gap(writer_id, sequence)
        if op == "append":
            local.round_robin_buckets = self.owned() or None
            return local.append(part, writer_id=writer_id, sequence=sequence)
        if op == "upsert":
            return local.upsert(part, columns, writer_id=writer_id, sequence=sequence)
        if op == "delete":
            return local.delete(part, columns, writer_id=writer_id, sequence=sequence)
        return local.write(part, kinds, columns, writer_id=writer_id, sequence=sequence)

    # ---- reads --------------------------------------------------------------------------------
    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table:
        local = self.local
        local._require_pk("lookup")
        columns = local._check_columns(columns)
        pk = list(local.descriptor.primary_key)
        keys = local._pk_table(keys, pk)
        if keys.num_rows == 0:
            return local.lookup(keys, columns)
        leaders, places = self._leaders(local.buckets_of(keys))
        servers = np.unique(leaders)
        if len(servers) == 1:
            if int(servers[0]) == self.server_id:
                return local.lookup(keys, columns)
            return self._remote_lookup(self._place_of(int(servers[0]), places), keys, columns)
        for server in servers:
            if int(server) != self.server_id:
                self._place_of(int(server), places).require()
        wanted = columns + [c for c in pk if c not in columns]
        parts = []
        for server in servers:
            part = keys.filter(pa.array(leaders == server))
            parts.append(local.lookup(part, wanted) if int(server) == self.server_id
                         else self._remote_lookup(self._place_of(int(server), places), part, wanted))
        found = pa.concat_tables(parts)
        order = keys.append_column("__position", pa.array(np.arange(keys.num_rows))) \
            .join(found, pk, join_type="inner").sort_by("__position")
        return order.select(columns).cast(local.projection(columns))

    def _remote_lookup(self, place: BucketLocation, keys: pa.Table, columns: list[str]) -> pa.Table:
        table = self.peers.get_table(place, {"op": "lookup", "table": str(self.local.path),
                                             "keys_ipc": tickets.encode_table(keys), "columns": columns},
                                     CALLER_TOKEN.get())
        return table.cast(self.local.projection(columns))

    def prefix_lookup(self, prefix: Any, columns: Sequence[str] | None = None,
                      limit: int | None = None) -> pa.Table:
        local = self.local
        local._require_pk("prefix lookup")
        columns = local._check_columns(columns)
        table = as_table(prefix)
        width = len(table.column_names)
        key = local.descriptor.primary_key
        if tuple(table.column_names) != key[:width] or width < len(local.descriptor.bucket_key):
            return local.prefix_lookup(prefix, columns, limit)  # the single server's refusal
        table = local._pk_table(table, key[:width])
        leaders, places = self._leaders(local.buckets_of(table))
        if (leaders == self.server_id).all():
            return local.prefix_lookup(table, columns, limit)
        for server in np.unique(leaders):
            if int(server) != self.server_id:
                self._place_of(int(server), places).require()
        parts, token = [], CALLER_TOKEN.get()
        for row in range(table.num_rows):  # in prefix order, as a single server answers
            remaining = None if limit is None else limit - sum(p.num_rows for p in parts)
            if remaining is not None and remaining <= 0:
                break
            one = table.slice(row, 1)
            if int(leaders[row]) == self.server_id:
                parts.append(local.prefix_lookup(one, columns, remaining))
            else:
                parts.append(self.peers.get_table(
                    self._place_of(int(leaders[row]), places),
                    {"op": "prefix_lookup", "table": str(local.path), "keys_ipc": tickets.encode_table(one),
                     "columns": columns, "limit": remaining}, token).cast(local.projection(columns)))
        return pa.concat_tables(parts) if parts else local.projection(columns).empty_table()

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None,
             key_range: Any = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Each bucket's pruned, filtered stream from its leader, in bucket order. Checks (now,
        not when iterated) that every leader is live."""
        local = self.local
        columns = local._check_columns(columns)
        if filter is not None:
            filter = filter.bind(local.schema)
        wanted = list(local.bucket_ids() if buckets is None else buckets)
        if local.has_primary_key and filter is not None and not local.descriptor.is_partitioned:
            pinned = ranges.pinned_bucket(filter, local.descriptor)
            if pinned is not None:
                wanted = [b for b in wanted if b == pinned]
        places = self.locations()
        groups: list[tuple[BucketLocation | None, list[int]]] = []
        for bucket in wanted:
            place = places[int(bucket) % len(places)] if places else None
            if place is not None and place.leader == self.server_id:
                place = None
            if place is not None:
                place.require()
            if groups and (groups[-1][0] is None) == (place is None) and \
                    (place is None or groups[-1][0].leader == place.leader):
                groups[-1][1].append(int(bucket))
            else:
                groups.append((place, [int(bucket)]))
        return self._scan_groups(groups, columns, filter, limit, key_range, exact, CALLER_TOKEN.get())

    def _scan_groups(self, groups: list, columns: list[str], filter: Predicate | None,
                     limit: int | None, key_range: Any, exact: bool,
                     token: str | None) -> Iterator[pa.RecordBatch]:
        schema = self.local.projection(columns)

        def open_group(place: BucketLocation | None, buckets: list[int],
                       remaining: int | None) -> Iterator[pa.RecordBatch]:
            if place is None:
                return self.local.scan(columns, filter, remaining, buckets, key_range, exact=exact)
            return self.peers.get(place, {
                "op": "scan", "table": str(self.local.path), "columns": columns,
                "filter": filter.to_dict() if filter is not None else None, "limit": remaining,
                "buckets": buckets, "exact": exact}, token)

        for batch in limited_sources((functools.partial(open_group, place, buckets) for place, buckets in groups),
                                     limit):
            yield batch if batch.schema.equals(schema) else batch.cast(schema)

    def scan_table(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                   limit: int | None = None, *, exact: bool = True) -> pa.Table:
        columns = self.local._check_columns(columns)
        return pa.Table.from_batches(list(self.scan(columns, filter, limit, exact=exact)),
                                     schema=self.local.projection(columns))

    def _servers(self) -> list[BucketLocation]:
        """One location per other server leading buckets of this table (each live, or UNAVAILABLE)."""
        seen: dict[int, BucketLocation] = {}
        for place in self.locations():
            if place.leader != self.server_id and place.leader not in seen:
                place.require()
                seen[place.leader] = place
        return list(seen.values())

    def row_count(self, partitions: Sequence[str] | None = None) -> int:
        """The sum of every leader's count: a server holds rows only in the buckets it leads."""
        others = self._servers()
        token = CALLER_TOKEN.get()
        local = self.local.row_count() if partitions is None else self.local.row_count(partitions)
        payload = {"op": "count", "table": str(self.local.path), "partitions": partitions}
        return local + sum(self.peers.get_table(place, payload, token).column(0)[0].as_py()
                           for place in others)

    def read_changelog(self, bucket: int, from_offset: int | None = None, *,
                       columns: Sequence[str] | None = None, to_offset: int | None = None,
                       max_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        place = self.location(bucket)
        if place is None:
            return self.local.read_changelog(bucket, from_offset, columns=columns, to_offset=to_offset,
                                             max_rows=max_rows)
        place.require()
        return self.peers.get(place, {"op": "changelog", "table": str(self.local.path), "bucket": int(bucket),
                                      "from_offset": from_offset, "to_offset": to_offset,
                                      "columns": list(columns) if columns else None,
                                      "max_rows": max_rows}, CALLER_TOKEN.get())

    def read_snapshot(self, bucket: int, at: int, columns: Sequence[str] | None = None
                      ) -> Iterator[pa.RecordBatch]:
        place = self.location(bucket)
        if place is None:
            return self.local.read_snapshot(bucket, at, columns)
        place.require()
        return self.peers.get(place, {"op": "snapshot", "table": str(self.local.path), "bucket": int(bucket),
                                      "at": int(at), "columns": list(columns) if columns else None},
                              CALLER_TOKEN.get())

    def _offsets(self, which: str, extra: Mapping[str, Any], mine: Callable[[], dict[int, int]]
                 ) -> dict[int, int]:
        """Per-bucket offsets, each bucket's from its leader."""
        places = self.locations()
        offsets = {b: o for b, o in mine().items()
                   if not places or places[b % len(places)].leader == self.server_id}
        token = CALLER_TOKEN.get()
        for place in self._servers():
            answer = self.peers.action(place, "flightstore.offsets",
                                       {"table": str(self.local.path), "which": which, **extra}, token)
            offsets.update({int(b): int(o) for b, o in answer["offsets"].items()
                            if places[int(b) % len(places)].leader == place.leader})
        return dict(sorted(offsets.items()))

    def end_offsets(self) -> dict[int, int]:
        return self._offsets("end", {}, self.local.end_offsets)

    def start_offsets(self) -> dict[int, int]:
        return self._offsets("start", {}, self.local.start_offsets)

    def offsets_for_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        return self._offsets("timestamp", {"timestamp_ms": int(timestamp_ms)},
                             lambda: self.local.offsets_for_timestamp(timestamp_ms))

    def resolve_start(self, start: Any) -> dict[int, int]:
        """Per-bucket offsets of a start position, each bucket's from its leader (explicit
        offsets are checked by the leaders when the subscription reads them)."""
        if start in (None, "earliest"):
            return self.start_offsets()
        if start == "latest":
            return self.end_offsets()
        if isinstance(start, int) and not isinstance(start, bool):
            return self.offsets_for_timestamp(start)
        if isinstance(start, Mapping) and "timestamp" in start:
            return self.offsets_for_timestamp(int(start["timestamp"]))
        if isinstance(start, Mapping):
            offsets = self.start_offsets()
            for bucket, offset in start.items():
                if int(bucket) not in offsets:
                    raise InvalidInput(f"table {self.local.path} has no bucket {bucket}")
                offsets[int(bucket)] = int(offset)
            return offsets
        return self.local.resolve_start(start)  # the single server's refusal

    def subscribe(self, start: Any = "earliest", *, columns: Sequence[str] | None = None,
                  stop: Any = None, heartbeat_s: float | None = 1.0,
                  until: Mapping | None = None) -> Iterator[pa.RecordBatch]:
        """Every leader's subscription to its own buckets, merged (each bucket in offset order)."""
        others = self._servers()
        if not others:
            return self.local.subscribe(start, columns=columns, stop=stop, heartbeat_s=heartbeat_s,
                                        until=until)
        places = self.locations()

        def mine(leader: int, offsets: Mapping | None) -> dict | None:
            if offsets is None:
                return None
            return {str(b): o for b, o in offsets.items() if places[int(b) % len(places)].leader == leader}

        by_offsets = isinstance(start, Mapping) and "timestamp" not in start
        token = CALLER_TOKEN.get()
        sources: list[Callable[[], Iterator[pa.RecordBatch]]] = []
        if any(p.leader == self.server_id for p in places):
            local_start = {int(b): o for b, o in mine(self.server_id, start).items()} if by_offsets else start
            local_until = None if until is None else {int(b): o for b, o in mine(self.server_id, until).items()}
            sources.append(lambda: self.local.subscribe(local_start, columns=columns, stop=stop,
                                                        heartbeat_s=heartbeat_s, until=local_until))
        for place in others:
            payload = {"op": "subscribe", "table": str(self.local.path),
                       "columns": list(columns) if columns else None,
                       "start": mine(place.leader, start) if by_offsets else start,
                       "until": mine(place.leader, until), "heartbeat_s": heartbeat_s}
            sources.append(lambda place=place, payload=payload: self.peers.get(place, payload, token))
        return _merged(sources, stop)


_END = object()


def _merged(sources: list[Callable[[], Iterator[pa.RecordBatch]]], stop: Any) -> Iterator[pa.RecordBatch]:
    """Batches of every source as they come (one thread each); ends when all ended, raises the
    first error, and stops the sources when the consumer goes away."""
    out: queue.Queue = queue.Queue(maxsize=64)
    done = threading.Event()
    iterators: list[Iterator] = []

    def pump(make: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        try:
            iterator = make()
            iterators.append(iterator)
            for batch in iterator:
                while not done.is_set():
                    try:
                        out.put(batch, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if done.is_set():
                    break
            out.put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            out.put(exc)

    threads = [threading.Thread(target=pump, args=(make,), daemon=True, name="cluster-subscribe")
               for make in sources]
    for thread in threads:
        thread.start()
    try:
        running = len(threads)
        while running:
            try:
                item = out.get(timeout=0.5)
            except queue.Empty:
                if stop is not None and stop.is_set():
                    return
                continue
            if item is _END:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        done.set()
        for iterator in iterators:
            close = getattr(iterator, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):  # a generator still running in its thread
                    close()

