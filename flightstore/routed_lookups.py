"""Lookups in cluster mode (and with ``serve --workers``): each key on its bucket leader's stream.

The client computes each key's bucket as the servers do (:func:`flightstore.bucketing.bucket_ids`,
over keys first cast to the table's key types, so the hash is the servers'), splits the keys by the
leader the table's locations name, and sends each share on that leader's lookup stream (one per
server, :mod:`flightstore.lookup_stream`) with a ``routed`` handle: a leader answers only for the
buckets it leads. Several leaders' answers are put back in key order (their rows carry each key's
position), a key given twice answering twice, as one server answers. When a leader answers
NOT_LEADER (the locations are stale: a failover, a restarted worker) or cannot be reached, nothing
of the lookup is returned: the locations are asked again and the whole lookup is sent again, for up
to :data:`RETRY_S`; past that the error is raised. Locations naming a bucket of one of the keys
without a live leader are asked again too, until one leads it (keys whose buckets all have live
leaders are sent at once, whatever other buckets' state). A lookup that cannot be routed (a partitioned table; still
no live leader after :data:`RETRY_S`) returns None: the caller sends it to the connected server,
which forwards it or names the bucket that has no leader.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import flight

from flightstore.lookup_stream import KeysDoNotFit, key_batch
from flightstore.wire.lookups import KEY_INDEX_COLUMN, HandleSpec

__all__ = ["RETRY_S", "point_leader", "point_values", "routed_lookup", "split_by_leader"]

RETRY_S = 30.0  # how long a routed lookup keeps asking the locations again (a failover's time)
FIRST_PAUSE_S = 0.05  # the backoff between attempts, doubling ...
MAX_PAUSE_S = 1.0  # ... up to this


def split_by_leader(layout: dict | None, rows: pa.Table, key: Sequence[str] | None = None
                    ) -> list[tuple[str, np.ndarray]] | None:
    """The positions of ``rows`` per leader URI (in first-seen order, ascending within each);
    None when they cannot be placed (no layout, a partitioned table, no bucket key among the
    columns, no rows). ``key``: the columns to hash (default the layout's bucket key)."""
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


def point_values(keys: Any, key_schema: pa.Schema) -> tuple[int, ...] | None:
    """One key of integer columns given as a dict of one-value lists (``{"id": [42]}``) as Python
    ints in ``key_schema``'s order, each in its column's range; None for anything else (several
    keys, a null, a bool, another type, a value out of range: they take the general way)."""
    if type(keys) is not dict:
        return None
    values = []
    for field in key_schema:
        column = keys.get(field.name)
        if type(column) not in (list, tuple) or len(column) != 1 or type(column[0]) is not int \
                or not pa.types.is_integer(field.type):
            return None
        value, bits = column[0], field.type.bit_width
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if pa.types.is_signed_integer(field.type) \
            else (0, (1 << bits) - 1)
        if not low <= value <= high:
            return None
        values.append(value)
    return tuple(values)


def point_leader(layout: dict | None, key_names: Sequence[str], values: Sequence[int]
                 ) -> list[tuple[str | None, None]] | None:
    """:func:`split_by_leader` of one key of integer columns (:func:`point_values`): its
    leader's URI (None: its bucket has no live leader), worked out on Python ints
    (:func:`~flightstore.bucketing.integer_bucket`, the bucket :func:`bucket_ids` gives); None
    when it cannot be placed (no layout, a partitioned table, a bucket key column not in the key)."""
    if layout is None or layout["partitioned"]:
        return None
    names = list(key_names)
    bucket_key = layout["bucket_key"]
    if not bucket_key or any(c not in names for c in bucket_key):
        return None
    from flightstore.bucketing import integer_bucket
    bucket = integer_bucket([values[names.index(c)] for c in bucket_key], layout["num_buckets"])
    return [(layout["leaders"][bucket], None)]


def routed_lookup(table: Any, spec: HandleSpec, keys: dict | pa.Table, limit: int | None) -> pa.Table | None:
    """``table``'s (a :class:`~flightstore.client.TableClient`) lookup of ``keys`` by ``spec`` (the
    handle a single server's stream would open) at their leaders (see the module doc); None when
    it cannot be routed; raises ``KeysDoNotFit`` like a single server's stream."""
    try:  # the key types (a handle opened once per stream, at the connected server): cast before hashing
        key_schema = table.connection._lookups.key_schema(spec)
    except flight.FlightUnavailableError:
        return None  # the connected server does not answer: the DoGet way moves on to another
    point = point_values(keys, key_schema)
    if point is None:
        try:
            typed = pa.Table.from_batches([key_batch(keys, key_schema)])
        except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
            raise KeysDoNotFit(str(exc)) from exc
    else:
        typed = keys  # one key of integer columns: its leader's stream writes it without a batch
    deadline = time.monotonic() + RETRY_S
    pause = FIRST_PAUSE_S
    while True:
        table._locations()
        layout = table._layout  # with the buckets that have no live leader (None): other keys go now
        layout = layout if layout.get("leaders") else None
        if point is None:
            split = split_by_leader(layout, typed)
        else:
            split = point_leader(layout, key_schema.names, point)
        if split is None:
            return None
        if any(uri is None for uri, _ in split):  # a key's bucket without a live leader:
            if time.monotonic() + pause > deadline:  # wait for one (a failover, a worker restarting)
                return None  # the connected server answers, or names the bucket that has none
        else:
            try:
                return _at_leaders(table, spec, typed, split, limit)
            except flight.FlightUnavailableError:  # NOT_LEADER, or a leader that does not answer
                if time.monotonic() + pause > deadline:
                    raise
        table._layout = None  # asked again before the whole lookup is sent again
        time.sleep(pause)
        pause = min(2 * pause, MAX_PAUSE_S)


def _at_leaders(table: Any, spec: HandleSpec, keys: pa.Table | dict, split: list[tuple[str, np.ndarray]],
                limit: int | None) -> pa.Table:
    """The answer of the leaders of ``split`` to ``keys`` (in key order; at most ``limit`` rows);
    ``keys`` a table, or one key of integer columns as its dict (:func:`point_values`: one leader)."""
    connection = table.connection
    if len(split) == 1:  # one leader answers as one server does
        return connection._peer(split[0][0])._lookups.call(replace(spec, routed=True), keys, limit)
    # Each leader answers its share of the distinct keys (in first-seen order, so its first
    # ``limit`` rows hold whatever of its rows the first ``limit`` of the whole answer need); its
    # rows carry their key's position in that share. The rows are then laid out in key order, each
    # key's rows as often as the key is given.
    from flightstore.kv.encoding import encode_key_array
    encoded = encode_key_array(keys, keys.column_names)
    distinct = pc.unique(encoded)
    of_key = pc.index_in(encoded, value_set=distinct).to_numpy()  # each key's distinct number
    first = np.unique(of_key, return_index=True)[1]  # each distinct key's first position
    spec = replace(spec, key_index=True, routed=True)
    parts, owners = [], []
    for uri, at in split:
        mine = np.unique(of_key[at])  # ascending: first-seen order
        rows = connection._peer(uri)._lookups.call(spec, keys.take(pa.array(first[mine])), limit)
        owners.append(mine[rows.column(KEY_INDEX_COLUMN).to_numpy()])
        parts.append(rows.drop_columns([KEY_INDEX_COLUMN]))
    rows = pa.concat_tables(parts)
    owner = np.concatenate(owners).astype(np.int64)
    grouped = np.argsort(owner, kind="stable")  # by distinct key, each in its leader's row order
    counts = np.bincount(owner, minlength=len(distinct))
    starts = np.cumsum(counts) - counts
    per_key = counts[of_key]
    before = np.cumsum(per_key) - per_key
    take = np.arange(int(per_key.sum())) + np.repeat(starts[of_key] - before, per_key)
    if limit is not None:
        take = take[:max(limit, 0)]
    return rows.take(pa.array(grouped[take]))
