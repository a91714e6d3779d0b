"""follow(): a live stream of appended records, in order, once each, until stopped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from flightstore.errors import InvalidInput
from flightstore.expressions import Comparison
from flightstore.log import LogTablet, follow

SCHEMA = pa.schema([("id", pa.int64()), ("tag", pa.string())])


def _batch(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch({"id": list(range(start, start + n)),
                            "tag": ["even" if i % 2 == 0 else "odd" for i in range(start, start + n)]},
                           schema=SCHEMA)


def _collect(stream, sink: list, stop_after_rows: int, stop: threading.Event) -> None:
    for record in stream:
        sink.append(record)
        if sum(r.batch.num_rows for r in sink) >= stop_after_rows:
            stop.set()


def test_follow_sees_appends_from_another_thread_in_order_once(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA, segment_bytes=2048) as tablet:
        tablet.append(_batch(0, 5))  # already there before following
        stop = threading.Event()
        seen: list = []
        consumer = threading.Thread(
            target=_collect, args=(follow(tablet, 2, stop=stop, poll_timeout=0.05), seen, 98, stop))
        consumer.start()

        def produce() -> None:
            for i in range(5, 100, 5):
                tablet.append(_batch(i, 5))
                time.sleep(0.002)

        producer = threading.Thread(target=produce)
        producer.start()
        producer.join()
        consumer.join(timeout=10)
        assert not consumer.is_alive()
        ids = [i for r in seen for i in r.batch.column("id").to_pylist()]
        assert ids == list(range(2, 100))
        offsets = [o for r in seen for o in r.row_offsets.to_pylist()]
        assert offsets == list(range(2, 100))
        assert [r.base_offset for r in seen] == list(range(0, 100, 5))


def test_follow_with_columns_filter_and_max_rows(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        for i in range(0, 40, 10):
            tablet.append(_batch(i, 10))
        stop = threading.Event()
        seen: list = []
        stream = follow(tablet, 0, columns=["id"], filter=Comparison("tag", "=", "odd").bind(SCHEMA),
                        stop=stop, poll_timeout=0.05, max_rows=3)
        for record in stream:
            seen.append(record)
            if record.next_offset == 30:
                tablet.append(_batch(40, 10))
            if record.next_offset == 50:
                stop.set()
        ids = [i for r in seen for i in r.batch.column("id").to_pylist()]
        assert ids == list(range(1, 50, 2))
        assert all(r.batch.column_names == ["id"] for r in seen)


def test_follow_ends_when_stopped_or_closed_while_idle(tmp_path: Path) -> None:
    tablet = LogTablet(tmp_path, SCHEMA)
    stop = threading.Event()
    timer = threading.Timer(0.1, stop.set)
    timer.start()
    started = time.monotonic()
    assert list(follow(tablet, 0, stop=stop, poll_timeout=0.02)) == []
    assert time.monotonic() - started < 2
    threading.Timer(0.1, tablet.close).start()
    assert list(follow(tablet, 0, poll_timeout=5)) == []  # close wakes the waiter


def test_follow_validates_columns_at_call_time(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        with pytest.raises(InvalidInput):
            follow(tablet, 0, columns=["missing"])


def test_wait_for(tmp_path: Path) -> None:
    with LogTablet(tmp_path, SCHEMA) as tablet:
        assert tablet.wait_for(0, 0.01) is False
        threading.Timer(0.05, lambda: tablet.append(_batch(0, 1))).start()
        assert tablet.wait_for(0, 5) is True
        assert tablet.wait_for(1, 0) is False
