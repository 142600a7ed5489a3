"""torchrecord.convert.from_webdataset against tars written with webdataset.TarWriter.

The check that matters: a model sees the same samples (as a multiset) from the
tars read by ``webdataset.WebDataset`` and from the converted set read by
``RecordDataset`` in DataLoader workers. URLs: ``file://`` and a local
``http.server`` started by the test (fsspec's HTTP filesystem, no network).
"""

from __future__ import annotations

import functools
import gc
import gzip
import http.server
import json
import shutil
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.convert.test_convert import image_pixels, png_bytes
from torchrecord import RecordDataset, RecordFile, open_set
from torchrecord.convert import convert, detect_format, from_webdataset
from torchrecord.errors import SourceError
from torchrecord.transforms import decode_image

wds = pytest.importorskip("webdataset")


def make_tars(folder: Path, tars: int = 3, per_tar: int = 6) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in range(tars):
        path = str(folder / f"shard-{t:03d}.tar")
        with wds.TarWriter(path) as writer:
            for i in range(per_tar):
                n = t * per_tar + i
                writer.write(
                    {
                        "__key__": f"sample{n:04d}",
                        "png": png_bytes(image_pixels(n % 4, n)),
                        "cls": n % 4,
                        "json": {"n": n, "name": f"s{n}"},
                        "seg.txt": f"segment {n}".encode(),
                    }
                )
        paths.append(path)
    return paths


def view(sample: dict[str, Any]) -> tuple[Any, ...]:
    """What a model sees of a sample, hashable: key, image bytes, class, JSON, text bytes."""
    meta = sample["json"]
    if isinstance(meta, (bytes, bytearray)):  # webdataset gives raw bytes
        meta = json.loads(meta)
    cls = sample["cls"]
    cls = int(cls.decode()) if isinstance(cls, (bytes, bytearray)) else int(cls)
    return (sample["__key__"], bytes(sample["png"]), cls, int(meta["n"]), meta["name"], bytes(sample["seg.txt"]))


def from_webdataset_library(paths: list[str]) -> Counter[tuple[Any, ...]]:
    """The samples as webdataset.WebDataset gives them (it leaves its tar files to the garbage collector)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        seen = Counter(view(s) for s in wds.WebDataset(paths, shardshuffle=False, empty_check=False))
        gc.collect()
    return seen


def from_loader(path: Path) -> Counter[tuple[Any, ...]]:
    ds = RecordDataset(path)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    return Counter(view(s) for s in loader)


def test_a_model_sees_the_same_samples_from_the_tars_and_the_set(tmp_path: Path) -> None:
    paths = make_tars(tmp_path / "tars")
    rf = from_webdataset(paths, tmp_path / "out.tr", seed=2, progress=False)
    assert len(rf) == 18 and rf.user_metadata == {"source_format": "webdataset", "tars": 3}
    fields = {f.name: f.dtype for f in rf.schema.fields}
    assert fields == {"__key__": "str", "png": "bytes", "cls": "int64", "json.n": "int64", "json.name": "str",
                      "seg.txt": "bytes"}  # fmt: skip
    assert from_loader(tmp_path / "out.tr") == from_webdataset_library(paths)
    assert [s["__key__"] for s in rf] != sorted(s["__key__"] for s in rf)  # shuffled across the tars


def test_images_decode_after_shuffling(tmp_path: Path) -> None:
    rf = from_webdataset(make_tars(tmp_path / "tars", 1, 4), tmp_path / "out.tr", progress=False)
    ds = RecordDataset(rf.path, transform=functools.partial(decode_image, key="png"), batch_size=4)
    (batch,) = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    for image, label, meta_n in zip(batch["png"], batch["cls"].tolist(), batch["json"]["n"].tolist()):
        assert torch.equal(image, torch.from_numpy(image_pixels(label, meta_n)).permute(2, 0, 1))


def test_shards_out_of_indexed_and_of_streamed_tars(tmp_path: Path) -> None:
    paths = make_tars(tmp_path / "tars")
    single = from_webdataset(paths, tmp_path / "one.tr", seed=5, progress=False)
    for i in range(2):
        from_webdataset(tmp_path / "tars", tmp_path / "shards", shard=i, num_shards=2, seed=5, progress=False)
    assert [s["__key__"] for s in open_set(tmp_path / "shards")] == [s["__key__"] for s in single]
    gz = []
    for path in paths:  # compressed tars are streamed; each shard reads whole tars
        with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        gz.append(path + ".gz")
    for i in range(3):
        from_webdataset(gz, tmp_path / "gzshards", shard=i, num_shards=3, progress=False)
    assert from_loader(tmp_path / "gzshards") == from_webdataset_library(paths)
    with pytest.raises(ValueError, match="3 streamed tars cannot make 4 shards"):
        from_webdataset(gz, tmp_path / "x", shard=0, num_shards=4)


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))

    class Quiet(http.server.ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass

    server = Quiet(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def test_urls_file_and_http(tmp_path: Path, http_root: tuple[str, Path]) -> None:
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    base, root = http_root
    paths = make_tars(root, 2, 3)
    expected = from_webdataset_library(paths)
    rf = from_webdataset([f"file://{p}" for p in paths], tmp_path / "file.tr", progress=False)
    assert Counter(view(s) for s in rf) == expected
    urls = [f"{base}/{Path(p).name}" for p in paths]
    rf = from_webdataset(urls, tmp_path / "http.tr", progress=False)
    assert Counter(view(s) for s in rf) == expected


def test_bad_members_are_named_and_tars_detected(tmp_path: Path) -> None:
    path = str(tmp_path / "bad.tar")
    with wds.TarWriter(path) as writer:
        writer.write({"__key__": "a", "cls": b"1", "png": b"x"})
        writer.write({"__key__": "b", "cls": b"one", "png": b"y"})
    assert detect_format(path) == "webdataset"
    with pytest.raises(SourceError, match=r"bad\.tar: sample 1 \('b'\): \.cls is not an int"):
        convert(path, tmp_path / "out.tr", shuffle=False, progress=False)
    rf = from_webdataset(path, tmp_path / "skip.tr", on_error="skip", progress=False)
    assert [s["__key__"] for s in rf] == ["a"] and rf.write_summary.skipped == 1
    with pytest.raises(SourceError, match="no such file"):
        from_webdataset(tmp_path / "missing.tar", tmp_path / "m.tr")
    assert not (tmp_path / "m.tr").exists() and isinstance(RecordFile(tmp_path / "skip.tr"), RecordFile)
