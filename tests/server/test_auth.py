"""Authentication: users of a file of Argon2id hashes, Basic credentials in, bearer tokens back;
tokens expire and are bounded; wrong or missing credentials are refused; non-ASCII passwords work."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import threading

import pytest
from adbc_driver_flightsql import dbapi
from pyarrow import flight

import flightstore
from flightstore.server.service import FlightSqlServer
from flightstore.server.users import UserStore
from flightstore.store import Store

NON_ASCII = "pässwörd-密码"


class Clock:
    """A clock the test moves by hand (token expiry without waiting)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _start(store: Store, **kwargs) -> tuple[FlightSqlServer, threading.Thread]:
    server = FlightSqlServer(store, **kwargs)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def secured(tmp_path):
    store = Store(tmp_path / "data")
    server, thread = _start(store, users={"alice": "s3cret", "bob": NON_ASCII}, super_users=("alice", "bob"))
    yield server
    server.shutdown()
    thread.join(timeout=10)
    store.close()


def _raw_client(server: FlightSqlServer) -> flight.FlightClient:
    return flight.FlightClient(server.uri)


def _list_actions(client: flight.FlightClient, header: tuple[bytes, bytes] | None) -> list:
    options = flight.FlightCallOptions(timeout=30, headers=[header] if header else [])
    return list(client.list_actions(options))


def test_basic_auth_python_client_and_adbc(secured):
    with flightstore.connect(secured.uri, username="alice", password="s3cret", timeout=30) as conn:
        conn.sql("CREATE TABLE t (a BIGINT)")
        conn.sql("INSERT INTO t VALUES (1)")
    with dbapi.connect(secured.uri, db_kwargs={"username": "alice", "password": "s3cret"},
                       autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM t")
        assert cur.fetchall() == [(1,)]


def test_wrong_or_missing_credentials_are_refused(secured):
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong username or password"):
        flightstore.connect(secured.uri, username="alice", password="wrong", timeout=30)
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong username or password"):
        flightstore.connect(secured.uri, username="nobody", password="s3cret", timeout=30)
    with flightstore.connect(secured.uri, timeout=30) as anonymous, \
            pytest.raises(flight.FlightUnauthenticatedError, match="authentication required"):
        anonymous.sql("SELECT 1")
    client = _raw_client(secured)
    with pytest.raises(flight.FlightUnauthenticatedError, match="invalid or expired token"):
        _list_actions(client, (b"authorization", b"Bearer made-up"))
    with pytest.raises(flight.FlightUnauthenticatedError, match="malformed"):
        _list_actions(client, (b"authorization", b"Basic %%%"))


def test_non_ascii_password_python_client_and_adbc(secured):
    """Defect 10: a non-ASCII password made every call fail with a TypeError from
    hmac.compare_digest; and ADBC sends base64 without padding, which was refused as malformed."""
    with flightstore.connect(secured.uri, username="bob", password=NON_ASCII, timeout=30) as conn:
        assert conn.sql("SELECT 1 AS one").column("one").to_pylist() == [1]
    with dbapi.connect(secured.uri, db_kwargs={"username": "bob", "password": NON_ASCII},
                       autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SELECT 2 AS two")
        assert cur.fetchall() == [(2,)]
    with pytest.raises(flight.FlightUnauthenticatedError, match="wrong username or password"):
        flightstore.connect(secured.uri, username="bob", password=NON_ASCII[:-1], timeout=30)


def test_tokens_expire_and_the_client_authenticates_again(tmp_path):
    store = Store(tmp_path / "data")
    server, thread = _start(store, users={"alice": "s3cret"}, super_users=("alice",), token_ttl_ms=60_000)
    clock = server.authenticator.clock = Clock()
    try:
        client = _raw_client(server)
        header = client.authenticate_basic_token("alice", "s3cret", flight.FlightCallOptions(timeout=30))
        assert _list_actions(client, header)
        with flightstore.connect(server.uri, username="alice", password="s3cret", timeout=30) as conn:
            clock.now += 59
            assert _list_actions(client, header)            # still within its 60 s
            clock.now += 2
            with pytest.raises(flight.FlightUnauthenticatedError, match="expired"):
                _list_actions(client, header)
            # The Python client's token expired too: it authenticates again and the call succeeds.
            assert conn.sql("SELECT 1 AS one").num_rows == 1
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def test_tokens_are_bounded(tmp_path):
    """Defect 11: one token was minted per Basic call and kept forever."""
    store = Store(tmp_path / "data")
    server, thread = _start(store, users={"alice": "s3cret"}, max_tokens=3)
    try:
        client = _raw_client(server)
        options = flight.FlightCallOptions(timeout=30)
        headers = [client.authenticate_basic_token("alice", "s3cret", options) for _ in range(10)]
        assert server.authenticator.live_tokens() == 3
        assert _list_actions(client, headers[-1])
        with pytest.raises(flight.FlightUnauthenticatedError):
            _list_actions(client, headers[0])                # the oldest were forgotten
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def _cli(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightstore", *args], input=stdin, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})}, check=False)


def test_user_cli_writes_salted_hashes_only(tmp_path):
    users_file = tmp_path / "users.json"
    done = _cli("user", "add", "alice", "--users-file", str(users_file), "--password-stdin",
                stdin=NON_ASCII + "\n")
    assert done.returncode == 0, done.stderr
    done = _cli("user", "add", "carol", "--users-file", str(users_file), env={"FLIGHTSTORE_PASSWORD": "pw-2"})
    assert done.returncode == 0, done.stderr
    text = users_file.read_text()
    assert NON_ASCII not in text and "pw-2" not in text
    hashes = json.loads(text)["users"]
    assert sorted(hashes) == ["alice", "carol"]
    assert all(h.startswith("$argon2id$") for h in hashes.values())
    assert hashes["alice"] != hashes["carol"]
    assert stat.S_IMODE(users_file.stat().st_mode) == 0o600
    # Adding an existing user needs --replace; removing an unknown one fails; nothing changes.
    assert _cli("user", "add", "alice", "--users-file", str(users_file), stdin="x\n").returncode != 0
    assert _cli("user", "remove", "zed", "--users-file", str(users_file)).returncode != 0
    assert json.loads(users_file.read_text())["users"] == hashes
    assert _cli("user", "list", "--users-file", str(users_file)).stdout.split() == ["alice", "carol"]
    users = UserStore.open(users_file)
    assert users.verify("alice", NON_ASCII) and not users.verify("alice", "pw-2")
    assert _cli("user", "remove", "carol", "--users-file", str(users_file)).returncode == 0
    assert UserStore.open(users_file).names() == ["alice"]
    # The option that put passwords on the command line is gone.
    assert _cli("serve", "--user", "alice:s3cret", "--data-dir", str(tmp_path / "d")).returncode == 2


def test_users_file_changes_reach_a_running_server(tmp_path):
    users_file = tmp_path / "users.json"
    UserStore.open(users_file, create=True).add("alice", "s3cret")
    store = Store(tmp_path / "data")
    server, thread = _start(store, users=UserStore.open(users_file), super_users=("alice", "dave"))
    try:
        with flightstore.connect(server.uri, username="alice", password="s3cret", timeout=30) as conn:
            assert conn.sql("SELECT 1 AS one").num_rows == 1
            # A user added while the server runs can log in; a removed user's token stops working.
            assert _cli("user", "add", "dave", "--users-file", str(users_file), stdin="d4ve\n").returncode == 0
            with flightstore.connect(server.uri, username="dave", password="d4ve", timeout=30) as dave:
                assert dave.sql("SELECT 1 AS one").num_rows == 1
            assert _cli("user", "remove", "alice", "--users-file", str(users_file)).returncode == 0
            with pytest.raises(flight.FlightUnauthenticatedError):
                conn.sql("SELECT 1 AS one")   # its token is refused, and so is logging in again
        with pytest.raises(flight.FlightUnauthenticatedError):
            flightstore.connect(server.uri, username="alice", password="s3cret", timeout=30)
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def test_removed_user_token_is_refused(tmp_path):
    users_file = tmp_path / "users.json"
    users = UserStore.open(users_file, create=True)
    users.add("erin", "s3cret")
    store = Store(tmp_path / "data")
    server, thread = _start(store, users=UserStore.open(users_file))
    try:
        client = _raw_client(server)
        header = client.authenticate_basic_token("erin", "s3cret", flight.FlightCallOptions(timeout=30))
        assert _list_actions(client, header)
        users.remove("erin")
        with pytest.raises(flight.FlightUnauthenticatedError, match="no longer exists"):
            _list_actions(client, header)
    finally:
        server.shutdown()
        thread.join(timeout=10)
        store.close()


def test_basic_header_carries_utf8():
    """The wire form the server decodes: base64 of UTF-8 ``user:password``, padded or not."""
    encoded = base64.b64encode(f"bob:{NON_ASCII}".encode()).decode().rstrip("=")
    from flightstore.server.auth import BasicAuthMiddlewareFactory
    factory = BasicAuthMiddlewareFactory(UserStore.from_passwords({"bob": NON_ASCII}))
    assert factory._authenticate({"authorization": [f"Basic {encoded}"]}).user == "bob"


def test_serve_and_sql_cli_with_a_users_file(tmp_path):
    users_file = tmp_path / "users.json"
    assert _cli("user", "add", "admin", "--users-file", str(users_file), stdin="adm1n\n").returncode == 0
    assert _cli("user", "add", "bob", "--users-file", str(users_file), stdin=NON_ASCII + "\n").returncode == 0
    server = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"),
                               "--port", "0", "--users-file", str(users_file), "--super-user", "admin"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        uri = server.stdout.readline().split(" at ", 1)[1].strip()
        done = _cli("sql", "--uri", uri, "--user", "admin", "CREATE TABLE t (id BIGINT)", "SELECT 6 * 7 AS x",
                    env={"FLIGHTSTORE_PASSWORD": "adm1n"})
        assert done.returncode == 0, done.stderr
        assert "42" in done.stdout
        denied = _cli("sql", "--uri", uri, "--user", "bob", "SELECT * FROM t", stdin=NON_ASCII + "\n")
        # bob holds no grant: the table does not exist for him (as an absent one)
        assert denied.returncode == 1 and "table 't' does not exist" in denied.stderr
        wrong = _cli("sql", "--uri", uri, "--user", "bob", "SELECT 1", env={"FLIGHTSTORE_PASSWORD": "nope"})
        assert wrong.returncode == 1 and "wrong username or password" in wrong.stderr
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_security_options_given_as_option_are_honoured(tmp_path):
    """`serve -o auth.users-file=... -o authorizer.super-users=...` secures the server exactly as
    the flags do (an accepted option is never ignored: an open server would be the result)."""
    users_file = tmp_path / "users.json"
    assert _cli("user", "add", "admin", "--users-file", str(users_file), stdin="adm1n\n").returncode == 0
    server = subprocess.Popen([sys.executable, "-m", "flightstore", "serve", "--data-dir", str(tmp_path / "data"),
                               "--port", "0", "-o", f"auth.users-file={users_file}",
                               "-o", "authorizer.super-users=admin", "-o", "auth.token-ttl=5s"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        uri = server.stdout.readline().split(" at ", 1)[1].strip()
        with flightstore.connect(uri, timeout=30) as anonymous, \
                pytest.raises(flight.FlightUnauthenticatedError, match="authentication required"):
            anonymous.sql("SELECT 1")
        with flightstore.connect(uri, username="admin", password="adm1n", timeout=30) as admin:
            admin.sql("CREATE TABLE t (id BIGINT)")  # a super user
    finally:
        server.terminate()
        server.wait(timeout=60)
