"""TLS material for the webhook: a private CA and a serving certificate.

The API server calls admission webhooks over HTTPS only and verifies the
serving certificate against the ``caBundle`` of the
``MutatingWebhookConfiguration``. In a cluster the chart mounts one Secret
(``webhookCertFile``/``webhookKeyFile``) into every daemon, so that one
``caBundle`` trusts all of them behind one Service. A daemon given none
keeps a CA of its own under ``DIR`` (:func:`ensure`): made once, reused
across restarts so the ``caBundle`` published from ``DIR/ca.pem`` stays
valid; the serving certificate is re-issued from it whenever its names do
not cover what is asked or it nears its end. Tests use :func:`make_ca` and
:func:`issue` directly.

Keys are ECDSA P-256 (what the API server, Go's TLS and every current
client accept; generated in milliseconds). Private keys are written 0600 in
a 0700 directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ..errors import HamidError

CA_DAYS = 3650
SERVING_DAYS = 365
RENEW_BEFORE_DAYS = 30  # a serving certificate this close to its end is re-issued at start-up


class CertError(HamidError):
    """TLS material could not be made, read or written."""


@dataclass(frozen=True)
class Issued:
    """A key and its certificate, PEM-encoded."""

    key_pem: bytes
    cert_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def key(self) -> ec.EllipticCurvePrivateKey:
        return serialization.load_pem_private_key(self.key_pem, password=None)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str = "hamid webhook CA", days: int = CA_DAYS) -> Issued:
    """A self-signed CA that may sign serving certificates (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    return Issued(_pem_key(key), cert.public_bytes(serialization.Encoding.PEM))


def _split_names(names) -> tuple[list[str], list[ipaddress._BaseAddress]]:
    dns, ips = [], []
    for n in names:
        try:
            ips.append(ipaddress.ip_address(n))
        except ValueError:
            if not n or any(c.isspace() for c in n):
                raise CertError(f"bad certificate name {n!r}: accepted: DNS names and IP addresses") from None
            dns.append(n)
    return dns, ips


def issue(ca: Issued, names, days: int = SERVING_DAYS, *, client: bool = False) -> Issued:
    """A serving certificate signed by ``ca`` for ``names`` (DNS names and IP
    addresses, all put in subjectAltName; the first is also the CN). With
    ``client``: a client certificate instead (``names[0]`` the CN, no
    subjectAltName), as kube-scheduler presents to the extender."""
    names = list(dict.fromkeys(names))
    if not names:
        raise CertError("a certificate needs at least one name")
    dns, ips = _split_names(names) if not client else ([], [])
    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert, ca_key = ca.cert, ca.key
    now = _now()
    san = [x509.DNSName(d) for d in dns] + [x509.IPAddress(i) for i in ips]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                  else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if san:
        cert = cert.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = cert.sign(ca_key, hashes.SHA256())
    return Issued(_pem_key(key), cert.public_bytes(serialization.Encoding.PEM))


def covers(cert: x509.Certificate, names) -> bool:
    """Whether ``cert``'s subjectAltName lists every one of ``names``."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {n.lower() for n in san.get_values_for_type(x509.DNSName)} | set(san.get_values_for_type(x509.IPAddress))
    dns, ips = _split_names(names)
    return all(d.lower() in have for d in dns) and all(i in have for i in ips)


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Files:
    """Where :func:`ensure` left the material."""

    ca: Path  # the CA certificate: the webhook configuration's caBundle
    cert: Path
    key: Path
    issued: bool  # whether the serving certificate was (re)issued now


def ensure(directory: str | os.PathLike, names) -> Files:
    """A CA and a serving certificate for ``names`` under ``directory``.

    ``ca.pem``/``ca.key`` are made once and kept (until 30 days before the
    CA's end); ``tls.crt``/``tls.key`` are kept while they are signed by that
    CA, cover ``names`` and have more than 30 days left, else re-issued.
    """
    d = Path(directory)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(d, 0o700)
        ca_pem, ca_key = d / "ca.pem", d / "ca.key"
        crt, key = d / "tls.crt", d / "tls.key"
        soon = _now() + dt.timedelta(days=RENEW_BEFORE_DAYS)
        ca = None
        if ca_pem.exists() and ca_key.exists():
            ca = Issued(ca_key.read_bytes(), ca_pem.read_bytes())
            if ca.cert.not_valid_after_utc < soon:
                ca = None
        new_ca = ca is None
        if new_ca:
            ca = make_ca()
            _write(ca_key, ca.key_pem, 0o600)
            _write(ca_pem, ca.cert_pem, 0o644)
        if not new_ca and crt.exists() and key.exists():
            cur = x509.load_pem_x509_certificate(crt.read_bytes())
            if cur.issuer == ca.cert.subject and cur.not_valid_after_utc > soon and covers(cur, names):
                try:
                    cur.verify_directly_issued_by(ca.cert)
                    return Files(ca_pem, crt, key, issued=False)
                except Exception:  # signed by an older CA of the same name: re-issue
                    pass
        srv = issue(ca, names)
        _write(key, srv.key_pem, 0o600)
        _write(crt, srv.cert_pem, 0o644)
        return Files(ca_pem, crt, key, issued=True)
    except (OSError, ValueError) as e:
        raise CertError(f"cannot keep the webhook's TLS material in {d}: {e}") from None
