"""``tinker://`` checkpoint paths: the official three-part form and the kind-less two-part form
some servers return from ``save_weights_for_sampler``."""

from __future__ import annotations

import pytest

import tinker_sync
from tinker_sync._paths import CheckpointPath, parse_checkpoint_path
from tinker_sync.checkpoints import target_dir_name
from tinker_sync.local import LocalServer
from tinker_sync.types import ParsedCheckpointTinkerPath


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("tinker://run-1/weights/s1", ("run-1", "weights/s1", "training")),
        ("tinker://run-1/sampler_weights/s1", ("run-1", "sampler_weights/s1", "sampler")),
        ("tinker://run-1/external_weights/s1", ("run-1", "external_weights/s1", "external")),
        ("tinker://run-1/s1", ("run-1", "s1", None)),
    ],
)
def test_accepted_forms(path: str, expected: tuple[str, str, str | None]) -> None:
    assert parse_checkpoint_path(path) == CheckpointPath(path, *expected)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "path",
    [
        "run-1/weights/s1",
        "tinker://run-1",
        "tinker://run-1/weights",  # a kind without a name is not a name
        "tinker://run-1//s1",
        "tinker:///s1",
        "tinker://run-1/other/s1",
        "tinker://a/b/c/d",
    ],
)
def test_rejected_forms_name_the_path(path: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_checkpoint_path(path)
    assert path in str(info.value) and "tinker://<run>/<name>" in str(info.value)


def test_the_official_type_keeps_the_official_rule() -> None:
    with pytest.raises(ValueError):
        ParsedCheckpointTinkerPath.from_tinker_path("tinker://run-1/s1")


def test_download_directory_name() -> None:
    assert target_dir_name("tinker://run-1/weights/s1") == "run-1_weights_s1"
    assert target_dir_name("tinker://run-1/s1") == "run-1_s1"


def test_rest_sends_a_two_part_path_to_the_server_as_its_checkpoint_id() -> None:
    with LocalServer() as server:
        rest = tinker_sync.RestClient(base_url=server.url, api_key=server.api_key)
        try:
            calls = [
                rest.publish_checkpoint_from_tinker_path,
                rest.unpublish_checkpoint_from_tinker_path,
                rest.delete_checkpoint_from_tinker_path,
            ]
            for call in calls:
                call("tinker://run-1/s1").exception(60)  # this server knows no such run
            sent = [(r.method, r.path) for r in server.requests.all()]
        finally:
            rest.close()
    checkpoint = "/api/v1/training_runs/run-1/checkpoints/s1"
    assert ("POST", f"{checkpoint}/publish") in sent
    assert ("DELETE", f"{checkpoint}/publish") in sent
    assert ("DELETE", checkpoint) in sent
