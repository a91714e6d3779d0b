"""The stop flag of a streaming call never asks the call's gRPC context once the call's stream
closed (threads outliving the call asked a freed context and crashed a server with SIGSEGV in
the Jepsen-style test)."""

from __future__ import annotations

import threading

from flightstore.server.rpc import CallStop


class _Context:
    """What CallStop asks of a ServerCallContext; counts the questions."""

    def __init__(self) -> None:
        self.asked = 0
        self.cancelled = False

    def is_cancelled(self) -> bool:
        self.asked += 1
        return self.cancelled


def test_the_flag_follows_the_call_then_stays_set_without_touching_it():
    context, server_stop = _Context(), threading.Event()
    stop = CallStop(context, server_stop)
    stream = stop.guard(iter([1, 2, 3]))
    assert next(stream) == 1
    assert not stop.is_set() and context.asked == 1
    context.cancelled = True
    assert stop.is_set()
    context.cancelled = False
    stream.close()  # the call ends (the client went away): gRPC frees its context after this
    asked = context.asked
    assert stop.is_set() and stop.is_set()
    assert context.asked == asked  # never asked again


def test_a_stream_that_ends_sets_the_flag_and_the_server_stop_sets_it_too():
    context, server_stop = _Context(), threading.Event()
    stop = CallStop(context, server_stop)
    assert list(stop.guard(iter([1, 2]))) == [1, 2]
    assert stop.is_set()
    other = CallStop(_Context(), server_stop)
    server_stop.set()
    assert other.is_set()
