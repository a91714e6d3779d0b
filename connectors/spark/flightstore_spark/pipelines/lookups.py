"""The delta join's batched lookups: the one door its tasks use to read rows by key.

Kept to this one small function on purpose: the lookups issue is building a faster path (a
DoExchange lookup stream in :mod:`flightstore.client`); when it lands, only this function changes.
Today it is one DoGet per call with the keys as Arrow IPC (no per-row conversion), at the keys'
bucket leader when they share one (cluster mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from flightstore.client import Connection
from flightstore.server import tickets

__all__ = ["lookup_rows"]


def lookup_rows(conn: Connection, table: str, keys: pa.Table, columns: Sequence[str], *,
                prefix: bool) -> pa.Table:
    """The ``columns`` of the rows of ``table`` whose primary key (``prefix``: whose primary-key
    prefix) equals a row of ``keys``; keys with no row are simply absent from the answer."""
    payload = {"op": "prefix_lookup" if prefix else "lookup", "table": table,
               "keys_ipc": tickets.encode_table(keys), "columns": list(columns)}
    return conn.table(table)._read_one(keys, payload)
