"""TLS of the Flight server: its certificate and key, and optionally the CA of its clients (mTLS).

With :class:`TlsConfig` the server listens on ``grpc+tls://`` only. With ``client_ca`` set, gRPC
asks every client for a certificate and refuses the connection of a client without one signed by
that CA (mutual TLS). In a cluster the servers call each other over TLS too
(:meth:`TlsConfig.client_kwargs`): each verifies the other's certificate against ``root`` (the CA
of the servers' certificates) and presents its own, so with a client CA the servers check each
other as they check clients, in addition to the peer credential. Certificates are PEM;
:meth:`TlsConfig.from_files` reads them at start-up so a bad path fails before the server listens.
"""

from __future__ import annotations

import os
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
        return cls(_read_pem(cert, "TLS certificate"), _read_pem(key, "TLS key"),
                   _read_pem(client_ca, "client CA") if client_ca else None,
                   _read_pem(root, "TLS root") if root else None)

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
