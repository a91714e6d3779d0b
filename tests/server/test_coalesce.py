"""Point lookups of concurrent streams run together (flightstore.server.coalesce): every request
gets exactly its own rows, in its key order, whatever the others asked (duplicates, missing keys,
other tables, a failing request)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from flightstore.errors import InvalidInput
from flightstore.server.coalesce import LookupCoalescer
from tests.waiting import wait_until

TIMEOUT = 60


@pytest.fixture
def tables(store):
    kv = store.create_table("kv", pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key=["id"],
                            options={"bucket.num": 3})
    kv.upsert(pa.table({"id": list(range(50)), "v": [None if i % 5 == 0 else f"v{i}" for i in range(50)]}))
    pair = store.create_table("pair", pa.schema([("a", pa.int32()), ("b", pa.string()), ("n", pa.int64())]),
                              primary_key=["a", "b"], options={"bucket.num": 2})
    pair.upsert(pa.table({"a": pa.array([i % 4 for i in range(20)], pa.int32()),
                          "b": [f"b{i}" for i in range(20)], "n": list(range(20))}))
    return kv, pair


def _queued_round(coalescer: LookupCoalescer, calls: list) -> list:
    """Run ``calls`` (args of ``coalescer.lookup``) from threads that all queue before one round
    runs them together; their outcomes (rows and positions, or the exception)."""
    outcomes: list = [None] * len(calls)
    coalescer._running = True  # a leader is busy: every call queues

    def call(i: int) -> None:
        try:
            outcomes[i] = coalescer.lookup(*calls[i])
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[i] = exc
    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(coalescer._queue) == len(calls), "every call queued", timeout=TIMEOUT)
    coalescer._lead_one_round()
    for thread in threads:
        thread.join(TIMEOUT)
    assert not coalescer._running
    return outcomes


def test_each_request_gets_its_own_rows(tables):
    kv, pair = tables
    keys = [[3, 99, 3, 7], [7, 0], [123], [0, 1, 2, 3, 4, 5], [10]]
    calls = [(kv, ("id",), ("id", "v"), pa.table({"id": k})) for k in keys]
    calls.append((pair, ("a", "b"), ("n",), pa.table({"a": pa.array([1, 2, 1], pa.int32()),
                                                       "b": ["b1", "b9", "b5"]})))
    calls.append((pair, ("a", "b"), ("n",), pa.table({"a": pa.array([1], pa.int32()), "b": ["b1"]})))
    coalescer = LookupCoalescer()
    outcomes = _queued_round(coalescer, calls)
    assert (coalescer.rounds, coalescer.requests) == (1, len(calls))
    for (table, _, fetch, request_keys), (rows, positions) in zip(calls, outcomes):
        alone = table.lookup(request_keys, list(fetch))
        assert rows.to_pylist() == alone.to_pylist()  # the same rows, in key order
        # each row's position is its key's index in the request's own keys
        key_names = request_keys.column_names
        wanted = request_keys.to_pylist()
        fetched = table.lookup(request_keys, list(fetch) + [c for c in key_names if c not in fetch])
        assert [{k: wanted[p][k] for k in key_names} for p in positions] == \
            [{k: row[k] for k in key_names} for row in fetched.to_pylist()]


@pytest.mark.parametrize("keys", [
    [[3, 7, 1], [0, 2], [40, 41, 42, 43], [9]],  # every key found, none repeated: no second match
    [[3, 99, 7], [123, 124], [0, 1, 2], [200]],  # none repeated, some missing (a request: all)
    [[5, 6], [6, 5], [8]],  # a key in two requests, every key found: no second match
])
def test_requests_of_found_and_missing_keys_get_their_rows_and_positions(tables, keys):
    """A round whose keys were all found matches its rows to its keys by order (no second
    ``index_in``), one with missing keys by matching: each request's rows and positions are those
    of the request run alone, its rows its own buffers."""
    kv, _ = tables
    calls = [(kv, ("id",), ("v", "id"), pa.table({"id": k})) for k in keys]
    outcomes = _queued_round(LookupCoalescer(), calls)
    for (table, _, fetch, request_keys), (rows, positions) in zip(calls, outcomes):
        alone = table.lookup(request_keys, list(fetch))
        assert rows.schema == alone.schema and rows.to_pylist() == alone.to_pylist()
        # its own buffers, not a slice of the round's (a validity bitmap's byte or so aside)
        assert rows.get_total_buffer_size() <= alone.get_total_buffer_size() + 8 * rows.num_columns
        asked = request_keys.column("id").to_pylist()
        assert [asked[p] for p in positions] == alone.column("id").to_pylist()


def test_a_failing_request_fails_alone(tables):
    kv, _ = tables
    calls = [(kv, ("id",), ("v",), pa.table({"id": [1, 2]})),
             (kv, ("id",), ("v",), pa.table({"id": pa.array([None, 3], pa.int64())})),
             (kv, ("id",), ("v",), pa.table({"id": [4]}))]
    outcomes = _queued_round(LookupCoalescer(), calls)
    assert outcomes[0][0].to_pylist() == [{"v": "v1"}, {"v": "v2"}]
    assert isinstance(outcomes[1], InvalidInput) and "null" in str(outcomes[1])
    assert outcomes[2][0].to_pylist() == [{"v": "v4"}]


def test_the_lead_passes_on(tables):
    """A call queued after a round began is led by itself next (no stream waits forever)."""
    kv, _ = tables
    coalescer = LookupCoalescer()
    first = _queued_round(coalescer, [(kv, ("id",), ("id",), pa.table({"id": [1]}))])
    assert first[0][0].to_pylist() == [{"id": 1}]
    results = []
    threads = [threading.Thread(target=lambda k=k: results.append(
        coalescer.lookup(kv, ("id",), ("id",), pa.table({"id": [k]}))[0].to_pylist())) for k in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert sorted(results, key=repr) == sorted(([{"id": k}] for k in range(20)), key=repr)
    assert not coalescer._running and not coalescer._queue
