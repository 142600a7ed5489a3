"""The ``torchrecord`` command line (also ``python -m torchrecord``).

Each subcommand is registered by its own ``_add_*`` function and runs a thin
handler over the library. :func:`main` returns the exit code: 0 on success, 1
with a one-line ``torchrecord <command>: error: ...`` on stderr when the input is
at fault (a torchrecord error, OSError, ValueError, or a missing optional
extra), 2 for usage errors, 141 without a word when the reader of its output
went away (``torchrecord head X | head -3``). Progress bars go to stderr, only
on a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

from torchrecord._core.structure import flatten
from torchrecord._version import __version__
from torchrecord.errors import ArgumentError, RecordExistsError, TorchRecordError

__all__ = ["build_parser", "main"]

_USER_ERRORS = (TorchRecordError, OSError, ValueError, ImportError)

_EPILOG = """examples:
  torchrecord convert data/train train.tr --workers 4   # class-per-folder images
  torchrecord convert arrays.npz train.tr --keys x,y
  torchrecord convert demo.hdf5 demo.tr --dataset-keys actions,rewards,dones   # robomimic demos
  torchrecord convert data/train shards/ --shards 8 --shard 3   # one writer of a sharded set
  torchrecord info train.tr
  torchrecord head train.tr -n 3
  torchrecord verify train.tr
  torchrecord bench train.tr --workers 2 --batch-size 256
run 'torchrecord COMMAND --help' for a command's options."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version or a usage error, already printed by argparse
        return exc.code if isinstance(exc.code, int) else 1
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a reader gone by then is caught below
        return code
    except BrokenPipeError as exc:
        if not _stdout_closed():
            print(f"torchrecord {args.command}: error: {_first_line(exc)}", file=sys.stderr)
            return 1
        return _SIGPIPE_EXIT  # the reader of the output went away (torchrecord head X | head -3): stop quietly
    except _USER_ERRORS as exc:
        print(f"torchrecord {args.command}: error: {_first_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"torchrecord {args.command}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="torchrecord",
        description="Create, inspect, check and benchmark torchrecord record sets.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"torchrecord {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_convert, _add_info, _add_head, _add_verify, _add_bench):
        add(commands)
    return parser


# -- helpers ---------------------------------------------------------------------

#: the exit code of a command whose output's reader went away, as for a process ended by SIGPIPE
_SIGPIPE_EXIT = 141


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader is gone; stdout then points at /dev/null, so exiting prints nothing."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
    except (OSError, ValueError, AttributeError):  # stdout replaced in-process, or no poll (Windows)
        return False
    poll.register(fd, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poll.poll(0)):
        return False  # the broken pipe was another one
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _integer(text: str, least: int, kind: str) -> int:
    """``text`` as an integer >= ``least``; argparse shows the message as is (no internal names)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {kind}, got {value}")
    return value


def _positive(text: str) -> int:
    return _integer(text, 1, "a positive integer (1 or more)")


def _non_negative(text: str) -> int:
    return _integer(text, 0, "a non-negative integer (0 or more)")


def _command(commands: Any, name: str, func: Callable[[argparse.Namespace], int], help: str, description: str) -> Any:
    parser = commands.add_parser(name, help=help, description=description)
    parser.set_defaults(func=func)
    return parser


def _add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar (it is shown only on a terminal anyway)"
    )


_PATH_HELP = "a record set, or a sharded set: its folder, manifest.json, or the manifest's URL"


def _add_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where a remote sharded set's shards are fetched to "
        "(default: $TORCHRECORD_CACHE, else $XDG_CACHE_HOME/torchrecord, else ~/.cache/torchrecord)",
    )


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.quiet else None  # None: a bar on a terminal only


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _short(value: Any, limit: int = 72) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- convert ---------------------------------------------------------------------

_CONVERT_ABOUT = (
    "Convert SOURCE into a new record set at PATH, pre-shuffled unless --no-shuffle.\n\n{formats}\n\n"
    "An option that does not apply to the source's format is refused, naming it.\n"
    "Images stay encoded; decode them when reading with\n"
    "RecordDataset(path, transform=torchrecord.transforms.decode_image)."
)


def _max_skipped(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count (10) or a fraction (0.01), got {text!r}") from None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object {{...}}, got {text!r}")
    return value


def _compression(text: str) -> str | dict[str, str | None]:
    if "=" not in text:
        return text.strip()
    fields: dict[str, str | None] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, codec = part.rpartition("=")
        if not eq or not name:
            raise argparse.ArgumentTypeError(f"expected FIELD=CODEC pairs, got {part!r}")
        fields[name.strip()] = None if codec.strip().lower() == "none" else codec.strip()
    return fields


#: The flags of the write and sharding options: (option name, flag, argparse keywords besides help, help).
#: A flag's value is the option's value for ``torchrecord.convert.convert``; a flag not given is absent.
# fmt: off
_WRITE_FLAGS: tuple[tuple[str, str, dict[str, Any], str], ...] = (
    ("shuffle", "--shuffle", {"action": argparse.BooleanOptionalAction},
     "pre-shuffle the samples (default: on; robomimic: keeps the demo order)"),
    ("seed", "--seed", {"type": int, "metavar": "S"}, "shuffle seed, stored in the metadata (default: 0)"),
    ("num_workers", "--workers", {"type": _non_negative, "metavar": "N"},
     "worker processes reading the source (default: 0: none)"),
    ("on_error", "--skip-bad", {"action": "store_const", "const": "skip"},
     "leave unreadable or non-image files out, each one named"),
    ("overwrite", "--overwrite", {"action": "store_true"}, "replace an existing record set at PATH"),
    ("num_shards", "--shards", {"type": _positive, "metavar": "N"},
     "write one shard of a sharded set of N shards in the folder PATH (with --shard); the last writer to "
     "finish publishes the set's manifest"),
    ("shard", "--shard", {"type": _non_negative, "metavar": "I"}, "which shard to write, 0 .. N-1 (with --shards)"),
    ("max_skipped", "--max-skipped", {"type": _max_skipped, "metavar": "N"},
     "with --skip-bad: the most samples that may be left out, a count (10) or a fraction (0.01) "
     "(default: no bound)"),
    ("checksums", "--no-checksums", {"action": "store_false"}, "store no CRC-32 per record"),
    ("samples_per_record", "--samples-per-record", {"type": _positive, "metavar": "K"},
     "samples stored per record (fixed shapes); default: chosen from the first sample"),
    ("group_by", "--group-by", {"metavar": "FIELD"},
     "write a grouped set by this field (samples of a group must come one after another)"),
    ("schema", "--schema", {"type": _json_object, "metavar": "JSON"},
     'fields stated up front, e.g. \'{"x": [3, null], "y": "int64"}\''),
    ("metadata", "--metadata", {"type": _json_object, "metavar": "JSON"},
     "user metadata, a JSON object"),
    ("compression", "--compression", {"type": _compression, "metavar": "CODEC"},
     "compress numeric fields: zstd or lz4, or FIELD=CODEC,... (CODEC none: leave the field alone); needs "
     "the compress extra (default: none)"),
    ("compression_level", "--compression-level", {"type": int, "metavar": "L"},
     "the codec's level: zstd -7..22 (default 3), lz4 1..12 (default: fast mode)"),
    ("multiprocessing_context", "--multiprocessing-context", {"choices": ("fork", "spawn", "forkserver")},
     "start method of the --workers processes (default: the platform's)"),
    ("progress", "--quiet", {"action": "store_const", "const": False},
     "no progress bar (it is shown only on a terminal anyway)"),
)
# fmt: on


def _add_convert(commands: Any) -> None:
    from torchrecord.convert.registry import REGISTRY, options

    formats = "\n".join(_format_help(c.name, c.summary) for c in REGISTRY.values())
    p = _command(
        commands,
        "convert",
        _convert,
        "convert image folders, list files, .npy/.npz, HDF5, robomimic, Hugging Face datasets or WebDataset tars",
        _CONVERT_ABOUT.format(formats=formats),
    )
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("source", metavar="SOURCE", help="the source: a file, a folder, or tar files (see above)")
    p.add_argument("path", metavar="PATH", help="the record set to create (a single file; a folder with --shards)")
    p.add_argument("--format", default="auto", choices=("auto", *REGISTRY), help="source format (default: auto)")
    for option in options().values():
        keywords = {**option.cli, "dest": option.name, "default": argparse.SUPPRESS}
        if "type" in keywords:
            keywords["type"] = _flag_type(keywords["type"])
        p.add_argument(option.flag, help=option.help, **keywords)
    w = p.add_argument_group("write options (as write_record's, with the same defaults)")
    for name, flag, keywords, text in _WRITE_FLAGS:
        flags = ("-q", flag) if flag == "--quiet" else (flag,)
        w.add_argument(*flags, dest=name, default=argparse.SUPPRESS, help=text, **keywords)


def _format_help(name: str, summary: str) -> str:
    """One format's paragraph of ``torchrecord convert --help``: its name, then its summary wrapped beside it."""
    lines = textwrap.wrap(summary, 66) or [""]
    return "\n".join(f"  {name if i == 0 else '':<10} {line}" for i, line in enumerate(lines))


def _flag_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A converter option's parser as argparse wants it: its ValueError shown as the flag's error."""

    def parsed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parsed


def _check_flags(args: argparse.Namespace, fmt: str, given: dict[str, Any]) -> None:
    """A one-line ArgumentError for flags that do not apply to a ``fmt`` source, or do not go together."""
    from torchrecord.convert.registry import options, refusal

    refused = refusal(fmt, given)
    if refused is not None:
        flags = {name: flag for name, flag, _, _ in _WRITE_FLAGS} | {o.name: o.flag for o in options().values()}
        name, why = refused
        raise ArgumentError(f"{flags[name]} does not apply to a {fmt} source ({args.source}): {why}; leave it out")
    if ("shard" in given) != ("num_shards" in given):
        raise ArgumentError("give both --shards N and --shard I, or neither")
    if "shard" in given and given["shard"] >= given["num_shards"]:
        raise ArgumentError(f"--shard {given['shard']} is not in [0, {given['num_shards']})")
    if "max_skipped" in given and "on_error" not in given:
        raise ArgumentError("--max-skipped bounds --skip-bad: pass --skip-bad with it")


def _convert(args: argparse.Namespace) -> int:
    from torchrecord.convert import convert, detect_format

    given = {k: v for k, v in vars(args).items() if k not in ("source", "path", "format", "func", "command")}
    fmt = detect_format(args.source) if args.format == "auto" else args.format
    _check_flags(args, fmt, given)
    started = time.perf_counter()
    try:
        result = convert(args.source, args.path, format=fmt, **given)
    except RecordExistsError as exc:
        if os.path.isdir(args.path):
            raise
        raise RecordExistsError(f"{args.path}: exists already; pass --overwrite to replace it") from exc
    for rf in result.values() if isinstance(result, dict) else [result]:
        _report(args, rf, started)
    if "num_shards" in given and os.path.exists(os.path.join(args.path, "manifest.json")):
        print(f"{args.path}: every shard is written; the sharded set is finalized")
    return 0


def _report(args: argparse.Namespace, rf: Any, started: float) -> None:
    """What one converted set holds (a dataset dict gives one set per split)."""
    meta = rf.metadata
    took = f"{_size(os.path.getsize(rf.path))}, {time.perf_counter() - started:.1f} s"
    robomimic = rf.user_metadata.get("robomimic")
    if isinstance(robomimic, dict):
        demos = len(robomimic.get("demos") or ())
        print(
            f"wrote {rf.path}: {len(rf)} steps from {demos} demos of {args.source} (robomimic), in robomimic's "
            f"demo order, {took}"
        )
    else:
        order = f"shuffled with seed {meta['seed']}" if meta.get("shuffled") else "in source order"
        print(
            f"wrote {rf.path}: {len(rf)} samples from {args.source} ({rf.user_metadata.get('source_format')}), "
            f"{order}, {meta.get('skipped', 0)} skipped, {took}"
        )
    compressed = {name: c["codec"] for name, c in (meta.get("compression") or {}).items() if c.get("applied")}
    if compressed:
        print("compressed: " + ", ".join(f"{name} ({codec})" for name, codec in compressed.items()))
    for skipped in rf.write_summary.skipped_samples:  # every one (image errors start with the file)
        print(f"skipped sample {skipped.index}: {skipped.error}")


# -- info ------------------------------------------------------------------------


def _add_info(commands: Any) -> None:
    p = _command(
        commands,
        "info",
        _info,
        "describe a record set: count, fields, size, versions, seed, metadata",
        "Describe the record set at PATH: sample count, fields (dtype and shape, fixed or "
        "variable), size on disk and its ratio to the sample data, format and writer versions, "
        "shuffle seed, creation time and user metadata.",
    )
    p.add_argument("path", metavar="PATH", help=_PATH_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object (the count is under 'count')")
    p.add_argument(
        "--scan",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode every record to measure the sample data when the schema has variable-size fields "
        "(default: only for files up to 64 MiB)",
    )
    _add_cache(p)


def _describe_set(path: str, cache_dir: str | None = None, scan: bool | None = None) -> dict[str, Any]:
    from torchrecord._check.size import SCAN_LIMIT, payload_bytes
    from torchrecord._shards.open import open_set
    from torchrecord._shards.sharded import ShardedSet

    rf = open_set(path, cache_dir=cache_dir)
    if isinstance(rf, ShardedSet):
        rf._check_headers()  # what info says of a local set is what its shards hold, not only what its manifest says
    meta = rf.metadata
    size = rf.size_bytes
    if scan is None:  # a sharded (perhaps remote) set is never scanned unless asked
        scan = size <= SCAN_LIMIT and rf.num_shards == 1
    payload = payload_bytes(rf, scan=scan)
    compression = meta.get("compression") or {}
    fields = [
        {
            "name": f.name,
            "kind": f.kind,
            "dtype": f.dtype,
            "shape": list(f.shape),
            "fixed": f.is_fixed,
            # a sharded set's schema does not say it: its manifest's compression map does
            "compression": f.compression or _applied(compression.get(f.name)),
            "compression_level": (compression.get(f.name) or {}).get("level"),
        }
        for f in rf.schema.fields
    ]
    for f in fields:
        if f["compression"] is None:
            f["compression_level"] = None
    groups = meta.get("groups")
    from torchrecord._write.autopack import choose

    auto = choose(rf.schema, 4096, meta.get("checksum") is not None) if len(rf) else 1
    return {
        "path": rf.path,
        "count": len(rf),
        "records": int(meta.get("records", len(rf))),
        "samples_per_record": int(meta.get("samples_per_record", 1)),
        "automatic_samples_per_record": auto,
        "fields": fields,
        "size_bytes": size,
        "payload_bytes": payload,
        "size_ratio": round(size / payload, 3) if payload else None,
        "shards": rf.num_shards,
        "groups": int(groups) if groups is not None else None,
        "group_by": meta.get("group_by"),
        "set_id": rf.set_id,
        "format_version": meta.get("format_version"),
        "manifest_version": meta.get("manifest_version"),
        "library_version": meta.get("library_version"),
        "shuffled": meta.get("shuffled"),
        "seed": meta.get("seed"),
        "created": meta.get("created"),
        "checksum": meta.get("checksum"),
        "skipped": meta.get("skipped", 0),
        "user_metadata": rf.user_metadata,
    }


def _applied(report: Any) -> str | None:
    """The codec of a compression report (metadata or manifest) when it was applied, else None."""
    if isinstance(report, dict) and report.get("applied") and isinstance(report.get("codec"), str):
        return str(report["codec"])
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return repr(value)


def _field_shape(f: dict[str, Any]) -> str:
    if f["kind"] in ("bytes", "str"):
        return "variable length"
    dims = ", ".join("?" if d is None else str(d) for d in f["shape"])
    return f"[{dims}] " + ("fixed" if f["fixed"] else "variable")


def _size_line(d: dict[str, Any]) -> str:
    """Size on disk and its ratio to the sample data, with the remedy when the overhead is large."""
    line = f"{_size(d['size_bytes'])} ({d['size_bytes']} bytes)"
    payload = d["payload_bytes"]
    if payload is None:
        return line + "; sample data not known without a scan (torchrecord info --scan)"
    if not payload:
        return line
    line += f", {d['size_ratio']:.2f}x the {_size(payload)} of sample data"
    per_record = payload / max(1, d["records"])
    packable = all(f["fixed"] or f["kind"] in ("bytes", "str") for f in d["fields"])  # K > 1 needs fixed shapes
    auto = d.get("automatic_samples_per_record", 1)
    if d["size_ratio"] >= 1.15 and per_record < 64 << 10 and packable and auto != d["samples_per_record"]:
        line += (
            f" (written with samples_per_record={d['samples_per_record']}; write it again with the default, "
            f"samples_per_record=None, which packs {auto} samples per record and comes near 1.0x)"
        )
    compressed = [f["name"] for f in d["fields"] if f.get("compression")]
    if compressed:
        line += f"; compressed: {', '.join(compressed)}"
    return line


def _format_line(d: dict[str, Any]) -> str:
    """The format versions: of the record set, or of a sharded set's manifest and its shards."""
    written = f"torchrecord {d['library_version']}"
    if d["manifest_version"] is None:  # one record-set file
        return f"version {d['format_version']}, written by {written}"
    shards = (
        f"shards of format version {d['format_version']}"
        if d["format_version"] is not None
        else "the shards' format version is not in the manifest (finalized by an older torchrecord)"
    )
    return f"sharded-set manifest version {d['manifest_version']}, {shards}, finalized by {written}"


def _info(args: argparse.Namespace) -> int:
    d = _describe_set(args.path, args.cache_dir, args.scan)
    if args.json:
        print(json.dumps(d, default=_jsonable, sort_keys=True))
        return 0
    per_record = f" in {d['records']} records" if d["samples_per_record"] > 1 else ""
    rows = [
        ("path", d["path"]),
        ("samples", f"{d['count']}{per_record}" + (f" ({d['skipped']} skipped at write)" if d["skipped"] else "")),
        ("shards", f"{d['shards']} (a sharded set: one manifest, one record-set file per shard)"),
        ("groups", f"{d['groups']} (group_by {d['group_by']!r}; torchrecord head --group G shows one)"),
        ("size on disk", _size_line(d)),
        ("format", _format_line(d)),
        ("order", f"shuffled with seed {d['seed']}" if d["shuffled"] else f"source order (seed {d['seed']})"),
        ("created", d["created"]),
        ("checksums", d["checksum"] or "none"),
    ]
    for label, value in rows:
        if (label != "shards" or d["shards"] > 1) and (label != "groups" or d["groups"] is not None):
            print(f"{label + ':':<14}{value}")
    print("fields:")
    width = max([len(f["name"]) for f in d["fields"]] + [4])
    for f in d["fields"]:
        level = f", level {f['compression_level']}" if f.get("compression_level") is not None else ""
        codec = f" ({f['compression']}-compressed{level})" if f.get("compression") else ""
        print(f"  {f['name']:<{width}}  {f['kind']:<7} {f['dtype']:<9} {_field_shape(f)}{codec}")
    print("user metadata:" + ("" if d["user_metadata"] else " none"))
    for key, value in d["user_metadata"].items():
        print(f"  {key}: {_short(value)}")
    return 0


# -- head ------------------------------------------------------------------------


def _add_head(commands: Any) -> None:
    p = _command(
        commands,
        "head",
        _head,
        "show the first samples: per field dtype, shape and a preview of values",
        "Show N samples from index I in stored (shuffled) order: for each field its kind, "
        "dtype, shape and a short preview of its values. With --group G, the samples of group G "
        "of a grouped set (I then counts within the group).",
    )
    p.add_argument("path", metavar="PATH", help=_PATH_HELP)
    p.add_argument("-n", type=_positive, default=5, metavar="N", help="how many samples (default: 5)")
    p.add_argument("--index", type=int, default=0, metavar="I", help="first sample index; negative counts from the end")
    p.add_argument(
        "--group",
        type=int,
        default=None,
        metavar="G",
        help="show the samples of group G (its stored index, as RecordFile.group takes; negative counts from "
        "the end) of a set written with group_by",
    )
    _add_cache(p)


def _preview(leaf: Any) -> str:
    import numpy as np
    import torch

    if isinstance(leaf, (bytes, str)):
        unit = "bytes" if isinstance(leaf, bytes) else "chars"
        return f"{type(leaf).__name__:<7} {len(leaf)} {unit}: {_short(leaf, 60)}"
    if isinstance(leaf, (torch.Tensor, np.ndarray)):
        kind = "tensor" if isinstance(leaf, torch.Tensor) else "ndarray"
        dtype = str(leaf.dtype).removeprefix("torch.")
        flat = leaf.reshape(-1)[:8].tolist()
        values = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat)
        if leaf.ndim:
            values = "[" + values + (", ...]" if leaf.reshape(-1).shape[0] > 8 else "]")
        return f"{kind:<7} {dtype} {list(leaf.shape)}: {values}"
    return f"{type(leaf).__name__:<7} {_short(leaf, 60)}"


def _head(args: argparse.Namespace) -> int:
    from torchrecord._shards.open import open_set

    rf = open_set(args.path, cache_dir=args.cache_dir)
    first, n = 0, len(rf)
    where = "the set"
    if args.group is not None:
        offsets = rf.groups
        if offsets is None:
            raise ArgumentError(f"{rf.path}: has no groups (it was written without group_by); leave --group out")
        count = len(offsets) - 1
        g = args.group + count if args.group < 0 else args.group
        if not 0 <= g < count:
            raise ArgumentError(f"{rf.path}: group {args.group} is out of range; the set holds {count} groups")
        first, n = int(offsets[g]), int(offsets[g + 1] - offsets[g])
        where = f"group {g}"
        print(f"group {g}: {n} sample{'s' if n != 1 else ''}, stored at {first} .. {first + n - 1}")
    if n == 0:  # an empty listing, like head of an empty file
        print(f"{rf.path}: no samples", file=sys.stderr)
        return 0
    start = args.index + n if args.index < 0 else args.index
    if not 0 <= start < n:
        raise ArgumentError(f"{rf.path}: index {args.index} is out of range; {where} holds {n} samples")
    names = rf.schema.names
    width = max(len(name) for name in names)
    for index in range(first + start, first + min(n, start + args.n)):
        print(f"sample {index}:")
        for name, leaf in zip(names, flatten(rf[index])[1]):
            print(f"  {name:<{width}}  {_preview(leaf)}")
    return 0


# -- verify ----------------------------------------------------------------------


def _add_verify(commands: Any) -> None:
    p = _command(
        commands,
        "verify",
        _verify,
        "check every record: present, checksum matches, decodes per the schema",
        "Check LMDB's page structure of PATH (in Python, before anything maps the file), then read "
        "every record in a separate process, check its CRC-32 and decode it against the schema. "
        "Safe on files of any provenance. Exits 1 naming the first bad record, or the structural "
        "damage, if anything is bad.",
    )
    p.add_argument("path", metavar="PATH", help=_PATH_HELP)
    _add_quiet(p)
    _add_cache(p)


def _verify(args: argparse.Namespace) -> int:
    from torchrecord._check.verify import verify

    report = verify(args.path, progress=_progress(args), cache_dir=args.cache_dir)
    if report.ok:
        print(f"{report.path}: OK, {report.records} records checked, none bad")
        return 0
    print(f"{report.path}: {report.bad} of {report.records} records bad")
    for index, message in report.errors:
        print(f"  record {index}: {_first_line(Exception(message))}")
    print(
        f"torchrecord verify: error: {report.path}: {report.bad} bad records, the first is record "
        f"{report.first_bad}: {_first_line(Exception(report.first_error))}",
        file=sys.stderr,
    )
    return 1


# -- bench -----------------------------------------------------------------------


def _add_bench(commands: Any) -> None:
    p = _command(
        commands,
        "bench",
        _bench,
        "measure read throughput (samples/s, MB/s) on this machine",
        "Read PATH for E epochs with RecordDataset(batch_size=B) in "
        "DataLoader(batch_size=None, num_workers=N) and report samples/s and MB/s of the "
        "record file (median over epochs; the first epoch includes starting the workers).",
    )
    p.add_argument("path", metavar="PATH", help=_PATH_HELP)
    p.add_argument("--workers", type=_non_negative, default=2, metavar="N", help="DataLoader workers (default: 2)")
    p.add_argument("--batch-size", type=_positive, default=64, metavar="B", help="samples per batch (default: 64)")
    p.add_argument("--epochs", type=_positive, default=3, metavar="E", help="epochs to time (default: 3)")
    p.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True, help="read shuffled (default: on)")
    _add_quiet(p)
    _add_cache(p)


def _batch_len(batch: Any) -> int:
    """Samples in a collated batch: the length of its first leaf's batch axis."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], (torch.Tensor, dict, tuple, list)):
        return _batch_len(batch[0])
    return len(batch)


def _bench(args: argparse.Namespace) -> int:
    import torch
    from torch.utils.data import DataLoader

    from torchrecord._core.progress import progress_bar as _progress_bar
    from torchrecord._read.dataset import RecordDataset

    dataset = RecordDataset(args.path, batch_size=args.batch_size, shuffle=args.shuffle, cache_dir=args.cache_dir)
    n, size = len(dataset.file), dataset.file.size_bytes
    if n == 0:
        raise ArgumentError(f"{args.path}: holds no samples; nothing to measure")
    loader = DataLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0)
    print(
        f"{args.path}: {n} samples, {size / 1e6:.1f} MB; workers={args.workers} batch_size={args.batch_size} "
        f"epochs={args.epochs} shuffle={args.shuffle}; {os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    seconds = []
    for epoch in range(args.epochs):
        dataset.set_epoch(epoch)
        bar = _progress_bar(n, _progress(args), f"epoch {epoch}")
        seen, started = 0, time.perf_counter()
        for batch in loader:
            size_of_batch = _batch_len(batch)
            seen += size_of_batch
            bar.update(size_of_batch)
        seconds.append(time.perf_counter() - started)
        bar.close()
        if seen != n:
            raise TorchRecordError(f"{args.path}: epoch {epoch} gave {seen} samples, the set holds {n}")
        print(f"epoch {epoch}: {seen / seconds[-1]:,.0f} samples/s, {size / seconds[-1] / 1e6:,.1f} MB/s")
    median = statistics.median(seconds)
    print(f"median: {n / median:,.0f} samples/s, {size / median / 1e6:,.1f} MB/s")
    return 0
