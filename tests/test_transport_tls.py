"""HTTPS through the transport: certificate checks, keep-alive, never-sent errors
(docs/design/behavior.md#timeouts, docs/design/behavior.md#submission-loop).

A throwaway CA and a server certificate for 127.0.0.1 are made with ``cryptography`` (skipped
when it is not installed); the server is the stdlib ``http.server`` behind ``ssl``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tinker_sync._config import ClientConfig, Timeout
from tinker_sync._credentials import StaticKeyAuth
from tinker_sync._transport import Pool, RequestSpec, Transport
from tinker_sync.exceptions import APIConnectError, APIConnectTimeoutError, RequestOutcome
from tinker_sync.local import LocalServer
from tinker_sync.local._tls import make_throwaway_pki

pytest.importorskip("cryptography")

pytestmark = pytest.mark.usefixtures("transport_path")  # every test on both request paths
KEY = "tml-tls-test-key-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA bundle, server cert, server key) files."""
    return make_throwaway_pki(tmp_path_factory.mktemp("pki"))


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


def _transport(
    url: str, monkeypatch: pytest.MonkeyPatch, ca: Path | None, timeout: Timeout | None = None
) -> Transport:
    if ca is not None:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    config = ClientConfig.from_env(base_url=url, api_key=KEY, environ={}, timeout=timeout)
    return Transport(config, auth=StaticKeyAuth(config.credentials))


def _post() -> RequestSpec:
    return RequestSpec(method="POST", path="/api/v1/x", pool=Pool.TRAIN, json={"a": 1})


def _fails_unsent(t: Transport, expected: type[APIConnectError]) -> APIConnectError:
    """One request on ``t`` (closed after) that must fail with ``expected``, never sent."""
    try:
        with pytest.raises(expected) as info:
            t.send_once(_post())
    finally:
        t.close()
    assert info.value.outcome is RequestOutcome.NOT_SENT
    return info.value


def _never_sent(server: Any, monkeypatch: pytest.MonkeyPatch, ca: Path | None) -> APIConnectError:
    """One request to ``server`` that must fail as a connect error the server never saw."""
    t = _transport(f"https://127.0.0.1:{server.server_address[1]}", monkeypatch, ca)
    error = _fails_unsent(t, APIConnectError)
    assert server.seen == []
    return error


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
    error = _never_sent(https_server, monkeypatch, None)  # certifi does not know our test CA
    assert KEY not in str(error)


def test_a_missing_ca_bundle_is_a_never_sent_connect_error(
    https_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Like urllib3, the bundle is read when the first connection opens: creating the client
    works, the request fails as a connect error naming the missing file's error."""
    error = _never_sent(https_server, monkeypatch, tmp_path / "no-such-bundle.pem")
    assert "No such file" in str(error)


def test_a_stalled_tls_handshake_is_a_never_sent_connect_timeout(
    pki: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that accepts the TCP connection but never answers the ClientHello: the connect
    timeout ends the handshake, and the failure says nothing was sent (urllib3 alone would call
    it a read timeout, which reads as "maybe sent")."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel accepts; no one reads
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        t = _transport(url, monkeypatch, pki[0], Timeout(30.0, connect=0.2))
        error = _fails_unsent(t, APIConnectTimeoutError)
    assert "handshake operation timed out" in str(error)  # the innermost cause's words


@pytest.mark.parametrize("in_subprocess", [False, True])
def test_local_server_serves_https_to_the_client(
    pki: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch, in_subprocess: bool
) -> None:
    """The local server with a throwaway certificate: a sampling client works end to end over
    HTTPS and keeps its TLS connections alive (the server saw requests, no refusal)."""
    import tinker_sync

    ca, cert, key = pki
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    with LocalServer(tls=(str(cert), str(key)), in_subprocess=in_subprocess) as server:
        assert server.url.startswith("https://127.0.0.1:")
        with tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key) as service:
            sampler = service.create_sampling_client(base_model="Qwen/Qwen3-8B")
            prompt = tinker_sync.ModelInput.from_ints([1, 2, 3])
            params = tinker_sync.SamplingParams(max_tokens=4)
            for _ in range(3):
                out = sampler.sample(prompt, 1, params).result(60)
                assert 0 < len(out.sequences[0].tokens) <= 4
        assert server.requests.count("asample") == 3


def _pki_for(name: str, directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate valid for the DNS name ``name`` only."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key: Any, issuer: Any, signer: Any, ca: bool) -> Any:
        subject_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject_name)
            .issuer_name(issuer or subject_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = cert("hostname test CA", ca_key, None, ca_key, True)
    server = cert(name, server_key, ca.subject, ca_key, False)
    pem = serialization.Encoding.PEM
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


@contextlib.contextmanager
def _tls_server(cert: Path, key: Path, **context_options: Any) -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.seen = []  # type: ignore[attr-defined]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for name, value in context_options.items():
        setattr(context, name, value)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)


def test_a_certificate_for_another_host_is_a_never_sent_connect_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A certificate the CA bundle trusts, but issued for another name: the hostname check
    fails on both paths, before anything is sent."""
    ca, cert, key = _pki_for("tinker.example.com", tmp_path)
    with _tls_server(cert, key) as server:
        error = _never_sent(server, monkeypatch, ca)
    assert "127.0.0.1" in str(error) or "match" in str(error).lower(), str(error)
    assert KEY not in str(error)


def test_a_server_offering_only_tls_below_1_2_is_a_never_sent_connect_error(
    pki: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both paths require TLS 1.2 or newer: a server capped at TLS 1.1 gets no request."""
    ca, cert, key = pki
    options = {"minimum_version": ssl.TLSVersion.MINIMUM_SUPPORTED}
    with _tls_server(cert, key, maximum_version=ssl.TLSVersion.TLSv1_1, **options) as server:
        _never_sent(server, monkeypatch, ca)
    with _tls_server(cert, key, maximum_version=ssl.TLSVersion.TLSv1_2) as server:
        t = _transport(f"https://127.0.0.1:{server.server_address[1]}", monkeypatch, ca)
        try:
            assert t.send_once(_post()).status == 200  # 1.2 itself is accepted
        finally:
            t.close()
