"""Per-sample mode through RecordLoader reads each loader batch whole: the batches are the ones collating samples gives.

``RecordLoader(RecordDataset(p), batch_size=B)`` with the default collation reads whole batches of B samples
(``ReaderDataset._fused``) instead of yielding B samples and collating them. Passing ``collate_fn=torchrecord.collate``
takes the sample-by-sample path; both must give equal batches (values, dtypes, structure), at 0 and 2 workers under
fork and spawn, resume alike, and leave the dataset yielding samples when iterated on its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import torchrecord
from torchrecord import RecordDataset, RecordLoader


def _tuples(n: int) -> list[Any]:
    return [(np.full((3, 4), i % 251, np.uint8), i) for i in range(n)]


def _dicts(n: int) -> list[Any]:
    return [
        {"x": torch.full((2,), i / 3), "i": i, "f": i / 2, "b": i % 2 == 0, "a": np.arange(3, dtype=np.int16) + i}
        for i in range(n)
    ]


SETS = {
    "tuples": (_tuples, {}),
    "dicts": (_dicts, {}),
    "packed": (_tuples, {"samples_per_record": 8}),
}


def _assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert pytree.tree_structure(x) == pytree.tree_structure(y)
        for u, v in zip(pytree.tree_leaves(x), pytree.tree_leaves(y)):
            assert type(u) is type(v)
            assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v)


def _write(tmp_path: Path, name: str, count: int = 53) -> str:
    make, options = SETS[name]
    path = str(tmp_path / f"{name}.tr")
    torchrecord.write_record(make(count), path, seed=1, progress=False, **options)
    return path


#: every set at 0 workers and with fork workers; spawn (a worker imports torch, about 10 s each on 2 cores)
#: with one set, since the set's layout does not change what crosses to a spawned worker
CASES = (
    [(name, 0, None) for name in sorted(SETS)] + [(name, 2, "fork") for name in sorted(SETS)] + [("dicts", 2, "spawn")]
)


@pytest.mark.parametrize(("name", "workers", "context"), CASES)
def test_whole_batches_equal_collated_samples(tmp_path: Path, name: str, workers: int, context: str | None) -> None:
    path = _write(tmp_path, name)
    options: dict[str, Any] = {"num_workers": workers}
    if context is not None:
        options["multiprocessing_context"] = context
    fused = RecordLoader(RecordDataset(path, seed=3, loader_batch_size=7), batch_size=7, **options)
    assert fused._fuse == 7
    collated = RecordLoader(
        RecordDataset(path, seed=3, loader_batch_size=7), batch_size=7, collate_fn=torchrecord.collate, **options
    )
    assert collated._fuse is None
    got, want = list(fused), list(collated)
    _assert_same(got, want)
    assert len(got) == len(fused) == len(collated)
    labels = [x["i"] if isinstance(x, dict) else x[1] for x in got]
    assert sorted(torch.cat(labels).tolist()) == list(range(53))


def test_a_resumed_fused_loader_plays_the_rest(tmp_path: Path) -> None:
    path = _write(tmp_path, "tuples", 90)
    whole = list(RecordLoader(RecordDataset(path, seed=5), batch_size=8))
    loader = RecordLoader(RecordDataset(path, seed=5), batch_size=8)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 4:
            break
    state = loader.state_dict()
    assert state["position"]["readers"][0][2] == 32  # positions count samples, as without fusing
    again = RecordLoader(RecordDataset(path, seed=5), batch_size=8)
    again.load_state_dict(state)
    _assert_same(head + list(again), whole)


def test_the_dataset_iterated_on_its_own_still_yields_samples(tmp_path: Path) -> None:
    path = _write(tmp_path, "tuples", 20)
    ds = RecordDataset(path, seed=2)
    batches = list(RecordLoader(ds, batch_size=6))
    assert [len(b[1]) for b in batches] == [6, 6, 6, 2]
    samples = list(ds)
    assert len(samples) == 20 and isinstance(samples[0][1], int)


def test_a_transform_or_variable_shapes_read_sample_by_sample(tmp_path: Path) -> None:
    path = _write(tmp_path, "tuples", 20)
    assert RecordLoader(RecordDataset(path, transform=lambda s: s), batch_size=4)._fuse is None
    varied = str(tmp_path / "varied.tr")
    samples = [{"x": np.zeros(3 - i % 2, np.float32)} for i in range(10)]
    torchrecord.write_record(samples, varied, schema={"x": [None]}, progress=False)
    assert RecordLoader(RecordDataset(varied), batch_size=4)._fuse is None
