"""A private certificate authority for a xirang NATS cluster (`xirang tls init`).

It makes, in one folder: `ca.pem` (the CA certificate every client and server trusts) and
`ca-key.pem` (keep it offline), then one certificate per server (`<name>.pem`,
`<name>-key.pem`) whose names (DNS or IP) are the addresses clients and the other servers
dial. Server certificates allow both server and client authentication, so the same pair
serves client connections and the cluster routes, where every server must present one
signed by this CA (`verify: true`): a rogue server cannot join. Keys are ECDSA P-256, files
mode 0600.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .durable import PRIVATE_MODE, write_durably

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
PUBLIC_MODE = 0o644  # certificates: anyone may read them
VALID_DAYS_CA = 3650
VALID_DAYS_SERVER = 825


class PkiError(ValueError):
    """Something about the CA folder that must be fixed first."""


def _write(path: Path, data: bytes, private: bool) -> None:
    write_durably(path, data, mode=PRIVATE_MODE if private else PUBLIC_MODE)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "xirang"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def create_ca(directory: Path) -> None:
    """Create the private CA (key and self-signed certificate) in `directory`, unless one is
    there already."""
    if (directory / CA_KEY).exists():
        return  # keep the CA: certificates made before must stay valid
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("xirang private CA"))
        .issuer_name(_name("xirang private CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS_CA))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write(directory / CA_KEY, _key_pem(key), private=True)
    _write(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM), private=False)


def _san(names: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def issue(directory: Path, name: str, addresses: list[str]) -> tuple[Path, Path]:
    """A certificate for server `name`, valid for `addresses`: (cert path, key path)."""
    if not addresses:
        raise PkiError(f"server {name}: give the names or IPs clients and other servers dial")
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    except OSError as err:
        raise PkiError(f"no CA in {directory}: {err}") from err
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS_SERVER))
        .add_extension(x509.SubjectAlternativeName(_san(addresses)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return cert_path, key_path


def init(directory: str | os.PathLike, servers: dict[str, list[str]]) -> dict[str, tuple[Path, Path]]:
    """The CA (made once) and a certificate for each server: {name: (cert, key)}."""
    directory = Path(directory)
    create_ca(directory)
    return {name: issue(directory, name, addresses) for name, addresses in servers.items()}
