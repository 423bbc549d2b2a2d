"""Dependency declarations: the lowest-versions CI run pins exactly setup.cfg's floors, the pins
stay below the next major version, and protobuf is not something the SDK needs."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def _install_requires() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = {}
    for line in cfg["options"]["install_requires"].strip().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(.*)", line.strip())
        assert match, line
        out[match.group(1).lower()] = match.group(2)
    return out


def _lowest_pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "lowest-versions.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_lowest_versions_run_pins_every_floor() -> None:
    floors = {}
    for name, spec in _install_requires().items():
        match = re.search(r">=\s*([0-9][0-9.]*)", spec)
        assert match, f"{name}: every direct dependency needs a floor, got {spec!r}"
        floors[name] = Version(match.group(1))
    assert {name: Version(v) for name, v in _lowest_pins().items()} == floors


def test_urllib3_is_pinned_below_the_next_major() -> None:
    assert "<3" in _install_requires()["urllib3"]


def test_protobuf_is_not_installed_with_the_sdk() -> None:
    assert "protobuf" not in _install_requires()
