"""TLS of the Flight server: its certificate and key, and optionally the CA of its clients (mTLS).

With :class:`TlsConfig` the server listens on ``grpc+tls://`` only. With ``client_ca`` set, gRPC
asks every client for a certificate and refuses the connection of a client without one signed by
that CA (mutual TLS). Certificates are PEM; :meth:`TlsConfig.from_files` reads them at start-up so
a bad path fails before the server listens.
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

    @classmethod
    def from_files(cls, cert: str | os.PathLike, key: str | os.PathLike,
                   client_ca: str | os.PathLike | None = None) -> TlsConfig:
        return cls(_read_pem(cert, "TLS certificate"), _read_pem(key, "TLS key"),
                   _read_pem(client_ca, "client CA") if client_ca else None)

    def server_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``pyarrow.flight.FlightServerBase`` for this configuration."""
        kwargs: dict[str, Any] = {"tls_certificates": [flight.CertKeyPair(cert=self.cert, key=self.key)]}
        if self.client_ca is not None:
            kwargs["verify_client"] = True
            kwargs["root_certificates"] = self.client_ca
        return kwargs
