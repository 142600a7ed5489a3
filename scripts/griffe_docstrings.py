"""A griffe extension for the API reference (mkdocs.yml): reads torchrecord's docstrings as Markdown.

The docstrings are Google style with a few reStructuredText habits that mkdocstrings would
otherwise print literally or misparse; this rewrites them when griffe loads an object
(the source files are not touched):

* ``:class:`~torchrecord.errors.StructureError``` and the other roles become inline code
  (`` `StructureError` ``);
* an ``Example:`` section becomes ``Examples:``, so its ``>>>`` lines render as code;
* a parameter entry that documents several names at once (``rank, world_size: ...``, its
  names possibly running over several lines) becomes one entry per name, so each is
  matched to the signature and shown with its type.
"""

from __future__ import annotations

import re
from typing import Any

try:
    from griffe import Extension
except ImportError:  # pragma: no cover - only used by mkdocs, where griffe is installed
    Extension = object  # type: ignore[assignment,misc]

_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`~?([^`]+)`")
_NAMES_CONTINUE = re.compile(r"^(\s+)([A-Za-z_][\w]*(?:,\s*[A-Za-z_]\w*)*,)\s*\n\s+(?=[A-Za-z_])", re.M)


def _role(match: re.Match[str]) -> str:
    target = match.group(1)
    shown = target.rsplit(".", 1)[-1] if match.group(0).split("`")[1].startswith("~") else target
    return f"`{shown}`"


_SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Other Parameters):\s*$")
_SHARED = re.compile(r"^(\s+)([A-Za-z_]\w*(?:,\s*[A-Za-z_]\w*)+):(.*)$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _split_shared_entries(text: str) -> str:
    """One entry per name for ``a, b: description`` entries of the parameter sections."""
    lines = text.split("\n")
    out: list[str] = []
    section: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _SECTION.match(line)
        if header:
            section = len(header.group(1))
            out.append(line)
            i += 1
            continue
        if section is not None and line.strip() and _indent(line) <= section:
            section = None
        shared = _SHARED.match(line) if section is not None else None
        if not shared:
            out.append(line)
            i += 1
            continue
        indent, names, first = shared.groups()
        body = [first]
        i += 1
        while i < len(lines) and lines[i].strip() and _indent(lines[i]) > len(indent):
            body.append("\n" + lines[i])
            i += 1
        for name in (n.strip() for n in names.split(",")):
            out.append(f"{indent}{name}:{''.join(body)}")
    return "\n".join(out)


def rewrite(text: str) -> str:
    """The docstring ``text`` with roles as inline code, ``Example:`` as ``Examples:``, one entry per name."""
    text = _ROLE.sub(_role, text)
    text = re.sub(r"^(\s*)Example:\s*$", r"\1Examples:", text, flags=re.M)
    while True:
        joined = _NAMES_CONTINUE.sub(lambda m: f"{m.group(1)}{m.group(2)} ", text)
        if joined == text:
            break
        text = joined
    return _split_shared_entries(text)


class TorchrecordDocstrings(Extension):  # type: ignore[misc]
    """Rewrites each loaded object's docstring with :func:`rewrite`."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        """Called by griffe for every object it loads."""
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
