"""The inspecting commands on the cases a new user meets: size overhead, empty sets, mistyped numbers."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import numpy as np
import pytest
import torch

from tests.cli.conftest import Run
from torchrecord.errors import TorchRecordWarning, VariableShapeWarning

THREE_KB = 3000


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
    with pytest.warns(TorchRecordWarning, match="no samples"):
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


# -- issue 27: info on sharded and grouped sets, the compression level, head of one group ------------------


def test_info_on_a_sharded_set_gives_the_versions(run: Run, tmp_path: os.PathLike[str]) -> None:
    import torchrecord

    folder = os.path.join(tmp_path, "shards")
    for i in range(2):
        torchrecord.write_shard([{"x": i} for i in range(10)], folder, shard=i, num_shards=2, progress=False)
    code, out, _ = run("info", folder)
    assert code == 0 and "None" not in out
    assert "format:       sharded-set manifest version 1, shards of format version 1, finalized by" in out
    info = json.loads(run("info", folder, "--json")[1])
    assert info["format_version"] == 1 and info["manifest_version"] == 1 and info["groups"] is None


def test_info_shows_the_groups_and_head_shows_one_group(run: Run, tmp_path: os.PathLike[str]) -> None:
    import torchrecord

    path = os.path.join(tmp_path, "g.tr")
    with torchrecord.RecordWriter(path, group_by="episode", progress=False) as w:
        for episode in range(4):
            for step in range(episode + 1):
                w.append({"episode": episode, "step": step})
    code, out, _ = run("info", path)
    assert code == 0 and "groups:       4 (group_by 'episode'" in out
    assert json.loads(run("info", path, "--json")[1])["groups"] == 4
    rf = torchrecord.RecordFile(path)
    g = next(i for i in range(4) if len(rf.group(i)) == 3)  # episode 2, wherever the shuffle put it
    start = int(rf.groups[g])
    code, out, _ = run("head", path, "--group", str(g))
    assert code == 0 and f"group {g}: 3 samples, stored at {start} .. {start + 2}" in out
    assert [line for line in out.splitlines() if line.startswith("sample ")] == [
        f"sample {start + k}:" for k in range(3)
    ]
    assert out.count("episode  int     2") == 3
    code, out, _ = run("head", path, "--group", str(g), "--index", "-1")
    assert out.count("sample ") == 1 and f"sample {start + 2}:" in out
    code, _, err = run("head", path, "--group", "4")
    assert code == 1 and "group 4 is out of range; the set holds 4 groups" in err
    plain = torchrecord.write_record([1, 2, 3], os.path.join(tmp_path, "p.tr"), progress=False)
    code, _, err = run("head", plain.path, "--group", "0")
    assert code == 1 and "has no groups (it was written without group_by); leave --group out" in err


def test_info_shows_the_compression_level(run: Run, tmp_path: os.PathLike[str]) -> None:
    pytest.importorskip("cramjam")
    import torchrecord

    rows = [{"x": np.zeros(2000, np.uint8), "s": "text"} for _ in range(20)]
    path = os.path.join(tmp_path, "c.tr")
    torchrecord.write_record(rows, path, compression="zstd", compression_level=7, progress=False)
    out = run("info", path)[1]
    assert "(zstd-compressed, level 7)" in out
    fields = {f["name"]: f for f in json.loads(run("info", path, "--json")[1])["fields"]}
    assert fields["x"]["compression_level"] == 7 and fields["s"]["compression_level"] is None
    folder = os.path.join(tmp_path, "shards")
    for i in range(2):
        torchrecord.write_shard(rows, folder, shard=i, num_shards=2, compression="zstd", progress=False)
    assert "(zstd-compressed, level 3)" in run("info", folder)[1]  # zstd's default level, from the manifest
