"""The inspecting commands on the cases a new user meets: size overhead, empty sets, mistyped numbers."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch

from torchrecord.cli import main
from torchrecord.errors import VariableShapeWarning

Run = Callable[..., tuple[int, str, str]]

THREE_KB = 3000


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """run(*argv) -> (exit code, stdout, stderr) of main(argv)."""

    def call(*argv: str | os.PathLike[str]) -> tuple[int, str, str]:
        code = main([os.fspath(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return call


def test_info_prints_the_ratio_of_file_size_to_sample_data(run: Run, make_record: Callable[..., str]) -> None:
    """A 3,000-byte sample takes a whole 4 KiB LMDB page; float32[16] + label pays per-record overhead."""
    samples = [torch.full((THREE_KB,), i % 256, dtype=torch.uint8) for i in range(200)]
    big = make_record(samples, samples_per_record=1)
    code, out, err = run("info", big)
    assert (code, err) == (0, "")
    ratio = os.path.getsize(big) / (200 * THREE_KB)
    assert 1.3 < ratio < 1.5
    assert f"{ratio:.2f}x the 585.9 KiB of sample data" in out
    assert "write it again with the default, samples_per_record=None, which packs 4 samples per record" in out
    default = make_record(samples)  # automatic: 4 samples fill 3 pages
    code, out, _ = run("info", default)
    packed_ratio = os.path.getsize(default) / (200 * THREE_KB)
    assert packed_ratio < 1.15 and f"{packed_ratio:.2f}x the 585.9 KiB of sample data" in out
    assert "200 in 50 records" in out and "samples_per_record" not in out
    code, out, _ = run("info", big, "--json")
    info = json.loads(out)
    assert info["payload_bytes"] == 200 * THREE_KB and info["size_ratio"] == round(ratio, 3)

    tiny = make_record([(torch.randn(16), i) for i in range(5000)], samples_per_record=1)
    info = json.loads(run("info", tiny, "--json")[1])
    assert info["payload_bytes"] == 5000 * (16 * 4 + 8) and info["size_ratio"] > 1.5
    info = json.loads(run("info", make_record([(torch.randn(16), i) for i in range(5000)]), "--json")[1])
    assert info["size_ratio"] < 1.15 and info["samples_per_record"] == info["automatic_samples_per_record"] > 1
    packed = make_record([(torch.randn(16), i) for i in range(20_000)], samples_per_record=1024)
    info = json.loads(run("info", packed, "--json")[1])
    assert info["size_ratio"] < 1.15, "packing brings it near 1.0x"
    assert "samples_per_record=" not in run("info", packed)[1]


def test_info_scans_variable_sets_when_cheap_or_asked(run: Run, make_record: Callable[..., str]) -> None:
    rows = [{"ids": np.arange(i % 9, dtype=np.int32), "text": "é" * i} for i in range(50)]
    with pytest.warns(VariableShapeWarning):
        path = make_record(rows)
    payload = sum(4 * (i % 9) + 2 * i for i in range(50))
    assert json.loads(run("info", path, "--json")[1])["payload_bytes"] == payload  # a small file: scanned
    code, out, _ = run("info", path, "--no-scan")
    assert code == 0 and "sample data not known without a scan (torchrecord info --scan)" in out
    assert json.loads(run("info", path, "--json", "--no-scan")[1])["payload_bytes"] is None
    packed = make_record([{"t": "x" * i} for i in range(30)], samples_per_record=4)
    assert json.loads(run("info", packed, "--json", "--scan")[1])["payload_bytes"] == sum(range(30))


def test_head_of_an_empty_set_is_an_empty_listing(run: Run, make_record: Callable[..., str]) -> None:
    path = make_record([])
    code, out, err = run("head", path)
    assert (code, out) == (0, "")
    assert "no samples" in err
    assert run("info", path)[0] == 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["head", "PATH", "-n", "x"], "argument -n: expected a positive integer (1 or more), got 'x'"),
        (["head", "PATH", "-n", "0"], "argument -n: expected a positive integer (1 or more), got 0"),
        (["bench", "PATH", "--workers", "-1"], "expected a non-negative integer (0 or more), got -1"),
        (["bench", "PATH", "--workers", "two"], "expected a non-negative integer (0 or more), got 'two'"),
    ],
)
def test_number_arguments_say_what_they_expect(run: Run, argv: list[str], expected: str) -> None:
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    assert expected in err and "_positive" not in err and "_non_negative" not in err
