"""No secret in any log line, repr, exception string or default pickle
(docs/design/behavior.md#secrets-never-leak).

A quickstart runs with DEBUG logging of ``tinker_sync`` and ``urllib3`` (through caplog) using
distinctive fake secrets: the API key, the exchanged JWT, the Cloudflare client secret and a
weights-access token. Then every artefact a user might share is searched for them.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

import numpy as np
import pytest

import tinker_sync
from tinker_sync import types
from tinker_sync.local import LocalServer

HANG = 60.0
API_KEY = "tml-SeCrEtApIkEy0123456789abcdefXYZ"
WRONG_KEY = "tml-WrOnGkEy9876543210zyxwvuZYXWVU"
CF_SECRET = "cfsecret-Qw3rTy-7788-distinctive"
WEIGHTS_TOKEN = "wat-SeCrEtWeIgHtS-5566-token"


def datum() -> types.Datum:
    t = np.arange(6, dtype=np.int64)
    return types.Datum(
        model_input=types.ModelInput.from_ints(t[:-1]), loss_fn_inputs={"target_tokens": t[1:]}
    )


def texts_of(obj: Any) -> list[str]:
    return [repr(obj), str(obj)]


def test_debug_quickstart_reprs_exceptions_and_pickles_hold_no_secret(
    monkeypatch, caplog, transport_path
):
    """Pins docs/design/behavior.md#secrets-never-leak."""
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_ID", "cf-client-id.access")
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_SECRET", CF_SECRET)
    caplog.set_level(logging.DEBUG, logger="tinker_sync")
    caplog.set_level(logging.DEBUG, logger="urllib3")
    artefacts: list[str] = []
    blobs: list[bytes] = []
    config = {"pjwt_auth_enabled": True}
    with LocalServer(api_key=API_KEY, client_config=config, long_poll_s=1.0) as server:
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=API_KEY)
        try:
            training = service.create_lora_training_client("base", rank=4)
            jwt = service._session.transport.auth.token()
            assert jwt.startswith("eyJ") and jwt != API_KEY
            fwd = training.forward_backward([datum()], "cross_entropy")
            opt = training.optim_step(types.AdamParams(learning_rate=1e-3))
            fwd.result(HANG)
            opt.result(HANG)
            path = training.save_state("ckpt").result(HANG).path
            resumed = service.create_training_client_from_state(
                path, weights_access_token=WEIGHTS_TOKEN
            )
            sampler = training.save_weights_and_get_sampling_client()
            sample = sampler.sample(
                types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=3)
            )
            sample.result(HANG)
            rest = service.create_rest_client()
            runs = rest.list_training_runs().result(HANG)
            tokenizer = training.get_tokenizer()

            # failures of every kind, with the secrets in flight
            server.faults.add("optim_step 400 x1")
            server.faults.add("retrieve_future fail:user match.request_type=Forward")
            errors: list[BaseException] = []
            for call in (
                lambda: training.optim_step(types.AdamParams()).result(HANG),
                lambda: training.forward([datum()], "cross_entropy").result(HANG),
            ):
                with pytest.raises(tinker_sync.TinkerError) as info:
                    call()
                errors.append(info.value)
            bad = tinker_sync.ServiceClient(base_url=server.url, api_key=WRONG_KEY)
            with pytest.raises(tinker_sync.AuthenticationError) as auth_info:
                bad.create_sampling_client(base_model="base")
            errors.append(auth_info.value)
            bad.close()

            for obj in (
                service,
                training,
                resumed,
                sampler,
                rest,
                tokenizer,
                fwd,
                opt,
                sample,
                runs,
                service._config,
                service._session.transport,
                service._session.transport.auth,
                service._session.config.credentials,
            ):
                artefacts.extend(texts_of(obj))
            for exc in errors:
                artefacts.extend(texts_of(exc))
                artefacts.extend(getattr(exc, "__notes__", []))
                for part in ("request", "response"):
                    snap = getattr(exc, part, None)
                    if snap is not None:
                        artefacts.extend(texts_of(snap))
                        artefacts.append(repr(getattr(snap, "headers", None)))
                blobs.append(pickle.dumps(exc))
                artefacts.extend(texts_of(pickle.loads(pickle.dumps(exc))))
            blobs.append(pickle.dumps(sampler))
            artefacts.append(sampler.get_sampler_handle())
            cf_sent = [
                r.headers.get("cf-access-client-secret")
                for r in server.requests.filter(endpoint="client/config")
            ]
            assert cf_sent and all(v not in (None, CF_SECRET) for v in cf_sent)  # sent, redacted
        finally:
            service.close()

    formatter = logging.Formatter()
    for record in caplog.records:
        artefacts.append(record.getMessage())
        if record.exc_info:
            artefacts.append(formatter.formatException(record.exc_info))
    assert any("X-API-Key" in a or "x-api-key" in a for a in artefacts)  # headers were dumped
    if transport_path == "urllib3":  # urllib3's own DEBUG lines were captured and checked
        assert any(r.name.startswith("urllib3.connectionpool") for r in caplog.records)
    else:  # the direct path's (docs/transport.md)
        assert any(r.getMessage().startswith("new connection to") for r in caplog.records)
    secrets = [API_KEY, WRONG_KEY, CF_SECRET, WEIGHTS_TOKEN, jwt]
    for secret in secrets:
        for text in artefacts:
            assert secret not in text, (secret[:8], text[:300])
        for blob in blobs:
            assert secret.encode() not in blob, secret[:8]
    assert len(errors) == 3


def test_an_opted_in_pickle_carries_the_key_but_never_cf_secrets(server, monkeypatch):
    """``pickle_credentials=True`` is the only way a key reaches a pickle
    (docs/design/behavior.md#credential-free-pickles, docs/design/behavior.md#secrets-never-leak).
    """
    monkeypatch.setenv("CLOUDFLARE_ACCESS_CLIENT_SECRET", CF_SECRET)
    with tinker_sync.ServiceClient(
        base_url=server.url, api_key=server.api_key, pickle_credentials=True
    ) as service:
        sampler = service.create_sampling_client(base_model="base")
        blob = pickle.dumps(sampler)
    assert server.api_key.encode() in blob
    assert CF_SECRET.encode() not in blob
