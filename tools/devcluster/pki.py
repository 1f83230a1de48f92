"""Certificates for the local control plane and for webhook servers under test.

One CA signs everything (API server serving cert, client certs, webhook serving certs); a separate
key pair signs service-account tokens. ECDSA P-256 like envtest's TinyCA.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        crt, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        crt.write_bytes(self.cert_pem)
        key.write_bytes(self.key_pem)
        key.chmod(0o600)
        return crt, key


class CertificateAuthority:
    """A tiny CA that issues serving and client certificates."""

    def __init__(self, common_name: str = "fiar-devcluster-ca") -> None:
        self._key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self._name = name
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    key_encipherment=False,
                    content_commitment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    @property
    def pair(self) -> KeyPair:
        return KeyPair(self.cert_pem, _pem_key(self._key))

    def issue(
        self,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        hosts: tuple[str, ...] = (),
        client: bool = False,
    ) -> KeyPair:
        """Issue a leaf certificate: a serving cert when ``hosts`` is given, a client cert when ``client``."""
        key = _key()
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        now = datetime.datetime.now(datetime.timezone.utc)
        usages = []
        if hosts:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if hosts:
            sans: list[x509.GeneralName] = []
            for host in hosts:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    sans.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def signing_key_pair() -> KeyPair:
    """A bare key pair for service-account token signing (public key as PEM in ``cert_pem``)."""
    key = _key()
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return KeyPair(public, _pem_key(key))
