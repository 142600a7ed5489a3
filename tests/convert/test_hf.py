"""torchrecord.convert.from_hf against real ``datasets`` objects and folders made in tmp_path.

Each source row is made distinct, so a round trip checks that every row is in
the record set exactly once with equal values (as a multiset).
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.convert.test_convert import image_pixels, png_bytes
from torchrecord import RecordDataset, RecordFile, open_set, write_record
from torchrecord.cli import main as cli_main
from torchrecord.convert import convert, detect_format, from_hf
from torchrecord.errors import SourceError, TorchRecordWarning
from torchrecord.transforms import decode_image

datasets = pytest.importorskip("datasets")
pytest.importorskip("pyarrow")

N = 24
CLASSES = ["cat", "dog", "eel"]


def make_dataset(n: int = N) -> Any:
    """Images (PNG bytes), a ClassLabel, a fixed-size float list, a string and variable token lists."""
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=CLASSES),
            "xy": datasets.Sequence(datasets.Value("float32"), length=2),
            "text": datasets.Value("string"),
            "tokens": datasets.Sequence(datasets.Value("int64")),
            "score": datasets.Value("float16"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "img": [{"bytes": png_bytes(image_pixels(i % 3, i)), "path": None} for i in range(n)],
            "label": [i % 3 for i in range(n)],
            "xy": [[i, -i] for i in range(n)],
            "text": [f"row {i}" for i in range(n)],
            "tokens": [list(range(i % 5)) for i in range(n)],
            "score": [i / 4 for i in range(n)],
        },
        features=features,
    )


def key(sample: dict[str, Any]) -> tuple[Any, ...]:
    """A hashable view of a stored (or source) row."""
    return (
        bytes(sample["img"]),
        int(sample["label"]),
        tuple(np.asarray(sample["xy"], np.float32).tolist()),
        sample["text"],
        tuple(np.asarray(sample["tokens"]).tolist()),
        float(sample["score"]),
    )


def source_rows(ds: Any) -> Counter[tuple[Any, ...]]:
    rows = ds.cast_column("img", datasets.Image(decode=False))
    return Counter(key({**r, "img": r["img"]["bytes"]}) for r in rows)


def test_dataset_round_trip_typed_fields_and_class_names(tmp_path: Path) -> None:
    ds = make_dataset()
    rf = from_hf(ds, tmp_path / "out.tr", seed=3, progress=False)
    assert Counter(key(s) for s in rf) == source_rows(ds)
    fields = {f.name: f for f in rf.schema.fields}
    assert (fields["xy"].dtype, tuple(fields["xy"].shape)) == ("float32", (2,))
    assert fields["score"].dtype == "float16" and fields["img"].dtype == "bytes" and fields["text"].dtype == "str"
    assert fields["label"].dtype == "int64" and fields["tokens"].shape == (None,)
    assert rf.user_metadata["classes"] == CLASSES  # as from_image_folder stores them
    assert rf.user_metadata["class_names"] == {"label": CLASSES}
    assert rf.user_metadata["source_format"] == "hf"
    assert [s["text"] for s in rf] != [f"row {i}" for i in range(N)]  # shuffled
    same = from_hf(ds, tmp_path / "again.tr", seed=3, progress=False)
    assert [s["text"] for s in same] == [s["text"] for s in rf]  # the seed decides the order


def test_images_decode_after_shuffling_in_loader_workers(tmp_path: Path) -> None:
    rf = from_hf(make_dataset(), tmp_path / "out.tr", keys=["img", "label"], progress=False)
    assert [f.name for f in rf.schema.fields] == ["img", "label"]
    ds = RecordDataset(rf.path, transform=functools.partial(decode_image, key="img"), batch_size=N // 2)
    batches = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    seen = 0
    for batch in batches:
        for image, label in zip(batch["img"], batch["label"].tolist()):
            i = int(image[1, 0, 0])
            assert torch.equal(image, torch.from_numpy(image_pixels(label, i)).permute(2, 0, 1))
            seen += 1
    assert seen == N


def test_selected_rows_follow_the_indices_mapping(tmp_path: Path) -> None:
    ds = make_dataset().select([5, 1, 17, 9]).shuffle(seed=1)
    rf = from_hf(ds, tmp_path / "sel.tr", shuffle=False, progress=False)
    assert [s["text"] for s in rf] == ds["text"]


def test_dataset_dict_one_set_per_split_or_the_named_split(tmp_path: Path) -> None:
    dd = datasets.DatasetDict(train=make_dataset(), test=make_dataset(6))
    out = from_hf(dd, tmp_path / "sets", progress=False)
    assert sorted(out) == ["test", "train"]
    assert len(RecordFile(tmp_path / "sets" / "train")) == N and len(RecordFile(tmp_path / "sets" / "test")) == 6
    assert out["test"].user_metadata["split"] == "test"
    one = from_hf(dd, tmp_path / "test.tr", split="test", progress=False)
    assert Counter(key(s) for s in one) == source_rows(dd["test"])
    with pytest.raises(SourceError, match="no split 'valid'"):
        from_hf(dd, tmp_path / "v.tr", split="valid")


def test_streaming_dataset_and_shards_match_a_single_set(tmp_path: Path) -> None:
    ds = make_dataset()
    streamed = from_hf(ds.to_iterable_dataset(num_shards=3), tmp_path / "stream.tr", progress=False)
    assert Counter(key(s) for s in streamed) == source_rows(ds)
    assert streamed.user_metadata["classes"] == CLASSES
    single = from_hf(ds, tmp_path / "one.tr", seed=7, progress=False)
    for i in range(3):
        from_hf(ds, tmp_path / "shards", shard=i, num_shards=3, seed=7, progress=False)
    assert [s["text"] for s in open_set(tmp_path / "shards")] == [s["text"] for s in single]
    # a streaming dataset is one shard each: each writer gives its own part
    it = ds.to_iterable_dataset(num_shards=2)
    for i in range(2):
        from_hf(it.shard(num_shards=2, index=i), tmp_path / "ishards", shard=i, num_shards=2, progress=False)
    assert Counter(key(s) for s in open_set(tmp_path / "ishards")) == source_rows(ds)


def test_saved_and_parquet_folders_through_convert_and_the_cli(tmp_path: Path, capsys: Any) -> None:
    dd = datasets.DatasetDict(train=make_dataset(), test=make_dataset(4))
    dd.save_to_disk(str(tmp_path / "saved"))
    assert detect_format(tmp_path / "saved") == "hf"
    assert cli_main(["convert", str(tmp_path / "saved"), str(tmp_path / "cli")]) == 0
    assert "train" in capsys.readouterr().out
    assert Counter(key(s) for s in RecordFile(tmp_path / "cli" / "train")) == source_rows(dd["train"])
    (tmp_path / "pq" / "data").mkdir(parents=True)
    dd["train"].to_parquet(str(tmp_path / "pq" / "data" / "train-00000-of-00001.parquet"))
    assert detect_format(tmp_path / "pq") == "hf"
    rf = convert(tmp_path / "pq", tmp_path / "pq.tr", split="train", progress=False)
    assert Counter(key(s) for s in rf) == source_rows(dd["train"])
    assert rf.user_metadata["classes"] == CLASSES  # the features come from the parquet metadata


def test_unstorable_columns_and_nulls_are_named(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"a": [1, 2], "meta": [{"x": 1}, {"x": 2}]})
    with pytest.raises(SourceError, match=r"column 'meta' has Arrow type struct.*keys="):
        from_hf(ds, tmp_path / "bad.tr")
    assert len(from_hf(ds, tmp_path / "a.tr", keys=["a"], progress=False)) == 2
    with pytest.raises(SourceError, match="no column named 'b'"):
        from_hf(ds, tmp_path / "b.tr", keys=["b"])
    nulls = datasets.Dataset.from_dict({"t": ["x", None, "z"]})
    with pytest.raises(SourceError, match=r"row 1, column 't' holds a null"):
        from_hf(nulls, tmp_path / "n.tr", shuffle=False, progress=False)


def test_write_record_points_to_the_converter(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"x": [1.0, 2.0], "s": ["a", "b"]})
    with pytest.warns(TorchRecordWarning, match=r"torchrecord\.convert\.from_hf"):
        rf = write_record(ds, tmp_path / "w.tr", progress=False)
    assert sorted(s["s"] for s in rf) == ["a", "b"]  # it still works for plain columns


def test_missing_datasets_gives_the_install_hint(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['datasets'] = None\n"
        "from torchrecord.convert import from_hf\n"
        "try:\n"
        "    from_hf(object(), sys.argv[1])\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "o.tr")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "converting a Hugging Face dataset needs datasets: pip install 'datasets>=3' 'pyarrow>=14'"
        " (or, in a torchrecord checkout: pip install -e '.[hf]')"
    ]
