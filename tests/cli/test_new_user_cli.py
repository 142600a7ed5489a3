"""Issue 41, item 8: the command line on folders that are no set, and with its output cut short."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchrecord
from tests.cli.conftest import Run

ROOT = Path(__file__).resolve().parents[2]


def test_info_on_a_folder_of_splits_names_one_of_them(run: Run, tmp_path: Path) -> None:
    """from_hf writes a DatasetDict as folder/<split>: info on the folder points to folder/train."""
    datasets = pytest.importorskip("datasets")
    from torchrecord.convert import from_hf

    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"x": [1, 2, 3]}), test=datasets.Dataset.from_dict({"x": [4]})
    )
    from_hf(dd, tmp_path / "splits", progress=False)
    for command in ("info", "head"):
        code, out, err = run(command, tmp_path / "splits")
        assert code == 1 and out == ""
        assert "is a folder of 2 record sets (test, train; from_hf writes one per split)" in err, err
        assert f"e.g. {tmp_path / 'splits' / 'train'}" in err, err
    assert run("info", tmp_path / "splits" / "train")[0] == 0
    with pytest.raises(torchrecord.errors.NotARecordSetError, match="give one of them"):
        torchrecord.RecordDataset(tmp_path / "splits")


def test_info_on_a_save_to_disk_folder_names_convert(run: Run, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict(
        train=datasets.Dataset.from_dict({"x": [1, 2, 3]}), test=datasets.Dataset.from_dict({"x": [4]})
    )
    dd.save_to_disk(str(tmp_path / "on-disk"))
    code, _, err = run("info", tmp_path / "on-disk")
    assert code == 1 and "a Hugging Face DatasetDict saved with save_to_disk (splits: test, train)" in err, err
    assert f"torchrecord convert {tmp_path / 'on-disk'} OUT.tr --split train" in err, err
    code, _, err = run("info", tmp_path / "on-disk" / "train")
    assert code == 1 and f"torchrecord convert {tmp_path / 'on-disk' / 'train'} OUT.tr" in err, err
    # what it says to run works
    assert run("convert", tmp_path / "on-disk", tmp_path / "train.tr", "--split", "train", "-q")[0] == 0
    assert len(torchrecord.RecordFile(tmp_path / "train.tr")) == 3


def test_a_folder_of_unfinalized_shards_still_says_to_finalize(run: Run, tmp_path: Path) -> None:
    """Control: shards without a manifest are LMDB files too, but their own message stands."""
    samples = [(torch.zeros(2), i) for i in range(8)]
    torchrecord.write_shard(samples, tmp_path / "shards", shard=0, num_shards=2, progress=False, finalize=False)
    code, _, err = run("info", tmp_path / "shards")
    assert code == 1 and "finalize_shards" in err and "folder of" not in err, err


def test_output_cut_short_ends_quietly(tmp_path: Path) -> None:
    """`torchrecord head X -n 3000 | head -3`: no "Broken pipe", no traceback; exit status 141."""
    path = tmp_path / "wide.tr"
    torchrecord.write_record([{f"a{k}": i for k in range(50)} for i in range(3000)], path, progress=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = f"{sys.executable} -m torchrecord head {path} -n 3000 | head -3; echo status=${{PIPESTATUS[0]}}"
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.stdout.splitlines()[0] == "sample 0:" and proc.stdout.splitlines()[-1] == "status=141", proc.stdout
    assert proc.stderr == "", proc.stderr  # neither "Broken pipe" nor "Exception ignored"
    # the whole output, read to the end, still exits 0
    whole = subprocess.run([sys.executable, "-m", "torchrecord", "head", str(path), "-n", "2"], env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert whole.returncode == 0 and whole.stdout.startswith("sample 0:")
