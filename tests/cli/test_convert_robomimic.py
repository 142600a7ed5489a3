"""`torchrecord convert` on robomimic files: the format in the help, its options, one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.cli.conftest import Run
from tests.cli.test_cli import assert_one_line_error
from tests.robomimic_files import write_demo_file
from torchrecord import RecordFile

LENGTHS = [6, 1, 13, 4, 9, 5]


@pytest.fixture
def hdf5(tmp_path: Path) -> Path:
    path = tmp_path / "demo.hdf5"
    write_demo_file(path, LENGTHS)
    return path


def test_help_lists_robomimic_and_its_options(run: Run) -> None:
    code, out, _ = run("convert", "--help")
    assert code == 0
    assert "robomimic  robomimic demos" in out
    assert "--dataset-keys" in out and "robomimic: obs keys" in out
    code, out, _ = run("--help")
    assert "robomimic" in out


def test_the_summary_counts_steps_and_demos(run: Run, hdf5: Path, tmp_path: Path) -> None:
    code, out, err = run("convert", hdf5, tmp_path / "out.tr", "-q")
    assert code == 0, err
    assert f": {sum(LENGTHS)} steps from {len(LENGTHS)} demos of " in out
    assert len(RecordFile(tmp_path / "out.tr")) == sum(LENGTHS)


@pytest.mark.parametrize(
    ("options", "flag", "why"),
    [
        (["--shards", "2", "--shard", "0"], "--shards", "a sharded set has no groups"),
        (["--shuffle"], "--shuffle", "keeps robomimic's demo order"),
        (["--seed", "3"], "--seed", "keeps robomimic's demo order"),
        (["--workers", "2"], "--workers", "read in this process"),
        (["--skip-bad"], "--skip-bad", "a bad demo stops the conversion"),
        (["--group-by", "demo"], "--group-by", "grouped by demo"),
        (["--schema", '{"demo": "int64"}'], "--schema", "builds the schema"),
        (["--no-paths"], "--no-paths", "for folder and list sources"),
        (["--extensions", ".png"], "--extensions", "for folder sources"),
        (["--no-check-images"], "--no-check-images", "for folder and list sources"),
        (["--multiprocessing-context", "spawn"], "--multiprocessing-context", "read in this process"),
    ],
)
def test_options_that_do_not_apply_are_refused(
    run: Run, hdf5: Path, tmp_path: Path, options: list[str], flag: str, why: str
) -> None:
    code, _, err = run("convert", hdf5, tmp_path / "out.tr", "-q", *options)
    assert code == 1
    assert_one_line_error(err, "convert", f"{flag} does not apply to a robomimic source", why, "leave it out")
    assert not (tmp_path / "out.tr").exists()


def test_no_shuffle_is_what_it_does(run: Run, hdf5: Path, tmp_path: Path) -> None:
    code, _, err = run("convert", hdf5, tmp_path / "out.tr", "-q", "--no-shuffle")
    assert code == 0, err
    assert RecordFile(tmp_path / "out.tr").metadata["shuffled"] is False


def test_dataset_keys_obs_keys_compression_and_packing(run: Run, hdf5: Path, tmp_path: Path) -> None:
    pytest.importorskip("cramjam")
    out = tmp_path / "out.tr"
    code, _, err = run(
        "convert", hdf5, out, "-q", "--keys", "pos,cam", "--dataset-keys", "actions,states",
        "--compression", "obs.cam=zstd", "--samples-per-record", "3",
    )  # fmt: skip
    assert code == 0, err
    rf = RecordFile(out)
    assert rf.schema.names == ["demo", "obs.pos", "obs.cam", "actions", "states"]
    assert rf.metadata["compression"]["obs.cam"]["codec"] == "zstd"
    assert rf.samples_per_record == 3
    with h5py.File(hdf5, "r") as f:
        np.testing.assert_array_equal(np.stack([s["states"] for s in rf][:6]), f["data/demo_0/states"][()])


def test_the_converted_set_is_not_flagged_as_badly_packed(run: Run, hdf5: Path, tmp_path: Path) -> None:
    """info's packing advice is for sets written with samples_per_record=1; the converter packs by default."""
    out = tmp_path / "out.tr"
    assert run("convert", hdf5, out, "-q")[0] == 0
    _, text, _ = run("info", out, "--json")
    info = json.loads(text)
    assert info["samples_per_record"] == info["automatic_samples_per_record"] > 1
    _, text, _ = run("info", out)
    assert "write it again" not in text
    # packed as told, the advice names what the user can do: convert again with the default
    assert run("convert", hdf5, tmp_path / "one.tr", "-q", "--samples-per-record", "1")[0] == 0
    _, text, _ = run("info", tmp_path / "one.tr")
    assert "samples_per_record=None" in text
    assert run("convert", hdf5, tmp_path / "again.tr", "-q")[0] == 0  # which convert accepts


def test_format_hdf5_on_a_robomimic_file_suggests_robomimic(run: Run, hdf5: Path, tmp_path: Path) -> None:
    code, _, err = run("convert", hdf5, tmp_path / "out.tr", "--format", "hdf5", "-q")
    assert code == 1
    assert_one_line_error(err, "convert", "a robomimic file", "--format robomimic")
    assert len(err) < 300


def test_many_disagreeing_arrays_make_a_short_message(run: Run, tmp_path: Path) -> None:
    path = tmp_path / "many.h5"
    with h5py.File(path, "w") as f:
        for i in range(60):
            f[f"group_{i:02d}/x"] = np.zeros(i % 7 + 1)
    code, _, err = run("convert", path, tmp_path / "out.tr", "-q")
    assert code == 1
    assert_one_line_error(err, "convert", "disagree in their first (sample) dimension", "more arrays", "more lengths")
    assert len(err) < 400


def test_image_options_are_refused_for_other_formats(run: Run, tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((4, 2)))
    code, _, err = run("convert", tmp_path / "a.npy", tmp_path / "out.tr", "-q", "--no-paths")
    assert code == 1
    assert_one_line_error(err, "convert", "--no-paths does not apply to a npy source")
    code, _, err = run("convert", tmp_path / "a.npy", tmp_path / "out.tr", "-q", "--dataset-keys", "x")
    assert_one_line_error(err, "convert", "--dataset-keys does not apply to a npy source", "robomimic")
