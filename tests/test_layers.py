"""The package's layers contract: which package may import which (lazy imports inside functions count).

The stack, bottom up (a package may import from its own layer's package and from any layer below,
never from a sibling on its layer or from above):

    face          torchrecord/__init__.py, __main__
    commands      cli, convert, transforms
    features      _mix | _streams | _robomimic | _lerobot | _memory
    operations    _read | _write | _check
    sets          _shards
    storage       _storage
    store         _store
    core          _core
    base          _order | errors | _proto | _version
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "torchrecord"

LAYERS: list[list[str]] = [
    ["__main__"],
    ["cli", "convert", "transforms"],
    ["_mix", "_streams", "_robomimic", "_lerobot", "_memory"],
    ["_read", "_write", "_check"],
    ["_shards"],
    ["_storage"],
    ["_store"],
    ["_core"],
    ["_order", "errors", "_proto", "_version"],
]
#: Siblings on one layer that may import each other (the first from the second), with the reason.
ALLOWED_SIBLINGS: dict[tuple[str, str], str] = {
    ("cli", "convert"): "the command line runs the converters",
    ("_order", "errors"): "the order functions check their arguments and raise torchrecord's errors",
}
#: Imports that break the contract today, each to be removed (the test fails once one no longer exists).
PENDING: dict[tuple[str, str], str] = {}


def _unit(module: str) -> str:
    """The contract's unit of a dotted module name: its first part below ``torchrecord``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _is_module(root: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (root / rel).with_suffix(".py").exists() or (root / rel / "__init__.py").exists()


def _is_type_checking(node: ast.AST) -> bool:
    """True for ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): a block that never runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(tree: ast.AST, typing: bool) -> list[ast.AST]:
    """Every node of ``tree``; without ``typing``, none inside an ``if TYPE_CHECKING:`` block."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if not typing and isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)  # the else branch runs
            else:
                stack.append(child)
    return out


def module_imports(root: Path = PACKAGE, typing: bool = True) -> dict[str, set[str]]:
    """Module -> modules of the package it imports anywhere in its body, lazy imports included.

    ``typing=False`` leaves out imports made for type checking only (``if TYPE_CHECKING:``):
    they never run, so they make no import circle; the layers contract counts them.
    """
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        name = ".".join(parts)
        targets: set[str] = set()
        for node in _nodes(ast.parse(path.read_text(encoding="utf-8")), typing):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parts if is_package else parts[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                names = {f"{prefix}.{a.name}" for a in node.names}
                if prefix == "torchrecord":  # `from torchrecord import x`: a submodule, or a name of the face
                    face = {n for n in names if not _is_module(root, n)}
                    targets.update(names - face)
                    if face:
                        targets.add("torchrecord")
                else:
                    targets.add(prefix)
                    targets.update(names)
        graph[name] = {t for t in targets if t.startswith("torchrecord.") or t == "torchrecord"}
    return graph


def violations(graph: dict[str, set[str]], layers: list[list[str]] = LAYERS) -> list[str]:
    """Every import that climbs a layer or crosses to a sibling not allowed to."""
    level = {unit: i for i, layer in enumerate(layers) for unit in layer}
    found = []
    for module, targets in graph.items():
        unit = _unit(module)
        if unit == "":  # the face re-exports everything
            continue
        if unit not in level:
            found.append(f"{module}: its package {unit!r} is in no layer")
            continue
        for target in sorted(targets):
            if any(module == m and target.startswith(t) for m, t in PENDING):
                continue
            other = _unit(target)
            if other == unit or other not in level:
                if other == "" and target == "torchrecord":
                    found.append(f"{module} imports the package face")
                continue
            if level[other] < level[unit] or (level[other] == level[unit] and (unit, other) not in ALLOWED_SIBLINGS):
                found.append(f"{module} imports {target} ({other} is not below {unit})")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan); targets resolved to known modules."""
    resolved: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out = set()
        for t in targets:
            while t and t not in graph:
                t = t.rpartition(".")[0]
            if t and t != module and t != "torchrecord" and (module, t) not in PENDING:
                out.add(t)
        resolved[module] = out
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in resolved[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(resolved):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert circles(module_imports(typing=False)) == []


def test_type_checking_imports_count_for_layers_only(tmp_path: Path) -> None:
    """Control: an ``if TYPE_CHECKING:`` import is left out of the circle graph, kept in the layers graph."""
    package = tmp_path / "torchrecord"
    package.mkdir()
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torchrecord.b\n")
    (package / "b.py").write_text("import torchrecord.a\n")
    assert "torchrecord.b" in module_imports(package)["torchrecord.a"]
    assert module_imports(package, typing=False)["torchrecord.a"] == set()
    assert circles(module_imports(package)) == [["torchrecord.a", "torchrecord.b"]]
    assert circles(module_imports(package, typing=False)) == []


def test_layers_contract() -> None:
    assert violations(module_imports()) == []


def test_pending_exceptions_still_exist() -> None:
    """An exception to the contract that the code no longer needs is removed from PENDING."""
    graph = module_imports()
    assert all(target in graph[module] for module, target in PENDING), PENDING


def test_every_package_is_in_a_layer() -> None:
    units = {_unit(m) for m in module_imports()} - {""}
    placed = {unit for layer in LAYERS for unit in layer}
    assert units <= placed, units - placed


@pytest.mark.parametrize(
    "graph, expect",
    [
        ({"torchrecord._core.a": {"torchrecord._store.b"}, "torchrecord._store.b": set()}, "climbs"),
        ({"torchrecord._read.a": {"torchrecord._write.b"}, "torchrecord._write.b": set()}, "sibling"),
        ({"torchrecord._store.a": {"torchrecord"}}, "face"),
    ],
)
def test_the_contract_check_can_fail(graph: dict[str, set[str]], expect: str) -> None:
    """Control: an upward import, a sibling import and an import of the face are each reported."""
    assert violations(graph)


def test_the_circle_check_can_fail() -> None:
    graph = {"torchrecord.a": {"torchrecord.b"}, "torchrecord.b": {"torchrecord.a"}, "torchrecord.c": set()}
    assert circles(graph) == [["torchrecord.a", "torchrecord.b"]]
