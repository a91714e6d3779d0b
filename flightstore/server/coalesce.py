"""Point lookups of concurrent lookup streams, run together as one multi-get per table.

Each lookup stream is served by its own thread; under load many of them hold a small point lookup
at the same moment, and each lookup's fixed cost (key checks, bucketing, the multi-get call, row
decoding) dwarfs its per-key cost. So a stream's point lookup joins a queue: the first thread to
find nobody running the queue becomes its **leader** and runs everything queued, grouped by table
and columns, as one multi-get of the distinct keys; every request then gets exactly its own rows in
its own key order (missing keys answer no row). A leader runs one round, then hands the lead to the
oldest request still queued, so no stream waits behind others for long. Alone, a lookup runs as it
would without the queue. When a combined lookup fails (a damaged bucket), each request of the group
runs alone, so each gets its own answer or its own error.

A request of a single key does not come here (:mod:`.exchange` runs it in its stream's thread):
measured with 8 client streams, queueing single keys doubled the server CPU per lookup (the
leader hand-over wake-ups and the grouping cost more than the point lookups they share). The queue
pays for requests of several keys (the lookuper's batches).
"""

from __future__ import annotations

import _thread
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flightstore.kv.encoding import encode_key_array

__all__ = ["MAX_COALESCED_KEYS", "LookupCoalescer", "matchable_keys"]

MAX_COALESCED_KEYS = 256  # a request with more keys is a batch already: it runs alone


class _Request:
    def __init__(self, table: Any, key_columns: Sequence[str], fetch: Sequence[str], keys: pa.Table) -> None:
        self.table = table
        self.key_columns = tuple(key_columns)
        self.fetch = tuple(fetch)
        self.keys = keys
        self.rows: pa.Table | None = None
        self.positions: np.ndarray | None = None  # of each row: its key's index in ``keys``
        self.error: BaseException | None = None
        self.answered = False
        self.lead = False  # woken to lead the next round
        # made for a request that waits (not a leader's): a raw lock, held until the request is
        # woken (answered, or to lead: its thread takes it back, and the round it leads releases it
        # again as it answers it). A threading.Event's set and wait each take its
        # Condition and make a waiter lock: ~17% of the GIL-held time of the coalesced lookups
        # under the lookuper's load (yappi), for the one wake-up a raw lock's release gives.
        self.wake: _thread.LockType | None = None

    def outcome(self) -> tuple[pa.Table, np.ndarray]:
        if self.error is not None:
            raise self.error
        return self.rows, self.positions


class LookupCoalescer:
    """The queue of point lookups waiting to run (one per server)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: list[_Request] = []
        self._running = False
        self.rounds = 0  # rounds run, and requests answered in them (tests, metrics)
        self.requests = 0

    def lookup(self, table: Any, key_columns: Sequence[str], fetch: Sequence[str],
               keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """``fetch`` columns of the rows of ``keys`` (a table of ``key_columns``, the primary key)
        in key order, and for each row the index of its key in ``keys``."""
        if keys.num_rows > MAX_COALESCED_KEYS:
            request = _Request(table, key_columns, fetch, keys)
            _run_alone(request)
            return request.outcome()
        with self._lock:
            if self._running:  # a round runs: queue, and wait to be answered or to lead the next
                request: _Request | None = _Request(table, key_columns, fetch, keys)
                request.wake = _thread.allocate_lock()
                request.wake.acquire()  # held: the request's thread blocks on it until released
                self._queue.append(request)
            else:
                self._running = True
                request = None
        if request is None:  # nobody running or queued: run it now, no request to queue or group
            try:
                self.rounds += 1
                self.requests += 1
                return table.lookup(keys, list(fetch)), None
            finally:
                self._hand_over()
        request.wake.acquire()  # released when answered, or to lead the next round
        if not request.answered:  # woken to lead: the round runs it with what queued meanwhile
            self._lead_one_round()
        return request.outcome()

    def _lead_one_round(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        failure: BaseException | None = None
        try:
            self._run(batch)
        except BaseException as exc:  # a bug of ours: every request of the round says so
            failure = exc
            raise
        finally:
            for request in batch:
                if request.rows is None and request.error is None:
                    request.error = failure or RuntimeError("the lookup round ended early")
                request.answered = True
                if request.wake is not None:
                    request.wake.release()
            self._hand_over()

    def _hand_over(self) -> None:
        """A round (or a lookup run alone) ended: the oldest request queued meanwhile leads the
        next round, or nobody runs."""
        with self._lock:
            successor = self._queue[0] if self._queue else None
            if successor is None:
                self._running = False
            else:
                successor.lead = True
        if successor is not None:
            successor.wake.release()  # it waits (it queued while a round ran): it leads the next one

    def _run(self, batch: list[_Request]) -> None:
        self.rounds += 1
        self.requests += len(batch)
        groups: dict[tuple, list[_Request]] = {}
        for request in batch:
            groups.setdefault((id(request.table), request.key_columns, request.fetch), []).append(request)
        for group in groups.values():
            if len(group) == 1:
                _run_alone(group[0])
                continue
            try:
                _run_together(group)
            except Exception:  # noqa: BLE001 - each request then finds its own answer or error
                for request in group:
                    _run_alone(request)


def _run_alone(request: _Request) -> None:
    try:
        rows = request.table.lookup(request.keys, list(request.fetch))
        request.rows = rows
        request.positions = None  # in key order; positions only when asked (see exchange)
    except Exception as exc:  # noqa: BLE001 - the request's own error
        request.error = exc


def _run_together(group: list[_Request]) -> None:
    """One multi-get of the group's distinct keys; each request gets its rows and positions.

    Two hash lookups match them: each key to its first occurrence among the group's keys
    (``index_in`` of the keys in themselves: the distinct keys are those that are their own
    first), and each row found to its key's first occurrence. (``unique`` and two more
    ``index_in``, each hashing the keys again, cost more than the multi-get of a few 32-key
    requests; measured under the lookuper's load.) When every key is found, the rows are the
    distinct keys' in their order: no second match."""
    first = group[0]
    columns = list(first.key_columns)
    keys = pa.concat_tables([request.keys.select(columns) for request in group])
    encoded = matchable_keys(keys, columns)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    firsts = pc.index_in(encoded, value_set=encoded).to_numpy()  # the first occurrence of each key
    distinct = firsts == np.arange(len(firsts))
    asked = keys if distinct.all() else keys.take(pa.array(np.flatnonzero(distinct)))
    fetch = list(first.fetch) + [c for c in columns if c not in first.fetch]
    found = first.table.lookup(asked, fetch)
    row_of = np.full(len(firsts), -1, dtype=np.int64)  # by a key's first occurrence: its row, or -1
    if found.num_rows == asked.num_rows:  # every key found: the rows are the asked keys' in order
        row_of[np.flatnonzero(distinct)] = np.arange(found.num_rows)
    else:
        row_of[pc.index_in(matchable_keys(found, columns), value_set=encoded).to_numpy()] = np.arange(found.num_rows)
    found = found.select(list(first.fetch))
    start = 0
    for request in group:
        end = start + request.keys.num_rows
        at = row_of[firsts[start:end]]
        hit = at >= 0
        # a take, not a slice of the round's rows: the answer's buffers are its own, so what the
        # server counts as sent (get_total_buffer_size, which ignores slicing) is the request's
        request.rows = found.take(pa.array(at[hit]))
        request.positions = np.flatnonzero(hit)
        start = end


def matchable_keys(data: pa.Table, key_columns: Sequence[str]) -> pa.ChunkedArray | pa.Array:
    """The keys of ``data``'s rows as one array whose equal values are equal keys (to match rows
    to keys with ``pc.index_in``/``pc.unique``): a key of one integer column as it is, any other
    key encoded (:func:`~flightstore.kv.encoding.encode_key_array`: encoding costs ~1 us per key
    of a few-hundred-key lookup, more than the match)."""
    if len(key_columns) == 1 and pa.types.is_integer(data.schema.field(key_columns[0]).type):
        return data.column(key_columns[0])
    return encode_key_array(data, key_columns)
