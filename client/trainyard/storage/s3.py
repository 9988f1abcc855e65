"""``S3Store``: the object-store contract on an S3 bucket (MinIO, AWS, moto), via ``minio``.

The store is rooted at ``s3://bucket/optional/prefix``; key ``k`` is the object
``prefix/k`` in the bucket. S3 replaces objects atomically on PUT, so no temp objects are
needed; downloads to a file go through a temp file and ``os.replace``. The bucket is
created on construction when it is missing (see ``ensure_bucket``).

It needs MinIO's client, the client distribution's optional extra ``s3``
(``pip install "trainyard[s3]"``; the platform always has it). Only this module imports it,
and ``trainyard.storage.open_store`` imports this module only for an ``s3`` URI.
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.error import S3Error
from urllib3 import BaseHTTPResponse

from trainyard.storage.base import (
    ObjectNotFound,
    ObjectStore,
    bounded,
    check_size,
    validate_key,
    validate_prefix,
    write_file_atomically,
)
from trainyard.storage.settings import StorageSettings

# Codes that mean "nothing there". A HEAD on a missing object has no body, so minio
# invents the code from the status; a GET returns the server's XML code.
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchObject", "ResourceNotFound"})
_BUCKET_EXISTS_CODES = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})
_CHUNK = 1024 * 1024


def client_from_settings(settings: StorageSettings) -> Minio:
    """A ``Minio`` client for the configured endpoint.

    The region is passed explicitly: without it minio asks the server for each bucket's
    location before the first request, an extra round trip that some S3 clones refuse.

    Its HTTP pool is minio's own (10 connections, certifi's or ``SSL_CERT_FILE``'s CAs, 5
    retries of a failed connection or a 5xx, with back-off) but with the settings'
    connect and read timeouts, and a request that timed out reading is tried once more,
    not five times: minio's 5 minutes each, six times over, held a caller of an endpoint
    that takes connections and never answers for half an hour. A request that times out
    raises urllib3's ``MaxRetryError`` (the object store unreachable: an outage to the
    services, ``bus.infrastructure_fault``)."""
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(
            connect=settings.s3_connect_timeout_seconds, read=settings.s3_read_timeout_seconds
        ),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(
            total=5, read=1, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
        ),
    )
    return Minio(
        settings.s3_endpoint,
        access_key=settings.s3_access_key,
        secret_key=settings.s3_secret_key.get_secret_value(),
        secure=settings.s3_secure,
        region=settings.s3_region,
        http_client=http,
    )


def ensure_bucket(client: Minio, bucket: str) -> None:
    """Create ``bucket`` unless it exists; safe when several processes race to create it."""
    if client.bucket_exists(bucket):
        return
    try:
        client.make_bucket(bucket)
    except S3Error as exc:
        # Lost the race to another creator. "AlreadyExists" can also mean another
        # account owns the name, so only accept it if we can now see the bucket.
        if exc.code not in _BUCKET_EXISTS_CODES or not client.bucket_exists(bucket):
            raise


class S3Store(ObjectStore):
    """Objects under ``prefix/`` in one bucket."""

    def __init__(self, client: Minio, bucket: str, prefix: str = "", *, create: bool = True):
        self._client = client
        self._bucket = bucket
        prefix = prefix.strip("/")
        if prefix:
            validate_key(prefix)
        self._prefix = f"{prefix}/" if prefix else ""
        if create:
            ensure_bucket(client, bucket)

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def prefix(self) -> str:
        """The object-name prefix of this store, ``""`` or ending in ``/``."""
        return self._prefix

    @property
    def root_uri(self) -> str:
        return f"s3://{self._bucket}/{self._prefix}".rstrip("/")

    def _name(self, key: str) -> str:
        return self._prefix + validate_key(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._client.put_object(self._bucket, self._name(key), io.BytesIO(data), len(data))

    def put_file(self, key: str, path: Path) -> None:
        self._client.fput_object(self._bucket, self._name(key), str(path))

    def _open(self, key: str, max_bytes: int | None) -> BaseHTTPResponse:
        try:
            response = self._client.get_object(self._bucket, self._name(key))
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                raise ObjectNotFound(key, self.uri_for(key)) from None
            raise
        length = response.headers.get("Content-Length")
        try:
            check_size(key, int(length) if length else None, max_bytes, self.uri_for(key))
        except BaseException:
            _done(response)  # its body unread: the connection is closed, not reused
            raise
        return response

    def _chunks(
        self, key: str, response: BaseHTTPResponse, max_bytes: int | None
    ) -> Iterator[bytes]:
        # Counted as they come too: a server need not send what its Content-Length said.
        return bounded(response.stream(_CHUNK), key, max_bytes, self.uri_for(key))

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> bytes:
        response = self._open(key, max_bytes)
        try:
            return b"".join(self._chunks(key, response, max_bytes))
        finally:
            _done(response)

    def get_file(self, key: str, path: Path, *, max_bytes: int | None = None) -> None:
        response = self._open(key, max_bytes)
        try:
            write_file_atomically(path, self._chunks(key, response, max_bytes))
        finally:
            _done(response)

    def exists(self, key: str) -> bool:
        try:
            self._client.stat_object(self._bucket, self._name(key))
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                return False
            raise
        return True

    def size(self, key: str) -> int | None:
        try:
            found = self._client.stat_object(self._bucket, self._name(key))
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                return None
            raise
        if found.size is None:  # an S3 HEAD always says Content-Length; this server did not
            raise ValueError(f"{self.uri_for(key)}: the store did not say the object's size")
        return found.size

    def delete(self, key: str) -> None:
        self._client.remove_object(self._bucket, self._name(key))

    def list(self, prefix: str = "") -> builtins.list[str]:
        validate_prefix(prefix)
        keys: builtins.list[str] = []
        objects = self._client.list_objects(
            self._bucket, prefix=self._prefix + prefix, recursive=True
        )
        for obj in objects:
            name = obj.object_name
            # Skip "folder" marker objects some tools create; they are not keys here.
            if name is None or name.endswith("/"):
                continue
            keys.append(name[len(self._prefix) :])
        keys.sort()
        return keys

    def uri_for(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._name(key)}"

    def copy(self, src: str, dst: str) -> None:
        # CopyObject: the bytes never leave the server (above 5 GiB minio copies part by part
        # with UploadPartCopy, still on the server).
        try:
            self._client.copy_object(
                self._bucket, self._name(dst), CopySource(self._bucket, self._name(src))
            )
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                raise ObjectNotFound(src, self.uri_for(src)) from None
            raise

    def presign_get(self, key: str, expires_s: int) -> str | None:
        # SigV4 query signing covers the method, bucket, key and expiry: the URL opens this
        # one object and nothing else, until it expires.
        return self._client.presigned_get_object(
            self._bucket, self._name(key), expires=timedelta(seconds=expires_s)
        )


def _done(response: BaseHTTPResponse) -> None:
    response.close()
    response.release_conn()
