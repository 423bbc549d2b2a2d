"""Unknown base model names: served with the local model and a warning, or rejected on demand."""

from __future__ import annotations

import logging

import pytest

import tinker_sync
from tinker_sync.cli import build_parser
from tinker_sync.local import LocalServer


def test_an_unknown_name_is_served_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tinker_sync.local")
    with LocalServer() as server:
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        try:
            service.create_lora_training_client("Qwen/Qwen3-8B", rank=4)
            service.create_lora_training_client("Qwen/Qwen3-8B", rank=4)
            service.create_lora_training_client("tinker-sync/tiny", rank=4)
        finally:
            service.close()
    warnings = [r.getMessage() for r in caplog.records if "unknown base model" in r.getMessage()]
    assert len(warnings) == 1 and "'Qwen/Qwen3-8B'" in warnings[0]
    assert "--reject-unknown-models" in warnings[0]


def test_unknown_names_can_be_rejected_like_the_hosted_service() -> None:
    with LocalServer(accept_any_model=False) as server:
        service = tinker_sync.ServiceClient(base_url=server.url, api_key=server.api_key)
        try:
            with pytest.raises(tinker_sync.BadRequestError, match="unknown base model"):
                service.create_lora_training_client("Qwen/Qwen3-8B", rank=4)
            service.create_lora_training_client("tinker-sync/tiny", rank=4)
        finally:
            service.close()


def test_serve_has_a_flag_for_it() -> None:
    parser = build_parser(["serve"])
    assert parser.parse_args(["serve", "--reject-unknown-models"]).reject_unknown_models
    assert not parser.parse_args(["serve"]).reject_unknown_models
