"""Python lists of numbers (issue 11, point 3): one 1-d tensor field, of any length.

The rule: a list whose items are all Python numbers of one kind (all bool, all
int, or ints and floats) is one leaf, stored as a 1-d array and read back as a
1-d tensor (bool, int64 or float64); tuples and other lists stay structures.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from torchrecord import RecordDataset, RecordWriter, write_record
from torchrecord.errors import SchemaError


def hf_rows(n: int) -> list[dict[str, Any]]:
    """Rows as Hugging Face ``datasets`` gives them: token ids of varying length and text."""
    return [{"input_ids": list(range(i, i + 3 + i % 7)), "text": f"sample n°{i} ✓"} for i in range(n)]


def test_variable_length_token_lists_round_trip(tmp_path: Path) -> None:
    rows = hf_rows(40)
    rf = write_record(rows, tmp_path / "hf.tr", shuffle=False, progress=False)
    assert rf.schema.names == ["input_ids", "text"]
    ids = rf.schema.fields[0]
    assert (ids.kind, ids.dtype, ids.shape) == ("tensor", "int64", (None,))
    for row, stored in zip(rows, rf):
        assert isinstance(stored["input_ids"], torch.Tensor)
        assert stored["input_ids"].dtype == torch.int64 and stored["input_ids"].tolist() == row["input_ids"]
        assert stored["text"] == row["text"]
    assert rf.write_summary.variable_fields == {}  # a list's length varies by nature: no warning


def test_a_fixed_length_list_is_one_field_not_n_scalars(tmp_path: Path) -> None:
    rows = [{"xyz": [float(i), i + 0.5, 2], "flags": [True, i % 2 == 0]} for i in range(10)]
    rf = write_record(rows, tmp_path / "f.tr", shuffle=False, progress=False)
    assert rf.schema.names == ["xyz", "flags"]
    xyz, flags = rf.schema.fields
    assert (xyz.dtype, xyz.shape, flags.dtype, flags.shape) == ("float64", (3,), "bool", (2,))
    assert rf.schema.is_fixed  # the fixed layout (fast path) applies
    assert rf[3]["xyz"].tolist() == [3.0, 3.5, 2.0] and rf[3]["flags"].tolist() == [True, False]
    batch = next(iter(RecordDataset(rf.path, batch_size=4, shuffle=False)))
    assert batch["xyz"].shape == (4, 3) and batch["xyz"].dtype == torch.float64


def test_empty_lists_take_the_dtype_of_the_field(tmp_path: Path) -> None:
    rows: list[Any] = [{"ids": []}, {"ids": [1, 2]}, {"ids": []}]
    rf = write_record(rows, tmp_path / "a.tr", shuffle=False, progress=False)
    assert [s["ids"].tolist() for s in rf] == [[], [1, 2], []]
    rows = [{"w": [0.5]}, {"w": []}]
    rf = write_record(rows, tmp_path / "b.tr", shuffle=False, progress=False)
    assert rf[1]["w"].dtype == torch.float64 and rf[1]["w"].numel() == 0


def test_tuples_and_mixed_lists_stay_structures(tmp_path: Path) -> None:
    rf = write_record([(i, 2 * i) for i in range(5)], tmp_path / "t.tr", shuffle=False, progress=False)
    assert rf.schema.names == ["0", "1"] and rf[2] == (2, 4)
    mixed = [[True, 1, "a"] for _ in range(3)]
    rf = write_record(mixed, tmp_path / "m.tr", shuffle=False, progress=False)
    assert rf.schema.names == ["0", "1", "2"] and rf[0] == [True, 1, "a"]


def test_pushed_lists_and_lists_inside_structures(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "w.tr", shuffle=False, progress=False) as w:
        for i in range(6):
            w.append(([i] * (i + 1), {"scores": [0.25] * (i + 1)}))
    assert w.result is not None
    assert w.result.schema.names == ["0", "1.scores"]
    sample = w.result[3]
    assert sample[0].tolist() == [3, 3, 3, 3] and sample[1]["scores"].tolist() == [0.25] * 4


def test_an_empty_first_list_then_floats_says_to_state_the_dtype(tmp_path: Path) -> None:
    rows: list[Any] = [{"w": []}, {"w": [0.5]}]
    with pytest.raises(SchemaError, match=r"sample 1, field 'w'.*empty.*schema=\{'w': 'float64'\}"):
        write_record(rows, tmp_path / "e.tr", shuffle=False, progress=False)


def test_a_list_of_strings_that_varies_is_refused_with_what_to_do(tmp_path: Path) -> None:
    rows = [{"id": i, "tokens": ["a"] * (3 + i)} for i in range(60)]
    path = tmp_path / "s.tr"
    with pytest.raises(SchemaError) as info:
        write_record(rows, path, shuffle=False, progress=False)
    message = str(info.value)
    assert "sample 1" in message and "sample 0" in message and "'tokens'" in message
    assert "list of 4 items" in message and "list of 3 items" in message
    assert "str" in message and "join" in message  # says what to do instead
    assert "tokens.40" not in message and len(message) < 900  # no wall of field names
    assert os.listdir(tmp_path) == []


def test_dict_keys_that_differ_are_named(tmp_path: Path) -> None:
    rows = [{"a": 1, "b": 2}, {"a": 1, "c": 2}]
    with pytest.raises(SchemaError, match=r"sample 1.*keys.*'c'.*sample 0.*'b'"):
        write_record(rows, tmp_path / "k.tr", shuffle=False, progress=False)


def test_nested_number_lists_are_refused_with_a_hint(tmp_path: Path) -> None:
    rows = [{"grid": [[1, 2]] * (1 + i)} for i in range(3)]
    with pytest.raises(SchemaError, match=r"'grid'.*np\.asarray"):
        write_record(rows, tmp_path / "g.tr", shuffle=False, progress=False)


def test_int_lists_out_of_int64_are_named(tmp_path: Path) -> None:
    from torchrecord.errors import SampleValueError

    with pytest.raises(SampleValueError, match=r"sample 0.*field 'big'.*int64"):
        write_record([{"big": [1, 2**70]}], tmp_path / "b.tr", progress=False)
