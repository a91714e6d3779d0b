"""The wrapper every Flight RPC of :class:`~flightstore.server.service.FlightSqlServer` goes
through: the caller (user and bearer token) set for the call, errors translated in exactly one
place (:func:`_translate`), and result streams pulled in the context of their call.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyarrow import flight

from flightstore.errors import FlightstoreError
from flightstore.server import status
from flightstore.server.auth import CALLER_TOKEN, principal_of, token_of
from flightstore.server.metrics import HANDLER_TIMED

# The authenticated user of the RPC being served (set by _rpc; None without authentication).
_CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("flightstore_caller", default=None)


def _translate(exc: BaseException, hidden: tuple[str, ...] = ()) -> BaseException:
    """The Flight error a client sees for ``exc`` (one place for every RPC): a status and a
    message saying what is wrong; ``hidden`` paths (the data directory) never reach the client,
    nor do tracebacks (:mod:`.status`)."""
    if isinstance(exc, flight.FlightError):
        return exc
    if isinstance(exc, FlightstoreError):
        message = status.client_message(str(exc), hidden)
        code = exc.flight_status
        if code in ("invalid_argument", "already_exists"):
            return status.InvalidArgument(message)
        if code == "not_found":
            return status.NotFound(message)
        if code == "unimplemented":
            return status.Unimplemented(message)
        if code == "unauthenticated":
            return flight.FlightUnauthenticatedError(message)
        if code == "unauthorized":
            return flight.FlightUnauthorizedError(message)
        if code == "cancelled":
            return flight.FlightCancelledError(message)
        if code == "deadline_exceeded":
            return flight.FlightTimedOutError(message)
        if code == "resource_exhausted":
            return flight.FlightInternalError(f"RESOURCE_EXHAUSTED: {message}")
        if code == "unavailable":
            return flight.FlightUnavailableError(message)
        if code == "data_loss":
            return flight.FlightInternalError(f"DATA_LOSS: {message}")
        status.log_failure(f"failure: {message}", exc, logging.WARNING)
        return flight.FlightInternalError(message)
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowTypeError)):
        return status.InvalidArgument(status.client_message(str(exc), hidden))
    if isinstance(exc, RecursionError):  # a statement or payload nested beyond what we walk
        return status.InvalidArgument("the request is nested too deeply (for instance a SELECT of many nested "
                               "subqueries); flatten it")
    return status.internal_error(exc)


def _rpc(method: Callable) -> Callable:
    """The wrapper of a Flight RPC handler. The calls whose handler does all their work
    (:data:`~.metrics.HANDLER_TIMED`: GetFlightInfo, DoPut, DoAction) are also timed and counted
    here, with the status the client gets, instead of by a metrics middleware instance."""
    timed = HANDLER_TIMED.get(method.__name__)

    @functools.wraps(method)
    def wrapper(self: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        caller = _CALLER.set(principal_of(context))
        token = CALLER_TOKEN.set(token_of(context))
        metrics = self.metrics if timed is not None and context is not None else None  # not in-process calls
        started = metrics.call_started(timed) if metrics is not None else 0.0
        error: BaseException | None = None
        try:
            return method(self, context, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error leaves through _translate
            error = _translate(exc, self._hidden_paths)
            raise error from None
        except BaseException as exc:
            error = exc
            raise
        finally:
            if metrics is not None:
                metrics.call_ended(timed, started, error)
            CALLER_TOKEN.reset(token)
            _CALLER.reset(caller)
    return wrapper


def _guarded(batches: Iterator[pa.RecordBatch | pa.Table],
             hidden: tuple[str, ...] = ()) -> Iterator[pa.RecordBatch | pa.Table]:
    """Translate errors raised while a stream is being produced."""
    try:
        yield from batches
    except Exception as exc:  # noqa: BLE001 - a client that stops reading closes us (GeneratorExit)
        raise _translate(exc, hidden) from None


def _in_call_context(batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """``batches`` pulled in the context of the call that created the stream. gRPC pulls a DoGet
    stream from its own threads after the call returned (and :func:`_rpc` reset the caller): its
    forwarded calls (a cluster scan or partial aggregate opened lazily) must still carry the
    caller's token (:data:`CALLER_TOKEN`), and checks see the caller, on every pull. Nothing is
    set in the pulling thread's own context, so no later call served by that thread inherits it."""
    return _pulled_in(contextvars.copy_context(), batches)  # captured now, not at the first pull


def _pulled_in(context: contextvars.Context, batches: Iterator[pa.Table]) -> Iterator[pa.Table]:
    try:
        while True:
            try:
                batch = context.run(next, batches)
            except StopIteration:
                return
            yield batch
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            context.run(close)


def _peer(context: flight.ServerCallContext | None) -> str:
    """The key of a call's session: its connection's gRPC peer address ("" in process)."""
    return context.peer() if context is not None else ""


class CallStop:
    """The stop flag of a streaming call (a subscription): set when the client cancels the call
    or the server stops; it raises when the caller may no longer receive the stream (``recheck``).
    Threads may outlive the call (a cluster subscription's source threads stop at their next batch
    or heartbeat), and the call's gRPC context is freed when it ends: asking it then crashed the
    server (SIGSEGV, found by the Jepsen-style test). :meth:`guard` marks the call ended when its
    stream closes; from then on the flag is set and the context is never touched again."""

    def __init__(self, context: flight.ServerCallContext, server_stop: threading.Event,
                 recheck: Any = None) -> None:
        self._context: flight.ServerCallContext | None = context
        self._server_stop = server_stop
        self._recheck = recheck  # a StreamRecheck: raises once the caller may no longer read
        self._lock = threading.Lock()

    def is_set(self) -> bool:
        with self._lock:  # finish() waits for a question in progress
            if self._context is None:
                return True
            if self._recheck is not None:
                self._recheck.check()
            return self._server_stop.is_set() or self._context.is_cancelled()

    def finish(self) -> None:
        with self._lock:
            self._context = None

    def guard(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches``, after which (or when the call is closed early) the flag is set for good."""
        try:
            yield from batches
        finally:
            self.finish()

