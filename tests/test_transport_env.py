"""Proxy and CA-bundle variables are honoured, resolved once per server (not per request)."""

from __future__ import annotations

import pytest

from tinker_sync._transport import _environment_settings, _new_session


@pytest.fixture(autouse=True)
def _clean_proxy_env(monkeypatch):
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    ):
        monkeypatch.delenv(name, raising=False)


def test_proxy_from_the_environment_is_used(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    proxies, verify = _environment_settings("https://tinker.example.com/services/x")
    assert proxies == {"https": "http://proxy.example:3128"}
    assert verify is True


def test_no_proxy_bypasses_the_host(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "tinker.example.com,127.0.0.1")
    assert _environment_settings("https://tinker.example.com")[0] == {}
    assert _environment_settings("http://127.0.0.1:8000")[0] == {}


def test_ca_bundle_and_session_does_not_rescan_the_environment(monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/custom.pem")
    session = _new_session(4, None, "https://tinker.example.com")
    assert session.verify == "/etc/ssl/custom.pem"
    assert session.trust_env is False
