"""Hand-made tars against from_webdataset (issue 38, items 2, 4 and 6): correct data or a SourceError.

Every malformed tar is refused with a SourceError naming the tar, the byte offset of the header
and the member, never a builtin or third-party exception and never a silent drop; local tars (read
from their headers) and gzip-compressed ones (streamed) alike. webdataset's own reader, where it
applies, is the oracle.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from torchrecord import RecordFile
from torchrecord.convert import convert, from_webdataset
from torchrecord.errors import SourceError

# -- tars made by hand ------------------------------------------------------------------------------


def header(name: str, size: int | bytes, kind: bytes = b"0", checksum: bool = True) -> bytes:
    """A ustar header; ``size`` as a number, or the raw 12 bytes of its field."""
    h = bytearray(512)
    h[0 : len(name.encode())] = name.encode()
    h[100:108] = b"0000644\0"
    h[108:116] = h[116:124] = b"0000000\0"
    h[124:136] = size if isinstance(size, bytes) else f"{size:011o}\0".encode()
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b" " * 8
    if checksum:
        h[148:156] = f"{sum(h):06o}\0 ".encode()
    return bytes(h)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 512)


def member(name: str, data: bytes, size: int | bytes | None = None, kind: bytes = b"0") -> bytes:
    return header(name, len(data) if size is None else size, kind) + padded(data)


def pax(records: dict[str, str], name: str = "././@PaxHeader") -> bytes:
    """A pax extended header (type x) with these records, for the member after it."""
    body = b""
    for key, value in records.items():
        text = f" {key}={value}\n".encode()
        length = len(text) + 1
        length = len(str(length + len(str(length)) - 1)) + len(text)  # the length counts its own digits
        body += str(length).encode() + text
    return member(name, body, kind=b"x")


END = b"\0" * 1024


def sample_members(key: str, label: int) -> bytes:
    return member(f"{key}.txt", f"text of {key}".encode()) + member(f"{key}.cls", str(label).encode())


def write_tar(path: Path, content: bytes, compressed: bool) -> str:
    """The tar at ``path`` (``.tar``), or gzip-compressed at ``path.tar.gz`` (then streamed by the converter)."""
    if compressed:
        target = path.with_suffix(".tar.gz")
        target.write_bytes(gzip.compress(content))
        return str(target)
    target = path.with_suffix(".tar")
    target.write_bytes(content)
    return str(target)


def converted(source: str, out: Path) -> list[tuple[str, bytes, int]]:
    rf = from_webdataset(source, out, shuffle=False, progress=False)
    return [(s["__key__"], bytes(s["txt"]), int(s["cls"])) for s in rf]


def refused(source: str, out: Path, *fragments: str) -> str:
    with pytest.raises(SourceError) as info:
        from_webdataset(source, out, shuffle=False, progress=False)
    message = str(info.value)
    for fragment in (os.path.basename(source), *fragments):
        assert fragment in message, (fragment, message)
    assert not out.exists()
    return message


def webdataset_samples(source: str) -> list[dict[str, Any]]:
    """webdataset's own grouping of a local tar (the oracle)."""
    wds = pytest.importorskip("webdataset.tariterators")
    with open(source, "rb") as stream:
        files = wds.tar_file_expander([{"stream": stream, "url": source}], eof_value=None)
        return list(wds.group_by_keys(files))


COMPRESSED = pytest.mark.parametrize("compressed", [False, True], ids=["local", "streamed"])


# -- item 2: duplicate and split members -----------------------------------------------------------------


@COMPRESSED
def test_a_duplicate_member_is_refused_as_webdataset_refuses_it(tmp_path: Path, compressed: bool) -> None:
    content = sample_members("a", 0) + member("a.txt", b"again") + sample_members("b", 1) + END
    source = write_tar(tmp_path / "dup", content, compressed)
    refused(source, tmp_path / "o.tr", "byte 2048, member 'a.txt'", "a second .txt for key 'a'", "byte 0", "duplicate")
    if not compressed:
        with pytest.raises(ValueError, match="duplicate file name"):
            webdataset_samples(source)


@COMPRESSED
def test_a_key_that_comes_back_later_is_refused(tmp_path: Path, compressed: bool) -> None:
    content = sample_members("a", 0) + sample_members("b", 1) + member("a.jpg", b"late") + END
    source = write_tar(tmp_path / "split", content, compressed)
    refused(source, tmp_path / "o.tr", "byte 4096, member 'a.jpg'", "key 'a' comes back", "consecutive")


# -- item 4: zero blocks ------------------------------------------------------------------------------------


@COMPRESSED
def test_tars_joined_after_their_end_marker_are_read_on(tmp_path: Path, compressed: bool) -> None:
    """``cat a.tar b.tar``: a zero block (the first tar's end) and then more members: all are read."""
    first = sample_members("a", 0) + sample_members("b", 1) + END + b"\0" * 512 * 6  # padded to a record
    second = sample_members("c", 2) + sample_members("d", 3) + END
    source = write_tar(tmp_path / "joined", first + second, compressed)
    got = converted(source, tmp_path / "o.tr")
    assert got == [(k, f"text of {k}".encode(), i) for i, k in enumerate("abcd")]


@COMPRESSED
def test_something_else_after_a_zero_block_is_refused(tmp_path: Path, compressed: bool) -> None:
    content = sample_members("a", 0) + b"\0" * 512 + b"not a header".ljust(512, b"x") + sample_members("b", 1)
    source = write_tar(tmp_path / "junk", content, compressed)
    refused(source, tmp_path / "o.tr", "byte 2560", "no tar header follow the end-of-archive marker at byte 2048")


@COMPRESSED
def test_a_tar_without_end_marker_or_with_trailing_zeros_is_whole(tmp_path: Path, compressed: bool) -> None:
    for name, tail in (("bare", b""), ("zeros", b"\0" * 512 * 19)):
        source = write_tar(tmp_path / name, sample_members("a", 0) + sample_members("b", 1) + tail, compressed)
        assert [k for k, _, _ in converted(source, tmp_path / f"{name}.tr")] == ["a", "b"]


# -- item 6: sizes, names, truncation -----------------------------------------------------------------------

BAD_SIZES: dict[str, Callable[[], bytes]] = {
    "pax size=abc": lambda: pax({"size": "abc"}) + member("a.txt", b"x"),
    "pax 5,000-digit size": lambda: pax({"size": "9" * 5000}) + member("a.txt", b"x"),
    "pax negative size": lambda: pax({"size": "-5"}) + member("a.txt", b"x"),
    "octal size field of letters": lambda: member("a.txt", b"x", size=b"abc\0".ljust(12, b"\0")),
    "base-256 negative size": lambda: member("a.txt", b"x", size=b"\xff" * 12),
    "size beyond the file": lambda: header("a.txt", 10**9) + b"x" * 512,
}


@COMPRESSED
@pytest.mark.parametrize("case", sorted(BAD_SIZES))
def test_a_bad_size_is_a_source_error_naming_tar_offset_and_member(tmp_path: Path, case: str, compressed: bool) -> None:
    content = sample_members("k", 0) + BAD_SIZES[case]() + END
    source = write_tar(tmp_path / "bad", content, compressed)
    at = 2048 + len(BAD_SIZES[case]()) - 1024 if case.startswith("pax") else 2048  # the member's own header
    refused(source, tmp_path / "o.tr", f"byte {at}, member 'a.txt'")


@COMPRESSED
def test_a_base256_size_reads_as_tarfile_and_webdataset_read_it(tmp_path: Path, compressed: bool) -> None:
    data = b"base-256 sized"
    field = b"\x80" + len(data).to_bytes(11, "big")
    content = member("a.txt", data, size=field) + member("a.cls", b"7") + END
    source = write_tar(tmp_path / "b256", content, compressed)
    assert converted(source, tmp_path / "o.tr") == [("a", data, 7)]
    if not compressed:
        (oracle,) = webdataset_samples(source)
        assert oracle["txt"] == data and oracle["cls"] == b"7"


@COMPRESSED
def test_traversal_and_absolute_names_are_keys_and_nothing_is_extracted(tmp_path: Path, compressed: bool) -> None:
    names = ["../../escape", "/abs/root", "a/./b"]
    content = b"".join(member(f"{n}.txt", n.encode()) + member(f"{n}.cls", b"1") for n in names) + END
    (tmp_path / "in").mkdir()
    source = write_tar(tmp_path / "in" / "names", content, compressed)
    got = converted(source, tmp_path / "o.tr")
    assert got == [(n, n.encode(), 1) for n in names]
    assert sorted(os.listdir(tmp_path)) == ["in", "o.tr"] and not Path("/abs").exists()
    if not compressed:
        assert [s["__key__"] for s in webdataset_samples(source)] == names


def test_long_names_of_every_kind_convert(tmp_path: Path) -> None:
    long = "d" * 120 + "/" + "n" * 140
    content = (
        member("././@LongLink", long.encode() + b".txt\0", kind=b"L")
        + member("ignored.txt", b"gnu")
        + pax({"path": long + "2.txt"})
        + member("ignored2.txt", b"pax")
        + END
    )
    source = write_tar(tmp_path / "long", content, False)
    rf = from_webdataset(source, tmp_path / "o.tr", shuffle=False, progress=False)
    assert [(s["__key__"], bytes(s["txt"])) for s in rf] == [(long, b"gnu"), (long + "2", b"pax")]
    with tarfile.open(source) as tar:  # what tarfile makes of the same bytes
        assert [m.name for m in tar] == [long + ".txt", long + "2.txt"]


def test_a_long_name_too_long_to_be_one_is_refused(tmp_path: Path) -> None:
    content = header("././@LongLink", 10 << 20, kind=b"L") + b"n" * (10 << 20) + END
    source = write_tar(tmp_path / "huge", content, False)
    refused(source, tmp_path / "o.tr", "byte 0", "@LongLink", f"a {10 << 20}-byte header")


@pytest.mark.parametrize(("kind", "what"), [(b"S", "GNU sparse"), (b"M", "multi-volume")])
def test_sparse_and_multivolume_members_are_refused(tmp_path: Path, kind: bytes, what: str) -> None:
    content = sample_members("a", 0) + member("b.txt", b"part", kind=kind) + END
    source = write_tar(tmp_path / "odd", content, False)
    refused(source, tmp_path / "o.tr", "byte 2048, member 'b.txt'", what)


def test_a_damaged_pax_record_is_refused(tmp_path: Path) -> None:
    content = member("././@PaxHeader", b"99999999999999999999999 path=x\n", kind=b"x") + member("a.txt", b"x") + END
    refused(write_tar(tmp_path / "pax", content, False), tmp_path / "o.tr", "byte 0", "damaged pax header")


@pytest.mark.parametrize("cut", [100, 700, 1030])
def test_a_truncated_compressed_tar_is_refused(tmp_path: Path, cut: int) -> None:
    whole = gzip.compress(sample_members("a", 0) + sample_members("b", 1) + END)
    source = tmp_path / "cut.tar.gz"
    source.write_bytes(whole[: len(whole) * cut // 2000])
    refused(str(source), tmp_path / "o.tr", "byte")


def test_convert_detects_and_refuses_alike(tmp_path: Path) -> None:
    """The command line's path (convert with format detection) gives the same error."""
    source = write_tar(tmp_path / "dup", sample_members("a", 0) + member("a.cls", b"3") + END, False)
    with pytest.raises(SourceError, match=r"byte 2048, member 'a\.cls': a second \.cls.*at byte 1024"):
        convert(source, tmp_path / "o.tr", progress=False)
    assert isinstance(RecordFile, type) and not (tmp_path / "o.tr").exists()


def test_the_hand_made_helpers_make_tars_tarfile_reads() -> None:
    """Control: the helpers' headers and pax records are what tarfile writes and reads."""
    content = pax({"path": "p/q.txt", "comment": "c"}) + member("x.txt", b"abc") + END
    with tarfile.open(fileobj=io.BytesIO(content)) as tar:
        (m,) = tar.getmembers()
        assert (m.name, m.size, tar.extractfile(m).read()) == ("p/q.txt", 3, b"abc")  # type: ignore[union-attr]
