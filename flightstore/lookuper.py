"""Batched asynchronous lookups, Apache Fluss's client model: ``table.lookuper()``.

``lookup_async(key)`` queues one key and returns a :class:`concurrent.futures.Future` of its rows
as a ``pyarrow.RecordBatch`` (a :class:`~flightstore.batch_futures.BatchFuture`: the futures of a
lookuper share one condition, and an answered request completes all of its futures under one
lock, with one notification); ``await lookup(key)`` is the asyncio flavour.

As Fluss's ``LookupQueue.drain`` does, a batch is sent when it holds
``client.lookup.max-batch-size`` keys (from the thread of the ``lookup_async`` that filled it, when
a request may be sent at once: no hand-off per batch) or, by a sender thread, when
``client.lookup.batch-timeout`` has passed since its first key came, as one request (keys
deduplicated) on the connection's lookup stream (:mod:`flightstore.lookup_stream`). In a cluster
(or with ``serve --workers``) a batch is split by its keys' bucket leaders, and each leader's share
is one request on that leader's stream, with a ``routed`` handle
(:mod:`flightstore.routed_lookups`): a leader answers only for its own buckets; when one answers
NOT_LEADER or cannot be reached, the share is routed again on fresh locations, for up to
``routed_lookups.RETRY_S``. At most ``client.lookup.max-inflight-requests`` requests are unanswered
at once, and at most ``client.lookup.queue-size`` keys wait in the queue: past that
``lookup_async`` blocks (the asyncio flavour waits without blocking its loop), so a producer faster
than the server, or a consumer whose callbacks are slow, holds memory for at most ``queue-size +
max-inflight-requests * max-batch-size`` keys.

Every future completes or fails: a request whose stream broke is sent once more on a new stream,
then its futures fail with ``FlightUnavailableError``; with a connection ``timeout`` a request
unanswered for that long fails its futures with ``FlightTimedOutError``; :meth:`Lookuper.close`
fails what was never sent.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyarrow import flight

from flightstore.batch_futures import BatchFuture, complete, fail
from flightstore.config import validate_client_options
from flightstore.lookup_stream import ATTEMPTS, RETRY_PAUSE_S, StaleHandle, StreamBroken, unanswered
from flightstore.routed_lookups import FIRST_PAUSE_S, MAX_PAUSE_S, RETRY_S, split_by_leader
from flightstore.wire.lookups import KEY_INDEX_COLUMN, HandleSpec

__all__ = ["Lookuper"]

_SCALARS = frozenset((int, str, float, bytes, bool))  # key types that are one value (the common case)
_INT = {int}


class _Batch:
    """One request's worth of lookups: distinct keys, and the futures waiting on each."""

    def __init__(self, items: list[tuple[tuple, Future]], answers: threading.Condition) -> None:
        self.answers = answers  # the condition of the batch's futures (batch_futures)
        keys = [key for key, _ in items]
        if len(set(keys)) == len(keys):  # the common case: no key twice
            self.keys: list[tuple] = keys
            self.waiting: list[list[Future]] = [[future] for _, future in items]
        else:
            where: dict[tuple, list[Future]] = {}
            for key, future in items:
                where.setdefault(key, []).append(future)
            self.keys, self.waiting = list(where), list(where.values())
        self.attempts = 0
        self.deadline: float | None = None
        self.reroute_until: float | None = None  # a routed share: routed again until then
        self.pause = RETRY_PAUSE_S  # before it is sent again
        self.reroutes = 0

    def share(self, positions: np.ndarray) -> _Batch:
        """The batch of the keys at ``positions`` (a leader's share), with their futures."""
        part = _Batch([], self.answers)
        part.keys = [self.keys[at] for at in positions.tolist()]
        part.waiting = [self.waiting[at] for at in positions.tolist()]
        return part

    def fail(self, error: BaseException) -> None:
        fail(self.answers, (future for futures in self.waiting for future in futures), error)


class Lookuper:
    """Batches concurrent lookups of one table into lookup requests (see the module doc).

    ``prefix`` (leading primary-key columns, at least the bucket key) makes it a prefix lookuper;
    a key is a dict naming the key columns, a tuple of their values in key order, or one value
    when there is one key column. A future answers a ``pyarrow.RecordBatch`` of the key's rows
    (``columns``, default all): at most one row for a lookup by primary key, none for a missing
    key. (A RecordBatch, not a Table: a slice of the request's answer per key, which costs a
    third of a Table's; it has the same ``num_rows``, ``to_pylist()``, ``column()``, ``schema``;
    ``pa.Table.from_batches([rows])`` makes it a Table.)"""

    def __init__(self, table: Any, *, columns: Sequence[str] | None = None,
                 prefix: Sequence[str] | None = None, options: Mapping[str, Any] | None = None) -> None:
        settings = validate_client_options(options or {})
        self.queue_size = settings["client.lookup.queue-size"]
        self.max_batch_size = settings["client.lookup.max-batch-size"]
        self.max_inflight = settings["client.lookup.max-inflight-requests"]
        self.batch_timeout_s = settings["client.lookup.batch-timeout"] / 1000
        self._table = table
        self._streams = table.connection._lookups
        self._timeout = self._streams.timeout
        self.spec = HandleSpec(table.name, "prefix" if prefix else "lookup",
                               tuple(columns) if columns else None, tuple(prefix) if prefix else None,
                               key_index=True)
        self._routed_spec = replace(self.spec, routed=True)
        # Opened now: a missing table, a log table or unknown columns fail here, and a dict key is
        # read in key order.
        self._key_schema = self._streams.key_schema(self.spec)
        self._key_names = tuple(self._key_schema.names)
        self._queue: collections.deque[tuple[tuple, Future]] = collections.deque()
        self._inflight: dict[int, _Batch] = {}
        self._retrying = 0  # batches between a broken stream and their second sending
        self._filling_since = 0.0  # when the queued batch's first key came
        self._room_waiters = 0  # threads waiting for room among the in-flight requests
        self._sending = 0  # batches taken off the queue, not yet in flight (each holds a place)
        self._ids = 0
        # The condition's lock, entered as itself: ``with self._mutex`` is one C call, where
        # ``with self._cond`` runs Condition's Python __enter__/__exit__ (per lookup_async, a tenth
        # of its CPU). Reentrant: a future's done callback, run under it (a timeout's failures),
        # may queue another lookup.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        # The futures' condition (batch_futures): an answered batch completes its futures at once.
        self._answers = threading.Condition()
        self._closed = False
        self._sender = threading.Thread(target=self._run, name="flightstore-lookuper", daemon=True)
        self._sender.start()

    # ---- the caller's side ----------------------------------------------------------------------
    def lookup_async(self, key: Any) -> Future:
        """Queue ``key``; its future answers the key's rows. Blocks while the queue is full."""
        if type(key) in _SCALARS:  # the common case: one value, a hashable key of one column
            key = (key,)
        else:
            key = self._key(key)
            unfit = self._unfit(key)
            if unfit is not None:
                return unfit
        future = BatchFuture(self._answers)
        queue = self._queue
        with self._mutex:
            while len(queue) >= self.queue_size and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("this lookuper is closed")
            # _enqueue inlined (per key): a first key starts the batch's timeout in the sender
            queue.append((key, future))
            queued = len(queue)
            if queued == 1:
                self._filling_since = time.monotonic()
                self._cond.notify_all()
            # A full batch with room in flight leaves from here, the caller's thread: no hand-off to
            # the sender thread (whose wake-up costs as much as the batch's Python work).
            if queued < self.max_batch_size:
                return future
            if len(self._inflight) + self._sending < self.max_inflight:
                items = self._take()
            else:
                items = None
                self._cond.notify_all()  # the sender sends it when a request is answered
        if items:
            self._send(_Batch(items, self._answers))
        return future

    async def lookup(self, key: Any) -> pa.RecordBatch:
        """The asyncio flavour of :meth:`lookup_async`: waits for queue room without blocking the
        event loop."""
        key = self._key(key)
        unfit = self._unfit(key)
        if unfit is not None:
            return await asyncio.wrap_future(unfit)
        future = BatchFuture(self._answers)
        with self._mutex:
            queued = len(self._queue) < self.queue_size or self._closed
            if queued:
                self._enqueue(key, future)
        if not queued:  # full: wait for room in a worker thread, not in the event loop
            future = await asyncio.get_running_loop().run_in_executor(None, self.lookup_async, key)
        return await asyncio.wrap_future(future)

    def _unfit(self, key: tuple) -> Future | None:
        """A failed future for a key that cannot be asked (a container where a value goes: a batch
        asks each distinct key once, by hash), as a key that does not fit fails; None for a key."""
        try:
            hash(key)
        except TypeError as exc:
            future: Future = Future()
            future.set_exception(pa.ArrowInvalid(
                f"lookup key {key!r} of {self.spec.table} does not fit its key columns {list(self._key_names)}: "
                f"{exc}"))
            return future
        return None

    def _enqueue(self, key: tuple, future: Future) -> None:
        """Queue one lookup (under the lock; the asyncio flavour's): a first key starts the batch's
        timeout in the sender thread, a full batch wakes it (lookup_async does the same inline)."""
        if self._closed:
            raise RuntimeError("this lookuper is closed")
        queue = self._queue
        queue.append((key, future))
        if len(queue) == 1:
            self._filling_since = time.monotonic()
            self._cond.notify_all()
        elif len(queue) >= self.max_batch_size:
            self._cond.notify_all()

    def _key(self, key: Any) -> tuple:
        kind = type(key)
        if kind is tuple:
            return key
        if kind in _SCALARS:
            return (key,)
        if isinstance(key, Mapping):
            return tuple(key[name] for name in self._key_names)
        if isinstance(key, (tuple, list)):
            return tuple(key)
        return (key,)

    def close(self) -> None:
        """Send what is queued, wait for every answer, then stop the sender. Lookups queued after
        close fail with RuntimeError."""
        with self._mutex:
            self._closed = True
            self._cond.notify_all()
        self._sender.join()

    def __enter__(self) -> Lookuper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Keys queued but not yet sent (at most ``client.lookup.queue-size``)."""
        with self._mutex:
            return len(self._queue)

    @property
    def inflight(self) -> int:
        """Requests sent and not yet answered (at most ``client.lookup.max-inflight-requests``)."""
        with self._mutex:
            return len(self._inflight)

    # ---- the sender thread --------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._mutex:
                items = self._drain()
                if items is None:
                    break
            if items:
                self._send(_Batch(items, self._answers))
        with self._mutex:  # closed: wait for the answers still in flight
            while self._inflight or self._retrying or self._sending:
                self._expire()
                self._cond.wait(self._wait_s())

    def _drain(self) -> list[tuple[tuple, Future]] | None:
        """Fluss's drain (under the lock): wait for a first lookup, then up to ``batch-timeout``
        for the batch to fill, and for room among the in-flight requests. None: closed and empty."""
        while True:
            while not self._queue:
                if self._closed:
                    return None
                self._expire()
                self._cond.wait(self._wait_s())
            # A caller may send the batch meanwhile (lookup_async, when it fills): then wait again.
            while self._queue and len(self._queue) < self.max_batch_size and not self._closed:
                left = self._filling_since + self.batch_timeout_s - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._queue:
                self._wait_for_room(taking=True)
                items = self._take()
                if items:
                    return items

    def _take(self) -> list[tuple[tuple, Future]]:
        """The next batch off the queue (under the lock); the keys left start a new batch."""
        queue = self._queue
        was_full = len(queue) >= self.queue_size
        items = [queue.popleft() for _ in range(min(len(queue), self.max_batch_size))]
        self._filling_since = time.monotonic()
        self._sending += 1  # released by _send: at most max-inflight batches out of the queue
        if was_full:
            self._cond.notify_all()  # room in the queue for blocked producers
        return items

    def _wait_for_room(self, taking: bool = False) -> None:
        """Wait (under the lock) until fewer than ``max-inflight-requests`` requests are in flight
        (``taking``: counting the batches taken to be sent, before one more is taken)."""
        self._room_waiters += 1
        try:
            while len(self._inflight) + (self._sending if taking else 0) >= self.max_inflight:
                self._expire()
                self._cond.wait(self._wait_s())
        finally:
            self._room_waiters -= 1

    def _wait_s(self) -> float | None:
        """How long the sender may sleep: until the oldest request's deadline (None: no timeout)."""
        if self._timeout is None or not self._inflight:
            return None if self._timeout is None else self._timeout
        oldest = min(batch.deadline for batch in self._inflight.values())
        return max(0.001, oldest - time.monotonic())

    def _expire(self) -> None:
        """Fail the requests unanswered past the connection's timeout (under the lock)."""
        if self._timeout is None:
            return
        now = time.monotonic()
        for request_id in [i for i, b in self._inflight.items() if b.deadline <= now]:
            batch = self._inflight.pop(request_id)
            batch.fail(flight.FlightTimedOutError(
                f"no answer to {len(batch.keys)} lookup(s) in {self.spec.table} within {self._timeout} s"))
        self._cond.notify_all()

    def _send(self, batch: _Batch, retried: bool = False) -> None:
        """Send ``batch``: one request on the connected server's stream, or one per leader of its
        keys (a cluster); their answers complete it."""
        if retried:
            time.sleep(batch.pause)
        try:
            try:
                shares = self._route(batch)
            except Exception as exc:  # noqa: BLE001 - whatever it is, the futures say it
                return batch.fail(exc)
            for share, leader, keys in shares:
                self._send_one(share, leader, keys)
        finally:
            with self._mutex:
                if retried:
                    self._retrying -= 1
                    self._cond.notify_all()
                else:  # a batch taken off the queue: its place is now in flight (or it failed)
                    self._sending -= 1
                    if self._room_waiters or self._closed:
                        self._cond.notify_all()

    def _route(self, batch: _Batch) -> list[tuple[_Batch, str | None, pa.RecordBatch | None]]:
        """``batch`` split by its keys' leaders: each share with its leader's URI (and its keys);
        the whole batch for the connected server (URI None) on a single server, for a partitioned
        table, or while a bucket has no live leader (the server forwards the keys, or names the
        bucket that has none)."""
        layout = self._table._locations()
        if layout is None or layout["partitioned"]:
            return [(batch, None, None)]
        keys = self._key_batch(batch, self._key_schema)
        if keys is None:
            return []  # no key of the batch fits the key columns: each future says why
        split = split_by_leader(layout, pa.Table.from_batches([keys]))
        if split is None:
            return [(batch, None, keys)]
        if batch.reroute_until is None:
            batch.reroute_until = time.monotonic() + RETRY_S
        if len(split) == 1:
            return [(batch, split[0][0], keys)]
        shares = []
        for uri, at in split:
            share = batch.share(at)
            share.reroute_until = batch.reroute_until
            shares.append((share, uri, keys.take(pa.array(at))))
        return shares

    def _send_one(self, batch: _Batch, leader: str | None, keys: pa.RecordBatch | None) -> None:
        """Send ``batch`` as one request on the stream of ``leader`` (routed), or of the connected
        server (None)."""
        batch.attempts += 1
        spec = self.spec if leader is None else self._routed_spec
        try:
            streams = self._streams if leader is None else self._table.connection._peer(leader)._lookups
            stream = streams.current()
            opened = stream.opened(spec, self._timeout)
            if keys is None or not keys.schema.equals(opened.key_schema):
                keys = self._key_batch(batch, opened.key_schema)
                if keys is None:
                    return  # no key of the batch fits the key columns: each future says why
        except StreamBroken as exc:
            return self._broken(batch, exc)
        except flight.FlightUnavailableError as exc:  # a leader that does not answer its OPEN
            return self._reroute(batch, exc)
        except TimeoutError:
            return batch.fail(flight.FlightTimedOutError(
                f"no answer to opening a lookup in {self.spec.table} within {self._timeout} s"))
        except Exception as exc:  # noqa: BLE001 - the handle was refused, or the keys do not fit
            return batch.fail(exc)
        with self._mutex:
            self._wait_for_room()  # a batch split over leaders: room for each
            self._ids += 1
            request_id = self._ids
            batch.deadline = None if self._timeout is None else time.monotonic() + self._timeout
            self._inflight[request_id] = batch
        stream.send(opened, spec, keys, lambda rows, error: self._answered(request_id, batch, rows, error))

    def _key_batch(self, batch: _Batch, key_schema: pa.Schema) -> pa.RecordBatch | None:
        """The batch's keys as a batch of ``key_schema``. A key that does not fit (wrong number
        of values, a null, a value the key type cannot take) fails its own futures only and
        leaves the batch (None when no key is left)."""
        try:
            return _keys_of(batch.keys, key_schema)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            pass
        good = []
        for at, key in enumerate(batch.keys):
            try:
                _keys_of([key], key_schema)
                good.append(at)
            except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
                error = pa.ArrowInvalid(f"lookup key {key!r} of {self.spec.table} does not fit its key "
                                        f"columns {key_schema.names}: {exc}")
                fail(self._answers, batch.waiting[at], error)
        batch.keys = [batch.keys[at] for at in good]
        batch.waiting = [batch.waiting[at] for at in good]
        return _keys_of(batch.keys, key_schema) if good else None

    def _answered(self, request_id: int, batch: _Batch, answer: pa.RecordBatch | pa.Table | None,
                  error: BaseException | None) -> None:
        """The answer of a request (in the stream's reader thread): split the rows by key."""
        with self._mutex:
            if self._inflight.pop(request_id, None) is None:
                return  # failed already (its timeout passed)
            if self._room_waiters or self._closed:
                self._cond.notify_all()  # room in flight (the sender waits for none otherwise)
        if isinstance(error, StreamBroken):
            return self._broken(batch, error)
        if isinstance(error, flight.FlightUnavailableError):  # NOT_LEADER: stale locations
            return self._reroute(batch, error)
        if isinstance(error, StaleHandle) and batch.attempts < ATTEMPTS + 2:
            return self._retry(batch)
        if error is not None:
            return batch.fail(error)
        rows = answer if isinstance(answer, pa.RecordBatch) else _one_batch(answer)
        positions = rows.column(KEY_INDEX_COLUMN).to_numpy()
        rows = rows.drop_columns([KEY_INDEX_COLUMN])
        waiting = batch.waiting
        if len(positions) == len(waiting) and (positions == np.arange(len(waiting))).all():
            # each key found once: a RecordBatch slice per key (a Table slice costs 3.5x as much)
            answers = [rows.slice(at, 1) for at in range(len(waiting))]
        else:
            if len(positions) > 1 and (np.diff(positions) < 0).any():  # rows answer in key order; if not:
                order = np.argsort(positions, kind="stable")
                rows, positions = rows.take(pa.array(order)), positions[order]
            counts = np.bincount(positions, minlength=len(waiting)).tolist()
            empty = rows.slice(0, 0)  # every missing key answers this one empty batch
            answers, start = [], 0
            for count in counts:
                answers.append(rows.slice(start, count) if count else empty)
                start += count
        complete(self._answers, ((future, found) for futures, found in zip(waiting, answers)
                                 for future in futures))

    def _broken(self, batch: _Batch, broken: StreamBroken) -> None:
        if batch.reroute_until is not None:  # a leader's stream: the leader may have moved
            return self._reroute(batch, unanswered(self.spec.table, broken))
        if batch.attempts >= ATTEMPTS:
            return batch.fail(unanswered(self.spec.table, broken))
        self._retry(batch)

    def _reroute(self, batch: _Batch, error: BaseException) -> None:
        """A routed share that a leader did not answer (NOT_LEADER, unreachable): ask the locations
        again and route it again, backing off, until its ``reroute_until``; then it fails."""
        if batch.reroute_until is None or time.monotonic() + batch.pause > batch.reroute_until:
            return batch.fail(error)
        self._table._layout = None
        batch.attempts = 0
        batch.pause = FIRST_PAUSE_S if batch.reroutes == 0 else min(2 * batch.pause, MAX_PAUSE_S)
        batch.reroutes += 1
        self._retry(batch)

    def _retry(self, batch: _Batch) -> None:
        # From the reader thread of the stream that broke: send from a thread of its own, which
        # opens the new stream (the reader thread ends with its stream).
        with self._mutex:
            self._retrying += 1
        threading.Thread(target=self._send, args=(batch, True), name="flightstore-lookuper-retry",
                         daemon=True).start()


def _one_batch(rows: pa.Table) -> pa.RecordBatch:
    """``rows`` as one RecordBatch (an answer cut into several messages is combined)."""
    batches = rows.to_batches()
    if len(batches) == 1:
        return batches[0]
    if rows.num_rows == 0:
        return pa.RecordBatch.from_pylist([], schema=rows.schema)
    return rows.combine_chunks().to_batches()[0]


def _keys_of(keys: list[tuple], key_schema: pa.Schema) -> pa.RecordBatch:
    """Key tuples as a batch of ``key_schema`` (ValueError / ArrowException when one does not fit)."""
    if len(key_schema) == 1:  # one key column: a key of another length fails to unpack (ValueError)
        values = [value for (value,) in keys]
        kind = key_schema.field(0).type
        if kind == pa.int64() and set(map(type, values)) == _INT:  # a BIGINT key: numpy's conversion
            try:  # and its buffer as it is, a quarter of pa.array's cost for a batch of a few dozen
                numbers = np.array(values, dtype=np.int64)
            except OverflowError:  # past int64: pa.array says so, as for any other key
                numbers = None
            if numbers is not None:
                return pa.RecordBatch.from_arrays(
                    [pa.Array.from_buffers(kind, len(numbers), [None, pa.py_buffer(numbers)])], schema=key_schema)
        arrays = [pa.array(values, kind)]
    else:
        if any(len(key) != len(key_schema) for key in keys):
            raise ValueError(f"a key has the {len(key_schema)} values of {key_schema.names}")
        # pa.array converts a list four times faster than the tuple zip gives
        arrays = [pa.array(list(values), field.type) for values, field in zip(zip(*keys), key_schema)]
    if any(array.null_count for array in arrays):
        raise ValueError("a key value is null")
    return pa.RecordBatch.from_arrays(arrays, schema=key_schema)
