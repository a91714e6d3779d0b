"""A DoGet result stream is pulled in the context of the call that created it: gRPC pulls it from
its own threads after the call returned, and the stream's forwarded calls must carry the caller's
token on every pull, without leaving it set in the pulling thread."""

from __future__ import annotations

import threading

import pyarrow as pa

from flightstore.server.auth import CALLER_TOKEN
from flightstore.server.rpc import _in_call_context


def _seen_tokens(seen: list):
    for _ in range(3):
        seen.append(CALLER_TOKEN.get())  # as a lazily opened forwarded call reads it
        yield pa.table({"x": [1]})


def test_every_pull_from_another_thread_sees_the_callers_token_and_leaks_nothing():
    seen: list = []
    reset = CALLER_TOKEN.set("token-of-the-caller")
    try:
        stream = _in_call_context(_seen_tokens(seen))  # created during the call
    finally:
        CALLER_TOKEN.reset(reset)  # the call returned: _rpc reset the token
    after: list = []

    def pull() -> None:  # as a gRPC thread does, later
        after.append(sum(t.num_rows for t in stream))
        after.append(CALLER_TOKEN.get())

    thread = threading.Thread(target=pull)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert seen == ["token-of-the-caller"] * 3
    assert after == [3, None]  # the pulling thread's own context holds no token afterwards
    assert CALLER_TOKEN.get() is None


def test_a_stream_left_early_is_closed_in_the_calls_context():
    closed_with: list = []

    def batches():
        try:
            while True:
                yield pa.table({"x": [1]})
        finally:
            closed_with.append(CALLER_TOKEN.get())

    reset = CALLER_TOKEN.set("t")
    try:
        stream = _in_call_context(batches())
    finally:
        CALLER_TOKEN.reset(reset)
    next(stream)
    stream.close()
    assert closed_with == ["t"]
