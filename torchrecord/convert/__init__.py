"""Convert common dataset layouts into record sets (what ``torchrecord convert`` runs).

========  ====================================  ==============================================
format    source                                sample
========  ====================================  ==============================================
folder    ``root/<class>/<image>`` tree          ``{"image": bytes, "label": int, "path": str}``;
                                                the class names are ``user_metadata["classes"]``
list      text file of ``<path> <label>`` lines  ``{"image": bytes, "label": int, "path": str}``
npy       one ``.npy`` array                     its row ``array[i]``
npz       ``.npz`` archive                       ``{name: array[i]}`` over its arrays
hdf5      HDF5 file                              ``{name: dataset[i]}`` (groups nest dicts)
lerobot   LeRobot v3.0 folder (or a repo id in   one frame, episodes together, cameras as
          the local Hugging Face cache)         uint8 [H, W, C]; see :func:`from_lerobot`
robomimic robomimic HDF5 (``data/demo_N/...``)    one time step, demos as groups (each
                                                demo's final next_obs frame kept beside
                                                the steps); see :func:`from_robomimic`
hf        a ``save_to_disk`` folder or a folder  ``{column: value}`` per row; see :func:`from_hf`
          of parquet files (or, from Python, a   (also a ``Dataset``/``DatasetDict``/
          ``datasets`` object)                   ``IterableDataset`` object)
webdataset  WebDataset ``.tar`` shards          ``{"__key__": str, <ext>: value}``; see
                                                :func:`from_webdataset`
========  ====================================  ==============================================

Every converter returns the :class:`~torchrecord.RecordFile` it wrote and takes
the write options of :func:`torchrecord.write_record`
(:class:`~torchrecord.WriteOptions`: ``shuffle``, ``seed``, ``num_workers``,
``on_error``, ``compression``, ...), with the same defaults, and
``shard``/``num_shards`` to write one shard of a sharded set
(:func:`torchrecord.write_shard`). The user metadata also records
``source_format``. robomimic files (detected before the generic HDF5 converter)
keep robomimic's demo order: the options that do not apply to them (``seed``,
``num_workers``, ``on_error``, ...; the windows are shuffled when read) are
refused, ``keys`` chooses their obs keys and ``dataset_keys`` their per-step
arrays. An option that applies only to other formats (``check_images``,
``keep_paths``, ``extensions``, ``dataset_keys``, ``split``) is refused when given another
value than its default for a source it does not apply to. Images are stored encoded; use
``RecordDataset(path, transform=torchrecord.transforms.decode_image)`` to decode
them after shuffling. Pillow (``images`` extra) and h5py (``hdf5`` extra) are
imported only when needed. Each format's converter is one entry of
:data:`REGISTRY` (see ``registry.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from torchrecord.convert._common import ConvertOptions
from torchrecord.convert.arrays import from_numpy
from torchrecord.convert.hdf5 import from_hdf5
from torchrecord.convert.hf import from_hf
from torchrecord.convert.images import from_image_folder, from_list_file
from torchrecord.convert.lerobot import from_lerobot, is_lerobot
from torchrecord.convert.registry import FORMATS, REGISTRY, convert, detect_format
from torchrecord.convert.robomimic import from_robomimic, is_robomimic
from torchrecord.convert.wds import from_webdataset

__all__ = [
    "CONVERTERS",
    "ConvertOptions",
    "FORMATS",
    "REGISTRY",
    "convert",
    "detect_format",
    "from_hdf5",
    "from_hf",
    "from_image_folder",
    "from_lerobot",
    "from_list_file",
    "from_numpy",
    "from_robomimic",
    "from_webdataset",
    "is_lerobot",
    "is_robomimic",
]

#: The converter function of each source format (its registry entry: :data:`REGISTRY`).
CONVERTERS: dict[str, Callable[..., object]] = {name: c.function for name, c in REGISTRY.items()}
