"""Shapes that change (issue 11, point 4): a stated schema, or a warning and the summary."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchrecord import RecordFile, RecordWriter, write_record
from torchrecord.errors import SchemaError, VariableShapeWarning


def images(n: int, odd: int | None = None) -> Iterator[dict[str, Any]]:
    """A generator of {"image": uint8[3,32,32], "label"}; sample ``odd`` is [3,32,31]."""
    for i in range(n):
        width = 31 if i == odd else 32
        yield {"image": torch.zeros(3, 32, width, dtype=torch.uint8), "label": i}


def test_a_field_turning_variable_warns_and_is_in_the_summary(tmp_path: Path) -> None:
    with pytest.warns(VariableShapeWarning) as caught:
        rf = write_record(images(20, odd=7), tmp_path / "v.tr", shuffle=False, progress=False)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "'image'" in message and "sample 7" in message and "[3, 32, 31]" in message
    assert "[3, 32, 32]" in message and "schema=" in message
    assert rf.schema.fields[0].shape == (3, 32, None)
    assert rf.write_summary.variable_fields == {"image": 7}
    assert RecordFile(rf.path).write_summary.variable_fields == {"image": 7}


def test_the_writer_warns_too(tmp_path: Path) -> None:
    with pytest.warns(VariableShapeWarning, match="sample 3.*'image'"), RecordWriter(tmp_path / "w.tr") as w:
        for sample in images(5, odd=3):
            w.append(sample)


def test_a_stated_variable_dimension_is_accepted_silently(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rf = write_record(
            images(10, odd=2), tmp_path / "s.tr", schema={"image": (3, 32, None)}, shuffle=False, progress=False
        )
    assert rf.schema.fields[0].shape == (3, 32, None)
    assert rf.write_summary.variable_fields == {}


def test_a_stated_variable_dimension_stays_variable(tmp_path: Path) -> None:
    """Shards written with the same stated schema agree, even if one shard happens to be fixed."""
    rf = write_record(images(4), tmp_path / "s.tr", schema={"image": [3, 32, None]}, progress=False)
    assert rf.schema.fields[0].shape == (3, 32, None)


def test_a_sample_breaking_a_stated_shape_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "s.tr"
    with pytest.raises(SchemaError) as info:
        write_record(images(20, odd=7), path, schema={"image": (3, 32, 32)}, shuffle=False, progress=False)
    message = str(info.value)
    assert str(path) in message and "sample 7" in message and "'image'" in message
    assert "[3, 32, 31]" in message and "[3, 32, 32]" in message
    assert os.listdir(tmp_path) == []


def test_a_stated_shape_is_checked_from_the_first_sample(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"sample 0, field 'image'.*\[3, 32, 32\].*\[3, 28, 28\]"):
        write_record(images(3), tmp_path / "s.tr", schema={"image": (3, 28, 28)}, progress=False)
    with pytest.raises(SchemaError, match=r"field 'image'.*rank 3.*stated rank 2"):
        write_record(images(3), tmp_path / "s.tr", schema={"image": (None, None)}, progress=False)


def test_a_stated_dtype(tmp_path: Path) -> None:
    rows: list[Any] = [{"w": []}, {"w": [0.5, 1.5]}]  # the first list is empty: no dtype of its own
    rf = write_record(rows, tmp_path / "a.tr", schema={"w": "float64"}, shuffle=False, progress=False)
    assert rf.schema.fields[0].dtype == "float64" and rf[1]["w"].tolist() == [0.5, 1.5]
    with pytest.raises(SchemaError, match=r"sample 0, field 'label'.*int64.*stated float32"):
        write_record(images(2), tmp_path / "b.tr", schema={"label": {"dtype": "float32"}}, progress=False)


def test_unknown_stated_fields_are_named(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"'imgae'.*did you mean 'image'"):
        write_record(images(2), tmp_path / "s.tr", schema={"imgae": (3, 32, 32)}, progress=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "schema",
    [{"image": (3, -1)}, {"image": "float8"}, {"image": {"shape": (1,), "size": 2}}, {3: (1,)}, [("image", (1,))]],
)
def test_bad_schema_arguments(tmp_path: Path, schema: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="schema"):
        write_record(images(2), tmp_path / "s.tr", schema=schema, progress=False)
    assert os.listdir(tmp_path) == []


def test_a_schema_of_another_set(tmp_path: Path) -> None:
    first = write_record(images(5, odd=1), tmp_path / "a.tr", progress=False, schema={"image": (3, 32, None)})
    rf = write_record(images(5), tmp_path / "b.tr", schema=first.schema, progress=False)
    assert rf.schema == first.schema
    with pytest.raises(SchemaError, match=r"sample 0, field 'label'.*float64.*int64"):
        write_record([{"image": torch.zeros(3, 32, 8, dtype=torch.uint8), "label": 0.5}], tmp_path / "c.tr",
                     schema=first.schema, progress=False)  # fmt: skip
    with pytest.raises(SchemaError, match=r"sample 0.*structure"):
        write_record([(np.zeros(2), 1)], tmp_path / "d.tr", schema=first.schema, progress=False)


def test_chunked_records_refuse_a_stated_variable_shape(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="samples_per_record"):
        write_record(images(8), tmp_path / "c.tr", samples_per_record=4, schema={"image": (3, 32, None)},
                     progress=False)  # fmt: skip


def test_a_stated_dtype_is_checked_not_converted(tmp_path: Path) -> None:
    with pytest.raises(
        SchemaError, match=r"field 'ids': tensor of int64 differs from the stated int32: schema= checks"
    ):
        write_record([{"ids": [1, 2]}], tmp_path / "i.tr", schema={"ids": "int32"}, progress=False)
    rf = write_record([{"ids": np.asarray([1, 2], dtype="int32")}], tmp_path / "j.tr", schema={"ids": "int32"})
    assert rf.schema.fields[0].dtype == "int32"
