"""Object storage for checkpoints, artifacts and logs, chosen by URI scheme.

``open_store(uri)`` returns an ``ObjectStore`` rooted at ``uri``:

* ``file:///abs/path`` or ``file://./relative/path`` (relative to the current folder at
  open time) -> ``LocalStore``;
* ``s3://bucket`` or ``s3://bucket/some/prefix`` -> ``S3Store`` on the endpoint and
  credentials of ``StorageSettings`` (the bucket is created if missing).

A URI may point anywhere below a bucket or folder (``s3://bucket/jobs/abc/checkpoints``);
the store is rooted there. ``split_uri`` splits an object's URI (as ``uri_for`` returns it)
into its folder's URI and the object's name, so ``open_store(root).get_bytes(key)`` reads it.

The contract, the key rules, the local folder and the URI parsing belong to the client
distribution (``trainyard.storage``), which a training job installs; this package adds S3,
which only the platform opens (with its credentials), and names the rest for the services.
"""

from __future__ import annotations

from shared.settings import StorageSettings
from shared.storage.s3 import S3Store, client_from_settings
from trainyard import storage as _client
from trainyard.storage import (
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    parse_uri,
    split_uri,
    validate_key,
    validate_prefix,
)

__all__ = [
    "LocalStore",
    "ObjectNotFound",
    "ObjectStore",
    "S3Store",
    "open_store",
    "split_uri",
    "validate_key",
    "validate_prefix",
]


def open_store(uri: str, settings: StorageSettings | None = None) -> ObjectStore:
    """The store rooted at ``uri``; ``settings`` (default: read from the environment)
    supply the S3 endpoint and credentials. Unknown schemes raise ``ValueError``."""
    scheme, rest = parse_uri(uri)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"S3 URI {uri!r} names no bucket (expected s3://bucket/prefix)")
        settings = settings if settings is not None else StorageSettings()
        return S3Store(client_from_settings(settings), bucket, prefix)
    return _client.open_store(uri)
