"""Flatten a sample (nested tuples, lists and dicts of leaves) and rebuild it.

The structure is described by a small msgpack-able tree, stored once in the
metadata, so each record holds only the leaves, in a fixed order:

    leaf:  {"t": "leaf"}
    tuple: {"t": "tuple", "c": [child, ...]}
    list:  {"t": "list", "c": [child, ...]}
    dict:  {"t": "dict", "k": [key, ...], "c": [child, ...]}   (str keys, insertion order)

A Python list whose items are all numbers of one kind (all ``bool``, all ``int``,
or ``int`` and ``float`` mixed; the empty list too) is a leaf, not a structure:
it is stored as one 1-d array (see :func:`number_list_dtype`). Tuples, and lists
holding anything else, stay structures.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from torchrecord.errors import SampleTypeError

__all__ = ["field_names", "first_difference", "flatten", "number_list_dtype", "unflatten"]

Tree = dict[str, Any]

_LEAF: Tree = {"t": "leaf"}

_NUMBERS = frozenset({bool, int, float})
#: leaf types that are never structures (no tuple, list or Mapping among them or their instances)
_PLAIN = frozenset({bool, int, float, bytes, str, type(None), np.ndarray, torch.Tensor})


def number_list_dtype(node: Any) -> str | None:
    """The dtype a list of Python numbers is stored as, or None if ``node`` is not one.

    All ``bool``: ``"bool"``; all ``int``: ``"int64"``; ``int`` and ``float``
    (at least one float): ``"float64"``; the empty list: ``"int64"`` (the writer
    gives it the dtype of its field). Lists mixing bool with other numbers, or
    holding anything but exact ``bool``/``int``/``float`` objects, are not.
    """
    if type(node) is not list:
        return None
    kinds = {type(x) for x in node}
    if not kinds <= _NUMBERS:
        return None
    if kinds == {bool}:
        return "bool"
    if bool in kinds:
        return None
    return "float64" if float in kinds else "int64"


def flatten(sample: Any) -> tuple[Tree, list[Any]]:
    """Split ``sample`` into its structure tree and the list of its leaves."""
    leaves: list[Any] = []
    return _flatten(sample, leaves, depth=0), leaves


def _flatten(node: Any, leaves: list[Any], depth: int) -> Tree:
    if depth > 32:
        raise SampleTypeError("sample nesting is deeper than 32 levels")
    kind = type(node)
    if kind in _PLAIN:  # a tensor, array, number or string: a leaf, without the ABC checks below
        leaves.append(node)
        return _LEAF
    if kind is dict:  # the usual batch: keys checked as below, without the Mapping ABC check
        keys = list(node)
        for key in keys:
            if not isinstance(key, str):
                raise SampleTypeError(f"dict keys in a sample must be str, got {type(key).__name__} {key!r}")
        return {"t": "dict", "k": keys, "c": [_flatten(node[k], leaves, depth + 1) for k in keys]}
    if kind is tuple and depth < 32:
        for x in node:
            if type(x) not in _PLAIN:
                break
        else:  # a flat tuple of plain leaves (the usual sample): what the general walk below gives
            leaves.extend(node)
            return {"t": "tuple", "c": [_LEAF] * len(node)}
    if isinstance(node, tuple) and not hasattr(node, "_fields"):
        return {"t": "tuple", "c": [_flatten(x, leaves, depth + 1) for x in node]}
    if isinstance(node, list):
        if number_list_dtype(node) is not None:
            leaves.append(node)
            return _LEAF
        return {"t": "list", "c": [_flatten(x, leaves, depth + 1) for x in node]}
    if isinstance(node, Mapping):
        keys = list(node.keys())
        for key in keys:
            if not isinstance(key, str):
                raise SampleTypeError(f"dict keys in a sample must be str, got {type(key).__name__} {key!r}")
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


def first_difference(a: Tree, b: Tree) -> tuple[str, Tree, Tree, int, int] | None:
    """Where two structures first differ, or None if they are equal.

    Returns the dotted name of the differing node (``""`` for the root), the
    node in ``a`` and in ``b``, and the positions of their first leaves among
    ``a``'s and ``b``'s leaves.
    """
    counters = [0, 0]
    return _difference(a, b, "", counters)


def _difference(a: Tree, b: Tree, prefix: str, counters: list[int]) -> tuple[str, Tree, Tree, int, int] | None:
    if a == b:
        counters[0] += _leaf_count(a)
        counters[1] += _leaf_count(b)
        return None
    same_kind = a["t"] == b["t"] and a["t"] != "leaf" and len(a["c"]) == len(b["c"])
    if not same_kind or (a["t"] == "dict" and a["k"] != b["k"]):
        return prefix, a, b, counters[0], counters[1]
    keys = a["k"] if a["t"] == "dict" else [str(i) for i in range(len(a["c"]))]
    for key, ca, cb in zip(keys, a["c"], b["c"]):
        found = _difference(ca, cb, f"{prefix}.{key}" if prefix else str(key), counters)
        if found is not None:
            return found
    return None


def _leaf_count(tree: Tree) -> int:
    if tree["t"] == "leaf":
        return 1
    return sum(_leaf_count(c) for c in tree["c"])
