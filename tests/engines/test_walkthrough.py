"""docs/walkthrough.md, run as written: a DatasetDict on disk -> a sharded set on S3 (moto) -> Lightning.

The page's Python blocks are marked ``# not run:`` for tests/test_docs_examples.py (they need an S3
endpoint and pytorch-lightning); this test runs them, in order, as one script in a fresh
interpreter, with the AWS_* variables pointing at a local moto server and the bucket made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.shards.conftest import moto_url, s3  # noqa: F401 (fixtures)
from tests.shards.faults import BUCKET
from tests.test_docs_examples import python_blocks
from torchrecord import open_set

pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning: pip install -e '.[lightning]'")
pytest.importorskip("datasets", reason="needs datasets: pip install -e '.[hf]'")
pytest.importorskip("PIL", reason="needs pillow")

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "walkthrough.md"


def page_script() -> str:
    """The page's Python blocks, in order, as one script."""
    blocks = [source for _, source in python_blocks(PAGE.read_text(encoding="utf-8"))]
    assert len(blocks) >= 4, "the walkthrough lost its blocks"
    return "\n".join(blocks)


@pytest.mark.timeout(600)
def test_the_walkthrough_runs_as_written(s3: Any, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    script = tmp_path / "walkthrough.py"
    script.write_text(page_script())
    env = {**os.environ, "WALKTHROUGH_BUCKET": BUCKET}  # the AWS_* variables of the s3 fixture point at moto
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"docs/walkthrough.md failed:\n{output[-6000:]}"
    lines = proc.stdout.splitlines()
    # the printed lines are what the page says they print
    assert "48 2 ['cat', 'dog']" in lines
    assert lines[-1] == "12"
    # the set is on S3 (shards, notes and the manifest), shuffled: not the split's order
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="pets/train/")["Contents"])
    assert "pets/train/manifest.json" in keys and sum(k.endswith(".tr") for k in keys) == 2
    remote = open_set(f"s3://{BUCKET}/pets/train", cache_dir=str(tmp_path / "check-cache"))
    labels = [int(remote[i]["label"]) for i in range(len(remote))]
    assert sorted(labels) == sorted(i % 2 for i in range(48))
    # the training run read through the page's shard cache: both shards were fetched there
    cached = [p for p in (tmp_path / "shard-cache").rglob("*") if p.is_file() and p.stat().st_size > 0]
    assert len([p for p in cached if p.name.endswith(".tr")]) >= 2, sorted(p.name for p in cached)
