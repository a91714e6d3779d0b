"""TLS of the Flight server: its certificate and key, and optionally the CA of its clients (mTLS).

With :class:`TlsConfig` the server listens on ``grpc+tls://`` only. With ``client_ca`` set, gRPC
asks every client for a certificate and refuses the connection of a client without one signed by
that CA (mutual TLS). In a cluster the servers call each other over TLS too
(:meth:`TlsConfig.client_kwargs`): each verifies the other's certificate against ``root`` (the CA
of the servers' certificates) and presents its own, so with a client CA the servers check each
other as they check clients, in addition to the peer credential. Certificates are PEM;
:meth:`TlsConfig.from_files` reads and checks them at start-up (with Python's OpenSSL,
:func:`_check_pair`) so a bad path, a file that is not a certificate, an encrypted key or a key of
another certificate fails before the server listens, with a message saying which (gRPC itself only
says "Server did not start properly").
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any

from pyarrow import flight

from flightstore.errors import InvalidInput

__all__ = ["TlsConfig"]


def _read_pem(path: str | os.PathLike, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read the {what} {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise InvalidInput(f"the {what} {path} is not PEM (no -----BEGIN line)")
    return data


def _check_certificates(path: str | os.PathLike, what: str) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=os.fspath(path))
    except (ssl.SSLError, ValueError) as exc:
        raise InvalidInput(f"the {what} {path} holds no readable certificate ({exc})") from None


def _check_pair(cert: str | os.PathLike, key: str | os.PathLike, key_pem: bytes) -> None:
    """Refuse a certificate and key that cannot serve TLS together, saying why."""
    _check_certificates(cert, "TLS certificate")
    if b"ENCRYPTED" in key_pem:
        raise InvalidInput(f"the TLS key {key} is encrypted with a passphrase; give the key unencrypted "
                           "(e.g. openssl pkey -in key.pem -out plain.pem)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(os.fspath(cert), os.fspath(key),
                                                                password=lambda: b"")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise InvalidInput(f"the TLS key {key} does not belong to the TLS certificate {cert} (it is the "
                               "key of another certificate)") from None
        raise InvalidInput(f"the TLS key {key} holds no readable private key ({exc})") from None


@dataclass(frozen=True)
class TlsConfig:
    """PEM bytes of the server's certificate chain and key, and of the client CA for mTLS."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None
    root: bytes | None = None  # cluster mode: the CA of the servers' certificates (default client_ca)

    @classmethod
    def from_files(cls, cert: str | os.PathLike, key: str | os.PathLike,
                   client_ca: str | os.PathLike | None = None, root: str | os.PathLike | None = None) -> TlsConfig:
        """Read the PEM files, checked: the key must belong to the certificate, the client CA and
        the root must hold certificates; InvalidInput says what is wrong with which file."""
        config = cls(_read_pem(cert, "TLS certificate"), _read_pem(key, "TLS key"),
                     _read_pem(client_ca, "client CA") if client_ca else None,
                     _read_pem(root, "TLS root") if root else None)
        _check_pair(cert, key, config.key)
        if client_ca:
            _check_certificates(client_ca, "client CA")
        if root:
            _check_certificates(root, "TLS root")
        return config

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightClient`` for this server's calls to the
        other servers of its cluster: it verifies them against :attr:`root` (else the client
        CA, else the system's roots) and presents its own certificate, which a server with a
        client CA (mutual TLS) checks like any client's."""
        kwargs: dict[str, Any] = {"cert_chain": self.cert, "private_key": self.key}
        root = self.root if self.root is not None else self.client_ca
        if root is not None:
            kwargs["tls_root_certs"] = root
        return kwargs

    def server_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightServerBase`` for this configuration."""
        kwargs: dict[str, Any] = {"tls_certificates": [flight.CertKeyPair(cert=self.cert, key=self.key)]}
        if self.client_ca is not None:
            kwargs["verify_client"] = True
            kwargs["root_certificates"] = self.client_ca
        return kwargs
