"""The converters' registry, read by :func:`convert`, :func:`detect_format` and ``torchrecord convert``.

Each format's module describes its converter with one
:class:`~torchrecord.convert._common.Converter` (its name, function, detection,
options with their command-line flags, and the write options that do not apply
to it); :data:`REGISTRY` lists them, one line each. Adding a converter is its
module, its line here and its test (docs/ARCHITECTURE.md, *Adding a converter*).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any

from torchrecord._write.settings import WriteOptions, WriteSettings, spell_out, unexpected
from torchrecord.convert._common import Converter, ConvertOptions, Option, Probe, existing
from torchrecord.convert.arrays import NPY, NPZ
from torchrecord.convert.hdf5 import HDF5
from torchrecord.convert.hf import HF
from torchrecord.convert.images import FOLDER, LIST
from torchrecord.convert.lerobot import LEROBOT
from torchrecord.convert.robomimic import ROBOMIMIC
from torchrecord.convert.wds import WEBDATASET
from torchrecord.errors import ArgumentError, ArgumentTypeError, SourceError

__all__ = ["FORMATS", "REGISTRY", "SHARDING", "convert", "detect_format", "options", "refusal"]

#: Every converter by its format name, in the order the formats are listed.
REGISTRY: dict[str, Converter] = {
    c.name: c
    for c in (
        FOLDER,
        LIST,
        NPY,
        NPZ,
        HDF5,
        ROBOMIMIC,
        LEROBOT,
        HF,
        WEBDATASET,
    )
}
#: Format names accepted by :func:`convert` (besides ``"auto"``).
FORMATS = tuple(REGISTRY)
#: The sharding options every converter takes unless it refuses them (see :func:`torchrecord.write_shard`).
SHARDING = ("shard", "num_shards")


def options() -> dict[str, Option]:
    """Every converter option by name (an option several converters take is listed once)."""
    return {option.name: option for c in REGISTRY.values() for option in c.options}


def detect_format(source: str | os.PathLike[str]) -> str:
    """Guess a source's format: the first converter, by rank, whose detection says yes.

    A folder written by ``save_to_disk``, or one holding parquet files and no
    image files, is ``hf``, any other folder ``folder``; a tar file is
    ``webdataset``. NumPy and HDF5 files are recognized by their signature bytes
    (HDF5 also by suffix; one with robomimic's layout is ``robomimic``); any
    other file without NUL bytes in its first 64 KiB is taken as a ``list``
    file. SourceError if the path is missing or the format is unclear.
    """
    path = os.fspath(source)
    is_dir = os.path.isdir(path)
    head = b""
    if not is_dir:
        with open(existing(path), "rb") as f:
            head = f.read(1 << 16)
    probe = Probe(path, is_dir, head)
    for converter in sorted(REGISTRY.values(), key=lambda c: c.rank):
        if converter.detect is not None and converter.detect(probe):
            return converter.name
    raise SourceError(f"{path}: cannot tell its format; choose one with format= (--format): {', '.join(FORMATS)}")


def refusal(fmt: str, given: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first of the ``given`` options that does not apply to a ``fmt`` source: (its name, why); else None.

    An option of other converters, or a write option the converter refuses, is
    refused when given with another value than its default (the format's own
    default where it has one): ``check_images=True`` passes for any source.
    """
    converter = REGISTRY[fmt]
    own = {o.name for o in converter.options}
    for name, value in given.items():
        if name in converter.refused:
            default = converter.defaults.get(name, _default(name))
            if _differs(value, default):
                return name, converter.refused[name]
        elif name in options() and name not in own and _differs(value, options()[name].default):
            takers = [c.name for c in REGISTRY.values() if name in {o.name for o in c.options}]
            return name, f"it is for {_listed(takers)} sources"
    return None


def _default(name: str) -> Any:
    return None if name in SHARDING else getattr(WriteSettings(), name)


def _differs(value: Any, default: Any) -> bool:
    as_tuple = tuple(value) if isinstance(value, list) else value
    return bool(as_tuple != default)


def _listed(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _takes(converter: Converter, given: Mapping[str, Any]) -> dict[str, Any]:
    """What ``convert()`` passes on: the converter's own options given another value, and the write options."""
    out = {}
    own = {o.name for o in converter.options}
    for name, value in given.items():
        if name in converter.refused:
            continue
        if name in options() and (name not in own or not _differs(value, options()[name].default)):
            continue
        out[converter.parameters.get(name, name)] = value
    return out


def _check_names(given: Iterable[str]) -> None:
    known = [*options(), *ConvertOptions.__annotations__]
    for name in given:
        if name not in known:
            raise ArgumentTypeError(unexpected("convert", name, known))


@spell_out(ConvertOptions)
def convert(source: str | os.PathLike[str], path: str | os.PathLike[str], *, format: str = "auto", **given: Any) -> Any:
    """Convert ``source`` into a record set at ``path`` with the converter of its format.

    Args:
        source: a folder, list file, ``.npy``/``.npz``, HDF5 or tar file, or a
            Hugging Face dataset folder.
        path: the record set to write (a folder with ``num_shards``).
        format: one of :data:`FORMATS`, or ``"auto"`` (:func:`detect_format`).
        **given: the options of the format's converter (``keys``, ``split``,
            ``check_images``, ...; see each ``from_*``), the write options and
            ``shard``/``num_shards`` (:class:`ConvertOptions`). An option that does not apply
            to the source's format is refused (ValueError naming it and why)
            unless it has its default: a robomimic source keeps its demo order,
            so ``shuffle=False`` is what it does, and refuses the options that
            do not apply to it (see :func:`from_robomimic`).

    Returns:
        What the converter returns: the :class:`~torchrecord.RecordFile`
        written (a dict of split -> RecordFile for a whole ``hf`` dataset dict).
    """
    _check_names(given)
    WriteSettings.of({k: v for k, v in given.items() if k in WriteOptions.__annotations__}, "convert")
    fmt = detect_format(source) if format == "auto" else format
    if fmt not in REGISTRY:
        raise ArgumentError(f"unknown source format {format!r}; choose one of auto, {', '.join(FORMATS)}")
    refused = refusal(fmt, given)
    if refused is not None:
        name, why = refused
        raise ArgumentError(
            f"{name}={given[name]!r} does not apply to a {fmt} source ({os.fspath(source)}): {why}; leave it out"
        )
    converter = REGISTRY[fmt]
    return converter.function(source, path, **_takes(converter, given))


def _published() -> inspect.Signature:
    """convert()'s signature as help() shows it: the converters' options, sharding, then the write options."""
    signature = inspect.signature(convert)
    parameters = list(signature.parameters.values())
    at = [p.name for p in parameters].index("format") + 1
    keyword = inspect.Parameter.KEYWORD_ONLY
    own = [inspect.Parameter(o.name, keyword, default=o.default, annotation=o.annotation) for o in options().values()]
    return signature.replace(parameters=parameters[:at] + own + parameters[at:])


convert.__signature__ = _published()  # type: ignore[attr-defined]
