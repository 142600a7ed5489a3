"""Fixtures of the sharded-set tests: a local S3 server (moto on 127.0.0.1) and a fresh bucket per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.shards.faults import BUCKET, FaultProxy, free_port


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """The URL of a moto S3 server on 127.0.0.1, for the module's tests."""
    pytest.importorskip("moto")
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A boto3 client on a fresh bucket of the moto server; the AWS_* variables point s3fs there."""
    s3fs = pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    for bucket in client.list_buckets().get("Buckets", []):  # a fresh bucket for each test
        for upload in client.list_multipart_uploads(Bucket=bucket["Name"]).get("Uploads", []):
            client.abort_multipart_upload(Bucket=bucket["Name"], Key=upload["Key"], UploadId=upload["UploadId"])
        for obj in client.list_objects_v2(Bucket=bucket["Name"]).get("Contents", []):
            client.delete_object(Bucket=bucket["Name"], Key=obj["Key"])
        client.delete_bucket(Bucket=bucket["Name"])
    client.create_bucket(Bucket=BUCKET)
    s3fs.S3FileSystem.clear_instance_cache()
    return client


@pytest.fixture
def proxy(moto_url: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy on 127.0.0.1 in front of the moto server (no rules: it forwards)."""
    faults = FaultProxy(moto_url)
    try:
        yield faults
    finally:
        faults.stop()
