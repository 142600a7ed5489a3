"""The torchrecord command line through main([...]) on real record sets and sources in tmp_path."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import torchrecord
from tests.cli.conftest import Run
from tests.conftest import IndexedImages
from tests.convert.test_convert import assert_same_images, assert_same_rows, image_pixels, make_image_folder, png_bytes
from torchrecord import RecordFile


def assert_one_line_error(err: str, command: str, *fragments: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"torchrecord {command}: error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# -- usage -----------------------------------------------------------------------


def test_usage_help_and_version(run: Run) -> None:
    code, out, _ = run("--help")
    assert code == 0
    for command in ("convert", "info", "head", "verify", "bench"):
        assert command in out
    code, out, _ = run("--version")
    assert (code, out.strip()) == (0, f"torchrecord {torchrecord.__version__}")
    code, out, _ = run("convert", "--help")
    assert code == 0 and "--skip-bad" in out and "--no-shuffle" in out
    assert "root/<class>/<image>" in out
    assert run()[0] == 2  # no command
    code, _, err = run("info")
    assert code == 2 and "PATH" in err.upper()
    assert run("head", "x.tr", "-n", "0")[0] == 2
    assert run("convert", "a", "b", "--format", "csv")[0] == 2


# -- info, head ------------------------------------------------------------------


def test_info_text_and_json(run: Run, make_record: Callable[..., str]) -> None:
    path = make_record(IndexedImages(30, size=4), seed=7, metadata={"split": "train", "blob": b"\x00\xff"})
    code, out, err = run("info", path)
    assert (code, err) == (0, "")
    assert "samples:      30 in 1 records\n" in out  # packed automatically
    assert "shuffled with seed 7" in out
    assert f"written by torchrecord {torchrecord.__version__}" in out
    assert f"({os.path.getsize(path)} bytes)" in out
    assert "  0     tensor  uint8     [3, 4, 4] fixed" in out
    assert "  1     int     int64     [] fixed" in out
    assert "split: 'train'" in out
    code, out, _ = run("info", path, "--json")
    info = json.loads(out)
    assert code == 0 and info["count"] == 30 and info["seed"] == 7 and info["shuffled"] is True
    assert info["fields"][0] == {
        "name": "0",
        "kind": "tensor",
        "dtype": "uint8",
        "shape": [3, 4, 4],
        "fixed": True,
        "compression": None,
        "compression_level": None,
    }
    assert info["groups"] is None and info["manifest_version"] is None
    assert info["user_metadata"] == {"split": "train", "blob": "\x00\\xff"}  # bytes: UTF-8, backslash-escaped
    assert info["size_bytes"] == os.path.getsize(path)
    assert info["format_version"] == 1 and info["library_version"] == torchrecord.__version__
    assert info["created"] == RecordFile(path).metadata["created"]


def test_info_variable_shapes(run: Run, make_record: Callable[..., str]) -> None:
    samples = [{"x": np.zeros((2, i + 1), np.float32), "s": "é" * i} for i in range(3)]
    code, out, _ = run("info", make_record(samples, schema={"x": (2, None)}))
    assert code == 0
    assert "  x     ndarray float32   [2, ?] variable" in out
    assert "  s     str     str       variable length" in out


def test_head(run: Run, make_record: Callable[..., str]) -> None:
    samples = [{"blob": bytes(range(200)), "text": "w" * 100, "x": np.arange(20.0) + i, "n": i} for i in range(6)]
    path = make_record(samples, shuffle=False)
    code, out, err = run("head", path, "-n", "2", "--index", "3")
    assert (code, err) == (0, "")
    assert "sample 3:" in out and "sample 4:" in out and "sample 2:" not in out and "sample 5:" not in out
    assert "  blob  bytes   200 bytes: b'\\x00\\x01" in out and "...\n" in out  # truncated
    assert "  text  str     100 chars: 'wwww" in out
    assert "  x     ndarray float64 [20]: [3, 4, 5, 6, 7, 8, 9, 10, ...]" in out
    assert "  n     int     3\n" in out
    code, out, _ = run("head", path, "--index", "-1")
    assert code == 0 and out.startswith("sample 5:") and out.count("sample") == 1
    code, out, err = run("head", path, "--index", "6")
    assert (code, out) == (1, "")
    assert_one_line_error(err, "head", "index 6 is out of range; the set holds 6 samples")


@pytest.mark.parametrize("command", ["info", "head", "verify", "bench"])
def test_not_a_record_set(run: Run, tmp_path: Path, command: str) -> None:
    code, _, err = run(command, tmp_path / "missing.tr")
    assert code == 1
    assert_one_line_error(err, command, "missing.tr: no record set here")
    (tmp_path / "text.tr").write_text("hello")
    code, _, err = run(command, tmp_path / "text.tr")
    assert code == 1
    assert_one_line_error(err, command, "text.tr")


# -- verify ----------------------------------------------------------------------


def test_verify_ok_and_corrupt(run: Run, make_record: Callable[..., str]) -> None:
    samples = [f"marker-{i:04d}-" + "x" * 40 for i in range(50)]
    path = make_record(samples)
    code, out, err = run("verify", path)
    assert (code, err) == (0, "")
    assert out.strip() == f"{path}: OK, 50 records checked, none bad"
    stored = list(RecordFile(path))
    victim = samples[17]
    data = bytearray(Path(path).read_bytes())
    at = data.index(victim.encode())
    data[at + 7] ^= 0x01  # flip one bit inside that record's value
    Path(path).write_bytes(bytes(data))
    code, out, err = run("verify", path, "--quiet")
    assert code == 1
    position = stored.index(victim)
    assert "1 of 50 records bad" in out and f"record {position}: " in out
    assert_one_line_error(err, "verify", f"the first is record {position}", "CRC-32")


# -- bench -----------------------------------------------------------------------


def test_bench(run: Run, make_record: Callable[..., str]) -> None:
    path = make_record(IndexedImages(100))
    code, out, err = run("bench", path, "--workers", "1", "--batch-size", "16", "--epochs", "2")
    assert (code, err) == (0, "")
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"{path}: 100 samples, ")
    assert "workers=1 batch_size=16 epochs=2 shuffle=True" in lines[0]
    assert [line.split(":")[0] for line in lines[1:]] == ["epoch 0", "epoch 1", "median"]
    assert all("samples/s, " in line and line.endswith(" MB/s") for line in lines[1:])
    code, out, _ = run("bench", path, "--workers", "0", "--batch-size", "7", "--epochs", "1", "--no-shuffle")
    assert code == 0 and "workers=0 batch_size=7 epochs=1 shuffle=False" in out


def test_bench_counts_samples_of_any_structure(run: Run, make_record: Callable[..., str]) -> None:
    samples = [{"image": b"bytes%d" % i, "label": i} for i in range(10)]
    code, out, _ = run("bench", make_record(samples), "--workers", "0", "--batch-size", "4", "--epochs", "1")
    assert code == 0 and "median" in out
    code, _, _ = run("bench", make_record([b"x%d" % i for i in range(9)]), "--workers", "0", "--epochs", "1")
    assert code == 0


# -- convert ---------------------------------------------------------------------


def test_convert_folder_then_inspect(run: Run, tmp_path: Path) -> None:
    expected = make_image_folder(tmp_path / "src", {"cat": 3, "dog": 4})
    out_path = tmp_path / "out.tr"
    code, out, err = run("convert", tmp_path / "src", out_path, "--seed", "3", "--workers", "2")
    assert (code, err) == (0, "")
    assert out.startswith(
        f"wrote {out_path}: 7 samples from {tmp_path / 'src'} (folder), shuffled with seed 3, 0 skipped"
    )
    assert_same_images(out_path, expected)
    code, out, _ = run("info", out_path, "--json")
    info = json.loads(out)
    assert info["count"] == 7 and info["seed"] == 3
    assert info["user_metadata"] == {"source_format": "folder", "classes": ["cat", "dog"]}
    assert [f["name"] for f in info["fields"]] == ["image", "label", "path"]
    code, out, _ = run("head", out_path, "-n", "1")
    assert code == 0 and "  image  bytes   " in out and "b'\\x89PNG" in out
    assert run("verify", out_path)[0] == 0


def test_convert_bad_image_and_skip_bad(run: Run, tmp_path: Path) -> None:
    expected = make_image_folder(tmp_path / "src", {"a": 3})
    bad = tmp_path / "src" / "a" / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff but then garbage")
    code, out, err = run("convert", tmp_path / "src", tmp_path / "out.tr")
    assert (code, out) == (1, "")
    assert_one_line_error(err, "convert", str(bad), "not a decodable image", "--skip-bad")
    assert not (tmp_path / "out.tr").exists()
    code, out, err = run("convert", tmp_path / "src", tmp_path / "out.tr", "--skip-bad", "--no-shuffle")
    assert (code, err) == (0, "")
    assert "in source order, 1 skipped" in out
    assert f"skipped sample 3: SourceError: {bad}: not a decodable image" in out  # each skipped file named
    assert_same_images(tmp_path / "out.tr", expected)
    # only the signature is checked with --no-check-images: this file passes
    code, out, _ = run("convert", tmp_path / "src", tmp_path / "o2.tr", "--no-check-images")
    assert code == 0 and "0 skipped" in out


def test_convert_extensions_and_paths(run: Run, tmp_path: Path) -> None:
    expected = make_image_folder(tmp_path / "src", {"a": 2})
    (tmp_path / "src" / "a" / "README.txt").write_text("not an image")
    code, out, err = run("convert", tmp_path / "src", tmp_path / "out.tr")
    assert (code, err) == (0, "") and "2 samples" in out
    assert_same_images(tmp_path / "out.tr", expected)
    assert sorted(s["path"] for s in RecordFile(tmp_path / "out.tr")) == ["a/000.png", "a/001.png"]
    code, out, err = run("convert", tmp_path / "src", tmp_path / "np.tr", "--no-paths")
    assert code == 0 and RecordFile(tmp_path / "np.tr").schema.names == ["image", "label"]
    code, out, err = run("convert", tmp_path / "src", tmp_path / "all.tr", "--extensions", "*")
    assert code == 1 and "README.txt: not a decodable image" in err
    code, out, err = run("convert", tmp_path / "src", tmp_path / "all.tr", "--extensions", "*", "--skip-bad")
    assert code == 0 and "1 skipped" in out and "README.txt" in out
    code, out, err = run("convert", tmp_path / "src", tmp_path / "j.tr", "--extensions", ".jpg,.jpeg")
    assert code == 1 and "none with an image extension (.jpg, .jpeg)" in err


def test_convert_existing_target(run: Run, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.arange(5))
    assert run("convert", tmp_path / "x.npy", tmp_path / "out.tr")[0] == 0
    code, _, err = run("convert", tmp_path / "x.npy", tmp_path / "out.tr")
    assert code == 1
    assert_one_line_error(err, "convert", "out.tr: exists already; pass --overwrite to replace it")
    code, _, _ = run("convert", tmp_path / "x.npy", tmp_path / "out.tr", "--overwrite", "--seed", "9")
    assert code == 0 and RecordFile(tmp_path / "out.tr").metadata["seed"] == 9


def test_convert_arrays(run: Run, tmp_path: Path) -> None:
    x, y = np.arange(60, dtype=np.float32).reshape(20, 3), np.arange(20, dtype=np.int64)
    np.savez_compressed(tmp_path / "a.npz", x=x, y=y, other=np.zeros(2))
    code, out, err = run("convert", tmp_path / "a.npz", tmp_path / "a.tr", "--keys", "x,y")
    assert (code, err) == (0, "")
    assert "20 samples" in out and "(npz)" in out
    assert_same_rows(tmp_path / "a.tr", [{"x": x[i], "y": y[i]} for i in range(20)])
    code, _, err = run("convert", tmp_path / "a.npz", tmp_path / "b.tr")
    assert code == 1
    assert_one_line_error(err, "convert", "disagree in their first (sample) dimension", "'other' has 2")
    with h5py.File(tmp_path / "d.hdf5", "w") as f:
        f["x"] = x
    code, out, _ = run("convert", tmp_path / "d.hdf5", tmp_path / "d.tr", "--format", "hdf5", "--no-shuffle")
    assert code == 0 and "(hdf5), in source order" in out
    assert [s["x"].tolist() for s in RecordFile(tmp_path / "d.tr")] == x.tolist()


def test_convert_takes_the_write_options(run: Run, tmp_path: Path) -> None:
    pytest.importorskip("cramjam")
    x = np.repeat(np.arange(400, dtype=np.float32)[:, None], 64, axis=1)  # compressible rows
    np.save(tmp_path / "x.npy", x)
    code, out, err = run("convert", tmp_path / "x.npy", tmp_path / "z.tr", "--compression", "zstd")
    assert (code, err) == (0, "") and "compressed: value (zstd)" in out
    rf = RecordFile(tmp_path / "z.tr")
    assert rf.metadata["compression"]["value"]["applied"] and rf.metadata["compression"]["value"]["codec"] == "zstd"
    assert rf.samples_per_record > 1  # packed automatically, as write_record does
    assert sorted(float(row[0]) for row in rf) == x[:, 0].tolist()
    argv = ["--compression", "value=lz4", "--compression-level", "9", "--samples-per-record", "1", "--no-checksums"]
    code, out, err = run("convert", tmp_path / "x.npy", tmp_path / "l.tr", *argv, "--metadata", '{"run": 7}')
    assert (code, err) == (0, "") and "compressed: value (lz4)" in out
    rf = RecordFile(tmp_path / "l.tr")
    assert rf.metadata["compression"]["value"]["level"] == 9 and rf.samples_per_record == 1
    assert rf.metadata["checksum"] is None and rf.user_metadata["run"] == 7
    code, out, err = run("convert", tmp_path / "x.npy", tmp_path / "g.tr", "--compression", "gzip")
    assert code == 1
    assert_one_line_error(err, "convert", "unknown compression 'gzip'")
    code, out, err = run("convert", tmp_path / "x.npy", tmp_path / "m.tr", "--max-skipped", "3")
    assert code == 1
    assert_one_line_error(err, "convert", "--max-skipped bounds --skip-bad")
    assert not (tmp_path / "g.tr").exists() and not (tmp_path / "m.tr").exists()


@pytest.mark.parametrize(
    ("make", "argv", "fragments"),
    [
        (None, ["missing_dir", "o.tr"], ["missing_dir: no such file or directory"]),
        ("empty_dir", ["empty_dir", "o.tr"], ["empty_dir: no class folders"]),
        ("empty_dir", ["empty_dir", "o.tr", "--format", "npy"], ["empty_dir: is a directory"]),
        (
            "npy",
            ["x.npy", "o.tr", "--keys", "a"],
            ["--keys does not apply to a npy source", "npz, hdf5, robomimic and hf sources"],
        ),
        ("npy", ["x.npy", "o.tr", "--format", "folder"], ["x.npy: not a directory"]),
        ("npy", ["x.npy", "no_such_dir/o.tr"], ["parent directory", "does not exist"]),
        ("empty_dir", ["empty_dir", "o.tr", "--keys", "a"], ["--keys does not apply to a folder source"]),
    ],
)
def test_convert_errors(
    run: Run,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: str | None,
    argv: list[str],
    fragments: list[str],
) -> None:
    if make == "empty_dir":
        (tmp_path / "empty_dir").mkdir()
    if make == "npy":
        np.save(tmp_path / "x.npy", np.arange(3))
    monkeypatch.chdir(tmp_path)
    code, out, err = run("convert", *argv)
    assert (code, out) == (1, "")
    assert_one_line_error(err, "convert", *fragments)
    assert not (tmp_path / "o.tr").exists()


# -- progress bars ---------------------------------------------------------------


def _on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run the CLI in a subprocess whose stdout and stderr are a pseudo-terminal."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # else tqdm's width is 0
    proc = subprocess.Popen([sys.executable, "-m", "torchrecord", *argv], stdout=follower, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """Through ``python -m torchrecord``: a bar on a terminal, none with --quiet."""
    np.save(tmp_path / "x.npy", np.arange(50))
    code, text = _on_a_terminal(["convert", str(tmp_path / "x.npy"), str(tmp_path / "a.tr")])
    assert code == 0 and "writing: 100%" in text and "50/50" in text
    code, text = _on_a_terminal(["convert", str(tmp_path / "x.npy"), str(tmp_path / "b.tr"), "--quiet"])
    assert code == 0 and "%" not in text and "wrote" in text


def test_quiet_when_piped(run: Run, tmp_path: Path) -> None:
    """Under pytest stderr is no terminal: no bar, so stderr stays empty."""
    make_image_folder(tmp_path / "src", {"a": 2})
    Path(tmp_path / "src" / "a" / "extra.png").write_bytes(png_bytes(image_pixels(3, 3)))
    code, _, err = run("convert", tmp_path / "src", tmp_path / "o.tr")
    assert (code, err) == (0, "")
    assert (run("verify", tmp_path / "o.tr")[2], run("bench", tmp_path / "o.tr", "--epochs", "1")[2]) == ("", "")


# -- the convert command reads the converters' registry (issue 37) -----------------------------


def test_hf_takes_keys_and_split_from_the_command_line(run: Run, tmp_path: Path) -> None:
    """--keys chooses hf columns, as convert(keys=) does (the command refused it before the registry)."""
    datasets = pytest.importorskip("datasets")
    data = {"a": [1, 2, 3], "b": ["x", "y", "z"], "c": [0.5, 1.5, 2.5]}
    datasets.DatasetDict(train=datasets.Dataset.from_dict(data)).save_to_disk(str(tmp_path / "saved"))
    code, _, err = run("convert", tmp_path / "saved", tmp_path / "o.tr", "--keys", "a,b", "--split", "train", "-q")
    assert code == 0, err
    rf = RecordFile(tmp_path / "o.tr")
    assert rf.schema.names == ["a", "b"] and sorted(s["a"] for s in rf) == [1, 2, 3]
    code, _, err = run("convert", tmp_path / "saved", tmp_path / "p.tr", "--dataset-keys", "a", "-q")
    assert code == 1
    assert_one_line_error(err, "convert", "--dataset-keys does not apply to a hf source", "robomimic")


def test_a_flags_own_parser_error_is_a_usage_error(run: Run, tmp_path: Path) -> None:
    code, _, err = run("convert", tmp_path, tmp_path / "o.tr", "--extensions", ",")
    assert code == 2 and "--extensions" in err and "expected extensions such as .jpg,.png" in err
