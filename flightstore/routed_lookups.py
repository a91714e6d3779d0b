"""Lookups in cluster mode (and with ``serve --workers``): each key on its bucket leader's stream.

The client computes each key's bucket as the servers do (:func:`flightstore.bucketing.bucket_ids`,
over keys first cast to the table's key types, so the hash is the servers'), splits the keys by the
leader the table's locations name, and sends each share on that leader's lookup stream (one per
server, :mod:`flightstore.lookup_stream`) with a ``routed`` handle: a leader answers only for the
buckets it leads. Several leaders' answers are put back in key order (their rows carry each key's
position). When a leader answers NOT_LEADER (the locations are stale: a failover, a restarted
worker) or cannot be reached, nothing of the lookup is returned: the locations are asked again and
the whole lookup is sent again, for up to :data:`RETRY_S`; past that the error is raised. A
lookup that cannot be routed (a partitioned table, a bucket without a live leader) returns None:
the caller sends it to the connected server, which forwards it (and waits out a failover).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import flight

from flightstore.lookup_stream import KeysDoNotFit, key_batch
from flightstore.wire.lookups import KEY_INDEX_COLUMN, HandleSpec

__all__ = ["RETRY_S", "routed_lookup", "split_by_leader"]

RETRY_S = 30.0  # how long a routed lookup keeps asking the locations again (a failover's time)


def split_by_leader(layout: dict | None, rows: pa.Table, key: Sequence[str] | None = None
                    ) -> list[tuple[str, np.ndarray]] | None:
    """The positions of ``rows`` per leader URI (in first-seen order); None when they cannot be
    placed (no layout, a partitioned table, no bucket key among the columns, no rows)."""
    if layout is None or layout["partitioned"]:
        return None
    key = list(key or layout["bucket_key"])
    if not key or any(c not in rows.column_names for c in key) or rows.num_rows == 0:
        return None
    from flightstore.bucketing import bucket_ids
    try:
        buckets = bucket_ids(rows.select(key), key, layout["num_buckets"])
    except (pa.ArrowException, TypeError, ValueError):
        return None
    leaders = np.asarray(layout["leaders"], dtype=object)[np.asarray(buckets, dtype=np.int64)]
    if (leaders == leaders[0]).all():
        return [(leaders[0], np.arange(rows.num_rows))]
    return [(uri, np.flatnonzero(leaders == uri)) for uri in dict.fromkeys(leaders.tolist())]


def routed_lookup(table: Any, kind: str, keys: Any, columns: Sequence[str] | None,
                  limit: int | None) -> pa.Table | None:
    """``table``'s (a :class:`~flightstore.client.TableClient`) lookup of ``keys`` at their
    leaders (see the module doc); raises ``KeysDoNotFit`` like a single server's stream."""
    columns = tuple(columns) if columns else None
    if not isinstance(keys, (dict, pa.Table)):
        keys = pa.Table.from_batches([keys]) if isinstance(keys, pa.RecordBatch) else pa.table(keys)
    key_columns = (tuple(keys) if isinstance(keys, dict) else tuple(keys.column_names)) if kind == "prefix" else None
    connection = table.connection
    # The key types, from the connected server's handle (opened once per stream): cast before hashing.
    key_schema = connection._lookups.key_schema(HandleSpec(table.name, kind, columns, key_columns))
    try:
        typed = pa.Table.from_batches([key_batch(keys, key_schema)])
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        raise KeysDoNotFit(str(exc)) from exc
    deadline = time.monotonic() + RETRY_S
    pause = 0.05
    while True:
        split = split_by_leader(table._locations(), typed)
        if split is None:
            return None
        try:
            return _at_leaders(table, kind, typed, split, columns, key_columns, limit)
        except flight.FlightUnavailableError:  # NOT_LEADER, or a leader that does not answer
            table._layout = None
            if time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, 1.0)


def _at_leaders(table: Any, kind: str, keys: pa.Table, split: list[tuple[str, np.ndarray]],
                columns: tuple[str, ...] | None, key_columns: tuple[str, ...] | None,
                limit: int | None) -> pa.Table:
    connection = table.connection
    if len(split) == 1:
        spec = HandleSpec(table.name, kind, columns, key_columns, routed=True)
        return connection._peer(split[0][0])._lookups.call(spec, keys, limit)
    spec = HandleSpec(table.name, kind, columns, key_columns, key_index=True, routed=True)
    parts, positions = [], []
    for uri, at in split:
        rows = connection._peer(uri)._lookups.call(spec, keys.take(pa.array(at)), limit)
        positions.append(at[rows.column(KEY_INDEX_COLUMN).to_numpy()])
        parts.append(rows.drop_columns([KEY_INDEX_COLUMN]))
    rows = pa.concat_tables(parts)
    order = np.argsort(np.concatenate(positions), kind="stable")  # key order, as one server answers
    rows = rows.take(pa.array(order))
    return rows if limit is None else rows.slice(0, limit)
