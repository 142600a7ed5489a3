"""The manifest mutation campaign (issue 30): craft sharded-set manifests, then open each with every path.

One good sharded set (4 shards of 50 samples) is written with ``write_shard``. Each
campaign case is a copy of it whose ``manifest.json`` (or the files around it) is
changed one way, made by a seeded generator over every field of the manifest and of
its shard entries (wrong types, huge, negative and float counts, missing and extra
keys, repeated, dropped and reordered shards, names with null bytes, path traversal,
5,000 characters), over the text (deep nesting, bad UTF-8, cut short, 5,000-digit
numbers) and over the file (a FIFO, a symbolic-link loop, a folder, a shard copied
over another) - half of the shard-list edits with the manifest's ``set_id`` computed
again, as a careful attacker would. Every read path runs on it in a forked child with
an address-space limit and a timeout, and its outcome is classified against the
samples written:

* ``error``: a torchrecord error; ``correct``: the 200 samples read back exactly
  (``verify``: the report is ok; ``info``: the count is 200);
* ``crash``: killed by a signal; ``hang``: past the timeout; ``memory``: a
  ``MemoryError`` at the address-space limit;
* ``wrong``: data came back without an error but differs from what was written
  (``verify``: ok while a data path read wrong data);
* ``other``: any other exception (its type is kept).

Test tooling, like ``tests/lmdb_mutations.py``: ``scripts/mutation_campaign.py
--manifests N`` runs it, ``tests/shards/test_manifest_campaign.py`` runs a fixed subset.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

import torchrecord
from torchrecord._check.isolate import run_each_in_child, run_in_child
from torchrecord._shards.manifest import manifest_set_id
from torchrecord.errors import TorchRecordError

PATHS = ("open_set", "dataset_checked", "verify", "info")
OUTCOMES = ("error", "correct", "crash", "hang", "memory", "wrong", "other")
#: outcomes the campaign must never see, in any path
BAD = ("crash", "hang", "memory", "wrong", "other")
SHARDS, PER_SHARD = 4, 50
COUNT = SHARDS * PER_SHARD
KINDS = (
    "top_value",
    "top_missing",
    "extra_key",
    "entry_value",
    "entry_missing",
    "count_adjusted",
    "shard_list",
    "set_id",
    "text",
    "file",
)

_TOP_KEYS = (
    "format",
    "manifest_version",
    "library_version",
    "set_id",
    "count",
    "samples_per_record",
    "schema",
    "shuffled",
    "seed",
    "source",
    "skipped",
    "checksum",
    "created",
    "user",
    "shards",
)
_ENTRY_KEYS = ("name", "count", "records", "bytes", "sha256", "set_id")


def _deep(depth: int) -> Any:
    out: Any = 0
    for _ in range(depth):
        out = [out]
    return out


#: values any field may be given
_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    1,
    -1,
    50,
    2**31,
    2**32 + 1,
    2**63,
    -(2**63),
    10**18,
    1.5,
    float("nan"),
    "",
    "x",
    "\0",
    "a" * 5000,
    "../shard-00000-of-00004.tr",
    "/etc/passwd",
    "shard-00000-of-00004.tr",
    "shard-00001-of-00004.tr\0",
    "0" * 32,
    "f" * 64,
    [],
    {},
    [1, 2],
    {"a": 1},
    "DEEP",  # a list nested 200 deep (JSON parses it; a reader must not trip over it)
)


def _value(rng: random.Random) -> Any:
    value = rng.choice(_VALUES)
    return _deep(200) if value == "DEEP" else copy.deepcopy(value)


# -- the good set -----------------------------------------------------------------------------------------------


def _write_base(folder: str) -> None:
    from tests.conftest import IndexedImages

    for i in range(SHARDS):
        torchrecord.write_shard(IndexedImages(COUNT), folder, shard=i, num_shards=SHARDS, seed=3, progress=False)


def _canonical(sample: Any) -> Any:
    image, label = sample
    return (
        int(label),
        bytes(image.contiguous().view(-1).numpy().tobytes()) if isinstance(image, torch.Tensor) else b"",
    )


@dataclass
class Base:
    """The good set: its folder, manifest and the samples it holds (as a multiset)."""

    folder: str
    manifest: dict[str, Any]
    counts: Counter[Any]


def build_base(directory: str) -> Base:
    """Write the good set under ``directory`` (in a child, so this process opens no LMDB)."""
    folder = os.path.join(directory, "base")
    outcome = run_in_child(_write_base, folder, timeout=300)
    assert outcome.status == "returned", outcome
    from tests.conftest import IndexedImages

    images = IndexedImages(COUNT)
    counts = Counter(_canonical(images[i]) for i in range(COUNT))
    with open(os.path.join(folder, "manifest.json")) as f:
        return Base(folder, json.load(f), counts)


# -- mutations --------------------------------------------------------------------------------------------------


class Skip(Exception):
    """The mutation changes nothing (its description says why)."""


def _resum(m: dict[str, Any]) -> None:
    """Make the total agree with the shards (when every count is an int), as a careful attacker would."""
    shards = m.get("shards")
    if isinstance(shards, list) and all(isinstance(e, dict) and type(e.get("count")) is int for e in shards):
        m["count"] = sum(e["count"] for e in shards)


def _reid(m: dict[str, Any]) -> None:
    """Give the manifest the set_id its (mutated) shard list gives."""
    shards = m.get("shards")
    if isinstance(shards, list) and all(isinstance(e, dict) and isinstance(e.get("set_id"), str) for e in shards):
        m["set_id"] = manifest_set_id([e["set_id"] for e in shards])


def mutate(base: Base, kind: str, rng: random.Random, folder: str) -> str:
    """Apply one mutation of ``kind`` to the copy of the set in ``folder``; returns its description."""
    manifest_path = os.path.join(folder, "manifest.json")
    m = copy.deepcopy(base.manifest)
    shards = m["shards"]
    i = rng.randrange(SHARDS)
    if kind == "top_value":
        key = rng.choice(_TOP_KEYS)
        m[key] = _value(rng)
        what = f"{key} = {_short(m[key])}"
    elif kind == "top_missing":
        key = rng.choice(_TOP_KEYS)
        del m[key]
        what = f"no {key}"
    elif kind == "extra_key":
        target = m if rng.random() < 0.5 else shards[i]
        target[rng.choice(("zzz", "", "\0", "a" * 300, "count "))] = _value(rng)
        what = "an extra key " + ("at the top" if target is m else f"in shard entry {i}")
    elif kind == "entry_value":
        key = rng.choice(_ENTRY_KEYS)
        shards[i][key] = _value(rng)
        what = f"shards[{i}].{key} = {_short(shards[i][key])}"
        if rng.random() < 0.5:
            _resum(m)
            what += ", total adjusted"
        if rng.random() < 0.5:
            _reid(m)
            what += ", set_id recomputed"
    elif kind == "entry_missing":
        key = rng.choice(_ENTRY_KEYS)
        del shards[i][key]
        what = f"shards[{i}] without {key}"
    elif kind == "count_adjusted":
        new = rng.choice((0, 1, 49, 51, 100, 2**31, 2**63, 10**18, 2**44))
        shards[i]["count"] = new
        what = f"shards[{i}].count = {new}, total adjusted"
        if rng.random() < 0.5:
            per = m["samples_per_record"]
            shards[i]["records"] = -(-new // per)
            what += ", records adjusted"
            if rng.random() < 0.5:
                shards[i]["bytes"] = max(shards[i]["bytes"], shards[i]["records"] * 64, new * 64)
                what += ", bytes adjusted"
        _resum(m)
    elif kind == "shard_list":
        choice = rng.randrange(9)
        if choice == 0:
            shards[(i + 1) % SHARDS] = shards[i]
            what = f"shard {i} listed twice"
        elif choice == 1:
            shards[(i + 1) % SHARDS] = dict(shards[i], name=shards[(i + 1) % SHARDS]["name"])
            what = f"shard {i}'s entry under the next one's name"
        elif choice == 2:
            m["shards"] = [shards[i]] * rng.choice((2, 1000, 100_000, 100_001))
            what = f"shard {i} listed {len(m['shards'])} times"
        elif choice == 3:
            del shards[i]
            what = f"shard {i} dropped"
        elif choice == 4:
            j = (i + 1) % SHARDS
            shards[i], shards[j] = shards[j], shards[i]
            what = f"shards {i} and {j} swapped"
        elif choice == 5:
            j = (i + 1) % SHARDS
            shards[i]["name"], shards[j]["name"] = shards[j]["name"], shards[i]["name"]
            what = f"the names of shards {i} and {j} swapped"
        elif choice == 6:
            shards.reverse()
            what = "shards reversed"
        elif choice == 7:
            shards.append(dict(shards[i]))
            what = f"shard {i} appended again"
        else:
            m["shards"] = []
            what = "no shards"
        _resum(m)
        if rng.random() < 0.5:
            _reid(m)
            what += ", set_id recomputed"
    elif kind == "set_id":
        choice = rng.randrange(3)
        if choice == 0:
            m["set_id"] = f"{rng.getrandbits(128):032x}"
            what = "another set_id"
        elif choice == 1:
            shards[i]["set_id"] = f"{rng.getrandbits(128):032x}"
            what = f"another set_id for shard {i}"
        else:
            shards[i]["set_id"] = f"{rng.getrandbits(128):032x}"
            _reid(m)
            what = f"another set_id for shard {i}, the set's recomputed"
    elif kind == "text":
        text = json.dumps(m).encode()
        choice = rng.randrange(8)
        raw, what = [
            (b"[" * 100_000 + b"]" * 100_000, "a list nested 100,000 deep"),
            (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "a map nested 50,000 deep"),
            (text[: rng.randrange(len(text))], "cut short"),
            (text.replace(b'"torchrecord-shards"', b'"torchrecord-shards\xff"'), "bad UTF-8 in the format"),
            (b"\xff\xfe" + text, "bytes that are not UTF-8 before the JSON"),
            (text.replace(b'"count": ', b'"count": 1' + b"0" * 5000, 1), "a 5,000-digit count"),
            (b"", "an empty file"),
            (text.replace(b"shard-0000", b"shard-0000\\u0000", 1), "an escaped null byte in a shard name"),
        ][choice]
        with open(manifest_path, "wb") as f:
            f.write(raw)
        return what
    elif kind == "file":
        choice = rng.randrange(7)
        os.remove(manifest_path)
        shard = os.path.join(folder, shards[i]["name"])
        if choice == 0:
            os.mkfifo(manifest_path)
            return "the manifest is a FIFO"
        if choice == 1:
            os.symlink(manifest_path, manifest_path)
            return "the manifest is a symbolic link to itself"
        if choice == 2:
            os.mkdir(manifest_path)
            return "the manifest is a folder"
        if choice == 3:
            os.symlink(shard, manifest_path)
            return "the manifest is a link to a shard"
        with open(manifest_path, "w") as f:
            json.dump(m, f)
        if choice == 4:
            os.remove(shard)
            os.mkfifo(shard)
            return f"shard {i} is a FIFO"
        other = os.path.join(folder, shards[(i + 1) % SHARDS]["name"])
        shutil.copyfile(shard, other)
        if choice == 5:
            return f"shard {i} copied over the next one"
        j = (i + 1) % SHARDS
        shards[j] = dict(shards[i], name=shards[j]["name"])
        shards[j]["set_id"] = f"{rng.getrandbits(128):032x}"
        _reid(m)
        with open(manifest_path, "w") as f:
            json.dump(m, f)
        return f"shard {i} copied over the next one, the manifest rewritten to a new set_id"
    else:
        raise AssertionError(kind)
    if m == base.manifest:
        raise Skip(f"{what}: no change")
    with open(manifest_path, "w") as f:
        json.dump(m, f)
    return what


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# -- the read paths (each runs in a forked child) ---------------------------------------------------------------


def _read_path(path_name: str, folder: str, counts: Counter[Any]) -> list[str]:
    """Run one read path; returns [outcome, detail]."""
    try:
        if path_name == "verify":
            report = torchrecord.verify(folder, progress=False)
            return ["correct", ""] if report.ok else ["error", str(report.first_error)[:300]]
        if path_name == "info":
            from torchrecord.cli import _describe_set

            described = _describe_set(folder)
            if described["count"] == COUNT:
                return ["correct", ""]
            return ["wrong", f"info says {described['count']} samples, {COUNT} were written"]
        if path_name == "open_set":
            got = [_canonical(s) for s in torchrecord.open_set(folder)]
        else:
            got = [_canonical(s) for s in torchrecord.RecordDataset(folder, shuffle=False, check="structure")]
        if Counter(got) == counts:
            return ["correct", ""]
        extra, missing = Counter(got) - counts, counts - Counter(got)
        return ["wrong", f"{len(got)} samples read, {COUNT} written; {sum(extra.values())} unexpected, "
                         f"{sum(missing.values())} missing"]  # fmt: skip
    except TorchRecordError as exc:
        return ["error", f"{type(exc).__name__}: {str(exc)[:300]}"]
    except MemoryError as exc:
        return ["memory", f"MemoryError: {str(exc)[:300]}"]
    except Exception as exc:
        return ["other", f"{type(exc).__name__}: {str(exc)[:300]}"]


# -- the campaign -----------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """One crafted manifest: what was done and what each read path did."""

    index: int
    kind: str
    description: str
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, tuple[str, str]]:
        return {p: o for p, o in self.outcomes.items() if o[0] in BAD}


@dataclass
class Campaign:
    """All results, with the tables."""

    cases: list[CaseResult]
    seconds: float
    memory_limit: int

    def totals(self, path: str) -> Counter[str]:
        return Counter(c.outcomes[path][0] for c in self.cases if path in c.outcomes)

    def failures(self) -> dict[str, int]:
        """What the campaign must not see, in any read path."""
        every = Counter(o[0] for c in self.cases for o in c.outcomes.values())
        return {outcome: every[outcome] for outcome in BAD}

    def render(self) -> str:
        tested = [c for c in self.cases if c.outcomes]
        lines = [
            f"{len(tested)} crafted manifests ({len(self.cases) - len(tested)} mutations changed nothing), "
            f"{self.seconds:.0f} s, memory limit {self.memory_limit >> 20} MiB a child"
        ]
        for path in PATHS:
            lines.append("")
            lines.append(f"read path: {path}")
            lines.append(f"{'mutation':<16}" + "".join(f"{o:>8}" for o in OUTCOMES))
            for kind in KINDS:
                row = Counter(c.outcomes[path][0] for c in tested if c.kind == kind and path in c.outcomes)
                lines.append(f"{kind:<16}" + "".join(f"{row[o]:>8}" for o in OUTCOMES))
            total = self.totals(path)
            lines.append(f"{'total':<16}" + "".join(f"{total[o]:>8}" for o in OUTCOMES))
        failures = self.failures()
        lines.append("")
        lines.append("in every read path: " + ", ".join(f"{n} {o}" for o, n in failures.items()))
        for c in self.cases:
            if c.failed:
                lines.append(f"  FAILED #{c.index} {c.kind}: {c.description} -> {c.failed}")
        return "\n".join(lines)


def cases(count: int, seed: int = 0) -> Iterator[tuple[int, str, random.Random]]:
    """Case i: kind cycling through KINDS, its own seeded generator."""
    for index in range(count):
        yield index, KINDS[index % len(KINDS)], random.Random(seed * 1_000_003 + index)


def run_campaign(
    count: int,
    directory: str,
    *,
    seed: int = 0,
    timeout: float = 20.0,
    memory_limit: int = 1 << 30,
    progress: Callable[[CaseResult], None] | None = None,
    keep: bool = False,
) -> Campaign:
    """Write the good set, then ``count`` crafted copies, each read by every path in a forked child."""
    start = time.monotonic()
    os.makedirs(directory, exist_ok=True)
    base = build_base(directory)
    results = []
    for index, kind, rng in cases(count, seed):
        folder = os.path.join(directory, f"case-{index:05d}")
        shutil.copytree(base.folder, folder)
        result = CaseResult(index, kind, "")
        try:
            result.description = mutate(base, kind, rng, folder)
        except Skip as exc:
            result.description = f"skipped: {exc}"
            results.append(result)
            shutil.rmtree(folder, ignore_errors=True)
            continue
        outcomes = run_each_in_child(
            functools.partial(_read_path, folder=folder, counts=base.counts),
            PATHS,
            timeout=timeout,
            memory_limit=memory_limit,
        )
        for path_name, outcome in zip(PATHS, outcomes):
            if outcome.status == "returned":
                result.outcomes[path_name] = (str(outcome.value[0]), str(outcome.value[1]))
            elif outcome.status == "signal":
                result.outcomes[path_name] = ("crash", f"{outcome.signal_name} {outcome.stderr.strip()[-200:]}")
            elif outcome.status == "timeout":
                result.outcomes[path_name] = ("hang", f"no result in {timeout} s")
            else:
                result.outcomes[path_name] = ("other", f"{outcome.status} {outcome.error_type} {outcome.message}")
        if result.outcomes.get("verify", ("", ""))[0] == "correct" and any(
            result.outcomes[p][0] == "wrong" for p in ("open_set", "dataset_checked")
        ):
            result.outcomes["verify"] = ("wrong", "verify passed a set a data path misread")
        results.append(result)
        if progress is not None:
            progress(result)
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)
    return Campaign(results, time.monotonic() - start, memory_limit)
