"""SequenceDataset against robomimic 0.3.0 itself: the same len() and items for every parameter combination."""

from __future__ import annotations

import contextlib
import io
import itertools
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tests.robomimic_files import DATASET, IMAGES, LOW_DIM, write_demo_file
from torchrecord import SequenceDataset
from torchrecord.convert import from_robomimic
from torchrecord.errors import MissingDatasetKeyWarning

robomimic_dataset = pytest.importorskip("robomimic.utils.dataset")
obs_utils = pytest.importorskip("robomimic.utils.obs_utils")

OBS_KEYS = ["pos", "cam", "depth", "eef"]
DATASET_KEYS = list(DATASET)
#: lengths 5-40, non-dense demo numbers (robomimic sorts them numerically: demo_2 before demo_10)
LENGTHS = [9, 5, 40, 17, 6, 23]
IDS = [0, 10, 2, 4, 7, 21]


@pytest.fixture(scope="module")
def demo_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(robomimic HDF5 file, its converted record set)."""
    obs_utils.initialize_obs_utils_with_obs_specs(
        {"obs": {"low_dim": list(LOW_DIM), "rgb": ["cam"], "depth": ["depth"]}}
    )
    root = tmp_path_factory.mktemp("robomimic")
    hdf5 = root / "demo.hdf5"
    write_demo_file(hdf5, LENGTHS, ids=IDS)  # contiguous: robomimic reads gzip chunks slowly
    out = root / "demo.tr"
    from_robomimic(hdf5, out, dataset_keys=[*DATASET_KEYS, "absent"], progress=False)
    return str(hdf5), str(out)


def oracle(hdf5: str, **kw: Any) -> Any:
    """robomimic's SequenceDataset, quietly (it prints while caching)."""
    cache = kw.pop("frame_cache")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return robomimic_dataset.SequenceDataset(hdf5, hdf5_cache_mode=cache, **kw)


def assert_same(ours: Any, theirs: Any, where: str = "") -> None:
    """Same keys in the same order, same shapes, dtypes and values, recursively."""
    assert isinstance(ours, dict) and isinstance(theirs, dict), where
    assert list(ours) == list(theirs), f"{where}: keys {list(ours)} != {list(theirs)}"
    for key in theirs:
        a, b = ours[key], theirs[key]
        if isinstance(b, dict):
            assert_same(a, b, f"{where}/{key}")
            continue
        assert isinstance(a, np.ndarray), f"{where}/{key}: {type(a)}"
        assert a.dtype == b.dtype, f"{where}/{key}: dtype {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{where}/{key}: shape {a.shape} != {b.shape}"
        assert np.array_equal(a, b), f"{where}/{key}: values differ"


def check_against_oracle(demo_set: tuple[str, str], **kw: Any) -> None:
    hdf5, path = demo_set
    try:
        theirs = oracle(hdf5, **kw)
        items = [theirs[i] for i in range(len(theirs))]  # robomimic may fail only at an item
    except (AssertionError, KeyError):
        with pytest.raises(ValueError):
            SequenceDataset(path, **kw)
        return
    ours = SequenceDataset(path, **kw)
    assert len(ours) == len(items)
    for i, item in enumerate(items):
        assert_same(ours[i], item, f"window {i} of {kw}")


WINDOW_SHAPES = list(itertools.product([1, 3, 6], [1, 4, 9], [True, False], [True, False]))
#: (get_pad_mask, goal_mode, load_next_obs), including robomimic's refused goal without next_obs
OUTPUTS = [
    (False, None, True),
    (True, "last", True),
    (True, None, False),
    (False, "last", True),
    (False, "last", False),
]
CACHES = [None, "low_dim", "all"]
FILTERS = [None, "train", "valid"]


def _params(
    fs: int, sl: int, pfs: bool, psl: bool, mask: bool, goal: str | None, nxt: bool, cache: str | None, filt: str | None
) -> dict[str, Any]:
    return dict(
        obs_keys=OBS_KEYS,
        dataset_keys=DATASET_KEYS,
        frame_stack=fs,
        seq_length=sl,
        pad_frame_stack=pfs,
        pad_seq_length=psl,
        get_pad_mask=mask,
        goal_mode=goal,
        frame_cache=cache,
        filter_by_attribute=filt,
        load_next_obs=nxt,
    )


def _covering() -> list[dict[str, Any]]:
    """Every window shape once, the other settings cycled so that each value of each appears often.

    The full product (1,620 combinations) is the slow test below.
    """
    return [
        _params(*shape, *OUTPUTS[k % len(OUTPUTS)], CACHES[k % 3], FILTERS[(k // 3) % 3])
        for k, shape in enumerate(WINDOW_SHAPES)
    ]


@pytest.mark.parametrize("params", _covering(), ids=lambda p: "-".join(str(v) for v in list(p.values())[2:]))
def test_items_equal_robomimic(demo_set: tuple[str, str], params: dict[str, Any]) -> None:
    check_against_oracle(demo_set, **params)


@pytest.mark.slow
def test_every_combination_equals_robomimic(demo_set: tuple[str, str]) -> None:
    for shape, outputs, cache, filt in itertools.product(WINDOW_SHAPES, OUTPUTS, CACHES, FILTERS):
        check_against_oracle(demo_set, **_params(*shape, *outputs, cache, filt))


def test_the_checker_can_fail(demo_set: tuple[str, str]) -> None:
    """Control: a dtype, a value and a key order that differ are caught."""
    hdf5, path = demo_set
    theirs = oracle(hdf5, **_params(2, 3, True, True, False, None, True, None, None))
    ours = SequenceDataset(path, **_params(2, 3, True, True, False, None, True, "low_dim", None))
    with pytest.raises(AssertionError, match="dtype"):
        assert_same(ours[0], theirs[0])
    ours = SequenceDataset(path, **_params(2, 3, True, True, False, None, True, None, None))
    with pytest.raises(AssertionError, match="values"):
        assert_same(ours[1], theirs[0])
    reordered = dict(reversed(list(ours[0].items())))
    with pytest.raises(AssertionError, match="keys"):
        assert_same(reordered, theirs[0])


@pytest.mark.parametrize("cache", CACHES)
def test_missing_dataset_key_reads_zeros_under_a_cache(demo_set: tuple[str, str], cache: str | None) -> None:
    """A key no demo has: robomimic gives float32 zeros [T, 1] under a cache mode and fails without one."""
    params = _params(1, 3, True, True, False, None, True, cache, None)
    params["dataset_keys"] = ["actions", "absent"]
    with pytest.warns(MissingDatasetKeyWarning, match="no dataset key 'absent'") if cache else _no_warning():
        check_against_oracle(demo_set, **params)
    if cache is not None:
        with pytest.warns(MissingDatasetKeyWarning):
            item = SequenceDataset(demo_set[1], **params)[0]
        assert item["absent"].dtype == np.float32 and item["absent"].shape == (3, 1) and not item["absent"].any()


@contextlib.contextmanager
def _no_warning() -> Any:
    yield


@pytest.mark.parametrize("cache", CACHES)
def test_a_dataset_key_the_source_lacks_reads_zeros_like_robomimic(
    demo_set: tuple[str, str], cache: str | None
) -> None:
    """A key named only when reading, absent from the file: robomimic's zeros (with a warning), not "convert again"."""
    params = _params(2, 4, True, True, True, "last", True, cache, None)
    params["dataset_keys"] = ["never_there", "actions"]
    with (
        pytest.warns(MissingDatasetKeyWarning, match="source file has no dataset key 'never_there'")
        if cache
        else (_no_warning())
    ):
        check_against_oracle(demo_set, **params)
    if cache is None:
        with pytest.raises(ValueError, match=r"source file has no dataset key 'never_there'.*frame_cache='low_dim'"):
            SequenceDataset(demo_set[1], **params)


def test_a_dataset_key_in_the_source_but_not_converted_says_convert_again(demo_set: tuple[str, str]) -> None:
    """ "states" is in every demo of the file but was not converted: robomimic would read it, so convert again."""
    with pytest.raises(ValueError, match=r"'states' is in the source file but was not converted.*convert again"):
        SequenceDataset(demo_set[1], OBS_KEYS, ["actions", "states"])


def test_too_short_demo_names_demo_and_minimum(demo_set: tuple[str, str]) -> None:
    path = demo_set[1]
    with pytest.raises(ValueError, match=r"demo\.tr: demo 'demo_0' has 9 frames.*at least 12"):
        SequenceDataset(
            path, OBS_KEYS, DATASET_KEYS, frame_stack=4, seq_length=9, pad_frame_stack=False, pad_seq_length=False
        )
    # robomimic builds this one and fails at the demo's first item: refused up front
    with pytest.raises(ValueError, match=r"'demo_10' has 5 frames.*at least 6"):
        SequenceDataset(path, OBS_KEYS, DATASET_KEYS, frame_stack=6, pad_frame_stack=False, frame_cache=None)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"frame_stack": 0}, "frame_stack"),
        ({"seq_length": 0}, "seq_length"),
        ({"goal_mode": "first"}, "goal_mode"),
        ({"goal_mode": "last", "load_next_obs": False}, "load_next_obs"),
        ({"frame_cache": "some"}, "frame_cache"),
        ({"filter_by_attribute": "nope"}, "nope"),
        ({"obs_keys": ["pos", "nope"]}, "nope"),
        ({"dataset_keys": ["states"]}, "states"),
        ({"hdf5_normalize_obs": True}, "normalize"),
        ({"frame_cache": None, "hdf5_cache_mode": "all"}, "disagree"),
    ],
)
def test_refused_parameters(demo_set: tuple[str, str], kw: dict[str, Any], match: str) -> None:
    params: dict[str, Any] = {"obs_keys": OBS_KEYS, "dataset_keys": DATASET_KEYS, **kw}
    with pytest.raises(ValueError, match=match):
        SequenceDataset(demo_set[1], **params)


def test_hdf5_cache_mode_is_an_alias(demo_set: tuple[str, str]) -> None:
    ds = SequenceDataset(demo_set[1], OBS_KEYS, DATASET_KEYS, hdf5_cache_mode=None)
    assert ds.frame_cache is None and ds[0]["actions"].dtype == np.float64
    assert SequenceDataset(demo_set[1], OBS_KEYS, DATASET_KEYS)[0]["actions"].dtype == np.float32


def test_low_dim_cache_holds_low_dim_keys_only(demo_set: tuple[str, str]) -> None:
    ds = SequenceDataset(demo_set[1], OBS_KEYS, DATASET_KEYS, frame_cache="low_dim")
    store = ds.core.store
    assert set(store.cached) == {"obs.pos", "obs.eef", *DATASET_KEYS}
    assert set(ds.core.file_fields) == {f"obs.{k}" for k in IMAGES}
    frames = sum(LENGTHS) + len(LENGTHS)  # steps and tail frames, each once
    assert store.cache_bytes == frames * (3 * 8 + 2 * 4 + 4 * 4 + 4 + 4 + 2 * 4)
    everything = SequenceDataset(demo_set[1], OBS_KEYS, DATASET_KEYS, frame_cache="all")
    assert everything.core.file_fields == []
    assert everything.core.store.cache_bytes == frames * (3 * 8 + 2 * 4 + 90 + 64 + 4 * 4 + 4 + 4 + 2 * 4)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_match_robomimic(demo_set: tuple[str, str], context: str) -> None:
    """In DataLoader workers (the dataset pickles without its cache under spawn) the batches are robomimic's."""
    hdf5, path = demo_set
    params = _params(2, 4, True, True, True, "last", True, "low_dim", "train")
    ours = SequenceDataset(path, **params)
    theirs = oracle(hdf5, **params)
    copy = pickle.loads(pickle.dumps(ours))
    assert copy.core.store.cache_bytes == 0  # pickled without its cache, which it fills on first use
    assert_same(copy[5], theirs[5])
    loader = DataLoader(ours, batch_size=16, num_workers=2, multiprocessing_context=context)
    reference = DataLoader(theirs, batch_size=16, num_workers=0)
    for a, b in zip(loader, reference, strict=True):
        for (ka, va), (kb, vb) in zip(_flat(a), _flat(b), strict=True):
            assert ka == kb and va.dtype == vb.dtype and torch.equal(va, vb)


def _flat(batch: dict[str, Any], prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    out = []
    for k, v in batch.items():
        out += _flat(v, f"{prefix}{k}/") if isinstance(v, dict) else [(prefix + k, v)]
    return out


def test_demo_order_and_filters(demo_set: tuple[str, str]) -> None:
    path = demo_set[1]
    assert SequenceDataset(path, ["pos"], []).demos == [f"demo_{i}" for i in sorted(IDS)]
    train = SequenceDataset(path, ["pos"], [], filter_by_attribute="train")
    assert train.demos == sorted([f"demo_{i}" for n, i in enumerate(IDS) if n % 4 != 1], key=lambda d: int(d[5:]))


def test_not_a_robomimic_set(tmp_path: Path) -> None:
    from torchrecord import write_record

    path = tmp_path / "plain.tr"
    write_record([{"x": np.zeros(2)}], path, progress=False)
    with pytest.raises(ValueError, match="not a set converted from robomimic"):
        SequenceDataset(path, ["x"], [])
