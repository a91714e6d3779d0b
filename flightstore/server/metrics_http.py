"""The HTTP endpoint of a server's Prometheus metrics: ``/metrics``, optionally over HTTPS and
behind HTTP Basic credentials.

The metrics name tables (and count refused logins), so a server with users does not serve them to
anyone: with ``metrics.auth`` ``basic`` (the default when the server has a users file) a scrape
must carry the Basic credentials of a user of the users file allowed DESCRIBE on the cluster
(checked through the same bounded password checks as Flight calls); a missing or wrong password
answers 401, a user without that grant 403, a busy login gate 503. With ``metrics.tls`` the
endpoint speaks HTTPS with the server's certificate (and requires a client certificate when the
server has a client CA).
"""

from __future__ import annotations

import base64
import binascii
import os
import socketserver
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from flightstore.errors import Unauthenticated, Unauthorized, Unavailable

__all__ = ["MetricsEndpoint", "basic_credentials", "ssl_context"]

_REALM = 'Basic realm="flightstore metrics", charset="UTF-8"'


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def ssl_context(cert: bytes, key: bytes, client_ca: bytes | None) -> ssl.SSLContext:
    """A server-side TLS context from PEM bytes (written to a private temporary directory only
    while they are loaded: ``ssl`` reads certificate chains from files)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="flightstore-tls-") as directory:
        cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        context.load_cert_chain(cert_path, key_path)
    if client_ca is not None:
        context.load_verify_locations(cadata=client_ca.decode("ascii"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def basic_credentials(header: str) -> tuple[str, str] | None:
    """``(user, password)`` of an HTTP Basic ``Authorization`` header; None for anything else."""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError, binascii.Error):
        return None
    return (user, password) if sep else None


class MetricsEndpoint:
    """Serves ``render()`` at ``/metrics`` in daemon threads.

    ``admit(user, password)`` (None: anyone may scrape) returns when the scrape may proceed and
    raises Unauthenticated, Unauthorized or Unavailable otherwise.
    """

    def __init__(self, render: Callable[[], bytes], *, admit: Callable[[str, str], None] | None = None,
                 tls: ssl.SSLContext | None = None, is_open: Callable[[], bool] | None = None) -> None:
        self.render = render
        self.admit = admit
        self.is_open = is_open or (lambda: False)  # a cluster without users yet: no credentials asked
        self.tls = tls
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        server = make_server(host, port, self._app, server_class=_Server, handler_class=_QuietHandler)
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="flightstore-metrics", daemon=True)
        self._thread.start()
        return server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)  # type: ignore[union-attr]
            self._server = self._thread = None

    def _app(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") not in ("/metrics", "/"):
            return _answer(start_response, "404 Not Found", b"only /metrics is served here\n")
        if self.admit is not None and not self.is_open():
            credentials = basic_credentials(environ.get("HTTP_AUTHORIZATION", ""))
            if credentials is None:
                return _answer(start_response, "401 Unauthorized", b"send Basic credentials\n",
                               [("WWW-Authenticate", _REALM)])
            try:
                self.admit(*credentials)
            except Unauthenticated as exc:
                return _answer(start_response, "401 Unauthorized", f"{exc}\n".encode(),
                               [("WWW-Authenticate", _REALM)])
            except Unauthorized as exc:
                return _answer(start_response, "403 Forbidden", f"{exc}\n".encode())
            except Unavailable as exc:
                return _answer(start_response, "503 Service Unavailable", f"{exc}\n".encode(),
                               [("Retry-After", "1")])
        return _answer(start_response, "200 OK", self.render(), [("Content-Type", CONTENT_TYPE_LATEST)])


def _answer(start_response: Callable, status: str, body: bytes,
            headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    headers = list(headers or [])
    if not any(name == "Content-Type" for name, _ in headers):
        headers.append(("Content-Type", "text/plain; charset=utf-8"))
    start_response(status, [*headers, ("Content-Length", str(len(body)))])
    return [body]
