"""RecordLoader's bundles: several batches per handover, yielded in exactly a plain DataLoader's order.

Every batch of every epoch is kept and compared afterwards (kept batches stay
valid while the workers go on), with real DataLoader workers under fork and
spawn, small batches (crossing together by value) and large ones (each in a slot).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import torchrecord
from tests.conftest import IndexedImages
from torchrecord import RecordDataset, RecordLoader
from torchrecord._read import ipc, slots
from torchrecord._read.loader import auto_bundle
from torchrecord.errors import ArgumentError

SMALL, LARGE = 4, 64  # image side: 48-byte samples (a batch crosses by value), 12 KB ones (a batch in a slot)
MEDIUM = 16  # 768-byte samples: a batch of 4 crosses by value alone, a bundle of 256 of them in a slot


def _write(tmp_path: Path, count: int, size: int) -> Path:
    path = tmp_path / f"set-{count}-{size}.tr"
    torchrecord.write_record(IndexedImages(count, size), path, progress=False)
    return path


def _epochs(loader: Any, dataset: RecordDataset, epochs: range) -> list[list[Any]]:
    kept = []
    for epoch in epochs:
        dataset.set_epoch(epoch)
        kept.append(list(loader))
    return kept


def _assert_same(got: list[list[Any]], want: list[list[Any]]) -> None:
    assert [len(e) for e in got] == [len(e) for e in want]
    for epoch_got, epoch_want in zip(got, want):
        for (images, labels), (want_images, want_labels) in zip(epoch_got, epoch_want):
            assert torch.equal(labels, want_labels)
            assert torch.equal(images, want_images)
            # each image still holds its own sample's pixels (the batch was not overwritten meanwhile)
            assert torch.equal(images[:, 0, 0, 0], (labels % 251).to(torch.uint8))


@pytest.mark.parametrize("size", [SMALL, LARGE])
@pytest.mark.parametrize("bundle", [None, 3])
def test_bundles_yield_every_batch_a_dataloader_yields_in_its_order(tmp_path: Path, size: int, bundle: Any) -> None:
    path = _write(tmp_path, 203, size)  # 51 batches of 4: uneven shares, a short last batch
    settings = {"batch_size": 4, "shuffle_buffer": 16, "seed": 3}
    plain_ds = RecordDataset(path, **settings)
    plain = DataLoader(plain_ds, batch_size=None, num_workers=2, persistent_workers=True)
    want = _epochs(plain, plain_ds, range(3))
    ds = RecordDataset(path, **settings)
    loader = RecordLoader(ds, num_workers=2, bundle=bundle, persistent_workers=True, multiprocessing_context="fork")
    assert loader.bundle == (3 if bundle == 3 else auto_bundle(ds))
    assert loader.bundle > 1
    got = _epochs(loader, ds, range(3))
    _assert_same(got, want)


def test_bundles_in_spawn_workers_with_pin_memory(tmp_path: Path) -> None:
    path = _write(tmp_path, 150, LARGE)
    settings = {"batch_size": 8, "shuffle_buffer": 16, "seed": 1}
    plain_ds = RecordDataset(path, **settings)
    want = _epochs(DataLoader(plain_ds, batch_size=None, num_workers=0), plain_ds, range(1))
    ds = RecordDataset(path, **settings)
    loader = RecordLoader(ds, num_workers=1, bundle=4, pin_memory=True, multiprocessing_context="spawn")
    # pin_memory without an accelerator: torch warns and pins nothing (with one, Bundle.pin_memory pins)
    with pytest.warns(UserWarning, match="pin_memory") if not torch.accelerator.is_available() else nullcontext():
        got = _epochs(loader, ds, range(1))
    _assert_same(got, want)


def test_a_worker_with_no_batches_and_more_workers_than_bundles(tmp_path: Path) -> None:
    path = _write(tmp_path, 9, SMALL)  # 3 batches of 4 (the last short) over 4 workers: one gets none
    settings = {"batch_size": 4, "shuffle_buffer": 4, "seed": 2}
    plain_ds = RecordDataset(path, **settings)
    want = _epochs(DataLoader(plain_ds, batch_size=None, num_workers=4), plain_ds, range(2))
    ds = RecordDataset(path, **settings)
    got = _epochs(RecordLoader(ds, num_workers=4, bundle=2), ds, range(2))
    _assert_same(got, want)


def test_a_resumed_epoch_with_bundles_plays_the_rest_in_order(tmp_path: Path) -> None:
    path = _write(tmp_path, 203, LARGE)
    settings = {"batch_size": 4, "shuffle_buffer": 16, "seed": 4}
    for stop in (5, 6, 12):  # inside a bundle and at a round's end (bundles of 3 over 2 workers)
        ds = RecordDataset(path, **settings)
        ds.set_epoch(2)
        loader = RecordLoader(ds, num_workers=2, bundle=3)
        full = list(loader)
        it = iter(loader)
        head = [next(it) for _ in range(stop)]
        state = loader.state_dict()
        del it, head
        fresh = RecordDataset(path, **settings)
        resumed = RecordLoader(fresh, num_workers=2, bundle=3)
        resumed.load_state_dict(state)
        _assert_same([list(resumed)], [full[stop:]])


def test_workers_reuse_their_segments_across_epochs_of_bundles(tmp_path: Path) -> None:
    """A bundle's segments come back at once; the worker keeps them rather than closing and making new ones."""
    path = _write(tmp_path, 400, LARGE)  # batches of 8 x 12 KB: in slots
    ds = RecordDataset(path, batch_size=8, shuffle_buffer=16)
    loader = RecordLoader(ds, num_workers=2, bundle=8, persistent_workers=True)

    earlier = slots.mapped_keys()  # segments of workers of earlier tests (a pid may be reused)

    def made() -> dict[tuple[int, int], int]:  # per worker, the highest segment number mapped (key: pid, nonce, n)
        ours = [key for key in slots.mapped_keys() if key not in earlier]
        return {(p, nonce): max(n for q, m, n in ours if (q, m) == (p, nonce)) for p, nonce, _ in ours}

    _epochs(loader, ds, range(1))  # every batch of the epoch kept, then let go
    after_first = made()
    for epoch in range(1, 5):
        _epochs(loader, ds, range(epoch, epoch + 1))
    assert len(after_first) == 2
    assert made() == after_first


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_large_batches_of_a_bundle_cross_in_one_arena(tmp_path: Path, context: str) -> None:
    """Batches in slots (8 x 12 KB) are gathered into one arena a bundle and cross stacked: the batches of a
    bundle are views of one storage. Every batch kept stays valid; a short last batch, an epoch cut short and
    the next epochs of persistent workers all give what a plain DataLoader gives."""
    path = _write(tmp_path, 203, LARGE)  # 26 batches of 8, the last one short
    settings = {"batch_size": 8, "shuffle_buffer": 16, "seed": 2}
    plain_ds = RecordDataset(path, **settings)
    want = _epochs(DataLoader(plain_ds, batch_size=None, num_workers=2), plain_ds, range(3))
    ds = RecordDataset(path, **settings)
    loader = RecordLoader(ds, num_workers=2, bundle=3, persistent_workers=True, multiprocessing_context=context)
    ds.set_epoch(0)
    cut = iter(loader)
    cut_short = [next(cut) for _ in range(4)]  # an epoch cut short: its workers' unfinished bundles are dropped
    del cut
    got = _epochs(loader, ds, range(3))
    _assert_same(got, want)
    _assert_same([cut_short], [want[0][:4]])
    for epoch in got:
        # batches come a bundle of each worker in turn: 0, 2, 4 from worker 0's first bundle (one storage)
        storages = [images.untyped_storage().data_ptr() for images, _ in epoch]
        assert storages[0] == storages[2] == storages[4]
        assert storages[0] != storages[1]
        assert storages[6] != storages[0]


@pytest.mark.skipif(not slots.available(), reason="no memfd_create: no slots")
def test_an_arena_crosses_only_whole() -> None:
    """A batch of a bundle's arena handed over alone is copied out of it (each handover of a segment has one
    receiver, who frees all of it); the bundle's batches stacked cross in the arena itself."""
    slots.bundle_arenas(3)
    try:
        slots.end_arena()
        batches = []
        for value in range(3):
            (images,) = slots.allocate(4, [16])
            images[...] = value
            batches.append((torch.from_numpy(images),))
        arena_segment = slots._worker_pool().arena.segment  # type: ignore[union-attr]
        alone = slots.into_slot(batches[0])
        assert alone._ref.segment is not arena_segment  # copied into a segment of its own
        assert torch.equal(alone.batch[0], batches[0][0])
        views = slots.arena_stacked([[b[0] for b in batches]])
        assert views is not None and views[0].shape == (3, 4, 16)
        assert [int(v) for v in views[0][:, 0, 0]] == [0, 1, 2]
        whole = slots.into_slot(views, whole_arena=True)
        assert whole._ref.segment is arena_segment  # no copy
        assert slots.arena_stacked([[b[0] for b in reversed(batches)]]) is None  # not in order: not stacked
    finally:
        slots.bundle_arenas(0)
        slots.end_arena()


@pytest.mark.skipif(not slots.available(), reason="no memfd_create: no slots")
def test_batches_gathered_together_take_their_places_in_the_arena_one_after_another() -> None:
    """``allocate_batches`` gives whole batches' places in the bundle's arena, never past its end; a bundle of
    batches gathered that way, split into batches, crosses stacked in the arena itself."""
    slots.bundle_arenas(5)
    try:
        slots.end_arena()
        first = slots.allocate_batches(4, [8, 16], 3)
        assert first is not None and first[1] == 3
        assert [a.shape for a in first[0]] == [(12, 8), (12, 16)]
        assert slots.allocate_batches(2, [8, 16], 1) is None  # the arena being filled holds batches of 4 rows
        second = slots.allocate_batches(4, [8, 16], 3)
        assert second is not None and second[1] == 2  # the room left
        arena = slots._worker_pool().arena
        assert arena is not None and arena.used == arena.count == 5
        batches = []
        for arrays, n in (first, second):
            for field, array in enumerate(arrays):
                array[...] = (torch.arange(len(array)) // 4 + 10 * field).numpy()[:, None]
            parts = [torch.split(torch.from_numpy(a), 4) for a in arrays]
            batches.extend(tuple(part[j] for part in parts) for j in range(n))
        views = slots.arena_stacked([[b[f] for b in batches] for f in range(2)])
        assert views is not None and [v.shape for v in views] == [(5, 4, 8), (5, 4, 16)]
        assert [int(v) for v in views[0][:, 0, 0]] == [0, 1, 2, 0, 1] and int(views[1][4, 3, 15]) == 11
        assert slots.into_slot(views, whole_arena=True)._ref.segment is arena.segment  # no copy
        again = slots.allocate_batches(4, [8, 16], 9)  # the arena is full: the next bundle's, capped at its size
        assert again is not None and again[1] == 5 and slots._worker_pool().arena is not arena
    finally:
        slots.bundle_arenas(0)
        slots.end_arena()
    assert slots.allocate_batches(4, [8, 16], 3) is None  # bundles not gathered in arenas


def test_small_batches_go_to_the_arena_only_where_their_bundle_crosses_in_a_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not slots.available():
        assert ipc.arena_places(4, [768], 8) is None
        return
    slots.bundle_arenas(256)
    try:
        slots.end_arena()
        assert ipc.arena_places(4, [768], 8) is not None  # 256 batches of 3 KB: 786 KB, in a slot
        slots.end_arena()
        assert ipc.arena_places(4, [48], 8) is None  # 256 batches of 192 B: 49 KB, by value
        monkeypatch.setenv(ipc.HANDOVER_ENV, "value")
        assert ipc.arena_places(4, [768], 8) is None  # every batch by value, as asked
    finally:
        slots.bundle_arenas(0)
        slots.end_arena()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_small_batches_gathered_in_their_bundles_arena_are_the_batches_a_dataloader_yields(
    tmp_path: Path, context: str
) -> None:
    """Small batches whose bundle crosses in a slot are gathered several at once straight into the bundle's
    arena (``ipc.arena_places``): every batch a plain DataLoader yields, in its order, and the batches kept
    from earlier epochs intact while persistent workers fill their arenas again."""
    path = _write(tmp_path, 1603, MEDIUM)  # 401 batches of 4: several gathers an arena, a short last batch
    settings = {"batch_size": 4, "shuffle_buffer": 16, "seed": 3}
    plain_ds = RecordDataset(path, **settings)
    plain = DataLoader(plain_ds, batch_size=None, num_workers=2, persistent_workers=True)
    want = _epochs(plain, plain_ds, range(3))
    ds = RecordDataset(path, **settings)
    loader = RecordLoader(ds, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    assert loader.bundle == 256 and 256 * 4 * 3 * MEDIUM * MEDIUM > ipc.BY_VALUE_LIMIT
    got = _epochs(loader, ds, range(3))
    _assert_same(got, want)


def test_bundle_arguments_are_checked(tmp_path: Path) -> None:
    path = _write(tmp_path, 20, SMALL)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ArgumentError, match="bundle must be an integer"):
            RecordLoader(RecordDataset(path, batch_size=4), num_workers=2, bundle=bad)
    with pytest.raises(ArgumentError, match="in_order=False"):
        RecordLoader(RecordDataset(path, batch_size=4), num_workers=2, in_order=False)
    # batches that cross by value (up to 64 KiB) come 256 a bundle: 4 x 48 bytes, and 5 x 12 KB
    assert RecordLoader(RecordDataset(path), num_workers=2, batch_size=4).bundle == 256
    big = _write(tmp_path, 40, LARGE)  # 12 KB samples
    assert RecordLoader(RecordDataset(big), num_workers=2, batch_size=5).bundle == 256
    assert RecordLoader(RecordDataset(big), num_workers=2, batch_size=6).bundle == 32  # 72 KB: slots, at most 32
    # a transform may grow each batch: small stored batches keep about 256 KiB a bundle, at most 64
    grown = RecordDataset(big, batch_size=5, transform=lambda sample: sample)
    assert RecordLoader(grown, num_workers=2).bundle == 5  # 61 KB batches
    assert RecordLoader(RecordDataset(path, batch_size=4, batch_transform=lambda b: b), num_workers=2).bundle == 64
    assert RecordLoader(RecordDataset(big, batch_size=16), num_workers=2).bundle == 32  # 192 KB: at most 32
    assert RecordLoader(RecordDataset(big, batch_size=100), num_workers=2).bundle == 14  # 1.2 MB: 16 MiB, the cap
    assert RecordLoader(RecordDataset(path, batch_size=4), num_workers=0).bundle == 1
    # a set without a fixed layout: the batch size is unknown, no bundles by default
    var = tmp_path / "var.tr"
    torchrecord.write_record([(torch.zeros(i + 1),) for i in range(10)], var, progress=False, schema={"0": [None]})
    assert RecordLoader(RecordDataset(var, batch_size=2), num_workers=2).bundle == 1


def test_bundle_pickles_with_its_worker() -> None:
    import pickle

    bundle = ipc.Bundle([torch.arange(3), {"a": torch.ones(2)}], 7)
    back = pickle.loads(pickle.dumps(bundle))
    assert back.worker == 7 and torch.equal(back.batches[0], torch.arange(3))
    assert torch.equal(back.batches[1]["a"], torch.ones(2))


def _batches(count: int, rows: int) -> list[Any]:
    """Small batches of one structure: a dict with a nested tuple, several dtypes, a 0-d tensor."""
    return [
        {
            "x": torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + j,
            "meta": (torch.full((rows,), j % 2 == 0), torch.tensor(j, dtype=torch.bfloat16)),
            "id": torch.arange(rows, dtype=torch.int64) + 100 * j,
        }
        for j in range(count)
    ]


def _assert_batches_equal(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert list(a) == list(b) and type(a["meta"]) is tuple
        for x, y in ((a["x"], b["x"]), (a["id"], b["id"]), *zip(a["meta"], b["meta"])):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


@pytest.mark.parametrize("rows", [4, 2000])  # 4: the bundle crosses by value; 2,000: in a slot
def test_small_batches_stack_and_split_back_after_pickling(rows: int) -> None:
    import pickle

    batches = _batches(5, rows)
    packed = ipc.stacked(batches)
    assert packed is not None and packed.count == 5
    bundle = pickle.loads(pickle.dumps(ipc.Bundle(packed, 1)))
    assert bundle.worker == 1
    _assert_batches_equal(bundle.batches, batches)
    x = bundle.batches[2]["x"]
    assert x.is_contiguous() and x.data_ptr() == bundle.batches[0]["x"].data_ptr() + 2 * x.nbytes  # one storage


def test_batches_that_do_not_stack_cross_as_a_list() -> None:
    batches = _batches(3, 4)
    short = [*batches[:2], _batches(1, 3)[0]]  # the last, short batch of an epoch
    assert ipc.stacked(short) is None
    other_dtype = [*batches[:2], {**batches[2], "id": batches[2]["id"].to(torch.int32)}]
    assert ipc.stacked(other_dtype) is None
    other_keys = [*batches[:2], {"x": batches[2]["x"], "id": batches[2]["id"], "meta": batches[2]["meta"]}]
    assert ipc.stacked(other_keys) is None  # the same leaves in another order: another structure
    assert ipc.stacked([{**b, "names": ["a"] * 4} for b in batches]) is None  # a leaf that is not a tensor
    assert ipc.stacked([{**b, "x": b["x"].requires_grad_()} for b in _batches(3, 4)]) is None


def _flat(kind: str, j: int, rows: int = 4) -> Any:
    """A flat batch (the usual one: its items are its tensors) of ``kind``."""
    x, y = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + j, torch.arange(rows) + 10 * j
    return {"x": x, "y": y} if kind == "dict" else (x, y) if kind == "tuple" else [x, y]


@pytest.mark.parametrize("kind", ["tuple", "list", "dict"])
def test_flat_batches_stack_by_column_and_come_back_as_they_left(kind: str) -> None:
    import pickle

    batches = [_flat(kind, j) for j in range(4)]
    packed = ipc.stacked(batches)
    assert packed is not None and packed.count == 4
    back = pickle.loads(pickle.dumps(ipc.Bundle(packed, 0))).batches
    for got, want in zip(back, batches):
        assert type(got) is type(want)
        pairs = zip(got.values(), want.values()) if kind == "dict" else zip(got, want)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize("kind", ["tuple", "list", "dict"])
def test_flat_batches_that_do_not_stack_are_refused_as_flattening_refuses_them(kind: str) -> None:
    def other(batch: Any) -> list[Any]:
        return [_flat(kind, 0), _flat(kind, 1), batch]

    third = _flat(kind, 2)
    key = "y" if kind == "dict" else 1
    swap: Any = dict(third) if kind == "dict" else list(third)
    variants = []
    for leaf in (
        third[key].to(torch.int32),  # another dtype
        third[key][:3],  # another shape
        third[key].tolist(),  # a list of numbers: a leaf, not a tensor
        {"nested": third[key]},  # a structure
        torch.nn.Parameter(third[key].float()),  # a subclass (and needing grad)
    ):
        swap[key] = leaf
        variants.append(swap if kind == "dict" else type(third)(swap))
        swap = dict(third) if kind == "dict" else list(third)
    if kind == "dict":
        variants.append({"y": third["y"], "x": third["x"]})  # the same keys in another order
    else:
        variants.append(list(third) if kind == "tuple" else tuple(third))  # another kind of sequence
        variants.append(type(third)([*third, third[0]]))  # another length
    for variant in variants:
        assert ipc.stacked(other(variant)) is None, variant
    assert ipc.stacked(other(third)) is not None


def _per_sample_labels(batches: list[Any]) -> list[list[int]]:
    return [labels.tolist() for _, labels in batches]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_per_sample_bundles_yield_what_a_dataloader_yields(tmp_path: Path, context: str) -> None:
    """Per-sample mode: each worker fetches several loader batches of samples at once; same batches, same order."""
    path = _write(tmp_path, 203, LARGE)
    settings = {"shuffle_buffer": 16, "seed": 6}
    plain_ds = RecordDataset(path, **settings)
    plain = DataLoader(plain_ds, batch_size=4, num_workers=2, collate_fn=torchrecord.collate)
    want = _epochs(plain, plain_ds, range(2))
    ds = RecordDataset(path, **settings)
    loader = RecordLoader(
        ds, num_workers=2, batch_size=4, bundle=3, multiprocessing_context=context, persistent_workers=True
    )
    assert len(loader) == len(plain) == 51
    got = _epochs(loader, ds, range(2))
    _assert_same(got, want)


def test_a_resumed_per_sample_epoch_with_bundles_plays_the_rest_in_order(tmp_path: Path) -> None:
    path = _write(tmp_path, 203, SMALL)
    for stop in (4, 7):
        ds = RecordDataset(path, shuffle_buffer=16, seed=8)
        ds.set_epoch(1)
        loader = RecordLoader(ds, num_workers=2, batch_size=4, bundle=3)
        full = list(loader)
        it = iter(loader)
        head = [next(it) for _ in range(stop)]
        state = loader.state_dict()
        del it, head
        fresh = RecordDataset(path, shuffle_buffer=16, seed=8)
        resumed = RecordLoader(fresh, num_workers=2, batch_size=4, bundle=3)
        resumed.load_state_dict(state)
        _assert_same([list(resumed)], [full[stop:]])
