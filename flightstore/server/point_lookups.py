"""A lookup stream's single-key lookup answered without Arrow calls (issue 23).

The general path (:mod:`.exchange`) decodes the key batch, validates it, makes a table, looks the
key up (a row decoded into arrays and a table), checks and casts the answer's schema, cuts it into
batches and serializes them: about a dozen pyarrow calls, several of which release the GIL. Alone
that is ~0.3 ms of server CPU; under 8 concurrent streams each hand-over of the GIL costs ~35 us
more (``bench/gil_handoffs.py``), and the lookup costs ~1 ms.

Here a request of one key of integer columns (:class:`~flightstore.wire.point_keys.PointKeys`)
is read with ``struct``, its bucket and RocksDB key worked out on Python ints
(:meth:`~flightstore.table.reads.TableReads.point`), its stored value read with the same checks
as any lookup (:meth:`~flightstore.kv.tablet.KvTablet.stored_value`), and the answer written from
the value's bytes (:class:`~flightstore.kv.row_message.RowMessage`): the same message the general
path sends. Everything else goes the general way (:func:`point_reply` answers None): keys of other
types, nulls, several keys, prefix handles, partitioned tables, a cluster's unrouted handles (the
server forwards their keys), a value written under an older schema version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from flightstore.wire import lookups as wire
from flightstore.wire.point_keys import PointKeys

__all__ = ["PointPath", "point_reply"]


@dataclass(frozen=True)
class PointPath:
    """What a handle's single-key lookups need, made when the handle is opened: the key reader
    and the answer to a missing key (an empty batch of the row schema)."""

    keys: PointKeys
    empty: bytes

    @staticmethod
    def of(spec: wire.HandleSpec, key_schema: pa.Schema, row_schema: pa.Schema) -> PointPath | None:
        """The path of a handle, or None when its lookups cannot take it (a prefix handle, keys
        not all integers)."""
        if spec.kind != "lookup":
            return None
        keys = PointKeys.of(key_schema)
        if keys is None:
            return None
        empty = pa.RecordBatch.from_arrays([pa.array([], f.type) for f in row_schema], schema=row_schema)
        return PointPath(keys, wire.encode_batch(empty).to_pybytes())


def point_reply(server: Any, handle: Any, handle_id: int, request_id: int, body: pa.Buffer) -> bytes | None:
    """The ROWS reply to a LOOKUP of ``handle`` (an exchange ``_Handle`` whose ``point`` is set),
    or None when the request is not one this path answers (the caller takes the general path)."""
    path: PointPath = handle.point
    values = path.keys.values(body)
    if values is None:
        return None
    table = server.store.table(handle.path)
    if table.descriptor.is_partitioned:
        return None
    if table.distributed:
        if not handle.spec.routed:  # the server forwards an unrouted handle's keys: general path
            return None
        point = table.local.point(values)
        if point is None:
            return None
        table = table.led_buckets([point[0]])  # NOT_LEADER for another server's bucket
    else:
        point = table.point(values)
        if point is None:
            return None
    bucket, key = point
    kv = table.kvs[bucket]
    value = kv.stored_value(key)
    head = wire.encode_reply(wire.ROWS, handle_id, request_id)
    if value is None:
        server.metrics.sent_rows(handle.name, 0, 0)
        server.metrics.point_lookups += 1
        return head + path.empty
    writer = kv.codec.row_message_of(value, handle.columns, handle.spec.key_index)
    if writer is None:  # a value of an older schema version: decoded and conformed the general way
        return None
    if not writer.fits(handle.row_schema):  # the KV's codec is not the handle's shape (mid-ALTER)
        return None
    reply, nbytes = writer.message(value, head)
    server.metrics.sent_rows(handle.name, 1, nbytes)
    server.metrics.point_lookups += 1
    return reply
