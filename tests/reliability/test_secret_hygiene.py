"""No secret leaks (docs/design/behavior.md#secrets-never-leak): logs, reprs, exceptions, pickles,
sampler handles, hooks.

One representative workload -- training, sampling, REST, retried faults, failed requests --
runs with DEBUG logging for ``tinker_sync`` and ``urllib3`` captured twice (pytest's caplog and
a handler on the root logger that also formats tracebacks), with distinctive fake secrets:

* an API key ``tml-`` + 40 random characters (the server accepts any ``tml-`` key);
* the JWTs the server issues, since ``pjwt_auth_enabled`` is on (recorded as they are issued);
* ``CLOUDFLARE_ACCESS_CLIENT_SECRET`` from the environment;
* weights-access tokens passed to ``copy_weights``, ``create_training_client_from_state`` and
  ``load_state``;
* a malformed credential given to a second client (its error must not echo it).

None of them, nor any 12-character piece of one, may appear in a log line, the repr/str of a
client, future, exception or its request/response snapshot, a default pickle of a
SamplingClient or an exception, a sampler handle (raw or base64-decoded), or a hook event.
"""

from __future__ import annotations

import base64
import binascii
import logging
import pickle
import secrets
import string
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from reliability_helpers import HANG, datum, prompt, wait_all

import tinker_sync
from tinker_sync import types
from tinker_sync.local import Fault, LocalServer

FAULTS = [
    "asample 503 x1",  # retried by the submission loop
    "forward_backward drop-after x1",  # the reply is lost: retried, deduplicated
    "retrieve_future 429 x1",  # poll backoff
    "training_runs 500 x2",  # REST retries
    "retrieve_future fail:user x1 match.request_type=Sample",  # a failed sample
    "optim_step 503 x1 should_retry=false after=1",  # a failed training op
]


def fake_secret(prefix: str, n: int = 40) -> str:
    alphabet = string.ascii_letters + string.digits
    return prefix + "".join(secrets.choice(alphabet) for _ in range(n))


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # includes exc_info / stack_info text


@pytest.fixture
def root_handler() -> Iterator[Collect]:
    handler = Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def pieces(secret: str, width: int = 12) -> list[str]:
    """The secret and every ``width``-character window of it (catches partial echoes)."""
    return [secret] + [secret[i : i + width] for i in range(len(secret) - width + 1)]


def decoded_handle(handle: str) -> str:
    try:
        return base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode(
            "utf-8", "replace"
        )
    except (binascii.Error, ValueError):
        return ""


def test_no_secret_leaks_anywhere(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    root_handler: Collect,
    transport_path: str,
) -> None:
    api_key = fake_secret("tml-")
    cf_secret = fake_secret("cfsecret-")
    weights_tokens = [fake_secret("wat-"), fake_secret("wat-"), fake_secret("wat-")]
    bad_key = fake_secret("notakey-")
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_ID", "cf-client-id.access")
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_SECRET", cf_secret)
    caplog.set_level(logging.DEBUG, logger="tinker_sync")
    caplog.set_level(logging.DEBUG, logger="urllib3")

    events: list[Any] = []
    objects: list[Any] = []  # everything whose repr/str is checked
    errors: list[BaseException] = []
    pickles: list[bytes] = []
    handles: list[str] = []
    jwts: list[str] = []

    with LocalServer(
        long_poll_s=1.0,
        api_key=None,
        client_config={"pjwt_auth_enabled": True},
        faults=FAULTS,
        gap_grace_s=1.0,
    ) as server:
        issue = server.app._jwt.issue

        def record_jwt(*args: Any, **kwargs: Any) -> str:
            token = issue(*args, **kwargs)
            jwts.append(token)
            return str(token)

        server.app._jwt.issue = record_jwt
        service = tinker_sync.ServiceClient(
            base_url=server.url, api_key=api_key, hooks=[events.append]
        )
        try:
            training = service.create_lora_training_client("base", rank=4)
            ops = [training.forward_backward([datum(i)], "cross_entropy") for i in range(2)] + [
                training.optim_step(types.AdamParams()) for _ in range(2)
            ]
            state = training.save_state("secrets")
            ops.append(state)
            sampler = service.create_sampling_client(base_model="base")
            samples = [
                sampler.sample(prompt(i), 1, types.SamplingParams(max_tokens=3)) for i in range(4)
            ]
            samples.append(sampler.compute_logprobs(prompt(9)))
            wait_all(ops + samples, HANG)
            path = state.result(0).path
            rest = service.create_rest_client()
            rest_futs = [
                rest.list_training_runs(),
                rest.get_training_run(training.model_id),
                rest.get_training_run("no-such-run"),  # 404
                rest.copy_weights(path, "proj-secrets", weights_access_token=weights_tokens[0]),
            ]
            wait_all(rest_futs, HANG)
            restored = service.create_training_client_from_state(
                path, weights_access_token=weights_tokens[1]
            )
            load = restored.load_state(path, weights_access_token=weights_tokens[2])
            wait_all([load], HANG)
            sampler2 = training.save_weights_and_get_sampling_client()
            handles.append(sampler.get_sampler_handle())
            handles.append(sampler2.get_sampler_handle())
            pickles.append(pickle.dumps(sampler))
            pickles.append(pickle.dumps(sampler2))
            try:  # a malformed credential: its error must not echo it
                with tinker_sync.ServiceClient(base_url=server.url, api_key=bad_key) as other:
                    other.create_sampling_client(base_model="base")
            except Exception as exc:
                errors.append(exc)
            futures = [*ops, *samples, *rest_futs, load]
            errors += [f.exception(0) for f in futures if f.exception(0) is not None]
            objects += [service, training, sampler, sampler2, rest, restored, *futures]
            objects += [f.result(0) for f in futures if f.exception(0) is None]
        finally:
            service.close()

    assert jwts, "pjwt_auth_enabled was on but no JWT was issued"
    assert len(errors) >= 4, errors  # the failed sample, optim_step, 404 and bad credential
    for exc in errors:
        objects += [exc, getattr(exc, "request", None), getattr(exc, "response", None)]
        objects.append(getattr(exc, "body", None))
        pickles.append(pickle.dumps(exc))
        cause = exc.__cause__ or exc.__context__
        while cause is not None:
            objects.append(cause)
            cause = cause.__cause__ or cause.__context__

    texts = {
        "caplog": [r.getMessage() for r in caplog.records] + [caplog.text],
        "root handler": root_handler.lines,
        "repr/str": [repr(o) for o in objects] + [str(o) for o in objects],
        "request/response headers": [
            repr(getattr(getattr(e, "request", None), "headers", None)) for e in errors
        ]
        + [repr(getattr(getattr(e, "response", None), "headers", None)) for e in errors],
        "pickles": [p.decode("latin-1") for p in pickles],
        "sampler handles": handles + [decoded_handle(h) for h in handles],
        "hook events": [repr(e) for e in events],
    }
    # the DEBUG lines of the request path in use were captured (and are checked below)
    marker = "urllib3.connectionpool" if transport_path == "urllib3" else "new connection to"
    assert len(root_handler.lines) > 50 and any(marker in line for line in root_handler.lines)
    named = {
        "api key": api_key,
        "cloudflare secret": cf_secret,
        "bad credential": bad_key,
        **{f"weights token {i}": t for i, t in enumerate(weights_tokens)},
        **{f"jwt {i}": t for i, t in enumerate(jwts)},
    }
    leaks = []
    for secret_name, secret in named.items():
        needles = pieces(secret)
        for where, items in texts.items():
            for text in items:
                hit = next((n for n in needles if n in text), None)
                if hit is not None:
                    at = text.find(hit)
                    leaks.append(
                        f"{secret_name} in {where}: ...{text[max(0, at - 60) : at + 60]}..."
                    )
                    break
    assert not leaks, "\n".join(leaks[:10])


def _escaped_echoes(key: str) -> dict[str, str]:
    return {
        "JSON \\u escapes": "".join(f"\\u{ord(c):04x}" if c in "tml" else c for c in key),
        "URL-encoding": "".join(f"%{b:02X}" for b in key.encode()),
        "base64": base64.b64encode(f"Bearer {key}".encode()).decode(),
    }


@pytest.mark.parametrize("form", list(_escaped_echoes("x")))
def test_a_key_echoed_back_escaped_is_scrubbed_from_the_error(form: str) -> None:
    """A server echoing the key in an error body, escaped: neither the exception's ``.body``,
    its message nor its pickle holds the key or the escaped echo."""
    key = fake_secret("tml-")
    echo = _escaped_echoes(key)[form]
    with LocalServer(backend="instant", api_key=None) as server:
        raw = '{"detail": "bad key ' + echo + '"}'  # sent as is: the escapes reach the client
        server.faults.add(Fault(endpoint="training_runs", status=400, body=raw, times=None))
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=key, max_retries=0)
        try:
            with pytest.raises(tinker_sync.BadRequestError) as info:
                service.create_rest_client().list_training_runs().result(timeout=HANG)
        finally:
            service.close()
    exc = info.value
    for text in (repr(exc.body), str(exc), repr(pickle.loads(pickle.dumps(exc)).body)):
        plain = urllib.parse.unquote(text.encode().decode("unicode_escape"))
        assert key not in plain and echo not in text, text
        assert key[4:16] not in plain
    assert "<redacted>" in str(exc)


def _reachable_from_modules(value: str) -> list[str]:
    """Module globals (by module and name) from which a str containing ``value`` is reachable."""
    import gc
    import sys

    found: list[str] = []
    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        if module is None or name == __name__:
            continue
        for attr, start in list(vars(module).items()):
            stack = [start]
            while stack:
                obj = stack.pop()
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
                if isinstance(obj, str):
                    if value in obj:
                        found.append(f"{name}.{attr}")
                    continue
                if isinstance(obj, (bytes, int, float, type(None))):
                    continue
                stack.extend(gc.get_referents(obj))
    return found


def test_no_secret_is_reachable_from_a_module_global_once_its_client_is_closed() -> None:
    import gc

    from tinker_sync._runtime import redact

    key = fake_secret("tml-")

    def use_and_close() -> None:
        with LocalServer(backend="instant", api_key=None) as server:
            service = tinker_sync.ServiceClient(base_url=server.url, api_key=key)
            service.create_rest_client().list_training_runs().result(timeout=HANG)
            assert key in redact._known  # scrubbed while a client holds it
            service.close()

    use_and_close()
    gc.collect()
    assert key not in redact._known
    assert _reachable_from_modules(key) == []
