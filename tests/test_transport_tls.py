"""HTTPS through the transport: certificate checks, keep-alive, never-sent errors
(docs/design/behavior.md#timeouts, docs/design/behavior.md#submission-loop).

A throwaway CA and a server certificate for 127.0.0.1 are made with ``cryptography`` (skipped
when it is not installed); the server is the stdlib ``http.server`` behind ``ssl``.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tinker_sync._config import ClientConfig
from tinker_sync._credentials import StaticKeyAuth
from tinker_sync._transport import Pool, RequestSpec, Transport
from tinker_sync.exceptions import APIConnectError, RequestOutcome

x509 = pytest.importorskip("cryptography.x509")
hashes = pytest.importorskip("cryptography.hazmat.primitives.hashes")
serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
ec = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ec")

KEY = "tml-tls-test-key-0123456789"


def _cert(subject: str, issuer_key: Any, issuer: Any, key: Any, *, ca: bool) -> Any:
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
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
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA bundle, server cert, server key) files."""
    root = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("tinker_sync test CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _cert("127.0.0.1", ca_key, ca.subject, server_key, ca=False)
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca.public_bytes(pem))
    (root / "server.pem").write_bytes(server.public_bytes(pem))
    (root / "server.key").write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return root / "ca.pem", root / "server.pem", root / "server.key"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.server.seen.append(
            (self.path, self.headers.get("X-API-Key"), body, self.client_address[1])
        )
        reply = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


@pytest.fixture
def https_server(pki: tuple[Path, Path, Path]) -> Iterator[Any]:
    _, cert, key = pki
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.seen = []  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(30)


def _transport(url: str, monkeypatch: pytest.MonkeyPatch, ca: Path | None) -> Transport:
    if ca is not None:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    config = ClientConfig.from_env(base_url=url, api_key=KEY, environ={})
    return Transport(config, auth=StaticKeyAuth(config.credentials))


def _post() -> RequestSpec:
    return RequestSpec(method="POST", path="/api/v1/x", pool=Pool.TRAIN, json={"a": 1})


def test_https_with_the_configured_ca_bundle(
    https_server: Any, pki: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"https://127.0.0.1:{https_server.server_address[1]}"
    t = _transport(url, monkeypatch, pki[0])
    try:
        assert t.send_once(_post()).json() == {"ok": True}
        assert t.send_once(_post()).status == 200
    finally:
        t.close()
    (p1, key1, body1, port1), (_, _, _, port2) = https_server.seen
    assert (p1, key1, body1) == ("/api/v1/x", KEY, b'{"a":1}')
    assert port1 == port2  # the TLS connection was kept alive and reused


def test_an_untrusted_certificate_is_a_never_sent_connect_error(
    https_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    url = f"https://127.0.0.1:{https_server.server_address[1]}"
    t = _transport(url, monkeypatch, None)  # certifi's bundle does not know our test CA
    try:
        with pytest.raises(APIConnectError) as info:
            t.send_once(_post())
    finally:
        t.close()
    assert info.value.outcome is RequestOutcome.NOT_SENT
    assert KEY not in str(info.value)
    assert https_server.seen == []
