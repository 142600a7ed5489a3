"""Coverage-guided fuzzing of the record decoder and the metadata checks with atheris.

Usage (needs ``pip install atheris``; libFuzzer flags pass through)::

    python scripts/fuzz_atheris.py -atheris_runs=100000
    python scripts/fuzz_atheris.py -max_total_time=600 corpus_dir/

Each input's first byte picks a target: the record decoder against a schema
with every kind of field (tensor, array, Python scalars, bytes, str, bf16),
against a variable-shape schema, or the metadata unpack + checks. A target may
only raise a torchrecord FormatError; anything else is a crash that libFuzzer
reports with the input that caused it. Seeds are valid records and metadata.
"""

from __future__ import annotations

import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    import numpy as np
    import torch

    from torchrecord._core.codec import decode_leaves, encode_payloads
    from torchrecord._core.kinds import materialize
    from torchrecord._core.schema import Field, Schema
    from torchrecord._core.structure import unflatten
    from torchrecord._store import format as _format
    from torchrecord._write.sources import normalize
    from torchrecord.errors import FormatError

SAMPLE = {
    "image": torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4),
    "emb": np.linspace(0, 1, 5, dtype=np.float32),
    "label": 7,
    "score": 0.5,
    "ok": True,
    "raw": b"\x00\x01",
    "name": "seven",
    "half": torch.ones(2, dtype=torch.bfloat16),
}
_NORM = normalize(SAMPLE)
_SCHEMA = Schema.from_first(_NORM.tree, _NORM.signatures)
FIXED = _SCHEMA.fields
VARIABLE = [Field(f.name, f.kind, f.dtype, tuple(None for _ in f.shape)) for f in FIXED]
VALID = encode_payloads(_NORM.payloads, _NORM.signatures)
META = _format.pack_metadata(
    {
        "format": "torchrecord",
        "format_version": 1,
        "count": 1,
        "records": 1,
        "samples_per_record": 1,
        "schema": _SCHEMA.to_dict(),
        "checksum": "crc32",
        "user": {},
        "complete": True,
    }
)


def _decode(value: bytes, fields: list[Field]) -> None:
    where = "atheris: record 0"
    out = decode_leaves(value, fields, where)
    unflatten(_SCHEMA.tree, [materialize(p, f, where) for p, f in zip(out, fields, strict=True)])


def _metadata(raw: bytes) -> None:
    meta: dict[str, Any] = _format.check_metadata(_format.unpack_metadata(raw, "atheris.tr"), "atheris.tr")
    schema = meta.get("schema")
    if schema is not None:
        built = Schema.from_dict(schema)
        unflatten(built.tree, [None] * len(built.fields))


def test_one_input(data: bytes) -> None:
    if not data:
        return
    target, body = data[0] % 3, data[1:]
    try:
        if target == 0:
            _decode(body, FIXED)
        elif target == 1:
            _decode(body, VARIABLE)
        else:
            _metadata(body)
    except FormatError:
        pass


def main() -> None:
    import atexit
    import os
    import shutil
    import tempfile

    args = list(sys.argv)
    if not any(not a.startswith("-") for a in args[1:]):  # no corpus given: seed a temporary one
        corpus = tempfile.mkdtemp(prefix="torchrecord-fuzz-")
        atexit.register(shutil.rmtree, corpus, True)
        seeds = {"record": b"\x00" + VALID, "variable": b"\x01" + VALID, "meta": b"\x02" + META}
        for name, blob in seeds.items():
            with open(os.path.join(corpus, name), "wb") as f:
                f.write(blob)
        args.append(corpus)
    atheris.Setup(args, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
