"""``S3Store`` and ``S3Server`` specifics against a real moto endpoint.

The behaviour both backends share is tested once, for both, in
``tests/contract/test_object_store.py``; this module covers what only S3 has (buckets,
prefixes, folder markers, the server's lifecycle) and the SDK writing to S3.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import urllib3
from minio import Minio
from minio.error import S3Error

from trainyard import sdk
from trainyard_platform.deploy.local.ports import port_is_open
from trainyard_platform.deploy.local.s3 import S3Server
from trainyard_platform.shared.control import JobRuntimeEnv
from trainyard_platform.shared.settings import StorageSettings
from trainyard_platform.shared.storage import S3Store, open_store, split_uri
from trainyard_platform.shared.storage.s3 import client_from_settings, ensure_bucket

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(log_dir=tmp_path_factory.mktemp("s3-logs")) as server:
        yield server


@pytest.fixture
def settings(s3: S3Server) -> StorageSettings:
    return s3.storage_settings()


@pytest.fixture
def client(settings: StorageSettings) -> Minio:
    return client_from_settings(settings)


def bucket_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def test_server_answers_and_logs(s3: S3Server) -> None:
    assert s3.endpoint == f"127.0.0.1:{s3.port}"
    assert port_is_open(s3.port)
    assert s3.log_path is not None and s3.log_path.exists()


def test_server_start_stop_lifecycle(tmp_path: Path) -> None:
    server = S3Server()
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.endpoint
    server.start()
    port = server.port
    try:
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
        store = open_store("s3://lifecycle", server.storage_settings())
        store.put_bytes("k", b"v")
    finally:
        server.stop()
    assert not port_is_open(port)
    server.stop()  # idempotent


def test_storage_env_configures_storage_settings(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3.storage_env("s3://from-env/prefix").items():
        monkeypatch.setenv(name, value)
    settings = StorageSettings()
    assert settings == s3.storage_settings("s3://from-env/prefix")
    open_store(settings.uri).put_bytes("k", b"env")  # settings=None reads the environment
    assert open_store("s3://from-env/prefix", settings).get_bytes("k") == b"env"


def test_open_store_creates_the_bucket(client: Minio, settings: StorageSettings) -> None:
    bucket = bucket_name()
    assert not client.bucket_exists(bucket)
    store = open_store(f"s3://{bucket}/jobs/abc/checkpoints", settings)
    assert isinstance(store, S3Store)
    assert client.bucket_exists(bucket)
    assert store.root_uri == f"s3://{bucket}/jobs/abc/checkpoints"
    store.put_bytes("step-00000001/manifest.json", b"{}")
    # The object sits under the prefix in the bucket, visible to any S3 client.
    names = [o.object_name for o in client.list_objects(bucket, recursive=True)]
    assert names == ["jobs/abc/checkpoints/step-00000001/manifest.json"]


def test_concurrent_opens_of_a_new_bucket_all_succeed(settings: StorageSettings) -> None:
    bucket = bucket_name()
    with ThreadPoolExecutor(max_workers=8) as pool:
        stores = list(pool.map(lambda i: open_store(f"s3://{bucket}/w{i}", settings), range(8)))
    for i, store in enumerate(stores):
        store.put_bytes("k", str(i).encode())
    assert open_store(f"s3://{bucket}", settings).list() == [f"w{i}/k" for i in range(8)]


def test_bucket_root_store(settings: StorageSettings) -> None:
    bucket = bucket_name()
    store = open_store(f"s3://{bucket}", settings)
    store.put_bytes("top.txt", b"t")
    assert store.root_uri == f"s3://{bucket}"
    assert store.uri_for("top.txt") == f"s3://{bucket}/top.txt"
    assert split_uri(store.uri_for("top.txt")) == (f"s3://{bucket}", "top.txt")


def test_folder_marker_objects_are_not_listed(client: Minio, settings: StorageSettings) -> None:
    bucket = bucket_name()
    store = open_store(f"s3://{bucket}/root", settings)
    store.put_bytes("a/real.txt", b"x")
    client.put_object(bucket, "root/a/", io.BytesIO(b""), 0)  # what some consoles create
    assert store.list() == ["a/real.txt"]


def test_invalid_bucket_name_is_a_value_error(settings: StorageSettings) -> None:
    with pytest.raises(ValueError):
        open_store("s3://Invalid_Bucket!/x", settings)


def test_sdk_checkpoint_on_s3_opens_with_plain_torch_load(
    s3: S3Server,
    client: Minio,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = bucket_name()
    checkpoint_uri = f"s3://{bucket}/jobs/job-s3/checkpoints"
    runtime = JobRuntimeEnv(
        job_id="job-s3", allocation_id="alloc-1", attempt=1, seed=3, checkpoint_uri=checkpoint_uri
    )
    for name, value in {**runtime.to_env(), **s3.storage_env()}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TRAINYARD_CONTROL_FD", raising=False)

    model = torch.nn.Linear(3, 2)
    with sdk.init() as ctx:
        assert ctx.checkpoint_uri == checkpoint_uri
        ctx.save_checkpoint(20, {"model": model.state_dict(), "step": 20})
        ref = ctx.wait_for_checkpoints()
    assert ref is not None
    assert ref.uri == f"{checkpoint_uri}/step-00000020/checkpoint.pt"

    # Fetch with the bare minio client (no Trainyard code) and load with plain torch.
    path = tmp_path / "downloaded.pt"
    client.fget_object(bucket, "jobs/job-s3/checkpoints/step-00000020/checkpoint.pt", str(path))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == ref.sha256
    assert os.path.getsize(path) == ref.size_bytes
    state = torch.load(path)
    assert state["step"] == 20
    assert torch.equal(state["model"]["weight"], model.weight.detach())

    manifest = json.loads(
        client.get_object(bucket, "jobs/job-s3/checkpoints/step-00000020/manifest.json").read()
    )
    assert manifest["sha256"] == ref.sha256 and manifest["job_id"] == "job-s3"

    # And a later attempt of the job restores it through the SDK.
    monkeypatch.setenv("TRAINYARD_ATTEMPT", "2")
    with sdk.init() as ctx:
        restored = ctx.restore_latest()
    assert restored is not None and restored[0] == 20
    assert torch.equal(restored[1]["model"]["bias"], model.bias.detach())


class RacingClient:
    """Stands in for a Minio client that loses the create-bucket race to another process."""

    def __init__(self, code: str, visible_after: bool) -> None:
        self.code = code
        self.visible_after = visible_after
        self.created = False

    def bucket_exists(self, bucket: str) -> bool:
        return self.created and self.visible_after

    def make_bucket(self, bucket: str) -> None:
        self.created = True  # someone else got there first
        raise S3Error(urllib3.HTTPResponse(), self.code, "exists", bucket, "req", "host")


@pytest.mark.parametrize("code", ["BucketAlreadyOwnedByYou", "BucketAlreadyExists"])
def test_losing_the_bucket_race_is_fine(code: str) -> None:
    ensure_bucket(RacingClient(code, visible_after=True), "b")  # type: ignore[arg-type]


def test_a_bucket_owned_by_someone_else_is_an_error() -> None:
    with pytest.raises(S3Error):
        ensure_bucket(
            RacingClient("BucketAlreadyExists", visible_after=False),  # type: ignore[arg-type]
            "b",
        )
