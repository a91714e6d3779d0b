"""A table of the cluster as one server sees it: every bucket served by its leader.

In cluster mode :meth:`ClusterStore.table` answers a :class:`ClusterTable`. It implements the
table interface (:class:`~flightstore.table.api.TableApi`) by splitting each call by bucket leader:
the buckets this server leads are served by its own table (:attr:`local`, after the replica
manager confirmed the lead), the others by a peer call to their leader
(:mod:`flightstore.cluster.peers`, ``"peer": true`` with the leader epoch of each bucket, so a
deposed leader refuses instead of answering). Operations that make no sense spread over servers
are refused by name (:class:`Unsupported`); nothing falls through to the local table by accident.

Failover: a leader that is down, deposed or not confirmed yet answers UNAVAILABLE; the call waits
for the next view (a new leader elected by the coordinator) and retries, for up to
:attr:`retry_s` (twice the ZooKeeper session timeout plus a margin: the time a failover takes).
Writes retry safely because every part carries a writer id and batch sequence: the caller's, or
for a statement without one (SQL INSERT) this server's own writer for the table, one sequence per
piece of the statement (a statement's rows are cut into pieces of at most a write chunk, which a
leader reads as one bounded forwarded write). A log table without bucket key sends a batch to
the bucket chosen by its writer id and sequence, so a retry lands where the first attempt did.

Before anything is written or streamed, every bucket involved must have a live leader; otherwise
the call fails with UNAVAILABLE naming the bucket and server (no partial answer).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import queue
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from flightstore import changetype
from flightstore.batches import limited_sources
from flightstore.cluster.peers import Peers
from flightstore.cluster.view import BucketLocation, ClusterView
from flightstore.config import server_option
from flightstore.errors import (
    BucketUnavailable,
    InvalidInput,
    NotEnoughReplicas,
    NotLeader,
    TableNotFound,
    Unavailable,
    Unsupported,
)
from flightstore.expressions import Predicate
from flightstore.kv import ranges
from flightstore.schema import as_table
from flightstore.server import tickets
from flightstore.server.auth import CALLER_TOKEN
from flightstore.store import Table, WriteResult
from flightstore.table.api import TableApi
from flightstore.table.writes import PINNED_BUCKET

__all__ = ["ClusterTable", "NoLeaderLeft"]


class NoLeaderLeft(BucketUnavailable):
    """A bucket's leader is down and no in-sync replica is alive to replace it: waiting for a
    failover would not help (UNAVAILABLE at once, naming the server)."""

log = logging.getLogger("flightstore.cluster")


class ClusterTable(TableApi):
    """See the module docstring. ``member`` gives the view, the replica manager and the peers."""

    distributed = True

    def __init__(self, local: Table, table_id: str, member: Any, peers: Peers, retry_s: float) -> None:
        self.local = local
        self.table_id = table_id
        self.member = member
        self.server_id: int = member.server_id
        self.peers = peers
        self.retry_s = retry_s
        self.path = local.path
        self.descriptor = local.descriptor
        self.schema = local.schema
        # Statement writers (writer id, its sequence numbers), one per statement in flight: see _write.
        self._idle_writers: list[tuple[str, Iterator[int]]] = []
        self._writers_lock = threading.Lock()
        self._placed: tuple[ClusterView | None, list[BucketLocation], np.ndarray] = (None, [], np.zeros(0))

    # ---- shape --------------------------------------------------------------------------------
    @property
    def num_buckets(self) -> int:
        return self.local.num_buckets

    @property
    def has_primary_key(self) -> bool:
        return self.local.has_primary_key

    def projection(self, columns: Sequence[str]) -> pa.Schema:
        return self.local.projection(columns)

    def bucket_ids(self, partitions: Sequence[str] | None = None, filter: Predicate | None = None) -> list[int]:
        if filter is None:
            return self.local.bucket_ids(partitions)
        return self.local.bucket_ids(partitions, filter)  # type: ignore[call-arg]

    def leader_uri(self, bucket: int) -> str | None:
        return self._place(bucket).require().uri

    def _check_columns(self, columns: Sequence[str] | None) -> list[str]:
        return self.local._check_columns(columns)

    # ---- where buckets live -------------------------------------------------------------------
    def locations(self) -> list[BucketLocation]:
        """Each bucket's leader (by bucket number within a partition) in the current view."""
        return self._placement()[0]

    def _placement(self) -> tuple[list[BucketLocation], np.ndarray]:
        view = self.member.view()
        cached = self._placed
        if cached[0] is view:
            return cached[1], cached[2]
        try:
            places = view.locations(self.local.path)
        except TableNotFound:
            places = []
        leaders = np.array([p.leader for p in places], dtype=np.int64)
        self._placed = (view, places, leaders)
        return places, leaders

    def _place(self, bucket: int) -> BucketLocation:
        places = self.locations()
        if not places:
            raise Unavailable(f"table {self.path} is not in this server's cluster view yet; retry")
        return places[int(bucket) % len(places)]

    def _leaders(self, buckets: np.ndarray) -> np.ndarray:
        places, leaders = self._placement()
        if not places:
            raise Unavailable(f"table {self.path} is not in this server's cluster view yet; retry")
        return leaders[np.asarray(buckets, dtype=np.int64) % len(places)]

    def _epochs(self, buckets: Sequence[int]) -> dict[str, int]:
        return {str(int(b)): self._place(int(b)).leader_epoch for b in buckets}

    def _mine(self, buckets: Sequence[int]) -> Table:
        """The local table, once the replica manager confirms this server leads ``buckets`` (by
        number within a partition) at the epochs of the view."""
        numbers = sorted({int(b) % self.num_buckets for b in buckets})
        self.member.replicas.require_leader(
            self.table_id, numbers, {b: self._place(b).leader_epoch for b in numbers},
            what=f"table {self.path}")
        return self.local

    def led_here(self, keys: pa.Table) -> Table:
        """The local table, when this server leads the buckets of every row of ``keys`` (which
        hold the bucket key columns); :class:`~flightstore.errors.NotLeader` otherwise (a client's
        routed lookup reached the wrong server: its locations are stale)."""
        return self.led_buckets(np.unique(self.local.buckets_of(keys)).tolist() if keys.num_rows else [])

    def led_buckets(self, buckets: list[int]) -> Table:
        """:meth:`led_here` of the keys of ``buckets`` (bucket numbers, each once)."""
        places, leaders = self._placement()
        strangers = [b for b in buckets if not places or leaders[b % len(places)] != self.server_id]
        if strangers:
            raise NotLeader(f"table {self.path}: server {self.server_id} does not lead bucket "
                            f"{strangers[0]}; ask the locations again")
        return self._mine(buckets) if buckets else self.local

    def _retrying(self, attempt: Callable[[], Any], what: str) -> Any:
        """``attempt()``; on UNAVAILABLE (a leader down, deposed, not confirmed yet) wait for the
        next view and try again, for up to :attr:`retry_s`."""
        deadline = time.monotonic() + self.retry_s
        while True:
            view = self.member.view()
            try:
                return attempt()
            except Unavailable as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or isinstance(exc, (NotEnoughReplicas, NoLeaderLeft)):
                    raise
                log.info("%s of %s: %s; waiting for a new leader", what, self.path, exc)
                self.member.metadata.wait_for(lambda v, seen=view: v is not seen, min(remaining, 1.0))
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def _stream_retrying(self, attempt: Callable[[], Iterator[pa.RecordBatch]], what: str) -> Iterator[pa.RecordBatch]:
        """:meth:`_retrying` for a stream: a leader that fails before the stream's first batch
        (a forwarded stream fails when it is read, not when it is opened) is retried as well;
        once a batch was streamed, a failure is the caller's."""
        deadline = time.monotonic() + self.retry_s
        while True:
            view = self.member.view()
            try:
                stream = self._retrying(attempt, what)
                first = next(stream, None)
            except Unavailable as exc:
                if time.monotonic() >= deadline or isinstance(exc, (NotEnoughReplicas, NoLeaderLeft)):
                    raise
                log.info("%s of %s: %s; waiting for a new leader", what, self.path, exc)
                self.member.metadata.wait_for(lambda v, seen=view: v is not seen,
                                              max(0.0, min(1.0, deadline - time.monotonic())))
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                continue
            return iter(()) if first is None else itertools.chain((first,), stream)

    def _groups(self, buckets: Sequence[int]) -> list[tuple[int, list[int]]]:
        """``buckets`` grouped by leader in order (every leader live, else UNAVAILABLE)."""
        groups: list[tuple[int, list[int]]] = []
        for bucket in buckets:
            place = self._place(int(bucket))
            if place.leader != self.server_id:
                self._require_leader(int(bucket))
            if groups and groups[-1][0] == place.leader:
                groups[-1][1].append(int(bucket))
            else:
                groups.append((place.leader, [int(bucket)]))
        return groups

    def _by_leader(self) -> dict[int, list[int]]:
        """Every bucket number (within a partition) of the table by its leader (live, else
        UNAVAILABLE)."""
        out: dict[int, list[int]] = {}
        for place in self.locations():
            if place.leader != self.server_id:
                self._require_leader(place.bucket)
            out.setdefault(place.leader, []).append(place.bucket)
        if not out:
            raise Unavailable(f"table {self.path} is not in this server's cluster view yet; retry")
        return out

    def _call(self, leader: int, buckets: Sequence[int], payload: dict) -> dict:
        return {"buckets": [int(b) for b in buckets], **payload, "table": str(self.path), "peer": True,
                "table_id": self.table_id, "epochs": self._epochs(buckets)}

    def _peer_place(self, leader: int, buckets: Sequence[int]) -> BucketLocation:
        return self._place(int(buckets[0]))

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
        if overwrite:
            raise Unsupported(f"table {self.path}: an overwrite (restoring rows as given) runs on a single "
                              "server only, not through a cluster")
        if not self.local.has_primary_key:
            return self.append(data, writer_id=writer_id, sequence=sequence)
        table = as_table(data)
        if kinds is None:
            kinds = np.full(table.num_rows, changetype.UPDATE_AFTER, dtype=np.int8)
        codes = pa.array(np.asarray(kinds.to_numpy(zero_copy_only=False)
                                    if isinstance(kinds, (pa.Array, pa.ChunkedArray)) else kinds), pa.int8())
        if len(codes) != table.num_rows:
            raise InvalidInput("one change type per row is required")
        return self._write("write", table, columns, codes, writer_id, sequence)

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

    def _write(self, op: str, data: pa.Table, columns: Sequence[str] | None, kinds: pa.Array | None,
               writer_id: str | None, sequence: int | None) -> WriteResult:
        statement = writer_id is None or sequence is None
        if not statement:
            return self._write_as(op, data, columns, kinds, writer_id, sequence, None)
        # A statement: a writer of this server's, its own sequence per piece. Statements in flight
        # at once never share a writer: a leader answers a batch whose sequence is not above what
        # it applied from the writer as a duplicate, and the retries of concurrent statements (a
        # leader died) reach the new leader in any order.
        with self._writers_lock:
            writer = self._idle_writers.pop() if self._idle_writers else \
                (f"__server_{self.server_id}_{uuid.uuid4().hex[:12]}", itertools.count())
        try:
            return self._write_as(op, data, columns, kinds, writer[0], None, writer[1])
        finally:
            with self._writers_lock:
                self._idle_writers.append(writer)

    def _write_as(self, op: str, data: pa.Table, columns: Sequence[str] | None, kinds: pa.Array | None,
                  writer_id: str, sequence: int | None, statements: Iterator[int] | None) -> WriteResult:
        """The write of ``data`` as ``writer_id``: batch ``sequence``, or a statement cut into
        pieces numbered by ``statements``."""
        statement = statements is not None
        local = self.local
        data = self._conformed(op, data, columns)  # validates, and types the bucket key
        pending = []
        for piece, piece_kinds in (self._pieces(data, kinds) if statement else [(data, kinds)]):
            piece_sequence = next(statements) if statement else int(sequence)
            if not local.descriptor.bucket_key:  # a log table without bucket key: the batch's own bucket
                pinned = (zlib.crc32(writer_id.encode()) + piece_sequence) % self.num_buckets  # round robin
                buckets = np.full(piece.num_rows, pinned, dtype=np.int64)
            else:
                buckets = np.asarray(local.buckets_of(piece), dtype=np.int64)
            pending.append((piece, piece_kinds, buckets, piece_sequence))
        result = WriteResult()
        deadline = time.monotonic() + self.retry_s
        while pending:
            view = self.member.view()
            try:
                # Every leader live (or none of the write goes out): a bucket without one waits for
                # the failover, or fails at once when no in-sync replica is left to elect.
                for _, _, part_buckets, _ in pending:
                    for bucket in np.unique(part_buckets):
                        self._require_leader(int(bucket))
                retry = self._send_parts(pending, op, columns, writer_id, result)
            except Unavailable as exc:
                if time.monotonic() >= deadline or isinstance(exc, (NotEnoughReplicas, NoLeaderLeft)):
                    raise
                log.info("write to %s: %s; waiting for a new leader", self.path, exc)
                retry = pending
            pending = retry
            if pending:
                if time.monotonic() >= deadline:
                    raise Unavailable(f"a write to table {self.path} did not reach every bucket's leader within "
                                      f"{self.retry_s:g} s; parts may be applied (retry it with the same writer "
                                      "id and sequence to complete it once)")
                self.member.metadata.wait_for(lambda v, seen=view: v is not seen,
                                              max(0.0, min(1.0, deadline - time.monotonic())))
        return result

    def _pieces(self, data: pa.Table, kinds: pa.Array | None) -> list[tuple[pa.Table, pa.Array | None]]:
        """A statement's rows cut into pieces a leader takes as one forwarded write (at most
        ``write.chunk-rows`` rows and half of ``write.chunk-bytes``: see
        :func:`~flightstore.server.upload.read_forwarded`); each piece is a batch of its own."""
        options = self.member.store.options
        per_row = max(1, data.nbytes // max(1, data.num_rows))
        step = max(1, min(server_option(options, "write.chunk-rows"),
                          server_option(options, "write.chunk-bytes") // 2 // per_row))
        if data.num_rows <= step:
            return [(data, kinds)]
        return [(data.slice(start, step), None if kinds is None else kinds.slice(start, step))
                for start in range(0, data.num_rows, step)]

    def _send_parts(self, pending: list, op: str, columns: Sequence[str] | None, writer_id: str,
                    result: WriteResult) -> list:
        """Send each part to its leader; the parts whose leader failed (to retry, idempotently)."""
        retry: list = []
        pinned = not self.local.descriptor.bucket_key
        for part, part_kinds, part_buckets, sequence in pending:
            if retry:  # a writer's batches reach the leaders in order: none goes before an
                retry.append((part, part_kinds, part_buckets, sequence))  # earlier one that failed
                continue  # (applied first, it would turn the earlier one into a duplicate there)
            leaders = self._leaders(part_buckets)
            for leader in np.unique(leaders):
                mask = leaders == leader
                piece = part if mask.all() else part.filter(pa.array(mask))
                piece_kinds = None if part_kinds is None else (
                    part_kinds if mask.all() else part_kinds.filter(pa.array(mask)))
                piece_buckets = part_buckets[mask]
                try:
                    outcome = self._write_part(int(leader), op, piece, columns, piece_kinds,
                                               np.unique(piece_buckets).tolist(), writer_id, sequence, pinned)
                except NotEnoughReplicas:
                    raise
                except Unavailable as exc:
                    log.info("write to %s: %s; retrying at the new leader", self.path, exc)
                    retry.append((piece, piece_kinds, piece_buckets, sequence))
                    continue
                result.update(outcome[0])
                result.duplicate |= outcome[1]
        return retry

    def _require_leader(self, bucket: int) -> None:
        """UNAVAILABLE unless ``bucket``'s leader is live; :class:`NotLeaderElectable` when no
        in-sync replica is alive to become one (waiting would not help)."""
        place = self._place(bucket)
        if place.available:
            return
        view = self.member.view()
        if not any(r in view.servers for r in place.isr if r != place.leader):
            raise NoLeaderLeft(place.reason)
        place.require()

    def _write_part(self, leader: int, op: str, part: pa.Table, columns: Sequence[str] | None,
                    kinds: pa.Array | None, buckets: list[int], writer_id: str, sequence: int,
                    pinned: bool) -> tuple[dict, bool]:
        if leader != self.server_id:
            place = self._place(buckets[0])
            sent = part if kinds is None else part.append_column(
                changetype.CHANGE_TYPE_COLUMN, changetype.to_strings(kinds))
            answer = self.peers.put(place, self._call(leader, buckets, {
                "op": op, "columns": list(columns) if columns else None, "writer_id": writer_id,
                "sequence": sequence, "buckets": buckets}), sent, CALLER_TOKEN.get())
            return {int(b): o for b, o in answer.get("offsets", {}).items()}, bool(answer.get("duplicate"))
        local = self._mine(buckets)
        outcome = apply_write(local, op, part, columns, kinds, writer_id, sequence,
                              buckets[0] if pinned else None)
        return dict(outcome), bool(outcome.duplicate)

    def writer_sequence(self, writer_id: str) -> int | None:
        """The last batch sequence of ``writer_id`` any leader of this table applied."""
        def attempt() -> int | None:
            known = []
            for leader, buckets in self._by_leader().items():
                if leader == self.server_id:
                    known.append(self._mine(buckets).writer_sequence(writer_id))
                else:
                    known.append(self.peers.action(self._place(buckets[0]), "flightstore.writer",
                                                   self._call(leader, buckets, {"writer_id": writer_id}),
                                                   CALLER_TOKEN.get())["sequence"])
            found = [s for s in known if s is not None]
            return max(found) if found else None
        return self._retrying(attempt, "the writer sequence")

    # ---- reads --------------------------------------------------------------------------------
    def lookup(self, keys: Any, columns: Sequence[str] | None = None) -> pa.Table:
        local = self.local
        local._require_pk("lookup")
        columns = local._check_columns(columns)
        pk = list(local.descriptor.primary_key)
        keys = local._pk_table(keys, pk)
        if keys.num_rows == 0:
            return local.lookup(keys, columns)
        buckets = np.asarray(local.buckets_of(keys), dtype=np.int64)

        def attempt() -> pa.Table:
            leaders = self._leaders(buckets)
            servers = np.unique(leaders)
            if len(servers) == 1:
                return self._lookup_at(int(servers[0]), keys, columns, np.unique(buckets).tolist())
            wanted = columns + [c for c in pk if c not in columns]
            # Each leader is asked each key once: a key given n times must answer n rows, not n x n
            # (the join below puts the answers back in the keys' order, duplicates included).
            unique = keys.group_by(pk, use_threads=False).aggregate([])
            unique_buckets = np.asarray(local.buckets_of(unique), dtype=np.int64)
            unique_leaders = self._leaders(unique_buckets)
            parts = []
            for server in np.unique(unique_leaders):
                mask = unique_leaders == server
                parts.append(self._lookup_at(int(server), unique.filter(pa.array(mask)), wanted,
                                             np.unique(unique_buckets[mask]).tolist()))
            found = pa.concat_tables(parts)
            order = keys.append_column("__position", pa.array(np.arange(keys.num_rows))) \
                .join(found, pk, join_type="inner").sort_by("__position")
            return order.select(columns).cast(local.projection(columns))
        return self._retrying(attempt, "a lookup")

    def _lookup_at(self, leader: int, keys: pa.Table, columns: list[str], buckets: list[int],
                   op: str = "lookup", limit: int | None = None) -> pa.Table:
        if leader == self.server_id:
            local = self._mine(buckets)
            return local.lookup(keys, columns) if op == "lookup" else local.prefix_lookup(keys, columns, limit)
        place = self._place(buckets[0])
        self._require_leader(place.bucket)
        table = self.peers.get_table(place, self._call(leader, buckets, {
            "op": op, "keys_ipc": tickets.encode_table(keys), "columns": columns, "limit": limit}),
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
        buckets = np.asarray(local.buckets_of(table), dtype=np.int64)

        def attempt() -> pa.Table:
            leaders = self._leaders(buckets)
            parts: list[pa.Table] = []
            for row in range(table.num_rows):  # in prefix order, as a single server answers
                remaining = None if limit is None else limit - sum(p.num_rows for p in parts)
                if remaining is not None and remaining <= 0:
                    break
                parts.append(self._lookup_at(int(leaders[row]), table.slice(row, 1), columns,
                                             [int(buckets[row])], "prefix_lookup", remaining))
            return pa.concat_tables(parts) if parts else local.projection(columns).empty_table()
        return self._retrying(attempt, "a prefix lookup")

    def scan(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
             limit: int | None = None, buckets: Sequence[int] | None = None,
             key_range: Any = None, *, exact: bool = True) -> Iterator[pa.RecordBatch]:
        """Each bucket's pruned, filtered stream from its leader, in bucket order. Checks (now,
        not when iterated) that every leader is live and confirmed."""
        local = self.local
        columns = local._check_columns(columns)
        if filter is not None:
            filter = filter.bind(local.schema)
        wanted = list(local.bucket_ids() if buckets is None else buckets)
        if local.has_primary_key and filter is not None and not local.descriptor.is_partitioned:
            pinned = ranges.pinned_bucket(filter, local.descriptor)
            if pinned is not None:
                wanted = [b for b in wanted if b == pinned]

        groups = self._retrying(lambda: self._scan_placement(wanted), "a scan")
        return self._scan_groups(groups, columns, filter, limit, key_range, exact, CALLER_TOKEN.get(),
                                 time.monotonic() + self.retry_s)

    def _scan_placement(self, buckets: Sequence[int]) -> list[tuple[int, list[int]]]:
        groups = self._groups(buckets)
        for leader, group in groups:
            if leader == self.server_id:
                self._mine(group)
        return groups

    def _scan_groups(self, groups: list[tuple[int, list[int]]], columns: list[str], filter: Predicate | None,
                     limit: int | None, key_range: Any, exact: bool,
                     token: str | None, deadline: float) -> Iterator[pa.RecordBatch]:
        """The groups' streams one after the other. A leader that fails before its first batch
        (killed, deposed: the failover is under way) is not an answer: its buckets are read again at
        their leaders of the next view, until ``deadline`` (nothing of them was streamed yet)."""
        schema = self.local.projection(columns)

        def open_group(leader: int, buckets: list[int], remaining: int | None) -> Iterator[pa.RecordBatch]:
            view = self.member.view()
            try:
                if leader == self.server_id:
                    stream = self._mine(buckets).scan(columns, filter, remaining, buckets, key_range, exact=exact)
                else:
                    stream = self.peers.get(self._place(buckets[0]), self._call(leader, buckets, {
                        "op": "scan", "columns": columns, "filter": filter.to_dict() if filter is not None else None,
                        "limit": remaining, "buckets": buckets, "exact": exact}), token)
                first = next(stream, None)
            except Unavailable as exc:
                if time.monotonic() >= deadline or isinstance(exc, (NotEnoughReplicas, NoLeaderLeft)):
                    raise
                log.info("a scan of %s: %s; reading buckets %s at their new leaders", self.path, exc, buckets)
                self.member.metadata.wait_for(lambda v, seen=view: v is not seen,
                                              max(0.0, min(1.0, deadline - time.monotonic())))
                time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
                regrouped = self._retrying(lambda: self._scan_placement(buckets), "a scan")
                return self._scan_groups(regrouped, columns, filter, remaining, key_range, exact, token, deadline)
            if first is None:
                return iter(())
            return itertools.chain((first,), stream)

        for batch in limited_sources((functools.partial(open_group, leader, buckets)
                                      for leader, buckets in groups), limit):
            yield batch if batch.schema.equals(schema) else batch.cast(schema)

    def scan_table(self, columns: Sequence[str] | None = None, filter: Predicate | None = None,
                   limit: int | None = None, *, exact: bool = True) -> pa.Table:
        columns = self.local._check_columns(columns)
        return pa.Table.from_batches(list(self.scan(columns, filter, limit, exact=exact)),
                                     schema=self.local.projection(columns))

    def row_count(self, partitions: Sequence[str] | None = None) -> int:
        """The sum of every leader's count of the buckets it leads."""
        def attempt() -> int:
            total = 0
            for leader, numbers in self._by_leader().items():
                if leader == self.server_id:
                    total += self._mine(numbers).row_count_of(numbers, partitions)
                else:
                    total += self.peers.get_table(self._place(numbers[0]), self._call(leader, numbers, {
                        "op": "count", "partitions": partitions, "buckets": numbers}),
                        CALLER_TOKEN.get()).column(0)[0].as_py()
            return total
        return self._retrying(attempt, "a count")

    def partial_aggregates(self, buckets: Sequence[int], local: Any, remote: Mapping[str, Any]) -> list[pa.Table]:
        """Each leader runs the partial over the buckets it leads (a peer ``partial`` call), this
        server over its own; only partial rows travel."""
        def attempt() -> list[pa.Table]:
            parts = []
            by_leader: dict[int, list[int]] = {}
            for leader, group in self._groups(list(buckets)):
                by_leader.setdefault(leader, []).extend(group)
            for leader, group in by_leader.items():
                if leader == self.server_id:
                    parts.append(local(self._mine(group), group))
                else:
                    parts.append(self.peers.get_table(self._place(group[0]), self._call(
                        leader, group, {**remote, "buckets": group}), CALLER_TOKEN.get()))
            return parts
        return self._retrying(attempt, "a partial aggregate")

    # ---- the changelog ------------------------------------------------------------------------
    def read_changelog(self, bucket: int, from_offset: int | None = None, *,
                       columns: Sequence[str] | None = None, to_offset: int | None = None,
                       max_rows: int | None = None) -> Iterator[pa.RecordBatch]:
        def attempt() -> Iterator[pa.RecordBatch]:
            place = self._place(bucket)
            if place.leader == self.server_id:
                return self._mine([bucket]).read_changelog(bucket, from_offset, columns=columns,
                                                           to_offset=to_offset, max_rows=max_rows)
            self._require_leader(place.bucket)
            return self.peers.get(place, self._call(place.leader, [bucket], {
                "op": "changelog", "bucket": int(bucket), "from_offset": from_offset, "to_offset": to_offset,
                "columns": list(columns) if columns else None, "max_rows": max_rows}), CALLER_TOKEN.get())
        return self._stream_retrying(attempt, "a changelog read")

    def read_snapshot(self, bucket: int, at: int, columns: Sequence[str] | None = None
                      ) -> Iterator[pa.RecordBatch]:
        def attempt() -> Iterator[pa.RecordBatch]:
            place = self._place(bucket)
            if place.leader == self.server_id:
                return self._mine([bucket]).read_snapshot(bucket, at, columns)
            self._require_leader(place.bucket)
            return self.peers.get(place, self._call(place.leader, [bucket], {
                "op": "snapshot", "bucket": int(bucket), "at": int(at),
                "columns": list(columns) if columns else None}), CALLER_TOKEN.get())
        return self._stream_retrying(attempt, "a snapshot read")

    def read_log(self, bucket: int, from_offset: int, columns: Sequence[str], *,
                 filter: Predicate | None = None, limit: int | None = None,
                 exact: bool = True) -> Iterator[pa.RecordBatch]:
        """The bucket's log from ``from_offset``, read (pruned, filtered) at its leader."""
        columns = self.local._check_columns(columns)

        def attempt() -> Iterator[pa.RecordBatch]:
            place = self._place(bucket)
            if place.leader == self.server_id:
                return self._mine([bucket]).read_log(bucket, from_offset, columns, filter=filter,
                                                     limit=limit, exact=exact)
            self._require_leader(place.bucket)
            return self.peers.get(place, self._call(place.leader, [bucket], {
                "op": "log", "bucket": int(bucket), "from_offset": int(from_offset), "columns": columns,
                "filter": filter.to_dict() if filter is not None else None, "limit": limit,
                "exact": exact}), CALLER_TOKEN.get())
        schema = self.local.projection(columns)
        for batch in self._retrying(attempt, "a log read"):
            yield batch if batch.schema.equals(schema) else batch.cast(schema)

    def _offsets(self, which: str, extra: Mapping[str, Any]) -> dict[int, int]:
        """Per-bucket offsets, each bucket's from its leader."""
        def attempt() -> dict[int, int]:
            offsets: dict[int, int] = {}
            for leader, numbers in self._by_leader().items():
                if leader == self.server_id:
                    mine = self._mine(numbers)
                    found = (mine.end_offsets() if which == "end" else mine.start_offsets() if which == "start"
                             else mine.offsets_for_timestamp(int(extra["timestamp_ms"])))
                else:
                    answer = self.peers.action(self._place(numbers[0]), "flightstore.offsets",
                                               self._call(leader, numbers, {"which": which, **extra}),
                                               CALLER_TOKEN.get())
                    found = {int(b): int(o) for b, o in answer["offsets"].items()}
                wanted = set(numbers)
                offsets.update({b: o for b, o in found.items() if b % self.num_buckets in wanted})
            return dict(sorted(offsets.items()))
        return self._retrying(attempt, f"the {which} offsets")

    def end_offsets(self) -> dict[int, int]:
        return self._offsets("end", {})

    def start_offsets(self) -> dict[int, int]:
        return self._offsets("start", {})

    def offsets_for_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        return self._offsets("timestamp", {"timestamp_ms": int(timestamp_ms)})

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
                    raise InvalidInput(f"table {self.path} has no bucket {bucket}")
                offsets[int(bucket)] = int(offset)
            return offsets
        return self.local.resolve_start(start)  # the single server's refusal

    def subscribe(self, start: Any = "earliest", *, columns: Sequence[str] | None = None,
                  stop: Any = None, heartbeat_s: float | None = 1.0,
                  until: Mapping | None = None) -> Iterator[pa.RecordBatch]:
        """Every leader's subscription to the buckets it leads, merged (each bucket in offset
        order). Positions are resolved to offsets first, so every source reads exactly its part."""
        offsets = self.resolve_start(start)
        token = CALLER_TOKEN.get()
        sources: list[Callable[[], Iterator[pa.RecordBatch]]] = []
        for leader, numbers in self._by_leader().items():
            wanted = set(numbers)
            mine = {b: o for b, o in offsets.items() if b % self.num_buckets in wanted}
            ends = None if until is None else {int(b): int(o) for b, o in until.items()
                                               if int(b) % self.num_buckets in wanted}
            if leader == self.server_id:
                local = self._mine(numbers)
                sources.append(lambda local=local, mine=mine, ends=ends, numbers=numbers: local.subscribe(
                    mine, columns=columns, stop=stop, heartbeat_s=heartbeat_s, until=ends, buckets=numbers))
            else:
                payload = self._call(leader, numbers, {
                    "op": "subscribe", "columns": list(columns) if columns else None,
                    "start": {str(b): o for b, o in mine.items()},
                    "until": None if ends is None else {str(b): o for b, o in ends.items()},
                    "heartbeat_s": heartbeat_s, "buckets": numbers})
                place = self._place(numbers[0])
                sources.append(lambda place=place, payload=payload: self.peers.get(place, payload, token))
        if len(sources) == 1:
            return sources[0]()
        return _merged(sources, stop)

    # ---- upkeep: every leader over the buckets it leads ----------------------------------------
    def run_upkeep(self, task: str, **args: Any) -> dict[int, Any]:
        """Run upkeep ``task`` on every leader of the table over the buckets it leads (a peer
        ``flightstore.upkeep`` call; this server's own share here), each bucket once; the answer
        of each server by id. Every leader must be live (else UNAVAILABLE naming the bucket and
        server, after waiting for a failover as any call does); the tasks are idempotent, so a
        retry after a failover runs them again where they already ran without harm."""
        from flightstore.table.upkeep import TASKS, run_task
        if task not in TASKS:
            raise InvalidInput(f"unknown upkeep task {task!r}; tasks are {', '.join(TASKS)}")

        def attempt() -> dict[int, Any]:
            done: dict[int, Any] = {}
            for leader, numbers in sorted(self._by_leader().items()):
                if leader == self.server_id:
                    done[leader] = run_task(self._mine(numbers), task, args, numbers)
                else:
                    answer = self.peers.action(self._place(numbers[0]), "flightstore.upkeep", self._call(
                        leader, numbers, {"task": task, "args": args}), CALLER_TOKEN.get())
                    done[leader] = answer["result"]
            return done
        return self._retrying(attempt, f"the {task} upkeep")

    def _upkeep(self, task: str, **args: Any) -> Any:
        from flightstore.table.upkeep import merged
        return merged(task, self.run_upkeep(task, **args))

    def snapshot(self, *, force: bool = False, stop: Any = None) -> dict[int, Any]:
        from flightstore.table.upkeep import SnapshotSummary
        taken = self._upkeep("snapshot", force=force)
        return {int(b): None if info is None else SnapshotSummary(**info) for b, info in taken.items()}

    def enforce_retention(self, now_ms: int | None = None) -> int:
        if now_ms is not None:
            raise Unsupported(f"table {self.path}: retention at a given time runs on one server only")
        return self._upkeep("retention")

    def disk_usage(self) -> dict[str, int]:
        """Bytes of one copy of the table: each leader's share of the buckets it leads."""
        return self._upkeep("usage")

    def undo(self, writer_id: str, after_sequence: int) -> int:
        return self._upkeep("undo", writer_id=writer_id, after_sequence=int(after_sequence))

    def release(self, writer_id: str) -> None:
        self._upkeep("release", writer_id=writer_id)

    def expire_writers(self, now_ms: int | None = None) -> list[str]:
        if now_ms is not None:
            raise Unsupported(f"table {self.path}: writer expiry at a given time runs on one server only")
        return self._upkeep("expire_writers")

    def _refuse(self, what: str) -> Unsupported:
        return Unsupported(f"table {self.path}: {what} acts on one server's storage; in a cluster it is not "
                           "forwarded to the buckets' leaders")

    def rows_at(self, bucket: int, at: int, columns: Sequence[str] | None = None,
                limit: int | None = None) -> Iterator[pa.RecordBatch]:
        raise self._refuse("a read at an offset")

    def partition_stats(self) -> list[tuple[Any, int]]:
        raise self._refuse("partition statistics")


def apply_write(table: Table, op: str, data: pa.Table, columns: Sequence[str] | None, kinds: pa.Array | None,
                writer_id: str | None, sequence: int | None, pinned: int | None = None) -> WriteResult:
    """Apply one part of a cluster write to a local table this server leads: the batch may be a
    gap in the writer's sequence (its other parts went to other leaders), and a log table without
    bucket key takes it in bucket ``pinned``."""
    accept_gap(table, writer_id, sequence)
    token = PINNED_BUCKET.set(pinned)
    try:
        if op == "append":
            return table.append(data, writer_id=writer_id, sequence=sequence)
        if op == "upsert":
            return table.upsert(data, columns, writer_id=writer_id, sequence=sequence)
        if op == "delete":
            return table.delete(data, columns, writer_id=writer_id, sequence=sequence)
        return table.write(data, kinds, columns, writer_id=writer_id, sequence=sequence)
    finally:
        PINNED_BUCKET.reset(token)


def accept_gap(table: Table, writer_id: str | None, sequence: int | None) -> None:
    """Let ``writer_id``'s batch ``sequence`` follow whatever this server saw of it before.

    A writer's batches are split by leader, so a server sees only those with rows in its
    buckets: a gap in its sequence is another server's share, not a lost batch. A retried batch
    is still applied once (its sequence is not above what the buckets applied)."""
    if writer_id is None or sequence is None or int(sequence) <= 0:
        return
    last = table._writers.sequence(writer_id)
    if last is None or last < int(sequence) - 1:
        table._writers.note(writer_id, int(sequence) - 1, table._clock())


_END = object()


def _merged(sources: list[Callable[[], Iterator[pa.RecordBatch]]], stop: Any) -> Iterator[pa.RecordBatch]:
    """Batches of every source as they come (one thread each); ends when all ended, raises the
    first error, and stops the sources when the consumer goes away.

    Each source is closed by its own thread, once it sees the consumer gone (at its next batch or
    heartbeat): closing it from the consumer's thread while its thread reads it (a generator over
    a Flight stream) crashed a server with SIGSEGV (found by the Jepsen-style test)."""
    out: queue.Queue = queue.Queue(maxsize=64)
    done = threading.Event()

    def hand(item: Any) -> bool:
        """Give ``item`` to the consumer; False once it is gone."""
        while not done.is_set():
            try:
                out.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def pump(make: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        iterator = None
        try:
            iterator = make()
            for batch in iterator:
                if not hand(batch):
                    break
            hand(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            hand(exc)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()

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
        done.set()  # every source's thread closes it
