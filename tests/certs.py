"""Certificates made in the test (``cryptography``): a CA, a server certificate for localhost and
127.0.0.1 (also good as a client certificate, as a cluster's servers use it), a client certificate
signed by the same CA, and one signed by a CA the server does not trust. Each is written as PEM
files in a directory and returned by path."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Certificates", "make_certificates"]


@dataclass(frozen=True)
class Certificates:
    ca: Path               # the CA that signed the server and the good client
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path       # a client certificate from a CA nobody trusts
    rogue_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
           *, ca: bool = False, server: bool = False, client: bool = False) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + \
        ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
    if usages:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, rogue_ca_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _issue("flightstore test CA", ca_key, "flightstore test CA", ca_key, ca=True)
    ca_path, _ = _write(directory, "ca", ca, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert, server_key_path = _write(
        directory, "server",  # also a client certificate: the servers of a cluster call each other with it
        _issue("localhost", server_key, "flightstore test CA", ca_key, server=True, client=True), server_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert, client_key_path = _write(
        directory, "client", _issue("alice", client_key, "flightstore test CA", ca_key, client=True), client_key)
    rogue_key = ec.generate_private_key(ec.SECP256R1())
    rogue_cert, rogue_key_path = _write(
        directory, "rogue", _issue("mallory", rogue_key, "rogue CA", rogue_ca_key, client=True), rogue_key)
    return Certificates(ca_path, server_cert, server_key_path, client_cert, client_key_path, rogue_cert,
                        rogue_key_path)
