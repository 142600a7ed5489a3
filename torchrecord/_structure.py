"""Flatten a sample (nested tuples, lists and dicts of leaves) and rebuild it.

The structure is described by a small msgpack-able tree, stored once in the
metadata, so each record holds only the leaves, in a fixed order:

    leaf:  {"t": "leaf"}
    tuple: {"t": "tuple", "c": [child, ...]}
    list:  {"t": "list", "c": [child, ...]}
    dict:  {"t": "dict", "k": [key, ...], "c": [child, ...]}   (str keys, insertion order)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["field_names", "flatten", "unflatten"]

Tree = dict[str, Any]

_LEAF: Tree = {"t": "leaf"}


def flatten(sample: Any) -> tuple[Tree, list[Any]]:
    """Split ``sample`` into its structure tree and the list of its leaves."""
    leaves: list[Any] = []
    return _flatten(sample, leaves, depth=0), leaves


def _flatten(node: Any, leaves: list[Any], depth: int) -> Tree:
    if depth > 32:
        raise TypeError("sample nesting is deeper than 32 levels")
    if isinstance(node, tuple) and not hasattr(node, "_fields"):
        return {"t": "tuple", "c": [_flatten(x, leaves, depth + 1) for x in node]}
    if isinstance(node, list):
        return {"t": "list", "c": [_flatten(x, leaves, depth + 1) for x in node]}
    if isinstance(node, Mapping):
        keys = list(node.keys())
        for key in keys:
            if not isinstance(key, str):
                raise TypeError(f"dict keys in a sample must be str, got {type(key).__name__} {key!r}")
        return {"t": "dict", "k": keys, "c": [_flatten(node[k], leaves, depth + 1) for k in keys]}
    leaves.append(node)
    return _LEAF


def unflatten(tree: Tree, leaves: list[Any]) -> Any:
    """Rebuild a sample from its tree and leaves (the inverse of :func:`flatten`)."""
    it = iter(leaves)
    return _build(tree, it)


def _build(tree: Tree, it: Iterator[Any]) -> Any:
    kind = tree["t"]
    if kind == "leaf":
        return next(it)
    children = [_build(c, it) for c in tree["c"]]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    return dict(zip(tree["k"], children))


def field_names(tree: Tree) -> list[str]:
    """Dotted names of the leaves in order: ``"0"``, ``"image"``, ``"meta.label"``.

    A sample that is a single leaf has the one field ``"value"``.
    """
    names: list[str] = []
    _names(tree, "", names)
    return names


def _names(tree: Tree, prefix: str, out: list[str]) -> None:
    kind = tree["t"]
    if kind == "leaf":
        out.append(prefix or "value")
        return
    keys = tree["k"] if kind == "dict" else [str(i) for i in range(len(tree["c"]))]
    for key, child in zip(keys, tree["c"]):
        _names(child, f"{prefix}.{key}" if prefix else str(key), out)
