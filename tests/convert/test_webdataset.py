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
import io
import json
import shutil
import tarfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.convert.test_convert import image_pixels, png_bytes
from torchrecord import RecordDataset, RecordFile, open_set
from torchrecord.convert import convert, detect_format, from_webdataset
from torchrecord.convert import wds as wds_module
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


# -- the direct ustar reader of local tars ------------------------------------------------------------


def tarfile_listing(path: str) -> list[tuple[str, int, int]]:
    with tarfile.open(path) as tar:
        return [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]


def odd_tar(path: Path, fmt: int, global_pax: bool = False) -> str:
    """A tar with long names, a POSIX prefix, non-ASCII names, a directory, a link and a hidden file."""
    long_dir = "d" * 60 + "/" + "e" * 60  # > 100 characters: the ustar prefix (or a long name)
    names = [
        "plain.txt",
        f"{long_dir}/k1.png",
        f"{long_dir}/k1.cls",
        "x" * 150 + ".seg.png",  # a file name of more than 100 characters: GNU 'L' or pax 'path'
        "ünïcödé/ключ.txt",
        ".hidden.txt",
    ]
    kwargs: dict[str, Any] = {"format": fmt}
    if global_pax:
        kwargs["pax_headers"] = {"comment": "global"}
    with tarfile.open(str(path), "w", **kwargs) as tar:
        dir_info = tarfile.TarInfo("folder")
        dir_info.type = tarfile.DIRTYPE
        tar.addfile(dir_info)
        for i, name in enumerate(names):
            data = f"{i}".encode() if name.endswith(".cls") else bytes(range(i * 37 % 256)) * (i + 1)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if fmt == tarfile.PAX_FORMAT and i == 0:
                info.pax_headers = {"size": str(len(data)), "comment": "kept"}
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("link.txt")
        link.type = tarfile.SYMTYPE
        link.linkname = "l" * 120  # a long link name: GNU 'K' or pax 'linkpath'
        tar.addfile(link)
    return str(path)


@pytest.mark.parametrize(
    ("fmt", "global_pax"),
    [
        (tarfile.USTAR_FORMAT, False),
        (tarfile.GNU_FORMAT, False),
        (tarfile.PAX_FORMAT, False),
        (tarfile.PAX_FORMAT, True),
    ],
)
def test_the_direct_reader_lists_what_tarfile_lists(tmp_path: Path, fmt: int, global_pax: bool) -> None:
    if fmt == tarfile.USTAR_FORMAT:
        path = tmp_path / "ustar.tar"
        with tarfile.open(str(path), "w", format=fmt) as tar:  # ustar: no long file names, but the prefix
            for name in ("a" * 90 + "/" + "b" * 90 + "/k.png", "short.cls"):
                info = tarfile.TarInfo(name)
                info.size = 5
                tar.addfile(info, io.BytesIO(b"12345"))
        source = str(path)
    else:
        source = odd_tar(tmp_path / "odd.tar", fmt, global_pax)
    listed = list([(m.name, m.offset, m.size) for m in wds_module._tar_members(source)])
    assert listed == tarfile_listing(source)
    assert any(len(name) > 100 for name, _, _ in listed)


def test_the_direct_reader_lists_what_tarfile_lists_of_webdataset_tars(tmp_path: Path) -> None:
    for path in make_tars(tmp_path / "tars", tars=2, per_tar=5):
        listed = [(m.name, m.offset, m.size) for m in wds_module._tar_members(path)]
        assert listed == tarfile_listing(path)
        assert len(listed) == 5 * 4


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_convert_to_their_keys(tmp_path: Path, fmt: int) -> None:
    names = ["d" * 80 + "/" + "e" * 80 + "/one.txt", "x" * 150 + ".txt", "ünïcödé/ключ.txt", "short.txt"]
    source = str(tmp_path / "long.tar")
    with tarfile.open(source, "w", format=fmt) as tar:
        for i, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = i + 1
            tar.addfile(info, io.BytesIO(b"z" * (i + 1)))
    written = from_webdataset(source, tmp_path / "out.tr", shuffle=False)
    got = [(written[i]["__key__"], bytes(written[i]["txt"])) for i in range(len(written))]
    assert got == [(name[: -len(".txt")], b"z" * (i + 1)) for i, name in enumerate(names)]


def test_a_truncated_tar_is_refused_naming_the_file_and_offset(tmp_path: Path) -> None:
    (path,) = make_tars(tmp_path / "tars", tars=1, per_tar=4)
    whole = Path(path).read_bytes()
    listed = tarfile_listing(path)
    _, offset, size = listed[-1]
    cut = tmp_path / "cut-data.tar"
    cut.write_bytes(whole[: offset + size // 2])  # inside the last member's data
    with pytest.raises(
        SourceError,
        match=rf"cut-data\.tar: byte {offset - 512}, member 'sample0003\.seg\.txt': the tar ends early: the member "
        rf"needs {size} bytes from byte {offset}, but the tar ends at byte {offset + size // 2}",
    ):
        from_webdataset(str(cut), tmp_path / "a.tr")
    cut = tmp_path / "cut-header.tar"
    cut.write_bytes(whole[: offset - 300])  # inside the last member's header
    with pytest.raises(
        SourceError,
        match=rf"cut-header\.tar: byte {offset - 512}: the tar ends early: 212 bytes of a 512-byte member header",
    ):
        from_webdataset(str(cut), tmp_path / "b.tr")
    assert not (tmp_path / "a.tr").exists() and not (tmp_path / "b.tr").exists()


def test_a_damaged_header_is_refused_naming_the_file_and_offset(tmp_path: Path) -> None:
    (path,) = make_tars(tmp_path / "tars", tars=1, per_tar=4)
    data = bytearray(Path(path).read_bytes())
    _, offset, _ = tarfile_listing(path)[5]
    data[offset - 512 + 3] ^= 0x20  # a bit of the sixth member's name
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=rf"bad\.tar: damaged tar header at byte {offset - 512}"):
        from_webdataset(str(bad), tmp_path / "out.tr")


def test_image_and_class_tars_convert_as_columns(tmp_path: Path) -> None:
    """Tars of images and classes take the writer's column path: the same samples as webdataset reads."""
    folder = tmp_path / "tars"
    folder.mkdir()
    paths = []
    for t in range(2):
        paths.append(str(folder / f"s{t}.tar"))
        with wds.TarWriter(paths[-1]) as writer:
            for i in range(7):
                n = 7 * t + i
                writer.write({"__key__": f"k{n:03d}", "png": png_bytes(image_pixels(n % 3, n)), "cls": n % 3})
    samples = wds_module.TarSamples([e for p in paths for e in wds_module._index(p)])
    assert samples._torchrecord_columns(np.arange(len(samples))) is not None
    written = from_webdataset(paths, tmp_path / "out.tr", seed=3)
    got = Counter((s["__key__"], bytes(s["png"]), int(s["cls"])) for s in (written[i] for i in range(len(written))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        expected = Counter(
            (s["__key__"], s["png"], int(s["cls"]))
            for s in wds.WebDataset(paths, shardshuffle=False, empty_check=False)
        )
    assert got == expected and len(got) == 14
