"""The repository explains itself: every design citation points at a page that is in it.

Code, tests and docs cite ``docs/design/<page>.md#<anchor>``. This test fails when a citation
names an anchor that does not exist, or when a citation of the design documents that were never
part of the repository (numbered behaviour ids, spec section signs, test-plan ids) comes back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design"
SCANNED_DIRS = ("tinker_sync", "tests", "docs", "benchmarks", "examples", "scripts", ".ci")
SCANNED_FILES = ("README.md", "CHANGELOG.md", "ARCHITECTURE.md", "setup.cfg", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".md", ".proto", ".pyi", ".cfg", ".toml", ".txt", ".json", ".sh", ""}

_SPEC = "|".join(("SURF" + "ACE", "BEHAV" + "IOR", "PROTO" + "COL", "LAY" + "OUT"))
#: Citations of documents outside the repository, and of their numbered items.
FOREIGN = re.compile(
    r"\b(?:" + _SPEC + r")\.md\b"  # the spec files by name
    r"|\b(?:" + _SPEC + r")\s*(?:\u00a7|section\s+\d|\d)"  # "SPEC §7.3", "SPEC 2.3"
    r"|\u00a7"  # any section sign
    r"|\bB\d{1,2}\b"  # behaviour numbers
    r"|\bT-[A-L]\d{1,2}\b"  # test-plan ids
)
CITATION = re.compile(r"docs/design/([\w.-]+\.md)(?:#([\w-]+))?")
ANCHOR = re.compile(r'<a id="([\w-]+)"></a>')


def _files() -> list[Path]:
    found = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for top in SCANNED_DIRS:
        base = ROOT / top
        if base.is_dir():
            found += [p for p in base.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    this = Path(__file__).resolve()
    return sorted(
        p
        for p in found
        if p.resolve() != this and "__pycache__" not in p.parts and not p.name.endswith("_pb2.py")
    )


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def _anchors() -> dict[str, set[str]]:
    return {page.name: set(ANCHOR.findall(page.read_text())) for page in DESIGN.glob("*.md")}


def test_the_design_pages_exist_and_define_anchors() -> None:
    anchors = _anchors()
    assert {"README.md", "protocol.md", "behavior.md", "surface.md", "local-server.md"} <= set(
        anchors
    )
    assert all(anchors[page] for page in anchors if page != "README.md")


def test_no_citation_of_documents_outside_the_repository() -> None:
    offenders = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = FOREIGN.search(line)
            if match:
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert not offenders, "cite docs/design/<page>.md#<anchor> instead:\n" + "\n".join(offenders)


def test_every_design_citation_resolves() -> None:
    anchors = _anchors()
    broken = []
    cited = 0
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for page, anchor in CITATION.findall(line):
                cited += 1
                if page not in anchors or (anchor and anchor not in anchors[page]):
                    broken.append(f"{path.relative_to(ROOT)}:{number}: {page}#{anchor}")
    for page in DESIGN.glob("*.md"):
        for target, anchor in re.findall(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)", page.read_text()):
            if target not in anchors or (anchor and anchor not in anchors[target]):
                broken.append(f"docs/design/{page.name}: link {target}#{anchor}")
    assert cited > 100  # the code does cite the design pages
    assert not broken, "unknown design page or anchor:\n" + "\n".join(broken)


@pytest.mark.parametrize(
    "line",
    ["see B13 here", "(PROTO" + "COL §4.2)", "SURF" + "ACE.md", "test T-A4", "SURF" + "ACE 2.3"],
)
def test_the_guard_recognises_each_citation_form(line: str) -> None:
    assert FOREIGN.search(line)


@pytest.mark.parametrize(
    "line", ["PROTOCOL_VERSION = '0.38.0'", "ssl.PROTOCOL_TLS_SERVER", "10 MiB", "bf16 -> f32"]
)
def test_the_guard_leaves_ordinary_code_alone(line: str) -> None:
    assert not FOREIGN.search(line)
