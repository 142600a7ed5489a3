"""torchrecord.convert and torchrecord.transforms on real files made in tmp_path.

Every round trip checks that each source sample is in the record set exactly once
with equal values (samples are made distinct so they can be matched up).
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from torchrecord import RecordDataset, RecordFile, open_set
from torchrecord.convert import (
    convert,
    detect_format,
    from_hdf5,
    from_image_folder,
    from_list_file,
    from_numpy,
)
from torchrecord.convert.arrays import NpyRows
from torchrecord.errors import CorruptRecordError, IgnoredOptionWarning, RecordExistsError, SourceError
from torchrecord.transforms import decode_image

# -- helpers ---------------------------------------------------------------------


def image_pixels(label: int, i: int, size: tuple[int, int] = (5, 7)) -> np.ndarray:
    """A distinct little RGB image (H, W, 3) for sample i of class label."""
    h, w = size
    pixels = np.zeros((h, w, 3), dtype=np.uint8)
    pixels[..., 0] = label * 50
    pixels[..., 1] = i
    pixels[..., 2] = np.arange(w, dtype=np.uint8)
    return pixels


def png_bytes(pixels: np.ndarray, mode: str | None = None) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode).save(out, format="PNG")
    return out.getvalue()


def make_image_folder(root: Path, counts: dict[str, int]) -> dict[bytes, int]:
    """root/<class>/<i>.png for each class; returns {png bytes: label} (labels by sorted class)."""
    expected = {}
    for label, name in enumerate(sorted(counts)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(counts[name]):
            data = png_bytes(image_pixels(label, i))
            (root / name / f"{i:03d}.png").write_bytes(data)
            expected[data] = label
    return expected


def assert_same_images(path: str | os.PathLike[str], expected: dict[bytes, int]) -> None:
    """Every expected (image bytes, label) is in the record set exactly once, and nothing else."""
    seen = Counter((s["image"], s["label"]) for s in RecordFile(path))
    assert seen == Counter(expected.items())


def assert_same_rows(path: str | os.PathLike[str], rows: list[Any]) -> None:
    """The record set holds exactly the given samples (dicts of arrays/scalars), each once."""
    stored = list(RecordFile(path))
    assert len(stored) == len(rows)
    unmatched = list(range(len(rows)))
    for sample in stored:
        match = next((j for j in unmatched if _equal(sample, rows[j])), None)
        assert match is not None, f"stored sample {sample!r} is not a source row"
        unmatched.remove(match)
    assert not unmatched


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (bytes, str)):
        return type(a) is type(b) and a == b
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


# -- image folders ---------------------------------------------------------------


def test_folder_round_trip_with_classes(tmp_path: Path) -> None:
    expected = make_image_folder(tmp_path / "src", {"dog": 4, "cat": 3, "zebra": 2})
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", progress=False)
    assert len(rf) == 9
    assert rf.user_metadata["classes"] == ["cat", "dog", "zebra"]
    assert rf.user_metadata["source_format"] == "folder"
    assert rf.metadata["shuffled"] is True
    assert_same_images(rf.path, expected)


def test_folder_workers_and_skip_bad_files(tmp_path: Path) -> None:
    expected = make_image_folder(tmp_path / "src", {"a": 10, "b": 10})
    (tmp_path / "src" / "a" / "notes.jpg").write_text("not an image")
    truncated = png_bytes(image_pixels(1, 99, (20, 20)))[:-30]
    (tmp_path / "src" / "b" / "broken.png").write_bytes(truncated)
    (tmp_path / "src" / "b" / "empty.png").write_bytes(b"")
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", num_workers=2, on_error="skip", progress=False)
    assert rf.metadata["skipped"] == 3
    assert_same_images(rf.path, expected)


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("notes.png", b"hello, not an image", "not a decodable image"),
        ("cut.png", None, "not a decodable image"),
        ("empty.png", b"", "empty file"),
    ],
)
def test_folder_bad_file_fails_naming_it(tmp_path: Path, name: str, content: bytes | None, reason: str) -> None:
    make_image_folder(tmp_path / "src", {"a": 3})
    if content is None:
        content = png_bytes(image_pixels(0, 9, (30, 30)))[:-40]
    bad = tmp_path / "src" / "a" / name
    bad.write_bytes(content)
    with pytest.raises(SourceError) as info:
        from_image_folder(tmp_path / "src", tmp_path / "out.tr", progress=False)
    first_line = str(info.value).splitlines()[0]
    assert str(bad) in first_line and reason in first_line and "--skip-bad" in first_line
    assert not (tmp_path / "out.tr").exists()


def test_folder_without_image_check_only_checks_signatures(tmp_path: Path) -> None:
    expected = make_image_folder(tmp_path / "src", {"a": 2})
    truncated = png_bytes(image_pixels(0, 50, (30, 30)))[:-40]
    (tmp_path / "src" / "a" / "cut.png").write_bytes(truncated)  # right signature: passes
    expected[truncated] = 0
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", check_images=False, progress=False)
    assert_same_images(rf.path, expected)
    (tmp_path / "src" / "a" / "x.gif").write_text("text")
    with pytest.raises(SourceError, match=r"x\.gif: not a PNG, JPEG"):
        from_image_folder(tmp_path / "src", tmp_path / "o2.tr", check_images=False, progress=False)


def test_folder_layout_rules(tmp_path: Path) -> None:
    """Hidden entries and files directly in root are ignored; nested folders belong to their class."""
    expected = make_image_folder(tmp_path / "src", {"a": 1, "b": 1})
    (tmp_path / "src" / "readme.txt").write_text("ignored: not in a class folder")
    (tmp_path / "src" / "a" / ".DS_Store").write_bytes(b"\0\0ignored")
    (tmp_path / "src" / ".cache").mkdir()
    (tmp_path / "src" / ".cache" / "x.bin").write_bytes(b"ignored")
    (tmp_path / "src" / "b" / "deeper").mkdir()
    nested = png_bytes(image_pixels(1, 77))
    (tmp_path / "src" / "b" / "deeper" / "n.png").write_bytes(nested)
    expected[nested] = 1
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", shuffle=False, progress=False)
    assert rf.user_metadata["classes"] == ["a", "b"]
    assert_same_images(rf.path, expected)
    assert [s["label"] for s in rf] == [0, 1, 1]  # shuffle=False keeps the sorted file order


def test_folder_bad_roots(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file or directory"):
        from_image_folder(tmp_path / "missing", tmp_path / "out.tr")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no class folders"):
        from_image_folder(tmp_path / "empty", tmp_path / "out.tr")
    (tmp_path / "empty" / "cat").mkdir()
    with pytest.raises(SourceError, match=r"class folders \(cat\) hold no files"):
        from_image_folder(tmp_path / "empty", tmp_path / "out.tr")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SourceError, match="not a directory"):
        from_image_folder(tmp_path / "file", tmp_path / "out.tr")
    assert sorted(os.listdir(tmp_path)) == ["empty", "file"]


def test_folder_metadata_and_existing_target(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", {"a": 2})
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", metadata={"note": "hi"}, progress=False)
    assert rf.user_metadata == {"source_format": "folder", "classes": ["a"], "note": "hi"}
    with pytest.raises(RecordExistsError):
        from_image_folder(tmp_path / "src", tmp_path / "out.tr", progress=False)
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", overwrite=True, seed=5, progress=False)
    assert rf.metadata["seed"] == 5


def test_folder_takes_only_image_extensions(tmp_path: Path) -> None:
    """Like torchvision's ImageFolder: README.txt or Thumbs.db in a class folder are left alone."""
    expected = make_image_folder(tmp_path / "src", {"cat": 2, "dog": 2})
    (tmp_path / "src" / "cat" / "README.txt").write_text("about these cats")
    (tmp_path / "src" / "dog" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0 thumbnails")
    upper = png_bytes(image_pixels(1, 50))
    (tmp_path / "src" / "dog" / "BIG.PNG").write_bytes(upper)  # case-insensitive
    expected[upper] = 1
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", progress=False)
    assert_same_images(rf.path, expected)
    only = from_image_folder(tmp_path / "src", tmp_path / "o2.tr", extensions=["PNG"], progress=False)
    assert len(only) == 5
    with pytest.raises(SourceError, match=r"README\.txt: not a decodable image"):
        from_image_folder(tmp_path / "src", tmp_path / "o3.tr", extensions=None, progress=False)
    with pytest.raises(SourceError, match=r"none with an image extension \(\.webp\).*extensions=None"):
        from_image_folder(tmp_path / "src", tmp_path / "o4.tr", extensions=[".webp"], progress=False)
    with pytest.raises(ValueError, match="extensions"):
        from_image_folder(tmp_path / "src", tmp_path / "o5.tr", extensions=[], progress=False)


def test_folder_and_list_samples_keep_their_file_path(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", {"cat": 2, "dog": 1})
    (tmp_path / "src" / "dog" / "deeper").mkdir()
    nested = png_bytes(image_pixels(1, 9))
    (tmp_path / "src" / "dog" / "deeper" / "n.png").write_bytes(nested)
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", progress=False)
    assert rf.schema.names == ["image", "label", "path"]
    paths = {s["path"]: s for s in rf}
    assert sorted(paths) == ["cat/000.png", "cat/001.png", "dog/000.png", "dog/deeper/n.png"]
    for name, sample in paths.items():
        assert (tmp_path / "src" / name).read_bytes() == sample["image"]
    assert paths["dog/deeper/n.png"]["label"] == 1
    bare = from_image_folder(tmp_path / "src", tmp_path / "bare.tr", keep_paths=False, progress=False)
    assert bare.schema.names == ["image", "label"]
    (tmp_path / "list.txt").write_text("src/cat/000.png 0\nsrc/dog/deeper/n.png 1\n")
    listed = from_list_file(tmp_path / "list.txt", tmp_path / "l.tr", shuffle=False, progress=False)
    assert [s["path"] for s in listed] == ["src/cat/000.png", "src/dog/deeper/n.png"]


def test_skipped_files_are_each_named(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", {"a": 3})
    bad = [tmp_path / "src" / "a" / f"bad{i}.jpg" for i in range(3)]
    for path in bad:
        path.write_bytes(b"\xff\xd8\xff garbage")
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", on_error="skip", progress=False)
    assert len(rf) == 3
    errors = [s.error for s in rf.write_summary.skipped_samples]
    assert len(errors) == 3 and all(str(p) in e for p, e in zip(bad, errors))
    stored = RecordFile(rf.path).metadata["skipped_samples"]
    assert [str(p) in s["error"] for p, s in zip(bad, stored)] == [True] * 3


# -- list files ------------------------------------------------------------------


def test_list_file_round_trip(tmp_path: Path) -> None:
    (tmp_path / "imgs" / "with space").mkdir(parents=True)
    expected, lines = {}, []
    for i in range(6):
        data = png_bytes(image_pixels(i % 3, i))
        name = f"imgs/with space/{i}.png" if i % 2 else f"imgs/{i}.png"
        (tmp_path / name).write_bytes(data)
        expected[data] = 10 + i
        lines.append(f"{name} {10 + i}")
    absolute = png_bytes(image_pixels(5, 5))
    (tmp_path / "abs.png").write_bytes(absolute)
    expected[absolute] = -1
    lines += ["", f"{tmp_path / 'abs.png'}\t-1"]
    (tmp_path / "lists").mkdir()
    lines = [f"../{line}" if line.startswith("imgs") else line for line in lines]  # relative to the list's dir
    (tmp_path / "lists" / "train.txt").write_text("\n".join(lines) + "\n")
    rf = from_list_file(tmp_path / "lists" / "train.txt", tmp_path / "out.tr", progress=False)
    assert rf.user_metadata["source_format"] == "list"
    assert_same_images(rf.path, expected)


def test_list_file_errors(tmp_path: Path) -> None:
    good = png_bytes(image_pixels(0, 0))
    (tmp_path / "a.png").write_bytes(good)
    listing = tmp_path / "list.txt"
    listing.write_text("a.png 3\nmissing.png 4\n")
    with pytest.raises(SourceError, match=r"missing\.png: cannot read it"):
        from_list_file(listing, tmp_path / "out.tr", progress=False)
    rf = from_list_file(listing, tmp_path / "out.tr", on_error="skip", progress=False)
    assert rf.metadata["skipped"] == 1
    assert_same_images(rf.path, {good: 3})
    for text, message in [
        ("a.png 3\njustonefield\n", "line 2: expected '<path> <label>'"),
        ("a.png cat\n", "line 1: label 'cat' is not an integer"),
        ("\n\n", "lists no files"),
    ]:
        listing.write_text(text)
        with pytest.raises(SourceError, match=message):
            from_list_file(listing, tmp_path / "o.tr", progress=False)
    listing.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SourceError, match="not a UTF-8 text file"):
        from_list_file(listing, tmp_path / "o.tr", progress=False)


# -- decode_image ----------------------------------------------------------------


def test_decode_image_after_reading(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", {"a": 3, "b": 3})
    rf = from_image_folder(tmp_path / "src", tmp_path / "out.tr", progress=False)
    ds = RecordDataset(rf.path, transform=decode_image, batch_size=6)
    (batch,) = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    assert batch["image"].dtype == torch.uint8 and batch["image"].shape == (6, 3, 5, 7)
    for image, label in zip(batch["image"], batch["label"].tolist()):
        i = int(image[1, 0, 0])
        assert torch.equal(image, torch.from_numpy(image_pixels(label, i)).permute(2, 0, 1))


def test_decode_image_forms_and_modes() -> None:
    pixels = image_pixels(1, 2)
    data = png_bytes(pixels)
    chw = torch.from_numpy(pixels).permute(2, 0, 1)
    assert torch.equal(decode_image(data), chw)
    out = decode_image({"image": data, "label": 4})
    assert out["label"] == 4 and torch.equal(out["image"], chw)
    image, label = decode_image((data, 4))
    assert label == 4 and torch.equal(image, chw)
    assert decode_image([data, 4])[1] == 4
    assert decode_image({"img": data}, key="img")["img"].shape == (3, 5, 7)
    gray = png_bytes(pixels[..., 1], "L")
    assert decode_image(gray).shape == (3, 5, 7)  # converted to RGB so batches collate
    assert torch.equal(decode_image(gray, mode="L")[0], torch.from_numpy(pixels[..., 1]))
    assert decode_image(gray, mode=None).shape == (1, 5, 7)
    assert decode_image(png_bytes(np.dstack([pixels, pixels[..., :1]])), mode=None).shape == (4, 5, 7)
    # picklable for spawn workers, also partially applied
    assert pickle.loads(pickle.dumps(decode_image)) is decode_image
    assert pickle.loads(pickle.dumps(functools.partial(decode_image, mode="L")))(gray).shape == (1, 5, 7)


def test_decode_image_errors() -> None:
    with pytest.raises(CorruptRecordError, match=r"cannot decode an image of 9 bytes starting with b'not an i'"):
        decode_image(b"not an im")
    with pytest.raises(TypeError, match="expects encoded image bytes, got Tensor"):
        decode_image(torch.zeros(3))


# -- NumPy -----------------------------------------------------------------------


def test_npy_round_trip_memory_mapped(tmp_path: Path) -> None:
    array = np.arange(40 * 6, dtype=np.float32).reshape(40, 2, 3)
    np.save(tmp_path / "x.npy", array)
    rf = from_numpy(tmp_path / "x.npy", tmp_path / "out.tr", num_workers=2, progress=False)
    assert rf.user_metadata["source_format"] == "npy"
    assert rf.schema.fields[0].kind == "ndarray" and rf.schema.fields[0].shape == (2, 3)
    assert_same_rows(rf.path, list(array))
    rows = NpyRows(str(tmp_path / "x.npy"), 40, np.asarray)
    assert np.array_equal(rows[3], array[3])
    assert isinstance(rows._array, np.memmap)  # mapped, not loaded
    assert len(pickle.dumps(rows)) < 1000  # workers get the path, not the data


def test_npy_one_dimensional_and_strings(tmp_path: Path) -> None:
    np.save(tmp_path / "y.npy", np.arange(7, dtype=np.int16) * 3)
    rf = from_numpy(tmp_path / "y.npy", tmp_path / "y.tr", shuffle=False, progress=False)
    assert [int(v) for v in rf] == [0, 3, 6, 9, 12, 15, 18]
    assert rf.schema.fields[0].dtype == "int16"
    words = np.array(["ä", "bc", "def"])
    np.save(tmp_path / "s.npy", words)
    rf = from_numpy(tmp_path / "s.npy", tmp_path / "s.tr", shuffle=False, progress=False)
    assert list(rf) == ["ä", "bc", "def"]


@pytest.mark.parametrize("compressed", [False, True], ids=["savez", "savez_compressed"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_npz_round_trip(tmp_path: Path, compressed: bool, shuffle: bool) -> None:
    n = 50
    arrays = {
        "x": np.arange(n * 12, dtype=np.float64).reshape(n, 3, 4),
        "y": np.arange(n, dtype=np.int64) * 7,
        "flag": np.arange(n) % 2 == 0,
        "name": np.array([f"s{i}".encode() for i in range(n)]),
        "empty": np.zeros((n, 0), dtype=np.uint8),
    }
    (np.savez_compressed if compressed else np.savez)(tmp_path / "a.npz", **arrays)
    rf = from_numpy(tmp_path / "a.npz", tmp_path / "out.tr", shuffle=shuffle, progress=False)
    rows = [{k: (bytes(v[i]) if k == "name" else v[i]) for k, v in arrays.items()} for i in range(n)]
    assert rf.user_metadata["source_format"] == "npz"
    assert_same_rows(rf.path, rows)
    if not shuffle:
        assert [int(s["y"]) for s in rf] == list(range(0, 7 * n, 7))


def test_npz_fortran_order_and_keys(tmp_path: Path) -> None:
    x = np.asfortranarray(np.arange(30, dtype=np.int32).reshape(10, 3))
    y = np.arange(10, dtype=np.uint8)
    np.savez(tmp_path / "f.npz", x=x, y=y, other=np.zeros(3))
    rf = from_numpy(tmp_path / "f.npz", tmp_path / "f.tr", keys=["y", "x"], progress=False)
    assert rf.schema.names == ["y", "x"]
    assert_same_rows(rf.path, [{"y": y[i], "x": x[i]} for i in range(10)])
    np.savez_compressed(tmp_path / "fc.npz", x=x)
    with pytest.raises(SourceError, match="Fortran-order array cannot be read row by row"):
        from_numpy(tmp_path / "fc.npz", tmp_path / "fc.tr")


def test_numpy_bad_sources(tmp_path: Path) -> None:
    out = tmp_path / "out.tr"
    np.savez(tmp_path / "mismatch.npz", a=np.zeros((5, 2)), b=np.zeros(4))
    with pytest.raises(
        SourceError, match=r"disagree in their first \(sample\) dimension: 'a' has 5 rows, 'b' has 4 rows"
    ):
        from_numpy(tmp_path / "mismatch.npz", out)
    rf = from_numpy(tmp_path / "mismatch.npz", out, keys=["a"], progress=False)
    assert len(rf) == 5
    with pytest.raises(SourceError, match=r"no array named 'c'; it holds \['a', 'b'\]"):
        from_numpy(tmp_path / "mismatch.npz", tmp_path / "o.tr", keys=["c"])
    np.savez(tmp_path / "scalar.npz", a=np.zeros(3), s=np.float64(1.0))
    with pytest.raises(SourceError, match="'s' is 0-d and has no sample axis"):
        from_numpy(tmp_path / "scalar.npz", tmp_path / "o.tr")
    np.save(tmp_path / "none.npy", np.zeros((0, 3)))
    with pytest.raises(SourceError, match="0 rows; there is nothing to convert"):
        from_numpy(tmp_path / "none.npy", tmp_path / "o.tr")
    np.save(tmp_path / "complex.npy", np.zeros(3, dtype=np.complex64))
    with pytest.raises(SourceError, match="'array' has dtype complex64, which torchrecord cannot store"):
        from_numpy(tmp_path / "complex.npy", tmp_path / "o.tr")
    objects = np.array([{"a": 1}, None], dtype=object)
    np.save(tmp_path / "obj.npy", objects, allow_pickle=True)
    with pytest.raises(SourceError, match="cannot memory-map"):
        from_numpy(tmp_path / "obj.npy", tmp_path / "o.tr")
    np.savez(tmp_path / "obj.npz", o=objects)
    with pytest.raises(SourceError, match="holds Python objects"):
        from_numpy(tmp_path / "obj.npz", tmp_path / "o.tr")
    (tmp_path / "text.npy").write_text("not numpy")
    with pytest.raises(SourceError, match=r"not a \.npy or \.npz file"):
        from_numpy(tmp_path / "text.npy", tmp_path / "o.tr")
    with pytest.raises(SourceError, match="no such file or directory"):
        from_numpy(tmp_path / "absent.npy", tmp_path / "o.tr")
    with pytest.raises(SourceError, match=r"keys= selects arrays of an \.npz"):
        from_numpy(tmp_path / "none.npy", tmp_path / "o.tr", keys=["a"])
    assert not (tmp_path / "o.tr").exists()


def test_converters_take_the_write_options(tmp_path: Path) -> None:
    """issue 26: every write_record option reaches the write, sharding too; none is dropped silently."""
    x, g = np.arange(240, dtype=np.float32).reshape(60, 4), np.repeat(np.arange(12), 5)
    np.savez(tmp_path / "a.npz", x=x, g=g)
    rf = from_numpy(tmp_path / "a.npz", tmp_path / "g.tr", group_by="g", seed=4, checksums=False, progress=False)
    assert rf.num_groups == 12 and rf.metadata["checksum"] is None and rf.metadata["seed"] == 4
    assert all(len({int(s["g"]) for s in rf.group(i)}) == 1 for i in range(12))
    for i in range(2):
        from_numpy(tmp_path / "a.npz", tmp_path / "shards", shard=i, num_shards=2, seed=4, progress=False)
    one = from_numpy(tmp_path / "a.npz", tmp_path / "one.tr", seed=4, progress=False)
    sharded = open_set(tmp_path / "shards")
    assert [s["x"].tolist() for s in sharded] == [s["x"].tolist() for s in one]
    assert sharded.samples_per_record == one.samples_per_record > 1
    with pytest.raises(ValueError, match="a sharded set has no groups"):
        from_numpy(tmp_path / "a.npz", tmp_path / "gs", shard=0, num_shards=2, group_by="g", progress=False)
    np.savez_compressed(tmp_path / "c.npz", x=x)  # read as one stream: workers cannot help
    with pytest.warns(IgnoredOptionWarning, match="num_workers=2 is ignored: the source is read as one stream"):
        from_numpy(tmp_path / "c.npz", tmp_path / "c.tr", num_workers=2, progress=False)


def test_compressed_npz_damage_stops_the_conversion_even_when_skipping(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    np.savez_compressed(tmp_path / "c.npz", x=rng.random((2000, 8)))
    data = bytearray((tmp_path / "c.npz").read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(64)
    (tmp_path / "c.npz").write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"c\.npz: array 'x' is damaged"):
        from_numpy(tmp_path / "c.npz", tmp_path / "out.tr", on_error="skip", progress=False)
    assert not (tmp_path / "out.tr").exists()


# -- HDF5 ------------------------------------------------------------------------


def _h5_rows(path: Path, names: list[str]) -> list[dict[str, Any]]:
    with h5py.File(path, "r") as f:
        columns = {name: f[name][()] for name in names}
    n = len(next(iter(columns.values())))
    rows = []
    for i in range(n):
        row: dict[str, Any] = {}
        for name, column in columns.items():
            *groups, leaf = name.split("/")
            node = row
            for g in groups:
                node = node.setdefault(g, {})
            value = column[i]
            node[leaf] = value.decode() if isinstance(value, bytes) and name == "text" else value
        rows.append(row)
    return rows


@pytest.mark.parametrize("layout", ["contiguous", "chunked"])
def test_hdf5_round_trip(tmp_path: Path, layout: str) -> None:
    n = 300
    options: dict[str, Any] = {"chunks": True, "compression": "gzip"} if layout == "chunked" else {}
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("images", data=np.arange(n * 12, dtype=np.uint8).reshape(n, 3, 4) % 251, **options)
        f.create_dataset("meta/label", data=np.arange(n, dtype=np.int64), **options)
        f.create_dataset("meta/score", data=np.linspace(0, 1, n, dtype=np.float32), **options)
        f.create_dataset("text", data=[f"ü{i}" for i in range(n)], dtype=h5py.string_dtype())
        f.create_dataset("raw", data=np.array([b"r%d" % i for i in range(n)]))
    rf = from_hdf5(tmp_path / "d.h5", tmp_path / "out.tr", num_workers=0, progress=False)
    assert rf.schema.names == ["images", "meta.label", "meta.score", "raw", "text"]
    assert [(f.kind, f.dtype) for f in rf.schema.fields][-2:] == [("bytes", "bytes"), ("str", "str")]
    expected = _h5_rows(tmp_path / "d.h5", ["images", "meta/label", "meta/score", "raw", "text"])
    for row in expected:
        row["raw"] = bytes(row["raw"])
    assert_same_rows(rf.path, expected)


def test_hdf5_workers_keys_and_errors(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = np.arange(40).reshape(20, 2)
        f["y"] = np.arange(19)
        f["scalar"] = 3.0
        f.create_group("g")
    with pytest.raises(SourceError, match="'scalar' is 0-d"):
        from_hdf5(tmp_path / "d.h5", tmp_path / "o.tr")
    with pytest.raises(SourceError, match="disagree in their first"):
        from_hdf5(tmp_path / "d.h5", tmp_path / "o.tr", keys=["x", "y"])
    with pytest.raises(SourceError, match="'g' is a group, not a dataset"):
        from_hdf5(tmp_path / "d.h5", tmp_path / "o.tr", keys=["g"])
    with pytest.raises(SourceError, match="'nope' is missing"):
        from_hdf5(tmp_path / "d.h5", tmp_path / "o.tr", keys=["nope"])
    rf = from_hdf5(tmp_path / "d.h5", tmp_path / "o.tr", keys=["/x"], num_workers=2, progress=False)
    assert_same_rows(rf.path, [{"x": np.arange(40).reshape(20, 2)[i]} for i in range(20)])
    (tmp_path / "bad.h5").write_text("not hdf5")
    with pytest.raises(SourceError, match="cannot open as HDF5"):
        from_hdf5(tmp_path / "bad.h5", tmp_path / "o2.tr")


# -- format detection, dispatch, optional extras -----------------------------------


def test_detect_format_and_convert(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "imgs", {"a": 1})
    np.save(tmp_path / "a.npy", np.zeros(3))
    np.savez(tmp_path / "b.npz", a=np.zeros(3))
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["a"] = np.zeros(3)
    (tmp_path / "c.h5").rename(tmp_path / "c.data")  # found by its signature, not its name
    (tmp_path / "list.txt").write_text("imgs/a/000.png 0\n")
    (tmp_path / "blob").write_bytes(b"\0\1\2")
    found = {name: detect_format(tmp_path / name) for name in ["imgs", "a.npy", "b.npz", "c.data", "list.txt"]}
    assert found == {"imgs": "folder", "a.npy": "npy", "b.npz": "npz", "c.data": "hdf5", "list.txt": "list"}
    with pytest.raises(SourceError, match="cannot tell its format"):
        detect_format(tmp_path / "blob")
    with pytest.raises(SourceError, match="no such file"):
        detect_format(tmp_path / "absent")
    for name in found:
        rf = convert(tmp_path / name, tmp_path / f"{name}.tr", progress=False)
        assert rf.user_metadata["source_format"] == found[name]
    with pytest.raises(ValueError, match=r"keys=.* does not apply to a folder source.*it is for npz, hdf5"):
        convert(tmp_path / "imgs", tmp_path / "x.tr", keys=["a"])
    with pytest.raises(ValueError, match="unknown source format 'tfrecord'"):
        convert(tmp_path / "imgs", tmp_path / "x.tr", format="tfrecord")


def test_optional_extras_are_imported_lazily_and_named_when_missing(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['PIL'] = None\n"  # as if Pillow and h5py were not installed
        "sys.modules['h5py'] = None\n"
        "import torchrecord.cli, torchrecord.convert, torchrecord.transforms\n"
        "from torchrecord.convert import from_hdf5, from_image_folder\n"
        "from torchrecord.transforms import decode_image\n"
        "for call in (lambda: from_image_folder(sys.argv[1], sys.argv[2]),\n"
        "             lambda: from_hdf5(sys.argv[3], sys.argv[2]), lambda: decode_image(b'x')):\n"
        "    try:\n"
        "        call()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
        "rf = from_image_folder(sys.argv[1], sys.argv[2], check_images=False, progress=False)\n"
        "print(len(rf))\n"
    )
    make_image_folder(tmp_path / "imgs", {"a": 2})
    (tmp_path / "d.h5").write_bytes(b"placeholder")
    args = [str(tmp_path / "imgs"), str(tmp_path / "out.tr"), str(tmp_path / "d.h5")]
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "checking images (check_images=True, the default) needs Pillow: pip install 'pillow>=9'"
        " (or, in a torchrecord checkout: pip install -e '.[images]')",
        "reading HDF5 files needs h5py: pip install 'h5py>=3'"
        " (or, in a torchrecord checkout: pip install -e '.[hdf5]')",
        "decode_image needs Pillow: pip install 'pillow>=9'"
        " (or, in a torchrecord checkout: pip install -e '.[images]')",
        "2",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["folder", "npy", "npz", "hdf5"])
def test_converters_read_in_spawn_workers(tmp_path: Path, source: str) -> None:
    """Every converter's dataset pickles into spawn workers (it must not carry open files or mappings)."""
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    src = tmp_path / {"folder": "src", "npy": "x.npy", "npz": "x.npz", "hdf5": "x.h5"}[source]
    expected: dict[bytes, int] = {}
    if source == "folder":
        expected = make_image_folder(src, {"a": 3, "b": 2})
    elif source == "npy":
        np.save(src, x)
    elif source == "npz":
        np.savez(src, x=x)
    else:
        with h5py.File(src, "w") as f:
            f["x"] = x
    rf = convert(src, tmp_path / "out.tr", num_workers=2, multiprocessing_context="spawn", progress=False)
    if source == "folder":
        assert_same_images(rf.path, expected)
    else:
        assert_same_rows(rf.path, list(x) if source == "npy" else [{"x": row} for row in x])
