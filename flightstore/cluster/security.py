"""One set of security rules across a cluster: users, grants and the signing secret in ZooKeeper.

As Fluss keeps its ACLs in ZooKeeper, a cluster keeps

* its **users** in ``<root>/security/users`` (``{"users": {name: Argon2id PHC hash}}``: no
  password, the hashes of :mod:`flightstore.server.users`; a token carries the fingerprint of the
  hash it was minted under, so a new password or a removed user ends it on every server);
* its **grants** in ``<root>/security/grants`` (``{"grants": [Grant JSON...]}``).

Each is one znode changed by compare-and-set on its version. Every server caches both
(:class:`ClusterSecurity`, kazoo data watches, which survive a lost session) and publishes in its
registration the versions it applied; a change made through any server (GRANT, REVOKE, adding or
removing a user) or with ``flightstore user --zookeeper`` returns once every live server applied
it (:func:`wait_applied`), so the next call anywhere sees it. The cluster authenticates as soon
as the users znode exists (the first user added, or the first server started with
``--users-file``, whose users seed it); before that it is open, as a single server without users.

**The signing secret** (bearer tokens, peer credentials) is never stored. It is derived on each
server from ``cluster.secret-file`` (``--cluster-secret-file``, the same random bytes on every
server) and the cluster's ZooKeeper root: ``HMAC-SHA256(file bytes, "flightstore-secret:" + root)``
(the same file gives two clusters two secrets).
ZooKeeper keeps only a verifier (an HMAC of the secret), so a server started with another file
is refused instead of minting tokens nobody accepts, and whoever reads ZooKeeper (its data
directory, a backup, a client without ACLs) learns nothing that mints a token. A digest ACL on
a znode would still keep the secret in ZooKeeper's snapshots and transaction logs in plaintext,
and its password would be a secret to distribute anyway; a file distributed like the TLS keys
is the same work and stores nothing. A cluster without a secret file keeps a random secret in
``<root>/secret`` as before (anyone who can read ZooKeeper can then mint tokens): allowed only
while the cluster has no users; a cluster with users refuses servers without the file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from flightstore.acl import Grant
from flightstore.cluster.layout import ZkAddress, ZkPaths, decode, encode
from flightstore.errors import InvalidInput, NotFound, Unavailable
from flightstore.server.users import _DEFAULT, UserStore, _check_password, check_user_name

__all__ = ["ClusterGrants", "ClusterSecurity", "ClusterUsers", "cluster_secret", "wait_applied",
           "zookeeper_users"]

log = logging.getLogger("flightstore.cluster")

MIN_SECRET_FILE_BYTES = 32
APPLY_TIMEOUT_S = 30.0
KINDS = ("users", "grants")


# ---- the signing secret ------------------------------------------------------------------------
def _derive(key: bytes, root: str) -> bytes:
    return hmac.new(key, b"flightstore-secret:" + root.encode(), hashlib.sha256).digest()


def _verifier(secret: bytes) -> str:
    return hmac.new(secret, b"flightstore-verifier", hashlib.sha256).hexdigest()


def read_secret_file(path: str | Path) -> bytes:
    """The bytes of a cluster secret file; InvalidInput when it is missing or too short."""
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read the cluster secret file {path}: {exc.strerror}") from None
    if len(key.strip()) < MIN_SECRET_FILE_BYTES:
        raise InvalidInput(f"the cluster secret file {path} holds {len(key.strip())} bytes; it needs at least "
                           f"{MIN_SECRET_FILE_BYTES} random bytes (e.g. `head -c 32 /dev/urandom | base64 > FILE`)")
    return key.strip()


def cluster_secret(client: KazooClient, paths: ZkPaths, key: bytes | None) -> bytes:
    """The secret that signs this cluster's tokens and peer credentials (see the module
    docstring): derived from ``key`` (the secret file's bytes), checked against the verifier in
    ZooKeeper (written by the first server with a file); without ``key``, the random secret kept
    in ZooKeeper. InvalidInput when this server's file is not the cluster's, or the cluster
    derives its secret and this server has no file."""
    if key is not None:
        secret = _derive(key, paths.root)
        wanted = {"verifier": _verifier(secret)}
        while True:
            try:
                data, stat = client.get(paths.secret)
            except NoNodeError:
                try:
                    client.create(paths.secret, encode(wanted))
                    return secret
                except NodeExistsError:
                    continue
            found = decode(data)
            if "verifier" not in found:  # a keyless cluster's plaintext secret: replace it
                try:
                    client.set(paths.secret, encode(wanted), version=stat.version)
                except BadVersionError:
                    continue
                log.warning("the cluster's signing secret was kept in ZooKeeper; it is now derived from the "
                            "cluster secret file: restart every server with --cluster-secret-file")
                return secret
            if not hmac.compare_digest(found["verifier"], wanted["verifier"]):
                raise InvalidInput("this server's --cluster-secret-file is not the one the cluster's servers use; "
                                   "give every server the same file")
            return secret
    try:
        client.create(paths.secret, encode({"secret": secrets.token_hex(32)}))
    except NodeExistsError:
        pass
    found = decode(client.get(paths.secret)[0])
    if "secret" not in found:
        raise InvalidInput("this cluster derives its signing secret from a cluster secret file; start this "
                           "server with --cluster-secret-file (the same file as the others)")
    return bytes.fromhex(found["secret"])


# ---- the cache of users and grants -------------------------------------------------------------
class ClusterSecurity:
    """The cluster's users and grants as this server sees them (watched znodes), and
    compare-and-set changes to them. ``on_applied()`` is called after each new version is cached
    (the member then publishes :attr:`versions` in its registration)."""

    def __init__(self, client: KazooClient, paths: ZkPaths, keyed: bool = False) -> None:
        self.client = client
        self.paths = paths
        self.keyed = keyed  # the signing secret is derived from a secret file (else: no users allowed)
        self.on_applied: Callable[[], None] | None = None
        self.on_change: list[Callable[[], None]] = []  # e.g. streams re-check at once
        self._cond = threading.Condition()
        self._users: dict[str, str] | None = None
        self._grants: frozenset[Grant] = frozenset()
        self._versions = {kind: -1 for kind in KINDS}
        self._loaded = {kind: False for kind in KINDS}
        self._watches: list[Any] = []

    def start(self, timeout: float = 30.0) -> None:
        """Follow both znodes; returns once both were read (Unavailable after ``timeout``)."""
        self.client.ensure_path(self.paths.security)
        for kind in KINDS:
            self._watches.append(self.client.DataWatch(self._path(kind), self._watcher(kind)))
        with self._cond:
            if not self._cond.wait_for(lambda: all(self._loaded.values()), timeout):
                raise Unavailable("could not read the cluster's users and grants from ZooKeeper in time")

    def _path(self, kind: str) -> str:
        return self.paths.users if kind == "users" else self.paths.grants

    def _watcher(self, kind: str) -> Callable:
        def changed(data: bytes | None, stat: Any) -> None:
            try:
                value = decode(data) if data else None
                if kind == "users":
                    users = None if value is None else {str(k): str(v) for k, v in value.get("users", {}).items()}
                else:
                    grants = frozenset(Grant.from_json(g) for g in (value or {}).get("grants", []))
            except (ValueError, KeyError, TypeError, InvalidInput) as exc:
                log.error("the cluster's %s in ZooKeeper do not read (%s); keeping the previous ones", kind, exc)
                return
            with self._cond:
                if kind == "users":
                    self._users = users
                else:
                    self._grants = grants
                self._versions[kind] = stat.version if stat is not None else -1
                self._loaded[kind] = True
                self._cond.notify_all()
            for callback in [self.on_applied, *self.on_change]:
                if callback is not None:
                    try:
                        callback()
                    except Exception:  # noqa: BLE001 - a listener's failure is its own
                        log.exception("a security listener failed")
        return changed

    # ---- what this server applied -------------------------------------------------------------
    @property
    def versions(self) -> dict[str, int]:
        """The znode version of users and grants this server applied (-1: absent)."""
        with self._cond:
            return dict(self._versions)

    def users(self) -> dict[str, str] | None:
        """User name -> password hash; None while the cluster has no users (it is open)."""
        with self._cond:
            return self._users

    def grants(self) -> frozenset[Grant]:
        with self._cond:
            return self._grants

    def wait_version(self, kind: str, version: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._versions[kind] >= version, timeout)

    # ---- changes ------------------------------------------------------------------------------
    def update(self, kind: str, change: Callable[[Any], Any]) -> tuple[int, Any]:
        """Apply ``change`` (current value -> new value, or None for no change) by
        compare-and-set; returns (new znode version, change's result). The users' current value
        is None when the cluster has none (the znode is then created)."""
        if kind == "users" and not self.keyed:
            raise InvalidInput("a cluster with users signs their tokens with a secret derived from "
                               "--cluster-secret-file; start every server with one before adding users")
        path = self._path(kind)
        while True:
            try:
                data, stat = self.client.get(path)
                current = decode(data).get(kind, {} if kind == "users" else [])
            except NoNodeError:
                stat, current = None, (None if kind == "users" else [])
            updated = change(current)
            if updated is None:
                return (stat.version if stat is not None else -1), None
            body = encode({kind: updated})
            try:
                if stat is None:
                    self.client.create(path, body)
                    return 0, updated
                return self.client.set(path, body, version=stat.version).version, updated
            except (BadVersionError, NodeExistsError):
                continue  # another server changed it meanwhile: read again


    def seed_users(self, users: UserStore) -> None:
        """Make ``users`` (a server's ``--users-file``) the cluster's users when it has none yet;
        otherwise the cluster's stay (a server restarted with an old file must not bring back a
        removed user or an old password), and the users of the file the cluster lacks are named
        in the log."""
        hashes = {name: users._hashes[name] for name in users.names()}

        def seeded(current: Mapping[str, str] | None) -> dict[str, str] | None:
            return dict(hashes) if current is None else None

        version, created = self.update("users", seeded)
        if created is not None:
            log.warning("the cluster had no users: %d user(s) of %s are now the cluster's", len(hashes), users.path)
            self.wait_version("users", version, APPLY_TIMEOUT_S)
            return
        missing = sorted(set(hashes) - set(self.users() or {}))
        log.warning("the cluster's users are kept in ZooKeeper; %s is not read again%s", users.path,
                    f" (its users {', '.join(missing)} are not the cluster's: add them with `flightstore user add "
                    "--zookeeper`)" if missing else "")


def wait_applied(client: KazooClient, paths: ZkPaths, kind: str, version: int,
                 timeout: float = APPLY_TIMEOUT_S) -> list[int]:
    """Wait until every live server published ``kind`` at ``version`` or later in its
    registration; the ids of the servers still behind after ``timeout`` (empty: all applied)."""
    deadline = time.monotonic() + timeout
    changed = threading.Event()
    while True:
        changed.clear()
        behind = []
        for name in client.get_children(paths.servers, watch=lambda _: changed.set()):
            try:
                data, _ = client.get(f"{paths.servers}/{name}", watch=lambda _: changed.set())
            except NoNodeError:
                continue
            if int(decode(data).get("security", {}).get(kind, -1)) < version:
                behind.append(int(name))
        remaining = deadline - time.monotonic()
        if not behind or remaining <= 0:
            return sorted(behind)
        changed.wait(min(remaining, 1.0))


# ---- the server's users and grants in cluster mode ---------------------------------------------
class ClusterUsers(UserStore):
    """The cluster's users (a :class:`UserStore` over :class:`ClusterSecurity`): until the server
    joined, every check fails closed (Unavailable); while the cluster has no users it is
    :attr:`is_open`. Adding or removing a user returns once every live server applied it."""

    def __init__(self) -> None:
        super().__init__()
        self.security: ClusterSecurity | None = None
        self.apply_timeout_s = APPLY_TIMEOUT_S

    @property
    def is_open(self) -> bool:
        """Whether this cluster has no users (it does not authenticate), once joined."""
        return self.security is not None and self.security.users() is None

    def _reload(self) -> None:
        if self.security is None:
            raise Unavailable("this server has not joined its cluster yet (its users are in ZooKeeper); retry")
        self._hashes = dict(self.security.users() or {})

    def add(self, name: str, password: str, *, replace: bool = False) -> None:
        check_user_name(name)
        digest = self._hasher.hash(_check_password(password))
        self._change(lambda users: _added(users, name, digest, replace))

    def remove(self, name: str) -> None:
        self._change(lambda users: _removed(users, name))

    def _change(self, change: Callable[[Any], Any]) -> None:
        if self.security is None:
            raise Unavailable("this server has not joined its cluster yet; retry")
        version, _ = self.security.update("users", change)
        _applied_everywhere(self.security, "users", version, self.apply_timeout_s)


class ClusterGrants:
    """The cluster's grants, for :class:`~flightstore.server.authz.Authorizer`: read from the
    cache, changed by compare-and-set; a change returns once every live server applied it."""

    def __init__(self, security: ClusterSecurity, apply_timeout_s: float = APPLY_TIMEOUT_S) -> None:
        self.security = security
        self.apply_timeout_s = apply_timeout_s

    def grants(self) -> frozenset[Grant]:
        return self.security.grants()

    def update(self, change: Callable[[set[Grant]], set[Grant]]) -> int:
        counted: list[int] = []

        def changed(current: list) -> list | None:
            before = {Grant.from_json(g) for g in current}
            after = change(set(before))
            counted[:] = [len(after ^ before)]
            if after == before:
                return None
            return [g.to_json() for g in sorted(after, key=_sort_key)]

        version, result = self.security.update("grants", changed)
        if result is not None:
            _applied_everywhere(self.security, "grants", version, self.apply_timeout_s)
        return counted[0] if counted else 0


def _sort_key(grant: Grant) -> tuple:
    return (grant.principal, grant.resource.database or "", grant.resource.table or "", grant.operation.value)


def _added(users: Mapping[str, str] | None, name: str, digest: str, replace: bool) -> dict[str, str]:
    if users and name in users and not replace:
        raise InvalidInput(f"user {name!r} exists; use --replace to set a new password")
    return {**(users or {}), name: digest}


def _removed(users: Mapping[str, str] | None, name: str) -> dict[str, str]:
    if not users or name not in users:
        raise NotFound(f"no user {name!r}")
    return {k: v for k, v in users.items() if k != name}


def _applied_everywhere(security: ClusterSecurity, kind: str, version: int, timeout: float) -> None:
    """Return once this server and every other live one applied ``kind`` at ``version``;
    Unavailable naming the servers still behind after ``timeout`` (the change is committed)."""
    if not security.wait_version(kind, version, timeout):
        raise Unavailable(f"the cluster's {kind} changed (version {version}) but this server has not applied it "
                          f"within {timeout:g} s")
    behind = wait_applied(security.client, security.paths, kind, version, timeout)
    if behind:
        raise Unavailable(f"the cluster's {kind} changed (version {version}) but servers "
                          f"{', '.join(map(str, behind))} have not applied it within {timeout:g} s")


# ---- ``flightstore user --zookeeper`` ----------------------------------------------------------
def zookeeper_users(address: str, action: str, name: str | None = None, password: str | None = None, *,
                    replace: bool = False, timeout: float = APPLY_TIMEOUT_S) -> list[str]:
    """Add, remove or list (``action``) the users of the cluster at ZooKeeper ``address``
    directly (no server needed); a change returns once every live server applied it. Returns
    the user names (list) or the names changed."""
    parsed = ZkAddress.parse(address)
    paths = ZkPaths(parsed.root)
    client = KazooClient(hosts=parsed.hosts, timeout=10)
    try:
        client.start(timeout=timeout)
    except Exception:  # noqa: BLE001 - kazoo's timeout types vary by handler
        client.close()
        raise Unavailable(f"cannot connect to ZooKeeper at {parsed.hosts}") from None
    try:
        if client.exists(paths.cluster_id) is None:
            raise NotFound(f"ZooKeeper at {address} holds no flightstore cluster (start a server first)")
        security = ClusterSecurity(client, paths, keyed=_derives_secret(client, paths))
        if action == "list":
            try:
                return sorted(json.loads(client.get(paths.users)[0]).get("users", {}))
            except NoNodeError:
                return []
        check_user_name(name)  # type: ignore[arg-type]
        if action == "add":
            digest = _DEFAULT.hash(_check_password(password))  # type: ignore[arg-type]
            version, _ = security.update("users", lambda users: _added(users, name, digest, replace))
        elif action == "remove":
            version, _ = security.update("users", lambda users: _removed(users, name))
        else:
            raise InvalidInput(f"unknown user action {action!r}")
        behind = wait_applied(client, paths, "users", version, timeout)
        if behind:
            log.warning("servers %s have not applied the change yet", behind)
        return [name]  # type: ignore[list-item]
    finally:
        client.stop()
        client.close()


def _derives_secret(client: KazooClient, paths: ZkPaths) -> bool:
    """Whether the cluster's servers derive the signing secret from a secret file (the CLI needs
    no file: only servers sign tokens); a keyless cluster takes no users."""
    try:
        return "verifier" in decode(client.get(paths.secret)[0])
    except NoNodeError:
        return False
