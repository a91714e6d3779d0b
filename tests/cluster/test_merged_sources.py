"""The merge of several leaders' streams (a cluster subscription): each source is closed by the
thread that reads it, never by the consumer's (closing a source from the consumer's thread while
its own thread read it crashed a server with SIGSEGV in the Jepsen-style test)."""

from __future__ import annotations

import threading

import pyarrow as pa

from flightstore.cluster.table import _merged
from tests.waiting import wait_until


def test_a_consumer_that_goes_away_leaves_each_source_to_its_own_thread():
    closed_by: dict[str, str] = {}

    def source(name: str):
        def batches():
            try:
                while True:
                    yield pa.record_batch({"source": [name]})
            finally:
                closed_by[name] = threading.current_thread().name
        return batches

    merged = _merged([source("a"), source("b")], None)
    seen = {next(merged).column(0)[0].as_py() for _ in range(1)}
    assert seen <= {"a", "b"}
    merged.close()  # the consumer goes away (a client cancelled its subscription)
    wait_until(lambda: len(closed_by) == 2, "both sources closed", timeout=30)
    assert set(closed_by.values()) == {"cluster-subscribe"}, closed_by


def test_the_merge_ends_when_every_source_ended_and_raises_the_first_error():
    def finite(n: int):
        return lambda: iter([pa.record_batch({"n": [i]}) for i in range(n)])

    assert sorted(b.column(0)[0].as_py() for b in _merged([finite(2), finite(3)], None)) == [0, 0, 1, 1, 2]

    def failing():
        yield pa.record_batch({"n": [0]})
        raise ValueError("the leader went away")
    try:
        list(_merged([failing, finite(1)], None))
    except ValueError as exc:
        assert "went away" in str(exc)
    else:
        raise AssertionError("the error of a source was not raised")
