"""DDL through the coordinator: a request/response protocol over znodes.

Why znodes rather than a Flight action to the coordinator: every server already holds a ZooKeeper
session, the coordinator may change at any moment, and the answer must be exactly-once. A request
is a persistent sequential znode ``ddl/requests/r-<seq>`` (JSON: ``op`` and its arguments, the
requester's server id). The coordinator takes requests in sequence order and answers each in ONE
ZooKeeper transaction that

1. checks the coordinator epoch znode's version (a deposed coordinator's commit fails: fencing),
2. applies the catalog change (database/table znodes, the bucket assignment),
3. bumps ``metadata/version`` (every server's cache re-reads the catalog on that watch),
4. creates the response ``ddl/responses/r-<seq>`` and deletes the request.

So a request is either pending (no answer yet; a newly elected coordinator picks it up) or answered
with its change committed; never half. A requester that gives up (``cluster.ddl-timeout``) deletes
its request: if the delete succeeds nothing was or will be changed (the coordinator's transaction
would fail on the missing request) and the caller gets :class:`CoordinatorUnavailable`; if the
request is already gone, the answer is there to read. The requester deletes the answer it read.

Operations: ``create_database``, ``drop_database``, ``create_table``, ``drop_table`` with the
arguments of the :class:`~flightstore.store.Store` methods of the same name (a table travels as its
descriptor's JSON, validated by the requester before it is sent and again by the coordinator).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from flightstore import errors
from flightstore.cluster.layout import ZkPaths, decode, encode
from flightstore.errors import CoordinatorUnavailable, FlightstoreError

__all__ = ["OPERATIONS", "DdlClient", "error_response", "raise_for_error"]

OPERATIONS = ("create_database", "drop_database", "create_table", "drop_table")
_ZK_ERRORS = (KazooException, KazooTimeoutError)


def error_response(exc: FlightstoreError, version: int) -> dict[str, Any]:
    """The answer to a refused request: the error's class name travels, so the requester raises
    the same class (and the client sees the same Flight status) as on a single server."""
    return {"ok": False, "version": version, "error": type(exc).__name__, "message": str(exc)}


def raise_for_error(response: dict[str, Any]) -> None:
    """Raise the error an answer carries (nothing for a success)."""
    if response.get("ok"):
        return
    cls = getattr(errors, str(response.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, FlightstoreError)):
        cls = FlightstoreError
    raise cls(response.get("message", "DDL failed"))


class DdlClient:
    """Submits DDL requests for server ``requester`` and waits for the coordinator's answer."""

    def __init__(self, client: KazooClient, paths: ZkPaths, requester: int) -> None:
        self._client = client
        self._paths = paths
        self._requester = requester

    def submit(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``request`` (``op`` + arguments); return the successful answer (with the catalog
        ``version`` that holds the change), raise the refusal's error, or
        :class:`CoordinatorUnavailable` when no coordinator answered in ``timeout_s`` (then nothing
        was changed)."""
        if request.get("op") not in OPERATIONS:
            raise errors.InvalidInput(f"unknown DDL operation {request.get('op')!r}")
        body = encode({**request, "requester": self._requester, "request_id": uuid.uuid4().hex})
        try:
            path = self._client.create(f"{self._paths.requests}/r-", body, sequence=True)
        except ConnectionLoss:
            raise CoordinatorUnavailable(
                f"lost ZooKeeper while submitting {request['op']}; it may or may not be applied: "
                "check the catalog before retrying") from None
        except _ZK_ERRORS as exc:
            raise CoordinatorUnavailable(f"cannot reach ZooKeeper to submit {request['op']} "
                                         f"({type(exc).__name__}); nothing was changed") from None
        try:
            response = self._await(path, request["op"], timeout_s)
        except _ZK_ERRORS as exc:
            raise CoordinatorUnavailable(
                f"lost ZooKeeper while waiting for {request['op']} ({type(exc).__name__}); it may or "
                "may not be applied: check the catalog before retrying") from None
        raise_for_error(response)
        return response

    def _await(self, path: str, op: str, timeout_s: float) -> dict[str, Any]:
        name = path.rsplit("/", 1)[1]
        answer = self._paths.response(name)
        arrived = threading.Event()

        def watch(event: object) -> None:
            arrived.set()

        deadline = time.monotonic() + timeout_s
        while self._client.exists(answer, watch=watch) is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                try:
                    self._client.delete(path)
                except NoNodeError:
                    continue  # the coordinator took it: its answer was committed with the deletion
                raise CoordinatorUnavailable(
                    f"no coordinator answered {op} within {timeout_s:g} s (is a majority of "
                    "ZooKeeper up, and any flightstore server alive?); nothing was changed")
            arrived.wait(remaining)
            arrived.clear()
        data, _ = self._client.get(answer)
        try:
            self._client.delete(answer)
        except NoNodeError:
            pass
        return decode(data)
