"""The calls one server of a cluster makes to another: forwarded parts of a client's call.

A :class:`~flightstore.cluster.table.ClusterTable` splits a call by bucket leader and sends each
leader its part as a flightstore command with ``"peer": true``, the table id, and the leader epoch
of each bucket it touches. They arrive here only (the client-facing handlers never see them), and
only from an authenticated peer (:func:`~flightstore.cluster.identity.peer_of`): a client that
sends ``"peer": true``, or a command only peers send (:data:`PEER_ONLY_OPS`), is refused with
PERMISSION_DENIED before anything of it is read. The caller's bearer token travels too, so the
leader still authorizes the original caller. What a peer may ask is bounded as a client's is: a
partial aggregate is a checked plan (:mod:`flightstore.sql.partial_plan`), never SQL text, and a
forwarded write is read in the server's bounded upload chunks.

Each part is served from this server's own table, after the replica manager confirmed that this
server leads every bucket named at the epoch the sender knows (else UNAVAILABLE: the sender
refreshes its view and retries at the leader).
"""

from __future__ import annotations

import threading
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore import changetype
from flightstore.acl import Operation
from flightstore.cluster.identity import peer_of
from flightstore.errors import Cancelled, InvalidInput, Unauthorized, Unavailable
from flightstore.expressions import from_json
from flightstore.replica.protocol import FETCH_OP, SNAPSHOT_FILES, SNAPSHOT_OP
from flightstore.server import tickets
from flightstore.server.rpc import CallStop
from flightstore.server.upload import read_forwarded
from flightstore.sql import nodes
from flightstore.sql.partial_plan import PartialPlan
from flightstore.sql.plan import is_union
from flightstore.table.upkeep import TASKS, run_task

__all__ = ["PEER_ONLY_OPS", "PeerRpcs", "is_peer_call"]

PARTIAL_INPUT = "__rows"  # what a forwarded partial aggregate's rows are registered as


#: Commands only a peer sends, whether or not they say ``"peer": true``.
PEER_ONLY_OPS = frozenset({SNAPSHOT_OP, FETCH_OP, "partial"})


def is_peer_call(payload: dict) -> bool:
    """Whether a flightstore command is an internal one (served by :class:`PeerRpcs` only)."""
    return bool(payload.get("peer")) or payload.get("op") in PEER_ONLY_OPS


class PeerRpcs:
    """The peer side of :class:`~flightstore.server.service.FlightSqlServer` (mixed into it)."""

    def _require_peer(self, context: Any) -> int:
        """The id of the peer server making this call; Unauthorized (PERMISSION_DENIED) for a
        client, before anything of the call is looked at: an internal call is open to the
        cluster's servers only (their peer credential, checked by
        :class:`~flightstore.cluster.identity.PeerMiddlewareFactory`, and with mutual TLS their
        certificate)."""
        peer = peer_of(context)
        if peer is None or self.cluster is None:
            raise Unauthorized("this call is open to the cluster's servers only")
        return peer

    def _peer_table(self, payload: dict, context: Any, operation: Operation, buckets: list[int]) -> Any:
        """This server's table for a peer call on ``buckets``, once the caller is a peer, the
        original caller may ``operation`` it, and this server leads them at the epochs sent."""
        self._require_peer(context)
        table = self.store.local_table(payload["table"])
        self._authorize_table(operation, table)
        record = self.cluster.view().tables.get(table.path)
        if record is None or record.table_id != payload["table_id"]:
            raise Unavailable(f"table {table.path} here is not the table the sender means (one of the two "
                              "views is behind a DROP and CREATE); retry")
        epochs = {int(b): int(e) for b, e in (payload.get("epochs") or {}).items()}
        self.cluster.replicas.require_leader(payload["table_id"], sorted({int(b) % table.num_buckets
                                                                          for b in buckets}),
                                             {b % table.num_buckets: e for b, e in epochs.items()},
                                             what=f"table {table.path}")
        return table

    @staticmethod
    def _peer_buckets(payload: dict) -> list[int]:
        buckets = payload.get("buckets")
        if buckets is None and payload.get("bucket") is not None:
            buckets = [payload["bucket"]]
        if not buckets:
            raise InvalidInput("a peer call names the buckets it touches")
        return [int(b) for b in buckets]

    def _peer_get(self, payload: dict, context: Any) -> tuple[pa.Schema, Any]:
        self._require_peer(context)
        op = payload.get("op")
        if op == SNAPSHOT_OP:  # a follower behind the log start copies the newest KV snapshot
            key = payload["key"]
            offset, files = self.cluster.replicas.snapshot_files((str(key[0]), int(key[1]), int(key[2])))
            schema = SNAPSHOT_FILES.with_metadata({"offset": str(offset)})
            paths, data = zip(*files)
            return schema, pa.table([pa.array(paths, pa.string()), pa.array(data, pa.large_binary())],
                                    schema=schema)
        buckets = self._peer_buckets(payload)
        table = self._peer_table(payload, context, Operation.READ, buckets)
        columns = payload.get("columns")
        if op in ("lookup", "prefix_lookup"):
            keys = tickets.decode_table(payload["keys_ipc"])
            schema = table.projection(columns or table.schema.names)
            found = table.lookup(keys, columns) if op == "lookup" else \
                table.prefix_lookup(keys, columns, payload.get("limit"))
            self.metrics.sent(str(table.path), found)
            return schema, found
        if op == "partial":  # a plan, checked and turned into SQL here (never SQL text)
            columns = list(columns or table.schema.names)
            unknown = [c for c in columns if c not in table.schema.names]
            if unknown:
                raise InvalidInput(f"table {table.path} has no column {unknown[0]!r}")
            sql = PartialPlan.from_json(payload.get("plan")).sql(PARTIAL_INPUT, columns)
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            item = nodes.ResidualInput(PARTIAL_INPUT, table.path, "table", tuple(columns),
                                       filter.bind(table.schema) if filter is not None else None, partial=sql)
            rows = self.executor.partial_rows(table, item, buckets)
            self.metrics.partials.inc()
            return rows.schema, self.metrics.metered(str(table.path), iter([rows]))
        if op == "scan":
            filter = from_json(payload["filter"]) if payload.get("filter") else None
            schema = table.projection(columns or table.schema.names)
            rows = table.scan(columns, filter, payload.get("limit"), buckets, exact=bool(payload.get("exact", True)))
            return schema, self.metrics.metered(str(table.path), rows)
        if op == "log":  # the log part of a union read (flightstore.lake.union)
            filter = from_json(payload["filter"]).bind(table.schema) if payload.get("filter") else None
            schema = table.projection(columns or table.schema.names)
            rows = table.read_log(int(payload["bucket"]), int(payload["from_offset"]), columns or schema.names,
                                  filter=filter, limit=payload.get("limit"), exact=bool(payload.get("exact", True)))
            return schema, self.metrics.metered(str(table.path), rows)
        if op == "subscribe":
            full = changetype.changelog_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            stop = threading.Event() if context is None else CallStop(context, self._stop)
            numbers = sorted({b % table.num_buckets for b in buckets})
            rows = table.subscribe(payload.get("start") or {}, columns=columns, stop=stop,
                                   heartbeat_s=payload.get("heartbeat_s", 1.0), until=payload.get("until"),
                                   buckets=numbers)
            if isinstance(stop, CallStop):
                rows = stop.guard(rows)
            return schema, self.metrics.metered(str(table.path), rows)
        if op == "changelog":
            full = changetype.changelog_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            return schema, self.metrics.metered(str(table.path), table.read_changelog(
                int(payload["bucket"]), payload.get("from_offset"), columns=columns,
                to_offset=payload.get("to_offset"), max_rows=payload.get("max_rows")))
        if op == "snapshot":
            full = changetype.snapshot_schema(table.schema)
            schema = pa.schema([full.field(c) for c in (columns or full.names)])
            return schema, self.metrics.metered(str(table.path), table.read_snapshot(
                int(payload["bucket"]), int(payload["at"]), columns))
        if op == "count":
            schema = pa.schema([pa.field("count", pa.int64(), nullable=False)])
            if is_union(table.descriptor):
                raise InvalidInput("a union table's count is not split by leader")
            count = table.row_count_of(buckets, payload.get("partitions"))
            return schema, pa.table({"count": [count]}, schema=schema)
        raise InvalidInput(f"unknown peer read command {op!r}")

    def _peer_put(self, payload: dict, reader: flight.MetadataRecordBatchReader, context: Any) -> dict:
        """A part of a write a peer forwarded (at most one of its chunks): one batch, applied to
        the buckets this server leads (a log table without bucket key: the bucket it names)."""
        from flightstore.cluster.table import apply_write
        self._require_peer(context)
        op = payload.get("op")
        if op not in ("append", "upsert", "delete", "write"):
            raise InvalidInput(f"unknown peer write command {op!r}")
        buckets = self._peer_buckets(payload)
        table = self._peer_table(payload, context, Operation.WRITE, buckets)
        data = read_forwarded(reader, self.upload_limits)  # bounded, as a client's chunks are
        if context is not None and context.is_cancelled():  # the peer went away mid-upload
            raise Cancelled("the forwarded upload was cancelled before it finished; nothing written")
        kinds = None
        if op == "write":
            if changetype.CHANGE_TYPE_COLUMN not in data.column_names:
                raise InvalidInput("a changelog write needs a _change_type column")
            try:
                kinds = changetype.from_strings(data.column(changetype.CHANGE_TYPE_COLUMN).combine_chunks())
            except (ValueError, pa.ArrowException) as exc:
                raise InvalidInput(f"column {changetype.CHANGE_TYPE_COLUMN}: {exc}") from None
            data = data.drop_columns([changetype.CHANGE_TYPE_COLUMN])
        pinned = buckets[0] if not table.descriptor.bucket_key else None
        if pinned is not None and len(buckets) != 1:
            raise InvalidInput("a forwarded batch of a log table without bucket key names one bucket")
        result = apply_write(table, op, data, payload.get("columns"), kinds, payload.get("writer_id"),
                             payload.get("sequence"), pinned)
        self.metrics.written(table.path, data)
        return {"op": "written", "rows": data.num_rows, "duplicate": bool(result.duplicate),
                "offsets": {str(k): v for k, v in result.items()}, "chunks": 1,
                "sequence": payload.get("sequence")}

    def _peer_action(self, kind: str, payload: dict, context: Any) -> bytes:
        if kind.startswith("flightstore.workers."):  # a machine's workers (flightstore.cluster.workers)
            handle = getattr(self.cluster, "handle", None)
            if handle is None:
                raise Unauthorized("this call is open to the server's workers only")
            return tickets.encode_custom(handle(kind, payload, peer_of(context)))
        self._require_peer(context)
        if kind == "flightstore.lake-status":  # asked of the cluster's tierer: its own status
            if self.cluster is None or self.tierer is None:
                raise Unauthorized("this call is open to the cluster's servers only")
            table = self._visible_table(payload["table"])
            self._authorize_table(Operation.DESCRIBE, table)
            return tickets.encode_custom({"op": "lake-status",
                                          "tables": [self.tierer.status(table.path, here=True).to_dict()]})
        buckets = self._peer_buckets(payload)
        if kind == "flightstore.offsets":
            table = self._peer_table(payload, context, Operation.DESCRIBE, buckets)
            which = payload.get("which", "end")
            if which == "end":
                offsets = table.end_offsets()
            elif which == "start":
                offsets = table.start_offsets()
            elif which == "timestamp":
                offsets = table.offsets_for_timestamp(int(payload["timestamp_ms"]))
            else:
                raise InvalidInput(f"unknown offsets {which!r}: use end, start or timestamp")
            numbers = {b % table.num_buckets for b in buckets}
            return tickets.encode_custom({"op": "offsets", "offsets": {
                str(k): v for k, v in offsets.items() if k % table.num_buckets in numbers}})
        if kind == "flightstore.writer":
            table = self._peer_table(payload, context, Operation.WRITE, buckets)
            return tickets.encode_custom({"op": "writer", "sequence": table.writer_sequence(payload["writer_id"])})
        if kind == "flightstore.upkeep":  # a task over the buckets this server leads
            task = payload.get("task")
            if task not in TASKS:
                raise InvalidInput(f"unknown upkeep task {task!r}")
            table = self._peer_table(payload, context, TASKS[task], buckets)
            numbers = sorted({b % table.num_buckets for b in buckets})
            return tickets.encode_custom({"op": "upkeep", "result": run_task(table, task, payload.get("args") or {},
                                                                             numbers)})
        raise InvalidInput(f"unknown peer action {kind!r}")
