"""docs/walkthrough.md, followed as written: a DatasetDict on disk -> a sharded set on S3 (moto) -> Lightning.

The page's shell block that starts the local S3 server (moto_server), exports the AWS_* variables
and creates the bucket runs as it is, with its port 5000 swapped for a free one; then the page's
Python blocks (marked ``# not run:`` for tests/test_docs_examples.py: they need that server and
pytorch-lightning) run, in order, as one script, from that shell, in a fresh interpreter. The
environment is this test's, which has the packages of the page's install block; nothing of the
test's own AWS settings reaches the page.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs_examples import fenced_blocks, python_blocks

pytest.importorskip("pytorch_lightning", reason="needs pytorch-lightning: pip install -e '.[lightning]'")
pytest.importorskip("datasets", reason="needs datasets: pip install -e '.[hf]'")
pytest.importorskip("PIL", reason="needs pillow")
pytest.importorskip("moto.server", reason="needs moto[server] (the page's install block)")
boto3 = pytest.importorskip("boto3")

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "walkthrough.md"
BUCKET = "my-bucket"


def page_script() -> str:
    """The page's Python blocks, in order, as one script."""
    blocks = [source for _, source in python_blocks(PAGE.read_text(encoding="utf-8"))]
    assert len(blocks) >= 4, "the walkthrough lost its blocks"
    return "\n".join(blocks)


def shell_blocks() -> tuple[str, str]:
    """The page's install block and its server block (starts moto_server, sets AWS_*, makes the bucket)."""
    blocks = [source for _, source in fenced_blocks(PAGE.read_text(encoding="utf-8"), ("bash", "sh"))]
    install = [b for b in blocks if "pip install" in b]
    server = [b for b in blocks if "moto_server" in b]
    assert len(install) == 1 and len(server) == 1, "the walkthrough lost its install or server block"
    return install[0], server[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_install_block_installs_this_project_and_a_resolvable_s3_server() -> None:
    """The install block: torch pinned first, this checkout (not PyPI's torchrecord), moto with a boto3 that fits."""
    install, _ = shell_blocks()
    lines = [line.split("#")[0].strip() for line in install.splitlines() if "pip install" in line]
    assert lines[0] == "pip install torch==2.13.0", lines
    assert lines[1].startswith("pip install -e '.[hf,s3,lightning]'"), lines
    assert (
        "moto[server]" in lines[2] and "boto3==$(python -c 'import botocore; print(botocore.__version__)')" in lines[2]
    )
    # what that line installs resolves here: boto3 is the botocore release, which aiobotocore accepts
    import aiobotocore
    import botocore

    assert boto3.__version__ == botocore.__version__, (boto3.__version__, botocore.__version__)
    from importlib.metadata import requires

    pins = [r for r in requires("aiobotocore") or [] if r.startswith("botocore")]
    from packaging.requirements import Requirement

    assert all(botocore.__version__ in Requirement(r).specifier for r in pins), (aiobotocore.__version__, pins)


@pytest.mark.timeout(600)
def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    _, server = shell_blocks()
    port = _free_port()
    assert "127.0.0.1:5000" in server and "-p 5000" in server
    server = re.sub(r"\b5000\b", str(port), server)
    (tmp_path / "walkthrough.py").write_text(page_script())
    (tmp_path / "walkthrough.sh").write_text(f"set -euo pipefail\n{server}\npython walkthrough.py\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "WALKTHROUGH_BUCKET"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # the venv, activated
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        ["bash", "walkthrough.sh"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the page's moto_server runs in this process group: ended below
    )
    try:
        output, _ = proc.communicate(timeout=540)
        assert proc.returncode == 0, f"docs/walkthrough.md failed:\n{output[-6000:]}"
        lines = output.splitlines()
        # the printed lines are what the page says they print
        assert "48 2 ['cat', 'dog']" in lines, output[-3000:]
        assert lines[-1] == "12", output[-3000:]
        # the set is on the page's S3 server (shards, notes and the manifest), shuffled: not the split's order
        endpoint = f"http://127.0.0.1:{port}"
        keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **keys)
        names = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="pets/train/")["Contents"])
        assert "pets/train/manifest.json" in names and sum(k.endswith(".tr") for k in names) == 2
        from torchrecord import open_set

        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        remote = open_set(f"s3://{BUCKET}/pets/train", cache_dir=str(tmp_path / "check-cache"), storage_options=options)
        labels = [int(remote[i]["label"]) for i in range(len(remote))]
        assert sorted(labels) == sorted(i % 2 for i in range(48))
        # the training run read through the page's shard cache: both shards were fetched there
        cached = [p for p in (tmp_path / "shard-cache").rglob("*") if p.is_file() and p.stat().st_size > 0]
        assert len([p for p in cached if p.name.endswith(".tr")]) >= 2, sorted(p.name for p in cached)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the page's server (and the shell, if it still runs)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
