"""The public signatures speak the vocabulary of docs/vocabulary.md.

The table there names, per concept, the option (with its default and whether it
is keyword-only), where it appears, and the retired spelling it replaced. This
test parses the table and checks every public reader, iterator, file and writer
against it: a name the table lists for a class is there with the stated default
and keyword-only-ness, and no class uses a retired name.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import torchrecord

TABLE = Path(__file__).resolve().parent.parent / "docs" / "vocabulary.md"

READERS = ("RecordDataset", "MixedDataset", "StreamDataset", "WindowDataset")
WRITERS = ("write_record", "RecordWriter", "write_shard")
CHECKED = (*READERS, "SequenceDataset", "BatchIter", "GroupBatchIter", "RecordFile", *WRITERS)
#: Retired spellings, besides those the table names with "(was ...)".
RETIRED = {"verify", "tail", "block", "cache"}

_NO_DEFAULT: Any = object()


@dataclass
class Name:
    """One name of the table: an option (with its default, if stated) or a method (``name()``)."""

    name: str
    method: bool = False
    default: Any = _NO_DEFAULT
    keyword_only: bool = False


@dataclass
class Row:
    concept: str
    names: list[Name]
    where: set[str]
    retired: set[str] = field(default_factory=set)


def _where(text: str) -> set[str]:
    out: set[str] = set()
    for term in (t.strip() for t in text.split(",")):
        but = re.fullmatch(r"every reader but (\w+)", term)
        if but:
            out |= set(READERS) - {but.group(1)}
        elif term == "every reader":
            out |= set(READERS)
        elif term == "writers":
            out |= set(WRITERS)
        elif term in CHECKED:
            out.add(term)
    return out


def _names(text: str) -> tuple[list[Name], set[str]]:
    retired = set(re.findall(r"was `(\w+)`", text))
    text = re.sub(r"\(was [^)]*\)", "", text)
    names = []
    for match in re.finditer(r"`([^`]+)`(\s*\(keyword-only\))?", text):
        body, keyword_only = match.group(1), bool(match.group(2))
        method = re.fullmatch(r"(\w+)\(\)", body)
        if method:
            names.append(Name(method.group(1), method=True))
            continue
        option = re.fullmatch(r"(\w+)(?:\s*:\s*[^=]+?)?(?:\s*=\s*(.+))?", body)
        if option is None:
            continue  # a call or a sentence in backticks (verify(path), TorchRecordError): not an option
        default = ast.literal_eval(option.group(2)) if option.group(2) is not None else _NO_DEFAULT
        names.append(Name(option.group(1), default=default, keyword_only=keyword_only))
    return names, retired


def parse_table(text: str) -> list[Row]:
    """The rows of the vocabulary table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| concept | name | where |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        concept, name_cell, where_cell = cells[0], cells[1], cells[2]
        names, retired = _names(name_cell)
        rows.append(Row(concept, names, _where(where_cell), retired))
    return rows


def parameters(obj: Any) -> dict[str, inspect.Parameter]:
    """The parameters a user passes: a class's ``__init__`` (without self), or a function's."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = dict(inspect.signature(target).parameters)
    params.pop("self", None)
    return params


def problems(rows: list[Row], classes: dict[str, Any], retired: set[str]) -> list[str]:
    """Every place where ``classes`` disagree with the table ``rows`` (empty: they agree)."""
    out = []
    for row in rows:
        for where in sorted(row.where):
            obj = classes.get(where)
            if obj is None:
                continue
            params = parameters(obj)
            for n in row.names:
                if n.method:
                    if not callable(getattr(obj, n.name, None)):
                        out.append(f"{where}: no method {n.name}() ({row.concept})")
                    continue
                p = params.get(n.name)
                if p is None:
                    out.append(f"{where}: no option {n.name!r} ({row.concept})")
                    continue
                if n.keyword_only and p.kind is not inspect.Parameter.KEYWORD_ONLY:
                    out.append(f"{where}: {n.name!r} is not keyword-only ({row.concept})")
                if n.default is not _NO_DEFAULT and p.default != n.default:
                    out.append(f"{where}: {n.name!r} defaults to {p.default!r}, the table says {n.default!r}")
    for where, obj in classes.items():
        for name in parameters(obj):
            if name in retired:
                out.append(f"{where}: uses the retired name {name!r}")
    return out


def _rows() -> list[Row]:
    return parse_table(TABLE.read_text())


def _classes() -> dict[str, Any]:
    return {name: getattr(torchrecord, name) for name in CHECKED}


def test_the_table_parses_into_what_it_says() -> None:
    rows = {row.concept: row for row in _rows()}
    assert {"batch size", "shuffle buffer", "end of epoch", "integrity on read", "frame cache"} <= set(rows)
    (batch,) = rows["batch size"].names
    assert batch.name == "batch_size" and batch.keyword_only
    assert rows["batch size"].where == {*READERS, "BatchIter"}
    assert [(n.name, n.default) for n in rows["shuffle buffer"].names] == [("shuffle_buffer", 8192)]
    assert rows["draws (mixing)"].retired == {"block"} and rows["frame cache"].retired == {"cache"}
    assert rows["collation"].where == set(READERS) - {"StreamDataset"}
    assert [n.name for n in rows["resume"].names if n.method] == ["state_dict", "load_state_dict"]


def test_public_signatures_match_the_vocabulary() -> None:
    rows = _rows()
    retired = RETIRED | {name for row in rows for name in row.retired}
    assert problems(rows, _classes(), retired) == []


def test_a_planted_mismatch_is_found() -> None:
    """The control: a class that drifts from the table in every way the check knows is caught each time."""

    class Drifted:
        def __init__(
            self, path: str, batch_size: int = 1, *, shuffle_buffer: int = 2048, block: int = 16, seed: int = 0
        ) -> None:
            pass

    rows = parse_table(
        "| concept | name | where | meaning |\n|---|---|---|---|\n"
        "| a | `batch_size` (keyword-only) | Drifted | |\n"
        "| b | `shuffle_buffer: int = 8192` | Drifted | |\n"
        "| c | `draw_size` (was `block`) | Drifted | |\n"
        "| d | `state_dict()` | Drifted | |\n"
        "| e | `seed: int = 0` | Drifted | |\n"
    )
    for row in rows:
        row.where = {"Drifted"}
    found = problems(rows, {"Drifted": Drifted}, {"block"})
    assert found == [
        "Drifted: 'batch_size' is not keyword-only (a)",
        "Drifted: 'shuffle_buffer' defaults to 2048, the table says 8192",
        "Drifted: no option 'draw_size' (c)",
        "Drifted: no method state_dict() (d)",
        "Drifted: uses the retired name 'block'",
    ]


@pytest.mark.parametrize("name", READERS)
def test_every_reader_has_the_reader_contract(name: str) -> None:
    """The four streaming datasets stand on the one base."""
    from torchrecord._read.base import ReaderDataset

    assert issubclass(getattr(torchrecord, name), ReaderDataset)
