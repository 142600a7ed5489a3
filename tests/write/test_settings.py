"""Write-time checks (issue 20, point 7; issue 11, point 10): options that cannot work fail before
the source is read, samples that every reader would refuse are refused when written."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import torchrecord.convert as convert_module
from torchrecord import RecordFile, RecordWriter, write_record, write_shard
from torchrecord._write.settings import StoreOptions, WriteOptions, WriterOptions, WriteSettings
from torchrecord.convert import ConvertOptions
from torchrecord.errors import IgnoredOptionWarning, SampleTypeError, SampleValueError, SchemaError


class Untouchable(torch.utils.data.Dataset[Any]):
    """A source that fails the test if the writer reads it."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        raise AssertionError("the source was read before the options were checked")


@pytest.mark.parametrize("seed", [2**70, 2**64, -1, 1.5, True])
def test_a_seed_that_cannot_be_stored_fails_at_once(tmp_path: Path, seed: Any) -> None:
    with pytest.raises((ValueError, TypeError), match=r"seed"):
        write_record(Untouchable(), tmp_path / "s.tr", seed=seed, progress=False)
    with pytest.raises((ValueError, TypeError), match=r"seed"):
        RecordWriter(tmp_path / "w.tr", seed=seed)
    assert os.listdir(tmp_path) == []


def test_the_largest_seed_works(tmp_path: Path) -> None:
    rf = write_record(list(range(5)), tmp_path / "s.tr", seed=2**64 - 1, progress=False)
    assert rf.metadata["seed"] == 2**64 - 1


@pytest.mark.parametrize(
    ("metadata", "where"),
    [
        ({"n": 2**70}, r"metadata\['n'\]"),
        ({"a": {"b": [1, -(2**64)]}}, r"metadata\['a'\]\['b'\]\[1\]"),
        ({"a": {1: "x"}}, r"metadata\['a'\].*key 1"),
        ({"f": {1, 2}}, r"metadata\['f'\].*set"),
        ({"t": torch.zeros(1)}, r"metadata\['t'\].*Tensor"),
    ],
)
def test_metadata_that_cannot_be_stored_fails_at_once(tmp_path: Path, metadata: Any, where: str) -> None:
    with pytest.raises((ValueError, TypeError), match=where):
        write_record(Untouchable(), tmp_path / "s.tr", metadata=metadata, progress=False)
    with pytest.raises((ValueError, TypeError), match=where):
        RecordWriter(tmp_path / "w.tr", metadata=metadata)
    assert os.listdir(tmp_path) == []


def test_metadata_that_can_be_stored(tmp_path: Path) -> None:
    meta = {"n": 2**64 - 1, "neg": -(2**63), "t": (1, 2), "b": b"\x00", "nested": {"x": [None, 1.5, True]}}
    rf = write_record([1], tmp_path / "s.tr", metadata=meta, progress=False)
    assert rf.user_metadata["n"] == 2**64 - 1 and rf.user_metadata["t"] == [1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: torch.tensor([0, 2], dtype=torch.uint8).view(torch.bool),
        lambda: np.array([1, 7], dtype=np.uint8).view(np.bool_),
    ],
)
@pytest.mark.parametrize("first", [False, True])
def test_bool_arrays_must_hold_zero_or_one(tmp_path: Path, bad: Any, first: bool) -> None:
    good = torch.tensor([0, 1], dtype=torch.bool) if "tensor" in repr(bad()).lower() else np.array([0, 1], "?")
    samples = [{"mask": good}] * 5
    samples.insert(0 if first else 3, {"mask": bad()})
    path = tmp_path / "s.tr"
    index = 0 if first else 3
    with pytest.raises(SampleValueError, match=rf"sample {index}, field 'mask'.*bool.*0 and 1"):
        write_record(samples, path, shuffle=False, progress=False)
    assert os.listdir(tmp_path) == []
    rf = write_record(samples, path, shuffle=False, on_error="skip", progress=False)
    assert len(rf) == 5 and [s.index for s in rf.write_summary.skipped_samples] == [index]
    assert all(s["mask"].tolist() == [False, True] for s in rf)


def test_rank_above_32_is_refused(tmp_path: Path) -> None:
    deep = np.zeros((1,) * 33, dtype=np.float32)
    with pytest.raises(SampleValueError, match=r"sample 0, field 'x'.*rank 33.*32"):
        write_record([{"x": deep}], tmp_path / "s.tr", progress=False)
    rf = write_record([{"x": np.zeros((1,) * 32, dtype=np.float32)}], tmp_path / "ok.tr", progress=False)
    assert rf[0]["x"].ndim == 32


def test_field_names_must_be_unique_after_flattening(tmp_path: Path) -> None:
    path = tmp_path / "s.tr"
    with pytest.raises(SchemaError, match=r"sample 0.*'a\.b'.*twice.*rename"):
        write_record([{"a.b": 1, "a": {"b": 2}}], path, progress=False)
    with pytest.raises(SchemaError, match=r"'a\.b'"), RecordWriter(path) as w:
        w.append({"a.b": 1, "a": {"b": 2}})
    assert os.listdir(tmp_path) == []


def test_bytes_paths_work_like_record_file(tmp_path: Path) -> None:
    path = os.fsencode(tmp_path / "b.tr")
    rf = write_record([1, 2, 3], path, progress=False)
    assert sorted(RecordFile(path)) == [1, 2, 3] and len(rf) == 3
    with RecordWriter(os.fsencode(tmp_path / "w.tr"), progress=False) as w:
        w.append(1)
    assert list(RecordFile(tmp_path / "w.tr")) == [1]


def _stream(n: int) -> Iterator[int]:
    yield from range(n)


def test_workers_with_an_iterable_source_are_not_silently_ignored(tmp_path: Path) -> None:
    with pytest.warns(IgnoredOptionWarning, match=r"num_workers=2.*iterable.*DataLoader"):
        rf = write_record(_stream(10), tmp_path / "s.tr", num_workers=2, progress=False)
    assert sorted(rf) == list(range(10))


def test_unknown_leaf_types_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(SampleTypeError, match=r"sample 0, field 'meta\.x'.*cannot store a leaf of type set"):
        write_record([{"meta": {"x": {1}}}], tmp_path / "s.tr", progress=False)


# -- one definition of the write options (issues 26 and 37) ------------------------------------

#: Every entry point that writes, and the options' TypedDict it takes as ``**options``. Besides the
#: options, the entry points differ only in their own arguments: the source and target
#: (write_record's ``dataset, path``; write_shard's ``dataset, directory``; a converter's source
#: file or folder and ``path``), the sharding of write_shard and the converters (``shard``,
#: ``num_shards``; write_shard's ``finalize``, ``storage_options``), and each converter's own
#: (``keys``, ``check_images``, ``extensions``, ``keep_paths``, ``split``, ``format``, robomimic's
#: ``obs_keys``, ``dataset_keys``).
ENTRY_POINTS: dict[str, tuple[Callable[..., Any], type]] = {
    "write_record": (write_record, WriteOptions),
    "write_shard": (write_shard, WriteOptions),
    "RecordWriter": (RecordWriter.__init__, WriterOptions),
    "from_image_folder": (convert_module.from_image_folder, ConvertOptions),
    "from_list_file": (convert_module.from_list_file, ConvertOptions),
    "from_numpy": (convert_module.from_numpy, ConvertOptions),
    "from_hdf5": (convert_module.from_hdf5, ConvertOptions),
    "from_hf": (convert_module.from_hf, ConvertOptions),
    "from_webdataset": (convert_module.from_webdataset, ConvertOptions),
    "convert": (convert_module.convert, ConvertOptions),
    "from_robomimic": (convert_module.from_robomimic, StoreOptions),
}
OPTIONS = [f.name for f in dataclasses.fields(WriteSettings)]
REFERENCE = inspect.signature(write_record).parameters


def test_the_options_are_one_list_typed_once_with_one_default_each() -> None:
    """WriteOptions (and its parts) name exactly WriteSettings' fields, with the same types."""
    assert sorted(WriteOptions.__annotations__) == sorted(OPTIONS)
    assert set(StoreOptions.__annotations__) < set(WriterOptions.__annotations__) < set(WriteOptions.__annotations__)
    typed, defaults = typing.get_type_hints(WriteOptions), typing.get_type_hints(WriteSettings)
    for name in OPTIONS:
        assert typed[name] == defaults[name], name


@pytest.mark.parametrize(
    ("taken", "parent"), [(StoreOptions, None), (WriterOptions, StoreOptions), (WriteOptions, WriterOptions)]
)
def test_every_option_is_documented_once_where_it_is_declared(taken: type, parent: type | None) -> None:
    own = [name for name in taken.__annotations__ if parent is None or name not in parent.__annotations__]
    doc = inspect.getdoc(taken) or ""
    for name in own:
        assert re.search(rf"^    {name}: ", doc, re.M), f"{taken.__name__} does not document {name}"
    for entry, (function, _) in ENTRY_POINTS.items():
        assert not re.search(r"^\s*shuffle, seed", inspect.getdoc(function) or "", re.M), f"{entry} lists them again"


def test_write_record_takes_every_option_with_the_default_of_the_one_definition() -> None:
    defaults = WriteSettings()
    assert [name for name in REFERENCE if name not in ("dataset", "path")] == OPTIONS
    for name in OPTIONS:
        assert REFERENCE[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert REFERENCE[name].default == getattr(defaults, name), name


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_takes_its_options_as_one_typed_keyword_mapping(entry: str) -> None:
    """The code says ``**options: Unpack[...]`` once; help() and inspect show every option with its default."""
    function, taken = ENTRY_POINTS[entry]
    code = function.__code__
    assert code.co_flags & inspect.CO_VARKEYWORDS, f"{entry} takes no **options"
    keywords = code.co_varnames[code.co_argcount + code.co_kwonlyargcount]
    if entry != "convert":  # convert also takes the converters' options: its **given is Any
        assert function.__annotations__[keywords] == f"Unpack[{taken.__name__}]"
    parameters = inspect.signature(function).parameters
    for option in OPTIONS:
        if option not in taken.__annotations__:
            assert option not in parameters, f"{entry} shows {option}, which it does not take"
            continue
        ours, reference = parameters[option], REFERENCE[option]
        assert ours.kind is inspect.Parameter.KEYWORD_ONLY
        assert ours.default == reference.default, f"{entry}'s {option} defaults to {ours.default!r}"
        assert ours.annotation == reference.annotation, f"{entry}'s {option} is typed otherwise"


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_an_unknown_or_misspelled_keyword_is_a_type_error_naming_the_function(entry: str, tmp_path: Path) -> None:
    function, taken = ENTRY_POINTS[entry]
    name = entry
    call: Callable[..., Any] = RecordWriter if entry == "RecordWriter" else function
    args: list[Any] = [tmp_path / "out.tr"] if entry == "RecordWriter" else [Untouchable(), tmp_path / "out.tr"]
    if entry.startswith(("from_", "convert")):
        args = [tmp_path / "missing-source", tmp_path / "out.tr"]
    near = "; did you mean 'shuffle'\\?" if "shuffle" in taken.__annotations__ else "$"
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'shufle'{near}"):
        call(*args, shufle=False)
    with pytest.raises(TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'zzz'$"):
        call(*args, zzz=1)
    if "num_workers" not in taken.__annotations__:
        with pytest.raises(
            TypeError, match=r"unexpected keyword argument 'num_workers' \(a write option it does not take"
        ):
            call(*args, num_workers=2)
    assert os.listdir(tmp_path) == []


def test_sharding_is_taken_alike() -> None:
    reference = inspect.signature(convert_module.convert).parameters
    for entry in ["write_shard", *(n for n in ENTRY_POINTS if n.startswith("from_") and n != "from_robomimic")]:
        parameters = inspect.signature(ENTRY_POINTS[entry][0]).parameters
        for name in ("shard", "num_shards"):
            assert parameters[name].default is None
            assert str(parameters[name].annotation) == str(reference[name].annotation)


def test_string_options_are_literal_types_checked_at_run_time(tmp_path: Path) -> None:
    hints = typing.get_type_hints(WriteOptions)
    assert typing.get_args(hints["on_error"]) == ("raise", "skip")
    assert typing.Literal["fork", "spawn", "forkserver"] in typing.get_args(hints["multiprocessing_context"])
    assert typing.Literal["zstd", "lz4"] in typing.get_args(hints["compression"])
    bad: list[dict[str, Any]] = [
        {"on_error": "ignore"},
        {"multiprocessing_context": "threads"},
        {"compression": "gzip"},
        {"num_workers": -1},
    ]
    for options in bad:
        with pytest.raises(ValueError, match=next(iter(options))):
            write_record(Untouchable(), tmp_path / "a.tr", **options)
        with pytest.raises(ValueError, match=next(iter(options))):  # checked before the source is opened
            convert_module.from_numpy(tmp_path / "missing.npy", tmp_path / "a.tr", **options)
        with pytest.raises(ValueError, match=next(iter(options))):
            write_shard(Untouchable(), tmp_path / "shards", shard=0, num_shards=2, **options)
    assert os.listdir(tmp_path) == []  # nothing written, not even the shards' folder


def test_settings_of_takes_the_options_and_checks_them() -> None:
    settings = WriteSettings.of({"seed": 5}, "f")
    assert settings == dataclasses.replace(WriteSettings(), seed=5)
    with pytest.raises(ValueError, match="max_skipped=3 bounds on_error='skip'"):
        WriteSettings.of({"max_skipped": 3}, "f")
    with pytest.raises(TypeError, match=r"f\(\) got an unexpected keyword argument 'keys'"):
        WriteSettings.of({"keys": ["x"]}, "f")
    with pytest.raises(TypeError, match=r"g\(\) got an unexpected keyword argument 'seed'"):
        WriteSettings.of({"seed": 1}, "g", StoreOptions)


def test_the_options_reference_in_the_docs_names_every_option() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "writing.md").read_text(encoding="utf-8")
    table = page[page.index("## Options at a glance") :]
    for name in OPTIONS:
        assert f"`{name}`" in table, f"docs/writing.md's options table lacks {name}"


def test_robomimic_refuses_the_options_that_do_not_apply(tmp_path: Path) -> None:
    for options in ({"seed": 1}, {"on_error": "skip"}, {"group_by": "demo"}, {"num_shards": 2, "shard": 0}):
        name = next(iter(options))
        with pytest.raises(ValueError, match=rf"{name}=.* does not apply to a robomimic source"):
            convert_module.convert(tmp_path / "demo.hdf5", tmp_path / "o.tr", format="robomimic", **options)
