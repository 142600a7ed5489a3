"""The registry of benchmarked loaders: one class per loader, looked up by name."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.loaders.base import Epochs, Loader, disk_bytes, ensure_built, read_through
from benchmarks.loaders.lance_take import LanceLoader
from benchmarks.loaders.limits import InMemoryLimit, RawLmdbLimit
from benchmarks.loaders.lmdb_pickle import LmdbPickleLoader
from benchmarks.loaders.npy_folder import NpyFolderLoader
from benchmarks.loaders.torchrecord_loader import TorchRecordLoader
from benchmarks.loaders.webdataset_tar import WebDatasetLoader

__all__ = [
    "Epochs",
    "Loader",
    "LoaderOptions",
    "disk_bytes",
    "ensure_built",
    "read_through",
    "registry",
]


@dataclass(frozen=True)
class LoaderOptions:
    """Knobs shared by the loaders that shuffle, and torchrecord's packing.

    Attributes:
        shuffle_buffer: samples held by the shuffle buffer of torchrecord and WebDataset.
        samples_per_record: K for the ``torchrecord-packed`` variants; ``0`` takes the K
            write_record chooses when left to itself (what a user gets).
        transform_us: a per-sample transform that spins this many microseconds, given
            to the torchrecord loaders (0: none): the stand-in for decoding or augmenting.
    """

    shuffle_buffer: int = 2048
    samples_per_record: int = 0
    transform_us: float = 0.0


#: the one-sample-per-record torchrecord loaders: (name, batch mode, through RecordLoader)
_TORCHRECORD_VARIANTS = [
    ("torchrecord", False, False),
    ("torchrecord-batch", True, False),
    ("torchrecord-loader", True, True),
    ("torchrecord-sample-loader", False, True),
]


#: the packed torchrecord loaders, batch mode: (name, through RecordLoader); the loader reads the set
#: write_record makes by default the way the docs recommend with workers
_PACKED_VARIANTS = [("torchrecord-packed", False), ("torchrecord-packed-loader", True)]


def registry(options: LoaderOptions | None = None) -> dict[str, Loader]:
    """Every loader by name, in report order: competitors first, then the limits."""
    opts = options or LoaderOptions()
    loaders: list[Loader] = [
        NpyFolderLoader(),
        LmdbPickleLoader(),
        WebDatasetLoader(opts.shuffle_buffer),
        LanceLoader(),
        *(
            TorchRecordLoader(
                name,
                batch_mode=batch_mode,
                shuffle_buffer=opts.shuffle_buffer,
                transform_us=opts.transform_us,
                record_loader=record_loader,
            )
            for name, batch_mode, record_loader in _TORCHRECORD_VARIANTS
        ),
        *(
            TorchRecordLoader(
                name,
                batch_mode=True,
                samples_per_record=opts.samples_per_record,
                shuffle_buffer=opts.shuffle_buffer,
                transform_us=opts.transform_us,
                record_loader=record_loader,
            )
            for name, record_loader in _PACKED_VARIANTS
        ),
        RawLmdbLimit(),
        RawLmdbLimit(fresh=True),
        RawLmdbLimit(packed=True, samples_per_record=opts.samples_per_record),
        InMemoryLimit(),
        InMemoryLimit(through_dataloader=True),
    ]
    return {loader.name: loader for loader in loaders}
