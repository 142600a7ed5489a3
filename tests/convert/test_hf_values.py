"""What from_hf makes of each column's values (issue 38 items 3 and 6, issue 41 item 9), on real Datasets.

Nulls follow one rule (the row is refused, naming row and column, and only that row), integer
scalars are one kind whatever the column, token-id lists keep their dtype, and broken image bytes
are stored as they are, from a Dataset, a streaming dataset, a save_to_disk folder and parquet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchrecord import RecordDataset
from torchrecord.convert import from_hf
from torchrecord.errors import SourceError

datasets = pytest.importorskip("datasets")


def _sources(ds: Any, tmp_path: Path) -> dict[str, Any]:
    """The same rows as a Dataset and as a streaming dataset."""
    return {"dataset": ds, "streaming": ds.to_iterable_dataset(num_shards=1)}


def _rows(rf: Any) -> list[dict[str, Any]]:
    return [rf[i] for i in range(len(rf))]


# -- nulls: one rule -----------------------------------------------------------------------------------

NULLS = {
    "top level": ({"a": [1, None, 3, 4]}, None),
    "inside a list": ({"a": [[1, 2], [3, None], [5], [6, 7]]}, None),
    "a null list": ({"a": [[1, 2], None, [5], [6, 7]]}, None),
    "inside a fixed-size array": (
        {"a": [[1, 2], [3, None], [5, 6], [7, 8]]},
        {"a": ("Sequence", "int64", 2)},
    ),
    "a string": ({"a": ["x", None, "z", "w"]}, None),
}


def _dataset(case: str) -> Any:
    data, typed = NULLS[case]
    if typed is None:
        return datasets.Dataset.from_dict(data)
    _, dtype, length = typed["a"]
    features = datasets.Features({"a": datasets.Sequence(datasets.Value(dtype), length=length)})
    return datasets.Dataset.from_dict(data, features=features)


@pytest.mark.parametrize("case", sorted(NULLS))
@pytest.mark.parametrize("kind", ["dataset", "streaming"])
def test_a_null_anywhere_refuses_its_row_naming_row_and_column(tmp_path: Path, case: str, kind: str) -> None:
    source = _sources(_dataset(case), tmp_path)[kind]
    with pytest.raises(SourceError, match=r"row 1, column 'a' holds a null; nulls cannot be stored"):
        from_hf(source, tmp_path / "raise.tr", shuffle=False, progress=False)
    assert not (tmp_path / "raise.tr").exists()
    if kind == "streaming":  # one stream: it cannot go on past the refused row, whatever on_error says
        with pytest.raises(SourceError, match=r"(?s)row 1, column 'a' holds a null.*cannot be skipped"):
            from_hf(source, tmp_path / "skip.tr", shuffle=False, on_error="skip", progress=False)
        return
    rf = from_hf(source, tmp_path / "skip.tr", shuffle=False, on_error="skip", progress=False)
    assert len(rf) == 3 and [s.index for s in rf.write_summary.skipped_samples] == [1]  # that row only
    kept = [s["a"] for s in _rows(rf)]
    originals = [v for i, v in enumerate(NULLS[case][0]["a"]) if i != 1]
    for value, original in zip(kept, originals):
        if isinstance(original, list):
            assert value.tolist() == original and value.dtype in (torch.int64, np.int64)  # no float64, no NaN
        else:
            assert value == original


def test_nested_nulls_never_become_nan_in_an_integer_column(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"a": [[1, None], [2, 3]]})
    rf = from_hf(ds, tmp_path / "s.tr", shuffle=False, on_error="skip", progress=False)
    (row,) = _rows(rf)
    assert row["a"].dtype == torch.int64 and row["a"].tolist() == [2, 3]
    assert rf.schema.fields[0].dtype == "int64"


# -- kinds and dtypes ------------------------------------------------------------------------------------


def _typed() -> Any:
    features = datasets.Features(
        {
            "ids": datasets.Sequence(datasets.Value("int32")),
            "i8": datasets.Value("int8"),
            "i32": datasets.Value("int32"),
            "i64": datasets.Value("int64"),
            "u16": datasets.Value("uint16"),
            "label": datasets.ClassLabel(names=["a", "b"]),
            "flag": datasets.Value("bool"),
            "f32": datasets.Value("float32"),
        }
    )
    data = {
        "ids": [[101, 2023, 102], [101, 102]],
        "i8": [-3, 4],
        "i32": [7, 8],
        "i64": [2**40, 5],
        "u16": [65535, 1],
        "label": [1, 0],
        "flag": [True, False],
        "f32": [0.5, 1.25],
    }
    return datasets.Dataset.from_dict(data, features=features)


@pytest.mark.parametrize("kind", ["dataset", "streaming"])
def test_token_ids_keep_int32_and_integer_scalars_are_one_kind(tmp_path: Path, kind: str) -> None:
    source = _sources(_typed(), tmp_path)[kind]
    rf = from_hf(source, tmp_path / "t.tr", shuffle=False, progress=False)
    first = _rows(rf)[0]
    assert isinstance(first["ids"], torch.Tensor) and first["ids"].dtype == torch.int32
    assert first["ids"].tolist() == [101, 2023, 102] and _rows(rf)[1]["ids"].tolist() == [101, 102]
    for name, value in (("i8", -3), ("i32", 7), ("i64", 2**40), ("u16", 65535), ("label", 1)):
        assert type(first[name]) is int and first[name] == value, name
    assert first["flag"] is True
    assert isinstance(first["f32"], np.ndarray) and first["f32"].dtype == np.float32 and first["f32"] == 0.5
    fields = {f.name: f for f in rf.schema.fields}
    assert fields["ids"].dtype == "int32" and tuple(fields["ids"].shape) == (None,)


def test_batches_of_the_converted_set_keep_the_dtypes(tmp_path: Path) -> None:
    rf = from_hf(_typed(), tmp_path / "t.tr", shuffle=False, progress=False)
    batch = next(iter(RecordDataset(rf.path, batch_size=2, shuffle=False)))
    assert batch["i32"].dtype == torch.int64 and batch["f32"].dtype == torch.float32
    assert batch["flag"].dtype == torch.bool and batch["i32"].tolist() == [7, 8]


# -- broken image bytes -------------------------------------------------------------------------------------

BROKEN = [b"not an image", b"\x89PNG\r\n\x1a\n broken", b""]


def _images() -> Any:
    features = datasets.Features({"image": datasets.Image(), "n": datasets.Value("int32")})

    def rows() -> Any:
        for i, data in enumerate(BROKEN):
            yield {"image": {"bytes": data, "path": None}, "n": i}

    return features, rows


def test_broken_image_bytes_are_stored_verbatim_from_every_kind_of_source(tmp_path: Path) -> None:
    features, rows = _images()
    ds = datasets.Dataset.from_generator(rows, features=features, cache_dir=str(tmp_path / "cache"))
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "pq" / "train-00000-of-00001.parquet"))
    sources = {
        "dataset": ds,
        "generator stream": datasets.IterableDataset.from_generator(rows, features=features),
        "saved": str(tmp_path / "saved"),
        "parquet": str(tmp_path / "pq"),
    }
    for name, source in sources.items():
        result = from_hf(source, tmp_path / f"{name}.tr", shuffle=False, progress=False)
        rf = result["train"] if isinstance(result, dict) else result
        assert [(bytes(s["image"]), s["n"]) for s in _rows(rf)] == list(zip(BROKEN, range(3))), name


def test_a_streaming_map_that_fails_on_a_broken_image_names_the_row(tmp_path: Path) -> None:
    """The row is found again one at a time; datasets 4.0 maps streaming rows in batches, and then the range."""
    features, _ = _images()
    good = datasets.Dataset.from_dict(
        {"image": [{"bytes": _png(), "path": None}] * 3 + [{"bytes": b"broken", "path": None}], "n": [0, 1, 2, 3]},
        features=features,
    )
    mapped = good.to_iterable_dataset().map(lambda row: {"n": row["n"] + 1})  # decodes the images for the map
    with pytest.raises(
        SourceError, match=r"(row 3|one of rows 0\.\.1023): the dataset raised UnidentifiedImageError .* Image columns"
    ):
        from_hf(mapped, tmp_path / "m.tr", shuffle=False, progress=False)
    assert not (tmp_path / "m.tr").exists()


def _png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.zeros((2, 2, 3), np.uint8)).save(out, format="PNG")
    return out.getvalue()
