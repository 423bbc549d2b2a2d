"""A throwaway certificate authority and server certificate for HTTPS on loopback.

Usage::

    ca, cert, key = make_throwaway_pki(tmp_dir)          # needs the cryptography package
    with LocalServer(tls=(str(cert), str(key))) as server:  # https://127.0.0.1:<port>
        ...  # clients trust ``ca`` (e.g. REQUESTS_CA_BUNDLE / SSL_CERT_FILE)

The certificate is valid for 127.0.0.1 and localhost, for ``hours`` hours. For tests and
benchmarks only: the keys are written unencrypted.
Thread safety: pure function (writes three files).
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any


def _certificate(
    subject: str, issuer_key: Any, issuer: Any, key: Any, *, ca: bool, hours: float
) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=hours))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_throwaway_pki(directory: str | Path, *, hours: float = 6.0) -> tuple[Path, Path, Path]:
    """Write ``ca.pem``, ``server.pem`` and ``server.key`` into ``directory``; return their paths."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("tinker_sync throwaway CA", ca_key, None, ca_key, ca=True, hours=hours)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("127.0.0.1", ca_key, ca.subject, server_key, ca=False, hours=hours)
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca.public_bytes(pem))
    (root / "server.pem").write_bytes(server.public_bytes(pem))
    (root / "server.key").write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return root / "ca.pem", root / "server.pem", root / "server.key"
