"""Users and their salted password hashes (Argon2id, via argon2-cffi), kept in a users file.

``flightstore user add NAME --users-file F`` writes ``F``; ``flightstore serve --users-file F``
reads it. The file is JSON, ``{"format": "flightstore-users", "version": 1, "users": {name: hash}}``,
rewritten atomically with mode 0600, and holds no password: each hash is Argon2id's PHC string
(algorithm, parameters, random salt and digest), so a stolen file costs an attacker an Argon2
computation per guess. A running server notices when the file changes (its size or modification
time): users added or removed take effect without a restart.

Passwords are Unicode text, compared only through Argon2 (no ``hmac.compare_digest`` on ``str``,
which refuses non-ASCII text). An unknown user costs the same hash computation as a wrong password,
so timing does not tell which users exist.

Each user's *fingerprint* (:meth:`UserStore.fingerprint`, a digest of its current hash) changes
whenever its password is set, also when it is removed and added again with the same password (a new
salt each time). Tokens carry the fingerprint they were minted under, so setting a password or
removing a user revokes every token minted before.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import argon2
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

from flightstore.errors import InvalidInput, NotFound

__all__ = ["UserStore", "check_user_name"]

_FORMAT = "flightstore-users"
# In-process users (tests, embedded servers) are hashed with a cheap profile: their passwords
# never touch the disk. Users of a file get argon2-cffi's default (RFC 9106 low-memory) profile.
_CHEAP = argon2.PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1)
_DEFAULT = argon2.PasswordHasher()
_MAX_NAME = 128


def check_user_name(name: str) -> str:
    """``name`` if it can be a user name: 1-128 printable characters, no ``:`` (HTTP Basic puts
    one between name and password), no surrounding spaces. InvalidInput otherwise."""
    if not isinstance(name, str) or not name or len(name) > _MAX_NAME:
        raise InvalidInput(f"a user name has 1 to {_MAX_NAME} characters, not {name!r}")
    if ":" in name or name != name.strip() or not name.isprintable():
        raise InvalidInput(f"invalid user name {name!r}: no ':', control characters or surrounding "
                           "spaces")
    return name


def _check_password(password: str) -> str:
    if not isinstance(password, str) or not password:
        raise InvalidInput("the password must not be empty")
    return password


class UserStore:
    """Users and password hashes, in memory or backed by a users file. Thread-safe."""

    def __init__(self, hashes: Mapping[str, str] | None = None, *, path: str | os.PathLike | None = None,
                 hasher: argon2.PasswordHasher = _DEFAULT) -> None:
        self.path = Path(path) if path is not None else None
        self._hasher = hasher
        self._hashes: dict[str, str] = dict(hashes or {})
        self._stamp: tuple[int, int] | None = None
        self._lock = threading.Lock()
        self._dummy = hasher.hash("flightstore: no such user")

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_passwords(cls, passwords: Mapping[str, str]) -> UserStore:
        """In-memory users from plain passwords (tests, embedded servers); nothing is written."""
        store = cls(hasher=_CHEAP)
        for name, password in passwords.items():
            store._hashes[check_user_name(name)] = _CHEAP.hash(_check_password(password))
        return store

    @classmethod
    def open(cls, path: str | os.PathLike, *, create: bool = False) -> UserStore:
        """The users of file ``path``; an absent file is an empty store when ``create`` is set,
        else NotFound. InvalidInput when the file is not a users file."""
        store = cls(path=path)
        if not store.path.exists():  # type: ignore[union-attr]
            if not create:
                raise NotFound(f"users file {path} does not exist; create it with "
                               "`flightstore user add NAME --users-file FILE`")
            return store
        with store._lock:
            store._reload()
        return store

    # ---- the file -----------------------------------------------------------------------------
    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            stat = os.stat(self.path)  # type: ignore[arg-type]
        except FileNotFoundError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def _reload(self) -> None:
        """Read the file again when it changed since the last read (caller holds the lock)."""
        if self.path is None:
            return
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        if stamp is None:
            self._hashes, self._stamp = {}, None
            return
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
            if state.get("format") != _FORMAT or not isinstance(state.get("users"), dict):
                raise ValueError("not a flightstore users file")
            hashes = {str(k): str(v) for k, v in state["users"].items()}
        except (OSError, ValueError, AttributeError) as exc:
            raise InvalidInput(f"users file {self.path}: {exc}") from None
        self._hashes, self._stamp = hashes, stamp

    def _save(self) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"format": _FORMAT, "version": 1, "users": self._hashes}, handle, indent=1,
                      sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)
        self._stamp = self._file_stamp()

    # ---- users --------------------------------------------------------------------------------
    def names(self) -> list[str]:
        with self._lock:
            self._reload()
            return sorted(self._hashes)

    def exists(self, name: str) -> bool:
        with self._lock:
            self._reload()
            return name in self._hashes

    def add(self, name: str, password: str, *, replace: bool = False) -> None:
        """Add user ``name`` (or set its password with ``replace``) and save the file."""
        check_user_name(name)
        digest = self._hasher.hash(_check_password(password))
        with self._lock:
            self._reload()
            if name in self._hashes and not replace:
                raise InvalidInput(f"user {name!r} exists; use --replace to set a new password")
            self._hashes[name] = digest
            if self.path is not None:
                self._save()

    def remove(self, name: str) -> None:
        """Remove user ``name`` and save the file; NotFound when there is no such user."""
        with self._lock:
            self._reload()
            if name not in self._hashes:
                raise NotFound(f"no user {name!r}")
            del self._hashes[name]
            if self.path is not None:
                self._save()

    def fingerprint(self, name: str) -> str | None:
        """A digest of ``name``'s current password hash; None when there is no such user. It
        changes whenever the password is set (see the module docstring)."""
        with self._lock:
            self._reload()
            digest = self._hashes.get(name)
        return None if digest is None else _fingerprint(digest)

    def verify(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s. Costs one Argon2 computation whether or not the user
        exists."""
        return self.authenticate(name, password) is not None

    def authenticate(self, name: str, password: str) -> str | None:
        """The fingerprint of the hash ``password`` matched, or None when it is not ``name``'s
        password (or there is no such user). Costs one Argon2 computation either way."""
        with self._lock:
            self._reload()
            digest = self._hashes.get(name)
        try:
            matched = self._hasher.verify(digest or self._dummy, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return None
        return _fingerprint(digest) if matched and digest is not None else None


def _fingerprint(digest: str) -> str:
    return hashlib.sha256(digest.encode()).hexdigest()[:24]
