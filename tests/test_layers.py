"""Imports point down the layers ARCHITECTURE.md states, and the local server stays apart.

Every module of ``tinker_sync`` is read with :mod:`ast`: its imports at module level, inside
functions and methods, and the ``"tinker_sync.x.y"`` strings it hands to ``importlib``. An
import that runs (not under ``if TYPE_CHECKING:``) may only reach a unit of the same or a lower
layer; type-checking-only imports may point anywhere in the client. The table below is the one in
ARCHITECTURE.md ("Layers and the direction of imports"); a new module must be placed in it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tinker_sync"

#: Unit (a top-level module or subpackage of ``tinker_sync``; ``""`` is the package's own
#: ``__init__``) -> layer, as in ARCHITECTURE.md.
LAYERS: dict[str, int] = {
    # 5. entry points
    "": 5,
    "__main__": 5,
    "cli": 5,
    "testing": 5,
    "_alias": 5,
    "_alias_boot": 5,
    "lib": 5,
    "contrib": 5,
    # 4. public clients
    "service_client": 4,
    "training_client": 4,
    "_training": 4,
    "sampling_client": 4,
    "_sampling": 4,
    "rest_client": 4,
    "_pending": 4,
    "_validate": 4,
    "checkpoints": 4,
    "auth": 4,
    "tokenizer": 4,
    "_byte_tokenizer": 4,
    # 3. session and polling
    "_session": 3,
    "_polling": 3,
    "_futures": 3,
    # 2. request flow
    "_flow": 2,
    # 1. transport
    "_transport": 1,
    # 0. foundations
    "types": 0,
    "_wire": 0,
    "_config": 0,
    "_credentials": 0,
    "exceptions": 0,
    "_paths": 0,
    "_lazynp": 0,
    "_runtime": 0,
    "_version": 0,
    "_logging": 0,
}

#: Units whose private submodules others import directly, as their ``__init__`` says
#: (``_wire``: "import the submodules directly"); elsewhere a unit's ``_module`` stays inside it.
OPEN_SUBMODULES = frozenset({"_wire"})

#: The local server is not a layer of the client: it may use only these client modules (and
#: their submodules), and only the entry points (layer 5) may import it.
SERVER = "local"
SERVER_MAY_IMPORT = (
    "tinker_sync.types",
    "tinker_sync._wire",
    "tinker_sync._runtime.fork",
    "tinker_sync._runtime.redact",
)


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported module, dotted (a submodule when the name is one)
    name: str | None  # the name imported from ``target``'s parent, if any
    line: int
    type_checking: bool

    def __str__(self) -> str:
        where = " (TYPE_CHECKING)" if self.type_checking else ""
        return f"{self.source}:{self.line} imports {self.target}{where}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _exists(dotted: str, root: Path) -> bool:
    path = root.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports_of(source: str, module: str, is_package: bool, root: Path) -> list[Edge]:
    """Every ``tinker_sync`` import in ``source`` (the text of ``module``), at any depth."""
    package = module if is_package else module.rpartition(".")[0]
    edges: list[Edge] = []
    tree = ast.parse(source)
    logger_names = {  # "tinker_sync.x" given to getLogger names a logger, not a module
        id(arg)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "attr", getattr(call.func, "id", None)) == "getLogger"
        for arg in call.args
    }

    def visit(node: ast.AST, type_checking: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, type_checking)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.append(Edge(module, alias.name, None, node.lineno, type_checking))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if _exists(sub, root) else base
                edges.append(Edge(module, target, alias.name, node.lineno, type_checking))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("tinker_sync.")
            and id(node) not in logger_names
            and _exists(node.value, root)
        ):
            edges.append(Edge(module, node.value, None, node.lineno, type_checking))
        for child in ast.iter_child_nodes(node):
            visit(child, type_checking)

    visit(tree, False)
    return [e for e in edges if e.target == "tinker_sync" or e.target.startswith("tinker_sync.")]


def unit_of(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private_name(edge: Edge) -> str | None:
    """The underscored name ``edge`` takes from another unit, if any.

    A unit itself may be underscored (``_flow``, ``_pending``); what it holds may not cross:
    an ``_name`` defined in one of its modules, or an ``_module`` of it imported by name
    (except the units in OPEN_SUBMODULES).
    """
    name = edge.name
    if name is None or not name.startswith("_") or name.startswith("__"):
        return None
    if edge.target.endswith(f".{name}"):  # a submodule imported by name
        if len(edge.target.split(".")) == 2 or unit_of(edge.target) in OPEN_SUBMODULES:
            return None  # a unit (``from tinker_sync import _pending``) or an open submodule
    return name


def violations(edges: list[Edge]) -> list[str]:
    """The edges that run against the layers, the server rule or the private-name rule."""
    found: list[str] = []
    for edge in edges:
        src, dst = unit_of(edge.source), unit_of(edge.target)
        if src == dst:
            continue
        private = _private_name(edge)
        if private is not None:
            found.append(
                f"{edge}: {private} is private to {dst or 'tinker_sync'}; expose it without "
                "the underscore where it is defined, or re-export it"
            )
        if src == SERVER:
            if not edge.target.startswith(SERVER_MAY_IMPORT):
                found.append(f"{edge}: the local server uses only {', '.join(SERVER_MAY_IMPORT)}")
            continue
        if dst == SERVER:
            if LAYERS.get(src) != 5:
                found.append(f"{edge}: only the entry points (layer 5) use the local server")
            continue
        if src not in LAYERS or dst not in LAYERS:
            continue  # reported by test_every_module_has_a_layer
        if not edge.type_checking and LAYERS[dst] > LAYERS[src]:
            found.append(f"{edge}: layer {LAYERS[src]} imports layer {LAYERS[dst]} at run time")
    return found


def _all_edges() -> list[Edge]:
    edges: list[Edge] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path, PACKAGE)
        source = path.read_text(encoding="utf-8")
        edges += imports_of(source, module, path.name == "__init__.py", PACKAGE)
    return edges


def test_every_module_has_a_layer() -> None:
    units = {unit_of(module_name(p, PACKAGE)) for p in PACKAGE.rglob("*.py")}
    unplaced = sorted(units - set(LAYERS) - {SERVER})
    assert not unplaced, f"place these in LAYERS and in ARCHITECTURE.md's layer table: {unplaced}"
    assert not set(LAYERS) - units, "LAYERS names units that no longer exist"


def test_the_top_level_holds_at_most_12_private_modules() -> None:
    """Private machinery lives in subpackages named for their concern (ARCHITECTURE.md)."""
    private = sorted(p.name for p in PACKAGE.glob("_*.py") if not p.name.startswith("__"))
    assert len(private) <= 12, f"{len(private)} private modules at the top: {private}"


def test_imports_follow_the_layers() -> None:
    found = violations(_all_edges())
    assert not found, "imports against the layers of ARCHITECTURE.md:\n" + "\n".join(found)


def _declared_imports(package: Path) -> set[str] | None:
    """The units a subpackage's ``__init__`` docstring says it imports ("Imports: ...;")."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
    if not doc or "Imports:" not in doc:
        return None
    declared = doc.split("Imports:", 1)[1].split(";", 1)[0]
    return {
        unit_of(f"tinker_sync.{name.removeprefix('tinker_sync.')}")
        for name in re.findall(r"``([\w.]+)``", declared)
    }


def test_each_subpackage_imports_what_its_docstring_says() -> None:
    edges = _all_edges()
    checked = 0
    for package in sorted(p.parent for p in PACKAGE.glob("_*/__init__.py")):
        declared = _declared_imports(package)
        if declared is None:
            continue
        checked += 1
        unit = package.name
        undeclared = sorted(
            {
                f"{e.source} imports {e.target}"
                for e in edges
                if unit_of(e.source) == unit
                and unit_of(e.target) not in (unit, *declared)
                and not e.type_checking
            }
        )
        assert not undeclared, f"{unit}/__init__.py does not list these imports: {undeclared}"
    assert checked >= 6


def test_the_table_matches_architecture_md() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    rows = {
        int(line.split("|")[1].strip().split(".")[0]): line
        for line in text.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()
    }
    for unit, layer in LAYERS.items():
        if not unit:
            continue
        named = re.compile(rf"`{re.escape(unit)}[`/. ]")
        listed = sorted(n for n, row in rows.items() if named.search(row.split("|")[2]))
        assert listed == [layer], f"ARCHITECTURE.md lists `{unit}` in layers {listed}, not {layer}"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # a foundation importing a client at run time, even inside a function
        ("tinker_sync._config", "def f():\n    import tinker_sync.service_client\n", 1),
        # the same import for type hints only is allowed
        (
            "tinker_sync._config",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from tinker_sync.service_client import ServiceClient\n",
            0,
        ),
        # transport importing the request flow (layer 1 -> 2), via importlib's string
        ("tinker_sync._transport._client", "M = 'tinker_sync._flow.retry'\n", 1),
        # the server reaching into client logic, and its allowed imports
        ("tinker_sync.local._polls", "from tinker_sync._polling.hold import X\n", 1),
        ("tinker_sync.local._polls", "from tinker_sync._wire import _pbwire\n", 0),
        ("tinker_sync.local._polls", "from tinker_sync._runtime import clock\n", 1),
        # a client importing the server
        ("tinker_sync._session.state", "from tinker_sync.local import LocalServer\n", 1),
        # a relative import resolved against the package
        ("tinker_sync._flow.retry", "from ..sampling_client import SamplingClient\n", 1),
        # an underscored name from another unit (also for type hints), and the allowed forms
        ("tinker_sync._sampling.job", "from tinker_sync._flow.retry import _header\n", 1),
        ("tinker_sync._polling.loop", "from tinker_sync._transport import _pools\n", 1),
        ("tinker_sync._flow.retry", "from tinker_sync._flow.limiter import _x\n", 0),
        ("tinker_sync._sampling.job", "from tinker_sync._wire import _proto\n", 0),
        ("tinker_sync.training_client", "from tinker_sync import _pending\n", 0),
    ],
)
def test_the_check_catches_a_wrong_edge(module: str, source: str, expected: int) -> None:
    edges = imports_of(source, module, False, PACKAGE)
    assert len(violations(edges)) == expected, edges
