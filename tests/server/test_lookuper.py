"""The batched asynchronous lookuper (Fluss's client model) against a real server: keys are
coalesced into requests, every future completes or fails when the server dies, and memory stays
bounded when the consumer is slow. (Its answers equal SELECT ... WHERE: test_lookup_stream.py.)"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading

import pyarrow as pa
import pytest
from pyarrow import flight

import flightstore
from flightstore.errors import InvalidOption
from tests.server.test_lookup_stream import killable  # noqa: F401 - the fixture
from tests.waiting import wait_until

TIMEOUT = 60
ROWS = 500


@pytest.fixture
def kv(server):
    with flightstore.connect(server.uri, timeout=TIMEOUT) as conn:
        conn.sql("CREATE TABLE kv (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '3')")
        conn.table("kv").upsert({"id": list(range(ROWS)), "v": [f"v{i}" for i in range(ROWS)]})
        yield conn.table("kv")


def test_concurrent_keys_travel_together(kv):
    """64 keys in flight, max-batch-size 16: four requests, not 64; duplicates asked once."""
    options = {"client.lookup.max-batch-size": 16, "client.lookup.batch-timeout": "10s"}
    with kv.lookuper(options=options) as lk:
        stream = kv.connection._lookups.current()
        sent = []
        send = stream.send
        stream.send = lambda opened, spec, keys, answered: sent.append(keys.num_rows) or \
            send(opened, spec, keys, answered)
        futures = [lk.lookup_async(k % 10) for k in range(64)]
        answers = [f.result(TIMEOUT) for f in futures]
    assert [a.to_pylist() for a in answers] == [[{"id": k % 10, "v": f"v{k % 10}"}] for k in range(64)]
    assert all(type(a) is pa.RecordBatch for a in answers)  # the documented answer type
    assert sent == [10, 10, 10, 10], sent  # full batches leave at once (no 10 s wait), deduplicated


def test_asyncio_flavour(kv):
    async def main(lk):
        return await asyncio.gather(*(lk.lookup(k) for k in range(0, ROWS + 20, 7)))
    with kv.lookuper(columns=["v"], options={"client.lookup.batch-timeout": "5ms",
                                             "client.lookup.queue-size": 8}) as lk:
        answers = asyncio.run(main(lk))  # more keys than the queue holds: waits, never blocks the loop
    assert [a.to_pylist() for a in answers] == \
        [[{"v": f"v{k}"}] if k < ROWS else [] for k in range(0, ROWS + 20, 7)]


def test_options_are_checked(kv):
    with pytest.raises(InvalidOption, match="client.lookup.max-batch-size"):
        kv.lookuper(options={"client.lookup.max-batch-size": 0})
    with pytest.raises(InvalidOption, match="unknown client option 'client.lookup.max-retries'"):
        kv.lookuper(options={"client.lookup.max-retries": 3})
    with kv.lookuper() as lk:
        assert (lk.queue_size, lk.max_batch_size, lk.max_inflight, lk.batch_timeout_s) == (25_600, 128, 128, 0.1)


def test_memory_stays_bounded_with_a_slow_consumer(kv):
    """The consumer's callbacks are slow (they run as answers arrive): requests stay in flight,
    the queue fills, and the producer blocks instead of queueing without end."""
    options = {"client.lookup.queue-size": 8, "client.lookup.max-batch-size": 4,
               "client.lookup.max-inflight-requests": 1, "client.lookup.batch-timeout": "1ms"}
    release = threading.Event()
    seen = {"pending": 0, "inflight": 0}
    submitted = []
    with kv.lookuper(options=options) as lk:
        def slow(future: concurrent.futures.Future) -> None:
            seen["pending"] = max(seen["pending"], lk.pending)
            seen["inflight"] = max(seen["inflight"], lk.inflight)
            release.wait(TIMEOUT)  # a consumer that takes its time

        def produce() -> None:
            for key in range(200):
                future = lk.lookup_async(key)
                future.add_done_callback(slow)
                submitted.append(future)
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            # 1 request in flight (4 keys, its first callback holding the reader), 4 more keys
            # taken by the sender waiting for room in flight, 8 queued: the producer is stuck.
            wait_until(lambda: lk.pending >= 8, "the queue filling up", timeout=TIMEOUT)
            stuck_at = len(submitted)
            assert lk.pending == 8 and stuck_at <= 4 + 4 + 8 + 1, (lk.pending, stuck_at)
            assert producer.is_alive()
        finally:
            release.set()
        producer.join(TIMEOUT)
        assert not producer.is_alive()
    done, not_done = concurrent.futures.wait(submitted, timeout=TIMEOUT)
    assert not not_done and [f.result().column("id").to_pylist() for f in submitted] == [[k] for k in range(200)]
    assert seen["pending"] <= 8 and seen["inflight"] <= 1, seen


def test_every_future_completes_or_fails_when_the_server_dies(killable):  # noqa: F811
    server = killable()
    with flightstore.connect(server.uri, timeout=TIMEOUT) as conn:
        conn.sql("CREATE TABLE kv (id BIGINT, v STRING, PRIMARY KEY (id) NOT ENFORCED) WITH ('bucket.num' = '2')")
        conn.table("kv").upsert({"id": list(range(ROWS)), "v": [f"v{i}" for i in range(ROWS)]})
        options = {"client.lookup.max-batch-size": 8, "client.lookup.max-inflight-requests": 2,
                   "client.lookup.batch-timeout": "1ms", "client.lookup.queue-size": 64}
        lk = conn.table("kv").lookuper(options=options)
        futures: list[concurrent.futures.Future] = []
        stop = threading.Event()

        def produce() -> None:
            key = 0
            while not stop.is_set():
                try:
                    futures.append(lk.lookup_async(key % ROWS))
                except RuntimeError:  # closed
                    return
                key += 1
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        wait_until(lambda: sum(f.done() for f in futures) > 100, "lookups being answered", timeout=TIMEOUT)
        server.kill()
        wait_until(lambda: any(f.done() and f.exception() is not None for f in futures),
                   "a lookup failing once the server died", timeout=TIMEOUT)
        stop.set()
        producer.join(TIMEOUT)
        closer = threading.Thread(target=lk.close, daemon=True)
        closer.start()
        closer.join(TIMEOUT)
        assert not closer.is_alive(), "close() hung on a dead server"
        done, not_done = concurrent.futures.wait(futures, timeout=TIMEOUT)
        assert not not_done, f"{len(not_done)} of {len(futures)} futures never completed"
        for key, future in enumerate(futures):
            if future.exception() is None:  # answered before the server died: the right row
                assert future.result().to_pylist() == [{"id": key % ROWS, "v": f"v{key % ROWS}"}]
            else:
                assert isinstance(future.exception(), flight.FlightUnavailableError), future.exception()


def test_an_unanswered_request_fails_after_the_timeout(killable):  # noqa: F811
    """A server that stops answering (SIGSTOP: its connection stays open) fails the futures at
    the connection's timeout: the timeout really fires."""
    server = killable()
    with flightstore.connect(server.uri, timeout=2.0) as conn:
        conn.sql("CREATE TABLE kv (id BIGINT, PRIMARY KEY (id) NOT ENFORCED)")
        conn.table("kv").upsert({"id": [1]})
        lk = conn.table("kv").lookuper(options={"client.lookup.batch-timeout": "1ms"})
        assert lk.lookup_async(1).result(TIMEOUT).num_rows == 1
        server.freeze()  # SIGSTOP, returning once the server's threads are all stopped
        try:
            future = lk.lookup_async(1)
            with pytest.raises(flight.FlightTimedOutError, match="within 2.0 s"):
                future.result(TIMEOUT)
            with pytest.raises(flight.FlightTimedOutError, match="within 2.0 s"):
                conn.table("kv").lookup({"id": [1]})  # the one-off lookup too
            closer = threading.Thread(target=lk.close, daemon=True)
            closer.start()
            closer.join(TIMEOUT)
            assert not closer.is_alive()
        finally:
            os.kill(server.process.pid, signal.SIGCONT)


def test_a_key_that_does_not_fit_fails_alone(kv):
    with kv.lookuper(options={"client.lookup.batch-timeout": "20ms"}) as lk:
        good, bad, null = lk.lookup_async(3), lk.lookup_async("three"), lk.lookup_async(None)
        assert good.result(TIMEOUT).to_pylist() == [{"id": 3, "v": "v3"}]
        with pytest.raises(pa.ArrowInvalid, match="does not fit"):
            bad.result(TIMEOUT)
        with pytest.raises(pa.ArrowInvalid, match="null"):
            null.result(TIMEOUT)
    with pytest.raises(RuntimeError, match="closed"):
        lk.lookup_async(1)


def test_an_unhashable_key_fails_alone_and_the_lookuper_still_closes(kv):
    with kv.lookuper(options={"client.lookup.max-batch-size": 2}) as lk:
        futures = [lk.lookup_async(4), lk.lookup_async({"id": [5, 6]}), lk.lookup_async(5)]
        assert futures[0].result(TIMEOUT).to_pylist() == [{"id": 4, "v": "v4"}]
        assert futures[2].result(TIMEOUT).to_pylist() == [{"id": 5, "v": "v5"}]
        with pytest.raises(pa.ArrowInvalid, match="does not fit"):
            futures[1].result(TIMEOUT)
        with pytest.raises(pa.ArrowInvalid, match="does not fit"):
            asyncio.run(asyncio.wait_for(lk.lookup({"id": [7]}), TIMEOUT))
    assert not lk._sender.is_alive()  # close() returned: nothing was left in flight


def test_bigint_keys_at_their_limits_and_past_them(kv):
    """A batch of BIGINT keys, all Python ints in range (converted through numpy:
    lookuper._keys_of), asks the extreme values as they are (missing: no row); in a batch with a
    key past int64 and a bool, those fail alone and the others are answered."""
    fit = [7, -2 ** 63, 2 ** 63 - 1, 11, -1, 12]
    expected = [[{"id": 7, "v": "v7"}], [], [], [{"id": 11, "v": "v11"}], [], [{"id": 12, "v": "v12"}]]
    with kv.lookuper(options={"client.lookup.max-batch-size": len(fit) + 2,
                              "client.lookup.batch-timeout": "10s"}) as lk:
        stream = kv.connection._lookups.current()
        sent = []
        send = stream.send
        stream.send = lambda opened, spec, keys, answered: sent.append(keys.column(0).to_pylist()) or \
            send(opened, spec, keys, answered)
        futures = [lk.lookup_async(k) for k in [*fit, 13, 14]]  # one full batch: sent at once
        assert [f.result(TIMEOUT).to_pylist() for f in futures[:len(fit)]] == expected
        mixed = [lk.lookup_async(k) for k in [*fit[:3], 2 ** 63, True, *fit[3:]]]
        for at in (3, 4):
            with pytest.raises(pa.ArrowException, match="does not fit"):
                mixed[at].result(TIMEOUT)
        assert [f.result(TIMEOUT).to_pylist() for at, f in enumerate(mixed) if at not in (3, 4)] == expected
    assert sent == [[*fit, 13, 14], fit], sent
