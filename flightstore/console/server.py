"""The console's HTTP endpoint: static pages, the JSON API under ``/api/``, and who is asking.

Served by the standard library's ``ThreadingHTTPServer`` on daemon threads of the Flight server's
process (as the metrics endpoint is), over HTTPS when the server has a TLS certificate. Pages are
plain HTML and JavaScript shipped in the package (``static/``); they fetch ``/api/...``.

Authentication (when the server has users): a session cookie from ``POST /api/login`` (HttpOnly,
SameSite=Strict, Secure over HTTPS) or HTTP Basic credentials on every request. A request with
neither answers 401 (pages redirect to ``/login``). A POST authenticated by its cookie must carry
the ``X-Flightstore-Console`` header, which no other site's page can add without the console
agreeing (cross-site request forgery). Authorization is the server's (:mod:`.views`).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import urllib.parse
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from flightstore.config import server_option
from flightstore.console.rates import RateRing
from flightstore.console.sessions import COOKIE, Sessions, basic_credentials
from flightstore.console.views import ConsoleViews
from flightstore.errors import (
    FlightstoreError,
    InvalidInput,
    NotFound,
    Unauthenticated,
    Unauthorized,
    Unavailable,
    Unsupported,
)
from flightstore.server.rpc import _CALLER

__all__ = ["Console"]

_log = logging.getLogger("flightstore.console")
CSRF_HEADER = "X-Flightstore-Console"
MAX_BODY = 64 * 1024
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_PAGES = {"/": "index.html", "/index.html": "index.html", "/login": "login.html"}
_SECURITY_HEADERS = (("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
                     ("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
                     ("Cache-Control", "no-store"))
_STATUS = ((Unauthenticated, HTTPStatus.UNAUTHORIZED), (Unauthorized, HTTPStatus.FORBIDDEN),
           (NotFound, HTTPStatus.NOT_FOUND), (InvalidInput, HTTPStatus.BAD_REQUEST),
           (Unavailable, HTTPStatus.SERVICE_UNAVAILABLE), (Unsupported, HTTPStatus.NOT_IMPLEMENTED))


def _static_files() -> dict[str, bytes]:
    """The pages, scripts and styles shipped in ``static/`` (read once: they are small)."""
    folder = resources.files("flightstore.console") / "static"
    return {entry.name: entry.read_bytes() for entry in folder.iterdir()
            if entry.name[entry.name.rfind("."):] in _STATIC_TYPES}


class Console:
    """The web console of one :class:`~flightstore.server.service.FlightSqlServer`.

    ``sample_interval_s``: how often the rate plots sample the server's metrics (one hour kept).
    """

    def __init__(self, server: Any, *, sample_interval_s: float = 10.0) -> None:
        self.server = server
        self.views = ConsoleViews(server)
        self.rates = RateRing(server.metrics, interval_s=sample_interval_s)
        options = server.store.options
        self.sessions = None if server.authenticator is None else Sessions(
            server.authenticator, ttl_s=server_option(options, "auth.token-ttl") / 1000,
            max_sessions=server_option(options, "auth.max-tokens"))
        self.static = _static_files()
        self.tls: ssl.SSLContext | None = None
        if server.tls is not None:
            from flightstore.server.metrics_http import ssl_context
            self.tls = ssl_context(server.tls.cert, server.tls.key, server.tls.client_ca)
        self._http: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def open(self) -> bool:
        """Whether the console admits anyone (the server authenticates no one)."""
        return self.sessions is None or bool(getattr(self.server.authenticator.users, "is_open", False))

    def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port) and start sampling; returns the port."""
        console = self

        class Handler(_Handler):
            pass
        Handler.console = console
        http = ThreadingHTTPServer((host, port), Handler)
        http.daemon_threads = True
        if self.tls is not None:
            http.socket = self.tls.wrap_socket(http.socket, server_side=True)
        self._http = http
        self.rates.start()
        self._thread = threading.Thread(target=http.serve_forever, name="flightstore-console", daemon=True)
        self._thread.start()
        return http.server_port

    def close(self) -> None:
        self.rates.stop()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._thread.join(timeout=10)  # type: ignore[union-attr]
            self._http = self._thread = None

    # ---- the API -----------------------------------------------------------------------------
    def api(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> Any:
        """The answer of one API call, for the caller ``_CALLER`` holds."""
        views = self.views
        if method == "GET":
            if path == "/api/whoami":
                return {"user": _CALLER.get(), "super": views.is_super(), "auth": not self.open}
            if path == "/api/tables":
                return views.tables()
            if path == "/api/table":
                return views.table(query.get("name", ""))
            if path == "/api/lake":
                return views.lake()
            if path == "/api/cluster":
                return views.cluster()
            if path == "/api/rates":
                views.require_cluster()
                return self.rates.series()
            if path == "/api/queries":
                return views.queries()
        elif method == "POST" and path == "/api/queries/cancel":
            try:
                number = int(body.get("number"))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise InvalidInput("send the query's number as {\"number\": N}") from None
            return views.cancel(number)
        raise NotFound(f"no console API {method} {path}")


class _Handler(BaseHTTPRequestHandler):
    console: Console
    server_version = "flightstore-console"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    # ---- answers ------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str, headers: tuple = ()) -> None:
        self.send_response(status)
        for name, value in (*_SECURITY_HEADERS, ("Content-Type", content_type),
                            ("Content-Length", str(len(body))), *headers):
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: Any, headers: tuple = ()) -> None:
        self._send(status, json.dumps(value, default=str).encode(), "application/json", headers)

    def _error(self, exc: BaseException) -> None:
        status = next((code for kind, code in _STATUS if isinstance(exc, kind)), HTTPStatus.INTERNAL_SERVER_ERROR)
        headers: tuple = ()
        if status == HTTPStatus.UNAUTHORIZED and CSRF_HEADER.lower() not in {k.lower() for k in self.headers}:
            headers = (("WWW-Authenticate", 'Basic realm="flightstore console", charset="UTF-8"'),)
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            headers = (("Retry-After", "1"),)
        if status == HTTPStatus.INTERNAL_SERVER_ERROR and not isinstance(exc, FlightstoreError):
            _log.warning("console: %s %s failed", self.command, self.path, exc_info=exc)
            message = "internal error (see the server's log)"
        else:
            message = str(exc)
        self._json(status, {"error": message}, headers)

    # ---- who is asking -----------------------------------------------------------------------
    def _session_token(self) -> str | None:
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = cookie.get(COOKIE)
        return morsel.value if morsel is not None else None

    def _caller(self) -> tuple[str | None, bool]:
        """The authenticated user (None: the console is open) and whether a cookie said so;
        Unauthenticated / Unavailable otherwise."""
        console = self.console
        if console.open:
            return None, False
        credentials = basic_credentials(self.headers.get("Authorization", ""))
        if credentials is not None:
            console.sessions.check(*credentials)  # type: ignore[union-attr]
            return credentials[0], False
        token = self._session_token()
        if token is None:
            raise Unauthenticated("log in (POST /api/login) or send HTTP Basic credentials")
        return console.sessions.user(token), True  # type: ignore[union-attr]

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise InvalidInput(f"the request body is over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        kind = self.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            if kind == "application/x-www-form-urlencoded":
                return dict(urllib.parse.parse_qsl(raw.decode("utf-8")))
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise InvalidInput("the request body is not valid JSON") from None
        if not isinstance(value, dict):
            raise InvalidInput("the request body must be a JSON object")
        return value

    # ---- methods -----------------------------------------------------------------------------
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        if url.path.startswith("/static/"):
            name = url.path[len("/static/"):]
            data = self.console.static.get(name)
            if data is None:
                return self._json(HTTPStatus.NOT_FOUND, {"error": "no such file"})
            return self._send(HTTPStatus.OK, data, _STATIC_TYPES.get(name[name.rfind("."):], "text/plain"))
        if url.path in _PAGES:
            if url.path != "/login":
                try:
                    self._caller()
                except Unauthenticated:
                    return self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", (("Location", "/login"),))
                except FlightstoreError as exc:
                    return self._error(exc)
            return self._send(HTTPStatus.OK, self.console.static[_PAGES[url.path]], _STATIC_TYPES[".html"])
        self._call("GET", url)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        url = urllib.parse.urlsplit(self.path)
        try:
            body = self._body()
        except FlightstoreError as exc:
            self.close_connection = True
            return self._error(exc)
        if url.path == "/api/login":
            return self._login(body)
        if url.path == "/api/logout":
            token = self._session_token()
            if token is not None and self.console.sessions is not None:
                self.console.sessions.logout(token)
            return self._json(HTTPStatus.OK, {"logged_out": True}, (("Set-Cookie", self._cookie("", 0)),))
        self._call("POST", url, body)

    def _call(self, method: str, url: urllib.parse.SplitResult, body: dict | None = None) -> None:
        if not url.path.startswith("/api/"):
            return self._json(HTTPStatus.NOT_FOUND, {"error": f"nothing at {url.path}"})
        try:
            user, by_cookie = self._caller()
            if method == "POST" and by_cookie and self.headers.get(CSRF_HEADER) is None:
                raise Unauthorized(f"a POST from a session must carry the {CSRF_HEADER} header")
            query = dict(urllib.parse.parse_qsl(url.query))
            reset = _CALLER.set(user)
            try:
                answer = self.console.api(method, url.path, query, body or {})
            finally:
                _CALLER.reset(reset)
        except Exception as exc:  # noqa: BLE001 - every failure answers one JSON error
            return self._error(exc)
        self._json(HTTPStatus.OK, answer)

    def _cookie(self, token: str, max_age: int) -> str:
        secure = "; Secure" if self.console.tls is not None else ""
        return f"{COOKIE}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}"

    def _login(self, body: dict[str, Any]) -> None:
        sessions = self.console.sessions
        if self.console.open or sessions is None:
            return self._json(HTTPStatus.OK, {"user": None, "auth": False})
        user, password = body.get("user"), body.get("password")
        if not isinstance(user, str) or not isinstance(password, str):
            return self._error(InvalidInput("send {\"user\": ..., \"password\": ...}"))
        try:
            token = sessions.login(user, password)
        except FlightstoreError as exc:
            return self._error(exc)
        self._json(HTTPStatus.OK, {"user": user, "auth": True},
                   (("Set-Cookie", self._cookie(token, int(sessions.ttl_s))),))
